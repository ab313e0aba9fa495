"""Time the sample select's count pass alone (`kernels/cut_select.py` `_count_pass`: top-k's first
pass from an element bound, the largest launch of issue #25's worst rows, top-k 1000: ~311 us of
~900 in bf16 on the H100, session 70), to find what bounds it.

Each row is one program of 4 warps (the pass launch's items where the rows are many), its
threshold just below the row's K-th largest logit (`--listed`: the tokens the element bound lets
through at top-k 1000 are ~1400-1900), every token above it listed as the pass launch lists it.
Printed against the floor measured in the same run (one `torch.amax` read of the same rows) and
beside the same pass with no list (LIST 0: the count alone, no slot claimed or stored), which
tells the list's cost: each step's stores wait for its atomic claim's round trip to L2. Other
trees' kernels time side by side (`--tree DIR`: a folder holding a copy of `kernels/`, e.g.
`git archive REV kernels | tar -x -C DIR`; their LIST 0 still claims slots if the tree predates
LIST 0, and stores nothing).

    python benchmarks/bench_count_pass.py [--rows 1024] [--vocab 151936] [--dtype bfloat16]
        [--listed 1400] [--kinds power-law flat ties] [--tree DIR ...]

Under TRITON_INTERPRET=1 (tests: small sizes) it runs on the CPU and prints no times.
"""

import argparse
import importlib
import itertools
import os
import platform
import shutil
import sys
import tempfile
from pathlib import Path

import torch
import triton

from bench_sample_select import packed_tokens
from dflash_et.export import cases

REPO = Path(__file__).resolve().parents[1]
FILES = ("cut_select.py", "common.py", "sampling_rule.py", "scratch.py")  # (the count pass and what it imports)
WRAPPER = '''
import triton
import triton.language as tl

from .cut_select import _count_pass


@triton.jit
def whole_rows(logits_ptr, stride, vocab, t_ptr, fill_ptr, list_ptr, out_ptr, LIST: tl.constexpr,
               LANES: tl.constexpr, STAGES: tl.constexpr):
    r = tl.program_id(0)
    above_n, _, lowest, n_finite, _ = _count_pass(logits_ptr + r * stride, 0, vocab, tl.load(t_ptr + r), fill_ptr + r,
                                                  list_ptr + r * LIST, LIST, LANES{stages})
    tl.store(out_ptr + 3 * r, tl.sum(tl.where(tl.arange(0, 4) == 2, above_n, 0), 0))
    tl.store(out_ptr + 3 * r + 1, lowest)
    tl.store(out_ptr + 3 * r + 2, n_finite)
'''
_LOADED = itertools.count()
LANES, STAGES, WARPS = 128, 4, 4  # the pass launch's (launch.SELECT_WARPS, cut_select.PASS_STAGES)


def load_tree(kernels_dir: Path, name: str, tmp: Path):
    """A tree's count pass as an importable package of its own: `name`.count_bench.whole_rows."""
    missing = [f for f in FILES if not (kernels_dir / f).is_file()]
    if missing:
        raise SystemExit(f"--tree: {kernels_dir} lacks {missing}; give a folder holding a copy of kernels/ "
                         f"(git archive REV kernels | tar -x -C DIR)")
    name = f"{name}_{next(_LOADED)}"  # (a package name of its own each time: the imports are cached)
    pkg = tmp / name
    pkg.mkdir()
    for f in FILES:
        shutil.copy(kernels_dir / f, pkg / f)
    (pkg / "__init__.py").write_text("")
    source = (kernels_dir / "cut_select.py").read_text()
    signature = source[source.index("def _count_pass("):].split(":\n", 1)[0]
    (pkg / "count_bench.py").write_text(WRAPPER.replace("{stages}", ", STAGES" if "STAGES" in signature else ""))
    # (a tree whose pass takes no pipeline depth, as ce141ae's, which prefetched its loads itself: none passed)
    sys.path.insert(0, str(tmp))
    return importlib.import_module(f"{name}.count_bench").whole_rows


def thresholds(x: torch.Tensor, listed: int) -> torch.Tensor:
    """Packed values just below each row's `listed`-th largest key (every index): the pass lists
    the tokens at or above that logit, as from an element bound."""
    kth = packed_tokens(x)[1].topk(listed, 1).values[:, -1]  # (SPEC.md's sanitized tokens, packed)
    return ((kth >> 32) << 32) - 1


def listed_sets(slots, fill, lst):
    """Each row's listed packed tokens as a sorted list (its first min(fill, lst) slots)."""
    return [sorted(row[:min(int(n), lst)].tolist()) for row, n in zip(slots, fill)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1024)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    ap.add_argument("--listed", type=int, default=1400)
    ap.add_argument("--kinds", nargs="+", default=["power-law", "flat", "ties"])
    ap.add_argument("--tree", action="append", default=[], metavar="DIR")
    args = ap.parse_args(argv)

    cpu = os.environ.get("TRITON_INTERPRET") == "1"
    device = "cpu" if cpu else "cuda"
    dtype = getattr(torch, args.dtype)
    if not cpu:
        props = torch.cuda.get_device_properties(0)
        print(f"- device: {props.name}, {props.multi_processor_count} SMs")
    print(f"- versions: torch {torch.__version__}, triton {triton.__version__}, python {platform.python_version()}")
    print(f"- rows {args.rows} x V {args.vocab} {args.dtype}, each row one program of {WARPS} warps; "
          f"~{args.listed} tokens listed a row\n")
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"tip": load_tree(REPO / "kernels", "count_tip", Path(tmp))}
        for i, d in enumerate(args.tree):
            trees[Path(d).name or f"tree{i}"] = load_tree(Path(d) / "kernels", f"count_tree{i}", Path(tmp))
        print("| rows | kernels | list | us | x floor | tokens a row |\n|---|---|---|---|---|---|")
        bad = 0
        for kind in args.kinds:
            g = torch.Generator(device=device).manual_seed(71)
            xs = [cases.kind_logits(g, kind, args.rows, args.vocab, dtype) for _ in range(1 if cpu else 2)]
            ts = [thresholds(x, min(args.listed, args.vocab)) for x in xs]
            floor = 0.0 if cpu else triton.testing.do_bench(lambda: xs[0].amax(1), warmup=25, rep=100,
                                                            return_mode="median") * 1e3
            want = want_list = None
            for label, kernel in trees.items():
                for lst in (4096, 0):
                    fill = torch.zeros(args.rows, dtype=torch.int64, device=device)
                    slots = torch.zeros(max(args.rows * lst, 1), dtype=torch.int64, device=device)
                    out = torch.zeros(args.rows * 3, dtype=torch.int64, device=device)
                    turn = [0]

                    def run():
                        i = turn[0] = (turn[0] + 1) % len(xs)
                        fill.zero_()
                        kernel[(args.rows,)](xs[i], xs[i].stride(0), args.vocab, ts[i], fill, slots, out, LIST=lst,
                                             LANES=LANES, STAGES=STAGES, num_warps=WARPS)

                    turn[0] = -1
                    run()  # (the first input: its counts checked)
                    counts = out.view(-1, 3).cpu()
                    want = counts if want is None else want
                    same = torch.equal(counts, want) and (lst == 0 or torch.equal(fill.cpu(), counts[:, 0]))
                    if lst:  # (the listed tokens too, in no order: the first list's)
                        listed = listed_sets(slots.view(args.rows, lst).cpu(), fill.cpu(), lst)
                        want_list = listed if want_list is None else want_list
                        same = same and listed == want_list
                    bad += not same
                    us = 0.0 if cpu else triton.testing.do_bench(run, warmup=25, rep=100, return_mode="median") * 1e3
                    ratio = f"{us / floor:.2f}" if floor else "-"
                    print(f"| {kind} | {label} | {lst or 'none'} | {us:.1f} | {ratio} | "
                          f"{counts[:, 0].float().mean():.0f}{'' if same else ' DIFFER'} |")
            print(f"| {kind} | one amax read (floor) | | {floor:.1f} | 1.00 | |")
    print(f"\nvariants whose counts or lists differ from the first: {bad}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
