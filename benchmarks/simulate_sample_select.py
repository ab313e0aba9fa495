"""Simulate issue #25's sample select on every row kind and mode (CPU; not a test).

A third design for the top-k / top-p cuts, worked out before its kernel (the house rule:
reference first). The window select (`simulate_window_select.py`) bins every logit of a pass:
on the H200 one `tl.histogram` of 256 bins cost 8.2x the floor and a 16-bin one-hot sum 12.1x
(benchmarks/HISTORY.md, session 33), so no pass of it fits #25's 4x budget. Here no pass bins
anything: the first pass keeps a sample of the row, and each later pass compares every logit
with a few thresholds taken from that sample (a compare, a masked add of count and mass) and
stores the tokens between two of them.

- The sample: every R-th token by index (R = `--rate`), stored by the first pass (the pass
  that already finds the max and S), then sorted in SPEC.md's order (V / R entries: 2374 at
  V = 151936, R = 64).
- A threshold is a token's place in the order: (key, index) packed into one int64, so one
  compare says "above it", ties at the cut in index order included. In a region of the order
  known to hold the cut, the sample points inside it estimate where the cut falls: each point
  stands for the region's exact count over its points, with its own weight for top-p; what
  that leaves of the region's exact mass (heavy tokens between the points, the LLM-like rows'
  few dozen) is put at the region's top, where such tokens are.
- A bracket pass takes the sample points `m` places either side of that estimate (`m` such
  that the bracket holds about `--fill` x the list), and G places further (`--guards`): it
  counts and sums exactly above each threshold and stores the bracket's tokens (key, index,
  weight) while they fit the list. If the cut is inside and the bracket fit, the cut is exact
  from the list (sorted in registers); otherwise the exact counts and masses at the thresholds
  give a smaller region, and the next pass starts from its sample points.
- A region with too few sample points (`MIN_POINTS`: a row built against the sample) is split
  by key instead, `--splits` equal key ranges a pass with exact counts and masses, and so is
  every region after `--brackets` bracket passes of the row: the bounded fallback. A key
  split narrows the region's range of ordered keys by `--splits`, down to one key (its ties
  share one weight: the cut is arithmetic) or a region that fits the list. The bound, per
  row: `--brackets` bracket passes, then per cut ceil(16 / log2 splits) key splits for 2-byte
  keys (ceil(32 / log2 splits) for float32) and one list pass, then step 7.
- top-k + top-p: the top-k cut first; its list holds the order from its bracket's start, so a
  top-p cut there needs no pass (S_k is exact: the mass above the bracket plus the list's).
- Then step 7 (the token, t = u * S_K in index order): one more pass with the exact cuts.

For each (kind, mode, dtype) this prints passes over the row after the first (mean / max;
bracket passes + key splits + step 7), key-split passes (max), the largest list, and checks
every cut against a sort (`simulate_cut_search.sorted_cuts`); it fails otherwise.

    python benchmarks/simulate_sample_select.py [--rows 4] [--vocab 151936] [--rate 64] [--list 4096]

(benchmarks/HISTORY.md, session 47, has a run; `bench_sample_select.py` times its stages on a GPU.)
"""

import math
import sys
from dataclasses import dataclass

import torch

from simulate_cut_search import (cells_parser, checked_cells, keys, largest, mean_max, passes,  # (benchmarks/,
                                 sorted_cuts, spec_order, worst_rows)  # beside this script)

MIN_POINTS = 4  # fewer sample points than this in a region: split it by key instead
ROUNDS_CAP = 100  # (a simulation that loops is a bug in it)


@dataclass
class Ordered:
    """One sanitized row in SPEC.md's order (logit descending, index ascending), finite tokens only."""
    key: torch.Tensor  # int64 ordered keys, by rank
    e: torch.Tensor  # float64 of SPEC.md's float32 weights, by rank
    sample: torch.Tensor  # ranks of the sample's tokens (index % rate == 0), ascending

    @staticmethod
    def of(x: torch.Tensor, dtype: torch.dtype, temperature: float, rate: int) -> "Ordered":
        finite = x > float("-inf")
        key = keys(x, dtype)
        order = spec_order(key, finite)
        e = torch.exp((x[order] - x[finite].max()) / temperature).double()
        sample = ((order % rate) == 0).nonzero().flatten()
        return Ordered(key[order], e, sample)


def kept_until(o: Ordered, by_mass: bool, goal: float, end: int) -> torch.Tensor:
    """kept[t] for ranks t in [0, end]: does the cut keep rank t? top-k: t < goal; top-p: the
    mass before rank t is under goal (rank 0 always). What a pass knows exactly at a threshold
    from its count or mass above it; True then False along the ranks, False at `end`."""
    if by_mass:
        before = torch.cat([torch.zeros(1, dtype=torch.float64), torch.cumsum(o.e[:end], 0)])
        kept = before < goal
        kept[0] = True
    else:
        kept = torch.arange(end + 1) < goal
    kept[end] = False
    return kept


def cut_in(kept: torch.Tensor, a: int, b: int) -> int:
    """The cut's rank from a list of the ranks [a, b) that holds it (their `kept` known exactly)."""
    return a + int(kept[a:b].sum()) - 1


def _estimate(o: Ordered, by_mass: bool, goal: float, lo: int, hi: int, above_lo: float, points: torch.Tensor):
    """The index, among `points` (the sample's ranks in [lo, hi)), of the first whose estimated
    measure up to it (count or mass, from rank 0) reaches the goal."""
    per_point = (hi - lo) / len(points)  # tokens of the region per sample point (exact count over the points)
    if by_mass:
        # Each point stands for per_point tokens of its weight; what that misses of the region's
        # exact mass (heavy tokens between the points) is put at the region's top, where they are.
        acc = torch.cumsum(o.e[points], 0) * per_point
        acc += float(o.e[lo:hi].sum()) - float(acc[-1])  # (the region's mass: exact, from earlier passes)
    else:
        acc = torch.arange(1, len(points) + 1, dtype=torch.float64) * per_point
    j = int(torch.searchsorted(acc + above_lo, torch.tensor([goal], dtype=torch.float64)).item())
    return min(j, len(points) - 1)


def find_cut(o: Ordered, by_mass: bool, goal: float, end: int, args, stats: dict) -> tuple[int, int]:
    """(the cut's rank, the rank where the last list starts) among ranks [0, end), the way the
    design finds it, counting its passes in `stats`. Every decision reads only what a pass
    knows exactly: `kept` at a threshold, and at every rank of a stored list."""
    kept = kept_until(o, by_mass, goal, end)
    lo, hi = 0, end  # the region known to hold the cut: ranks [lo, hi), kept[lo] and not kept[hi]
    for _ in range(ROUNDS_CAP):
        stats["passes"] += 1
        if hi - lo <= args.list:  # the whole region fits: this pass stores it
            stats["list"] = max(stats["list"], hi - lo)
            return cut_in(kept, lo, hi), lo
        points = o.sample[(o.sample >= lo) & (o.sample < hi)]
        if len(points) < MIN_POINTS or stats["brackets"] >= args.brackets:  # the fallback: equal ranges of keys
            stats["splits"] += 1
            k_top = int(o.key[lo])
            width = max(1, math.ceil((k_top - int(o.key[hi - 1]) + 1) / args.splits))
            part = (k_top - o.key[lo:hi]) // width  # rises along the ranks: each part a range of them
            starts = lo + torch.cat([torch.zeros(1, dtype=torch.long), (part[1:] != part[:-1]).nonzero().flatten() + 1])
            bounds = starts.tolist() + [hi]
            i = max(i for i in range(len(bounds) - 1) if kept[bounds[i]])
            lo, hi = bounds[i], bounds[i + 1]
            if int(o.key[lo]) == int(o.key[hi - 1]):
                return cut_in(kept, lo, hi), lo  # one key: its ties share one weight, the cut is arithmetic
            continue
        stats["brackets"] += 1
        above_lo = float(o.e[:lo].sum()) if by_mass else float(lo)  # exact: a pass summed it above its threshold
        j = _estimate(o, by_mass, goal, lo, hi, above_lo, points)
        m = max(1, int(args.fill * args.list * len(points) / (2 * (hi - lo))))
        at = lambda i, edge: int(points[i]) if 0 <= i < len(points) else edge  # noqa: E731
        first, last = at(j - m, lo), at(j + m, hi)  # the bracket: this pass stores ranks [first, last)
        if kept[first] and not kept[last] and last - first <= args.list:
            stats["list"] = max(stats["list"], last - first)
            return cut_in(kept, first, last), first
        thresholds = {lo, hi, first, last}
        if args.guards:
            thresholds |= {at(j - args.guards * m, lo), at(j + args.guards * m, hi)}
        lo = max(t for t in thresholds if kept[t])  # the exact counts / masses at every threshold
        hi = min(t for t in thresholds if not kept[t])  # say which of their ranges holds the cut
    raise AssertionError(f"no cut after {ROUNDS_CAP} passes")


def simulate(x: torch.Tensor, dtype, temperature: float, top_k: int, top_p: float, args):
    """(rank of the top-k cut or None, of the top-p cut or None, stats) of one sanitized row."""
    o = Ordered.of(x, dtype, temperature, args.rate)
    n = len(o.e)
    stats = {"passes": 0, "brackets": 0, "splits": 0, "list": 0}
    end, listed_from = n, None
    cut_k = cut_p = None
    if 0 < top_k < n:
        cut_k, listed_from = find_cut(o, False, top_k, n, args, stats)
        end = top_k
    if top_p < 1.0:
        goal = top_p * float(o.e[:end].sum())  # S_k: exact once the top-k cut is (the mass above its list + the list's)
        kept = kept_until(o, True, goal, end)
        if listed_from is not None and kept[listed_from]:
            cut_p = cut_in(kept, listed_from, end)  # inside top-k's list: no pass
        else:
            cut_p, _ = find_cut(o, True, goal, end if listed_from is None else max(listed_from, 1), args, stats)
    if cut_k is not None or cut_p is not None:
        stats["passes"] += 1  # step 7
    key = lambda r: None if r is None else int(o.key[r])  # noqa: E731
    return key(cut_k), key(cut_p), stats


def main(argv=None) -> int:
    ap = cells_parser(__doc__)
    ap.add_argument("--rate", type=int, default=64, help="one sample point per this many tokens")
    ap.add_argument("--fill", type=float, default=0.8, help="the bracket's expected tokens, a fraction of the list")
    ap.add_argument("--guards", type=int, default=4, help="guard thresholds this many times further (0: none)")
    ap.add_argument("--splits", type=int, default=16, help="key ranges per fallback pass")
    ap.add_argument("--brackets", type=int, default=3, help="bracket passes per row before the key splits")
    args = ap.parse_args(argv)
    print(f"V = {args.vocab}, {args.rows} rows per cell, a sample point per {args.rate} tokens, list {args.list}, "
          f"fill {args.fill}, guards x{args.guards}; passes after the first: mean / max; key splits: max")
    cells = checked_cells(args, lambda x, *rule: simulate(x, *rule, args))
    return worst_rows(cells, {"passes": (passes, mean_max), "key splits": (largest("splits"), str),
                              "list": (largest("list"), str)})


if __name__ == "__main__":
    sys.exit(main())
