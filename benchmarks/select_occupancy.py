"""Does the sample select run faster with more of its rows side by side on an SM? Its begin and
rounds launches (`kernels/verify.py`, `verify_filtered_kernel`: one 8-warp program at ~240-255
registers, so one program an SM, `verify.GROUP` rows a program in turn) are latency-bound by the
SASS (benchmarks/HISTORY.md, session 52): capped at 128 registers they spill little and two
programs share an SM. This times `dflash_verify` under launch variants of those two launches, in one
run against the floor, each variant in a process of its own (its kernels compiled for it):

- `base`: as the heads launch them;
- `rN`: `maxnreg=N` on the begin and rounds launches (N = 128: 2 programs an SM at 8 warps; 80: 3;
  64: 4; ptxas spills what does not fit);
- `gN`: N rows a program (`verify.GROUP`; 1: a program a row, more programs, more waves). At
  GROUP 8, 1024 rows make 128 programs, under one an SM: `rN` and `w4` share an SM between two
  programs only with `g4` or less;
- `w4`: 4 warps; combined with `-`, e.g. `g1-r80`.

The variants patch the launcher in their process (`wrap_triton` of `verify_filtered_kernel`); the
kernels' code is the package's. Cases: row kind x mode of `export/cases.py` at 64 owners x 16 rows,
V = 151936, bf16, and mixed batches ("mixed N": the first N owners T 1 with top-p 0.95, the rest
greedy). A variant that wins is a launch option to carry into the heads, which AOTInductor must
keep: `num_warps` (`w4`) it does. `maxnreg` (`rN`), by torch 2.13's source, it would not: Inductor
writes a user kernel's launch configs through `config_to_dict` (`define_user_defined_triton_kernel`
in `_inductor/codegen/wrapper.py`), which keeps their kwargs, num_warps and num_stages only, and
`maxnreg` is not among the launch options `wrap_triton` moves into a config (not run: an `rN` win
needs that path made to work first).

    python benchmarks/select_occupancy.py [--variants base,r128,g1-r80] [--quick]
    (scripts/gpu-checks.sh occupancy)
"""

import argparse
import os
import platform
import subprocess
import sys

CASES = (("flat", "top-p 0.9"), ("power-law", "top-p 0.95"), ("peaked", "top-p 0.9"),
         ("equal", "top-k 40 + top-p 0.9"), ("nan/-inf", "top-k 1000 + top-p 0.95"), ("flat", "top-k 1000"),
         ("peaked", "temperature 1.0"), ("peaked", "greedy"), ("flat", "mixed 1"), ("flat", "mixed 8"))
QUICK = (("flat", "top-p 0.9"), ("nan/-inf", "top-k 1000 + top-p 0.95"), ("peaked", "temperature 1.0"),
         ("flat", "mixed 8"))
VARIANTS = "base,g4,g4-r128,g4-w4,g1-r80"  # (g4: 256 programs for 1024 rows, room for 2 an SM)
COPIES = 4  # rotating inputs per case (311 MB each at bf16)


def launch_options(variant: str) -> tuple[int | None, dict]:
    """(rows a program or None, launch options of the begin and rounds launches) of a variant name."""
    group, options = None, {}
    for part in variant.split("-"):
        if part == "base":
            continue
        if part[:1] == "g" and part[1:].isdigit() and int(part[1:]) > 0:
            group = int(part[1:])
        elif part[:1] == "r" and part[1:].isdigit() and 24 <= int(part[1:]) <= 255:
            options["maxnreg"] = int(part[1:])
        elif part == "w4":
            options["num_warps"] = 4
        else:
            raise ValueError(f"select_occupancy.py: variant part {part!r} of {variant!r}: use base, gN (N >= 1 rows "
                             "a program), rN (maxnreg 24-255) or w4, joined by '-'")
    return group, options


def patch_launches(verify, group: int | None, options: dict) -> None:
    """`verify`'s begin and rounds launches of `verify_filtered_kernel` with `options`; GROUP rows a
    program (before the kernel's first compile: the kernel reads the module's GROUP)."""
    import triton.language as tl
    from bench_verify import launcher_with

    from dflash_et.kernels.cut_select import SELECT_BEGIN, SELECT_ROUNDS

    if group is not None:
        verify.GROUP = tl.constexpr(group)
    stages = (SELECT_BEGIN.value, SELECT_ROUNDS.value)

    def edit(kernel, kwargs):
        if kernel is verify.verify_filtered_kernel and kwargs.get("STAGE") in stages:
            return {**kwargs, **options}
        return kwargs

    verify.wrap_triton = launcher_with(verify.wrap_triton, edit)


def time_variant(variant: str, cases) -> None:
    """One variant's line per case (us, x floor), printed as it goes."""
    import torch

    import bench_verify as bv
    from dflash_et.export import cases as row_cases
    from dflash_et.kernels import verify
    from roofline import copy_bandwidth

    patch_launches(verify, *launch_options(variant))
    owners, vocab = bv.KINDS_SHAPE
    rows = owners * bv.ROWS_PER_OWNER
    modes = row_cases.kind_modes(vocab)
    g = torch.Generator(device=bv.DEVICE).manual_seed(52)
    floor_ms = rows * vocab * 2 / copy_bandwidth() * 1e3
    for kind, mode in cases:
        argsets = []
        for _ in range(COPIES):
            x = row_cases.kind_logits(g, kind, rows, vocab, torch.bfloat16)
            if mode.startswith("mixed "):
                c = bv.mixed(bv.verify_inputs(g, x, owners, modes["greedy"]), int(mode.split()[1]))
            else:
                c = bv.verify_inputs(g, x, owners, modes[mode])
            argsets.append([c[k] for k in bv.KEYS])
        ms = bv.graph_ms(torch.ops.dflash.dflash_verify, argsets)
        print(f"| {variant} | {kind} | {mode} | {ms * 1e3:.1f} | {ms / floor_ms:.2f} |", flush=True)
        del argsets


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", default=VARIANTS, help=f"comma-separated (default {VARIANTS})")
    ap.add_argument("--quick", action="store_true", help="four cases: " + "; ".join(" ".join(c) for c in QUICK))
    ap.add_argument("--one", metavar="VARIANT", help=argparse.SUPPRESS)  # (a variant's own process)
    ap.add_argument("--timeout", type=int, default=240, help="seconds a variant's process may take")
    args = ap.parse_args(argv)
    cases = QUICK if args.quick else CASES
    if args.one:
        time_variant(args.one, cases)
        return 0
    variants = args.variants.split(",")
    for v in variants:
        launch_options(v)  # (a bad name fails before any GPU work)
    import torch
    import triton

    print(f"device: {torch.cuda.get_device_name()}; torch {torch.__version__}, triton {triton.__version__}, "
          f"python {platform.python_version()}")
    print("dflash_verify, 64 owners x 16 rows, V = 151936, bfloat16, graph-captured; x floor: the logits' bytes "
          "over the copy bandwidth measured in each variant's process\n")
    print("| variant | kind | mode | us | x floor |\n|---|---|---|---|---|", flush=True)
    failed = 0
    for v in variants:
        cmd = [sys.executable, os.path.abspath(__file__), "--one", v] + (["--quick"] if args.quick else [])
        try:
            failed += subprocess.run(cmd, timeout=args.timeout).returncode != 0
        except subprocess.TimeoutExpired:
            print(f"| {v} | (timed out after {args.timeout} s) | | | |", flush=True)
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    sys.exit(main())
