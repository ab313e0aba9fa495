"""Count the sample select's passes over the row (kernels/cut_select.py) at issue #25's vocabulary,
on every row kind and filtered mode, by running the kernels on this machine's CPU under
TRITON_INTERPRET=1 (slow: ~20 s a row at V = 151936; no GPU timing). The kernel counts its own
passes in each row's scratch (`scratch.S_PASSES`: after the row's first pass, step 7 included);
each token is also checked against the reference (SPEC.md's legal bands apart).

What the pass counts say: with the row's first pass, the launches' reads of each row, the
number that issue #25's bound of 4x the floor rests on (`simulate_sample_select.py` simulated
the design; this counts the kernel's own rounds, with its sample of runs and its list of 4096).

    python benchmarks/count_select_passes.py [--vocab 151936] [--rows 1] [--dtype bfloat16]
        [--op sample_rows|dflash_verify] [--top-k K ...]

`--op dflash_verify` counts `dflash_verify`'s select instead (each row an owner of its own, so
each row is decided: the last row of an owner never matches; its first pass is that launch's, with
its own element maxima: float32's in segments, `filtered.element_count`). `--top-k` adds top-k K
modes (e.g. k near the element maxima: 1500, 2000).
"""

import argparse
import os
import platform
import sys

os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402
import triton  # noqa: E402

from dflash_et import kernels  # noqa: E402,F401  (registers torch.ops.dflash)
from dflash_et.export import cases, heads, legal, rng  # noqa: E402
from dflash_et.kernels import launch  # noqa: E402
from dflash_et.kernels import sample_rows as sample_rows_kernel  # noqa: E402
from dflash_et.kernels import verify as verify_kernel  # noqa: E402


def filtered_modes(vocab: int) -> dict[str, tuple[float, int, float]]:
    """`cases.kind_modes` that take a top-k or top-p cut (not top-k 1 or top-p <= 0, which keep one token:
    greedy rows, `sampling_rule.decided_temperature`)."""
    return {name: m for name, m in cases.kind_modes(vocab).items()
            if m[0] > 0 and m[1] != 1 and m[2] > 0 and (0 < m[1] < vocab or m[2] < 1)}


def count(x: torch.Tensor, modes: list[tuple[float, int, float]], g: torch.Generator, op: str = "sample_rows"):
    """(passes per row, rows outside SPEC.md's bands) of `op` on rows x under `modes` (one per row;
    dflash_verify: one owner a row, a random draft)."""
    n = x.shape[0]
    params = {"temperature": torch.tensor([m[0] for m in modes], dtype=torch.float32),
              "top_k": torch.tensor([m[1] for m in modes], dtype=torch.int64),
              "top_p": torch.tensor([m[2] for m in modes], dtype=torch.float32)}
    scratch = launch.scratch_for(x)
    if op == "dflash_verify":
        inp = {"logits": x, "tokens": torch.randint(0, x.shape[1], (n,), generator=g), "offsets": torch.arange(n + 1),
               "start_position": torch.randint(0, 1 << 40, (n,), generator=g), **params,
               "seed": torch.randint(0, 1 << 62, (n,), generator=g)}
        args = [inp[k] for k in cases.VERIFY_INPUTS]
        got = verify_kernel.launch(*args, scratch=scratch)
        want = heads.DFlashVerify()(*args)
        wrong = ((got[0] != want[0]) | (got[1] != want[1])) & ~legal.close_owners(*args)
    else:
        inp = {"logits": x, "position": torch.randint(0, 1 << 40, (n,), generator=g), **params,
               "seed": torch.randint(0, 1 << 62, (n,), generator=g)}
        args = [inp[k] for k in cases.SAMPLE_INPUTS]
        got = sample_rows_kernel.launch(*args, scratch=scratch)
        want = heads.SampleRows()(*args)
        wrong = (got != want) & ~legal.close_rows(x, args[2], args[3], args[4],
                                                  rng.uniform(args[5], args[1], rng.SAMPLE))
    passes = [scratch.stats(r)["passes"] for r in range(n)]
    return passes, int(wrong.sum())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--rows", type=int, default=1, help="rows per kind and mode")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--kinds", nargs="+", default=list(cases.ROW_KINDS), choices=list(cases.ROW_KINDS))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--op", default="sample_rows", choices=["sample_rows", "dflash_verify"])
    ap.add_argument("--top-k", type=int, nargs="*", default=[], help="more top-k modes (temperature 1)")
    args = ap.parse_args(argv)
    dtype = getattr(torch, args.dtype)
    modes = filtered_modes(args.vocab)
    bad_k = [k for k in args.top_k if not 1 < k < args.vocab]
    if bad_k:
        ap.error(f"--top-k {bad_k}: each k takes a cut only in 1 < k < V = {args.vocab}")
    modes.update({f"top-k {k}": (1.0, k, 1.0) for k in args.top_k})
    print(f"device: this CPU under TRITON_INTERPRET=1 (no timing); torch {torch.__version__}, triton "
          f"{triton.__version__}, python {platform.python_version()}")
    print(f"{args.op}, V = {args.vocab} {args.dtype}, {args.rows} row(s) per kind and mode; passes over the row "
          "after its first (step 7 included), max over the rows\n")
    print("| kind | " + " | ".join(modes) + " |")
    print("|---|" + "---|" * len(modes))
    g = torch.Generator().manual_seed(args.seed)
    worst, wrong = 0, 0
    for kind in args.kinds:
        x = cases.kind_logits(g, kind, args.rows * len(modes), args.vocab, dtype)
        passes, bad = count(x, [m for m in modes.values() for _ in range(args.rows)], g, args.op)
        wrong += bad
        per_mode = [max(passes[i * args.rows:(i + 1) * args.rows]) for i in range(len(modes))]
        worst = max(worst, *per_mode)
        print(f"| {kind} | " + " | ".join(str(p) for p in per_mode) + " |", flush=True)
    print(f"\nworst: {worst} passes after the first; tokens outside SPEC.md's bands: {wrong}")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
