"""Time dflash_verify's light row launch under other launch configs (GPU; not a test).

`launch.decide_config` (the first row launch, which reads every row and decides greedy and
temperature-only rows, and the accept launch; the FILTERED row launch takes its
step: `launch.filtered_rows_config`) is replaced by each config given, the op is timed
at the headline shape (64 owners x 16 rows, V = 151936) as `bench_verify.py` times it (a
captured graph of >= 4 calls, median of do_bench) and its launches are profiled:

    python benchmarks/sweep_rows.py [--configs 4096:4:5,8192:8:5] [--modes greedy,"temp 0.8"]

A config is BYTES:WARPS:STAGES (logits bytes per loop step, warps per program, pipeline
stages). Each new config compiles its kernel variants first (~30 s each on the H200's host).
The numbers in `decide_config`'s docstring came from runs like this one.
"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_verify as bench  # noqa: E402  (the same inputs, timing and profile)

from dflash_et.kernels import launch, verify  # noqa: E402


def parse_config(text: str) -> tuple[int, int, int]:
    try:
        nbytes, warps, stages = (int(x) for x in text.split(":"))
    except ValueError:
        raise SystemExit(f"sweep_rows: config {text!r} is not BYTES:WARPS:STAGES (e.g. 4096:4:5)") from None
    if nbytes < 64 or nbytes & (nbytes - 1) or warps not in (1, 2, 4, 8, 16) or stages < 1:
        raise SystemExit(f"sweep_rows: config {text!r}: BYTES a power of two >= 64, WARPS 1/2/4/8/16, "
                         "STAGES >= 1")
    return nbytes, warps, stages


def use(nbytes: int, warps: int, stages: int) -> None:
    """Make `verify.launch` take this config for its light row launch (and accept)."""

    def decide_config(vocab, block=None, itemsize=2):
        logits = nbytes // itemsize if block is None else block
        return launch.RowConfig(block=logits, warps=warps, stages=stages, cap=16, buf=32)

    verify.decide_config = decide_config


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", default="4096:4:5,8192:8:5,4096:4:3,2048:2:5")
    ap.add_argument("--modes", default="greedy,temp 0.8", help=f"comma-separated, of {list(bench.MODES)}")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    args = ap.parse_args(argv)
    modes = [m.strip() for m in args.modes.split(",")]
    unknown = [m for m in modes if m not in bench.MODES]
    if unknown:
        raise SystemExit(f"sweep_rows: unknown modes {unknown}; use some of {list(bench.MODES)}")
    configs = [parse_config(c) for c in args.configs.split(",")]
    if not torch.cuda.is_available():
        raise SystemExit("sweep_rows: needs a CUDA GPU (the timings are CUDA-graph replays)")
    dtype = getattr(torch, args.dtype)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, 64 x 16 rows, V = 151936, {args.dtype}")
    print("| config (bytes:warps:stages) | mode | fused us | launches (profiler, us per call) |")
    print("|---|---|---:|---|")
    for config in configs:
        use(*config)
        g = torch.Generator(device="cuda").manual_seed(0)
        for mode in modes:
            argsets = [[c[k] for k in bench.KEYS]
                       for c in (bench.make_inputs(g, 64, 151936, dtype, mode) for _ in range(2))]
            op = bench.fused_op(mode)
            ms = bench.graph_ms(op, argsets)
            parts = ", ".join(f"{k} {v:.1f}" for k, v in bench.breakdown(op, argsets, rounds=2))
            print(f"| {':'.join(map(str, config))} | {mode} | {ms * 1e3:.1f} | {parts} |",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
