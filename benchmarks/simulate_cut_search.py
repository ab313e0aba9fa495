"""Simulate issue #25's bounded cut search on every row kind and mode (CPU; not a test).

SPEC.md's top-k and top-p cuts are two searches over the ordered keys of a row
(`export/sampling.py` bisects all 33 bits of a float32 key, one pass per bit). A kernel
can instead evaluate P probe keys per pass over the row (each probe: count and mass of
the tokens above it) and keep the bracket between the two probes that straddle the cut:

- top-k: the largest key v with count(x > v) >= k; the cut is v + 1;
- top-p: the smallest key c >= the top-k cut with mass(x > c) < top_p * S_k;
- the search works in the row dtype's own key space: 16 bits for bfloat16 / float16
  rows, 32 for float32, so P-ary search ends within ceil(bits / log2(P + 1)) passes
  whatever the row holds. Probes placed evenly in *value* (not key) space first land
  near the cut on smooth rows and shrink the bracket faster; a strategy may also stop
  early and *compact* the bracket's tokens (one more pass) once they fit a buffer.

For each (kind, mode, dtype) this prints the passes each strategy needed (mean / max
over the rows) and checks that the cuts equal a sort-based computation of SPEC.md's
(the search is exact whatever its probes). The ALU figure is per logit over all the
search's passes: ~4 operations per probe for a mass probe (compare, count, select, add)
and 2 for a count-only probe, plus ~4 per pass (load, convert, weight).

    python benchmarks/simulate_cut_search.py [--rows 4] [--vocab 151936] [--probes 4 8 16] [--buf 4096]

(benchmarks/HISTORY.md, session 38, has a run.)
"""

import argparse
import math
import sys

import torch

from dflash_et.export import cases, sampling


def keys(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Ordered int64 keys of `x` (float32 values exactly representable in `dtype`): the
    order of the values, one key per value of the dtype (16 bits for 2-byte dtypes)."""
    if dtype == torch.float32:
        bits = x.view(torch.int32).to(torch.int64)
        return torch.where(bits < 0, -(bits & 0x7FFFFFFF) - 1, bits)
    bits = x.to(dtype).view(torch.int16).to(torch.int64)
    return torch.where(bits < 0, -(bits & 0x7FFF) - 1, bits)


def spec_order(key: torch.Tensor, finite: torch.Tensor) -> torch.Tensor:
    """The finite tokens' indices in SPEC.md's order: key descending, index ascending."""
    order = torch.argsort(-key.masked_fill(~finite, torch.iinfo(torch.int64).min // 2), stable=True)
    return order[: int(finite.sum())]


def sorted_cuts(x, key, temperature, top_k, top_p):
    """(cut_k, cut_p) keys by sorting (the check): rank order is key descending, index ascending."""
    finite = x > float("-inf")
    order = spec_order(key, finite)
    n = len(order)
    k = top_k if 0 < top_k < n else n
    ranked = key[order][:k]
    e = torch.exp((x[order][:k] - x.max()) / temperature).double()
    cut_k = int(ranked[-1])
    if top_p >= 1.0:
        return cut_k, None
    before = torch.cumsum(e, 0) - e  # C(r - 1)
    kept = before < top_p * e.sum()
    kept[0] = True
    return cut_k, int(ranked[kept][-1])


def search(count_or_mass, lo: int, hi: int, probes: int, strategy: str, to_value, bracket_size, buf: int):
    """Largest v in [lo, hi) with pred(v) (pred(lo) holds, pred(hi) does not), by P-ary
    passes: returns (v, passes, passes with compaction)."""
    passes, compact_at = 0, None
    while hi - lo > 1:
        if compact_at is None and bracket_size(lo, hi) <= buf:
            compact_at = passes
        span = hi - lo
        if strategy == "value" and passes == 0 or strategy == "mixed" and passes % 2 == 0:
            a, b = to_value(lo + 1), to_value(hi)  # probe values evenly between the ends' values
            grid = torch.linspace(0, 1, probes + 2, dtype=torch.float64)[1:-1]
            candidates = {int(k) for k in count_or_mass.key_of(a + (b - a) * grid)}
        else:
            candidates = {lo + (span * (i + 1)) // (probes + 1) for i in range(probes)}
        candidates = sorted(c for c in candidates if lo < c < hi)
        if not candidates:  # (value probes that all rounded onto the ends)
            candidates = sorted({lo + (span * (i + 1)) // (probes + 1) for i in range(probes)} - {lo, hi})
        passes += 1
        for c in candidates:  # one pass evaluates all of them
            if count_or_mass.pred(c):
                lo = c
            else:
                hi = c
                break
    done_compacted = passes if compact_at is None else min(passes, compact_at + 1)
    return lo, passes, done_compacted


class Row:
    def __init__(self, x, dtype, temperature):
        self.x, self.key = x, keys(x, dtype)
        finite = x > float("-inf")
        self.finite = finite
        self.e = torch.where(finite, torch.exp((x - x.max()) / temperature), 0.0).double()
        self.dtype = dtype
        self.pred = None

    def key_of(self, values: torch.Tensor) -> torch.Tensor:
        return keys(values.float().to(self.dtype).float(), self.dtype)


def cells_parser(doc: str) -> argparse.ArgumentParser:
    """The command line every design simulation shares (`checked_cells` reads it); each adds its own knobs."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--rows", type=int, default=4, help="rows per (kind, mode, dtype)")
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--list", type=int, default=4096, help="tokens the list holds")
    ap.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"])
    return ap


def checked_cells(args, simulate):
    """The simulations' common loop: for each dtype, row kind and mode with a cut, (dtype, kind,
    mode, the stats of each row), from `simulate(x, dtype, temperature, top_k, top_p) ->
    (cut_k or None, cut_p or None, stats)` on `args.rows` sanitized rows (`cells_parser`'s
    arguments), every cut checked against a sort (`sorted_cuts`; AssertionError otherwise)."""
    g = torch.Generator().manual_seed(0)
    modes = {name: m for name, m in cases.kind_modes(args.vocab).items() if m[1] != 0 or m[2] < 1.0}
    for dtype in (getattr(torch, d) for d in args.dtypes):
        for kind in cases.ROW_KINDS:
            # SPEC.md's sanitizing; + 0.0 merges -0.0 into 0.0 (one value, so one key: a kernel must too)
            x_all = sampling.sanitize(cases.kind_logits(g, kind, args.rows, args.vocab, dtype)) + 0.0
            for mode, (temperature, top_k, top_p) in modes.items():
                got = []
                for x in x_all:
                    if not bool((x > float("-inf")).any()):
                        continue
                    cut_k, cut_p, stats = simulate(x, dtype, temperature, top_k, top_p)
                    want_k, want_p = sorted_cuts(x, keys(x, dtype), temperature, top_k, top_p)
                    if cut_k is not None:
                        assert cut_k == want_k, (kind, mode, dtype, cut_k, want_k)
                    assert cut_p == want_p, (kind, mode, dtype, cut_p, want_p)
                    got.append(stats)
                if got:
                    yield dtype, kind, mode, got


def worst_rows(cells, columns: dict) -> int:
    """Print each cell's row of the table (`columns`: title -> (a cell's figure from its stats,
    its format)), under a heading per dtype, then the worst cell per dtype and figure; returns 0."""
    worst, heading = {}, None
    for dtype, kind, mode, got in cells:
        if dtype != heading:
            heading = dtype
            print(f"\n## {dtype}\n\n| kind | mode | " + " | ".join(columns) + " |\n|---|---|"
                  + "---|" * len(columns))
        figures = {title: figure(got) for title, (figure, _) in columns.items()}
        print(f"| {kind} | {mode} | " + " | ".join(fmt(figures[t]) for t, (_, fmt) in columns.items()) + " |")
        for title, v in figures.items():
            v = v[1] if isinstance(v, tuple) else v  # (mean, max): the max
            worst[(str(dtype), title)] = max(worst.get((str(dtype), title), (0, "")), (v, f"{kind}, {mode}"))
    print("\n## The worst row\n\n| dtype | what | worst | kind, mode |\n|---|---|---|---|")
    for (dtype, what), (v, where) in sorted(worst.items()):
        print(f"| {dtype} | {what} | {v:.0f} | {where} |")
    return 0


def passes(got: list[dict]) -> tuple[float, int]:
    """(mean, max) passes of a cell's rows."""
    p = [s["passes"] for s in got]
    return sum(p) / len(p), max(p)


def mean_max(v: tuple[float, int]) -> str:
    return f"{v[0]:.1f} / {v[1]}"


def largest(name: str):
    """A cell's figure for `worst_rows`: the largest `name` of its rows' stats."""
    return lambda got: max(s[name] for s in got)


def value_of_key(key: int, dtype) -> float:
    if dtype == torch.float32:
        bits = key if key >= 0 else -(key + 1) | -0x80000000
        return torch.tensor([bits], dtype=torch.int32).view(torch.float32).item()
    bits = key if key >= 0 else (-(key + 1)) | -0x8000
    return torch.tensor([bits], dtype=torch.int16).view(dtype).float().item()


def simulate(x, dtype, temperature, top_k, top_p, probes, strategy, buf):
    row = Row(x, dtype, temperature)
    key, finite = row.key, row.finite
    fkey = key[finite]
    n = int(finite.sum())
    k = top_k if 0 < top_k < n else n
    to_value = lambda c: value_of_key(int(c), dtype)  # noqa: E731
    size = lambda lo, hi: int(((key > lo) & (key <= hi) & finite).sum())  # noqa: E731
    stats = {"passes": 0, "compacted": 0, "alu": 0.0}
    cut_k = int(fkey.min())
    if k < n:  # top-k: the largest v with count(x > v) >= k
        row.pred = lambda v: int((fkey > v).sum()) >= k
        v, p, pc = search(row, int(fkey.min()) - 1, int(fkey.max()), probes, strategy, to_value, size, buf)
        cut_k = v + 1
        stats["passes"] += p
        stats["compacted"] += pc
        stats["alu"] += p * (2 * probes + 4)
    cut_p = None
    if top_p < 1.0:
        above = key > cut_k
        room = k - int(above.sum())
        tie = (key == cut_k).nonzero().flatten()[:room]
        kept = above.clone()
        kept[tie] = True
        s_k = float(row.e[kept].sum())
        target = top_p * s_k
        row.pred = lambda c: float(row.e[key > c].sum()) >= target  # false from the cut up
        v, p, pc = search(row, cut_k - 1, int(fkey.max()), probes, strategy, to_value, size, buf)
        cut_p = v + 1
        stats["passes"] += p
        stats["compacted"] += pc
        stats["alu"] += p * (4 * probes + 4)
    return cut_k if k < n else None, cut_p, stats


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=4, help="rows per (kind, mode, dtype)")
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--probes", type=int, nargs="+", default=[4, 8, 16])
    ap.add_argument("--strategies", nargs="+", default=["key", "value", "mixed"])
    ap.add_argument("--buf", type=int, default=4096, help="tokens a compaction buffer holds")
    args = ap.parse_args(argv)
    g = torch.Generator().manual_seed(0)
    modes = {name: m for name, m in cases.kind_modes(args.vocab).items() if m[1] != 0 or m[2] < 1.0}
    print(f"V = {args.vocab}, {args.rows} rows per cell, compaction buffer {args.buf}; passes: mean / max "
          f"(with compaction); ALU ops per logit: mean / max")
    worst = {}
    for dtype in (torch.bfloat16, torch.float32):
        bits = 16 if dtype == torch.bfloat16 else 32
        for probes in args.probes:
            bound = math.ceil(bits / math.log2(probes + 1))
            print(f"\n## {dtype}, {probes} probes a pass (bound: {bound} passes per search)\n")
            print("| kind | mode | " + " | ".join(args.strategies) + " |")
            print("|---" * (len(args.strategies) + 2) + "|")
            for kind in cases.ROW_KINDS:
                # SPEC.md's sanitizing; + 0.0 merges -0.0 into 0.0 (one value, so one key: a kernel must too)
                x_all = sampling.sanitize(cases.kind_logits(g, kind, args.rows, args.vocab, dtype)) + 0.0
                for mode, (temperature, top_k, top_p) in modes.items():
                    cells = []
                    for strategy in args.strategies:
                        got = []
                        for x in x_all:
                            if not bool((x > float("-inf")).any()):
                                continue
                            cut_k, cut_p, stats = simulate(x, dtype, temperature, top_k, top_p, probes, strategy,
                                                           args.buf)
                            want_k, want_p = sorted_cuts(x, keys(x, dtype), temperature, top_k, top_p)
                            if 0 < top_k < int((x > float("-inf")).sum()):
                                assert cut_k == want_k, (kind, mode, strategy, cut_k, want_k)
                            assert cut_p == want_p, (kind, mode, strategy, cut_p, want_p)
                            got.append(stats)
                        if not got:
                            cells.append("-")
                            continue
                        p = [s["passes"] for s in got]
                        c = [s["compacted"] for s in got]
                        a = [s["alu"] for s in got]
                        cells.append(f"{sum(p) / len(p):.1f} / {max(p)} ({max(c)}); "
                                     f"{sum(a) / len(a):.0f} / {max(a):.0f}")
                        for what, values in (("passes", p), ("with compaction", c), ("ALU ops per logit", a)):
                            key = (str(dtype), probes, strategy, what)
                            worst[key] = max(worst.get(key, (0, "")), (max(values), f"{kind}, {mode}"))
                    print(f"| {kind} | {mode} | " + " | ".join(cells) + " |")
    print("\n## The worst row per strategy (both searches together)\n")
    print("| dtype | probes | strategy | passes | with compaction | ALU ops per logit |")
    print("|---|---|---|---|---|---|")
    for dtype, probes, strategy in sorted({k[:3] for k in worst}):
        cells = [f"{worst[(dtype, probes, strategy, w)][0]:.0f} ({worst[(dtype, probes, strategy, w)][1]})"
                 for w in ("passes", "with compaction", "ALU ops per logit")]
        print(f"| {dtype} | {probes} | {strategy} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
