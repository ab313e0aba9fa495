"""Benchmark `dflash::cached_attention` (issue #26) on a CUDA GPU (not a test).

A verify step's attention at Qwen3-like heads: `owners` owners x `rows` verify rows each (the
rows of owner o at the last positions of its length L_o), every row seeing cells
[0, position + 1) of its owner's slot, for several `max_seq_len` (the slots' size); the same
with 15 rows an owner (owners near their last tokens: runs that straddle the kernel's tiles
of 16 rows) and with one row an owner (a decoding step: target-only decoding, a tile of 16
one-row runs). Two series of lengths: fixed ones drawn from [128, 2048] (the same at every
max_seq_len: the time must stay flat in it), and ones drawn from [128, max_seq_len].

Prints device, versions, shapes, the median time (triton's do_bench), the floor (each owner's
cells read once: sum(L_o) x KV x D x 2 (K and V) x itemsize, at the device-to-device copy
bandwidth measured in the same run) and the ratio to it; the same op with twice the programs
for the pieces (`WAVES` 2), with every run whole (one program a tile and KV head: `SPLIT_CELLS`
out of reach), with a pipeline of 2 stages instead of `STAGES` (3: less shared memory, 3
programs an H100 SM instead of 2) and under each `--variant` (the module's constants set, e.g.
"WAVES=4 SPLIT_CELLS=2048") against the same floor; the op's
largest error on two owners against float64; and, with --reference, the models' reference
(gather of every row's whole slot + masked SDPA) where its gather fits in memory. Not by
default: on the H200 the op timed right after the reference came out well above its other
runs, suspected the reference's after-effect, not confirmed (benchmarks/HISTORY.md, session
58); the reference is known to be ~40x the op.

    python benchmarks/bench_attention.py [--owners 64 --rows 16 15 1 --heads 16 --kv-heads 8
        --head-dim 128 --max-seq-len 2048 8192 32768 --dtype bfloat16] [--variant "WAVES=4" ...]
        [--reference] [--out attention.md]
    python benchmarks/bench_attention.py --smoke   (CPU, under TRITON_INTERPRET=1: tiny sizes,
        checks the script and the op against the reference; no timings)
"""

import argparse
import contextlib
import os
import platform
import sys

import torch

from dflash_et import kernels  # noqa: F401  (registers torch.ops.dflash)
from dflash_et.kernels import cached_attention as ca
from roofline import copy_bandwidth  # (benchmarks/, beside this script)

REFERENCE_BYTES = 24 << 30  # the reference's gathered K and V together, at most


def step_case(g, owners, rows, heads, kv_heads, dim, cells, lengths, dtype, device):
    """(q, k_cache, v_cache, slot, lo, hi) of one verify step: owner o in slot o, its rows at
    positions L_o - rows .. L_o - 1."""
    k = torch.randn(owners, cells, kv_heads, dim, generator=g, device=device).to(dtype)
    v = torch.randn(owners, cells, kv_heads, dim, generator=g, device=device).to(dtype)
    q = torch.randn(owners * rows, heads, dim, generator=g, device=device).to(dtype)
    slot = torch.arange(owners, device=device).repeat_interleave(rows)
    position = (lengths.to(device)[:, None] - rows + torch.arange(rows, device=device)[None, :]).reshape(-1)
    return q, k, v, slot, torch.zeros_like(position), position + 1


@contextlib.contextmanager
def patched(**values):
    """`cached_attention`'s module globals set to `values` inside the block (the launcher reads
    them at each call), restored after."""
    saved = {name: getattr(ca, name) for name in values}
    for name, value in values.items():
        setattr(ca, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(ca, name, value)


def variant(text: str) -> dict:
    """--variant's "NAME=INT NAME=INT ...": `cached_attention` constants to set."""
    values = {}
    for word in text.split():
        name, _, value = word.partition("=")
        if not hasattr(ca, name) or not value.lstrip("-").isdigit():
            raise argparse.ArgumentTypeError(f"--variant {text!r}: {word!r} is not NAME=INT with NAME one of "
                                             "cached_attention's constants (e.g. WAVES=4)")
        values[name] = int(value)
    return values


def check_owners(case, lengths, rows) -> float:
    """The op's largest error, relative to the largest output, on the shortest and the longest
    owner's rows against float64 attention over their cells (the reference's gather does not
    fit at long max_seq_len); fails past bfloat16's bound (8 x its eps)."""
    q, k, v, slot, lo, hi = case
    out = torch.ops.dflash.cached_attention(*case).double()
    worst = 0.0
    group = q.shape[1] // k.shape[2]
    for o in {int(lengths.argmin()), int(lengths.argmax())}:
        at = slice(o * rows, (o + 1) * rows)
        n = int(lengths[o])
        kk = k[o, :n].double().repeat_interleave(group, dim=1)  # [n, H, D]
        vv = v[o, :n].double().repeat_interleave(group, dim=1)
        s = torch.einsum("rhd,nhd->rhn", q[at].double(), kk) * q.shape[2] ** -0.5
        cell = torch.arange(n, device=q.device)
        s = s.masked_fill(~((cell >= lo[at, None]) & (cell < hi[at, None]))[:, None, :], float("-inf"))
        want = torch.einsum("rhn,nhd->rhd", torch.softmax(s, dim=-1), vv).reshape(rows, -1)
        worst = max(worst, float((out[at] - want).abs().max() / want.abs().max()))
    assert worst <= 8 * torch.finfo(torch.bfloat16).eps, f"cached_attention differs from float64 by {worst:.2e}"
    return worst


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--owners", type=int, default=64)
    ap.add_argument("--rows", type=int, nargs="+", default=[16, 15, 1], help="verify rows per owner (a series each)")
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--max-seq-len", type=int, nargs="+", default=[2048, 8192, 32768])
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--variant", type=variant, action="append", default=[],
                    help='cached_attention constants to set, timed as a column of their own: "WAVES=4 ..."')
    ap.add_argument("--reference", action="store_true", help="also time the models' reference where it fits")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU (TRITON_INTERPRET=1), no timings")
    ap.add_argument("--out", help="also write the table here")
    args = ap.parse_args(argv)
    dtype = getattr(torch, args.dtype)
    if args.smoke:
        if os.environ.get("TRITON_INTERPRET") != "1":
            ap.error("--smoke runs the kernel in Triton's interpreter: set TRITON_INTERPRET=1")
        args.owners, args.rows, args.heads, args.kv_heads, args.head_dim = 3, [4, 1], 4, 2, 16
        args.max_seq_len, device = [48, 96], "cpu"
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
        import interpreter_dot  # (the interpreter multiplies bfloat16 tiles' bits: tests/interpreter_dot.py)

        interpreter_dot.install()
    elif not torch.cuda.is_available():
        ap.error("needs a CUDA GPU (or --smoke)")
    else:
        device = "cuda"
    itemsize = torch.tensor([], dtype=dtype).element_size()
    bandwidth = None if args.smoke else copy_bandwidth()
    lines = []
    if not args.smoke:
        import triton

        lines += [f"device {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}, "
                  f"python {platform.python_version()}, copy bandwidth {bandwidth / 1e9:.0f} GB/s",
                  f"{args.owners} owners, {args.heads} heads / {args.kv_heads} KV heads x {args.head_dim}, "
                  f"{args.dtype}", "",
                  "| rows an owner | lengths | max_seq_len | pieces programs | sum L_o | op us | floor us | "
                  "x floor | twice the programs us | x floor | runs whole us | x floor | 2 stages us | x floor | "
                  + "".join(f"{' '.join(f'{k}={v}' for k, v in values.items())} us | x floor | "
                            for values in args.variant)
                  + "max error | reference us | x op |",
                  "|---" * (17 + 2 * len(args.variant)) + "|"]
    g = torch.Generator(device=device).manual_seed(0)
    short = max(*args.rows, 128 if not args.smoke else 8)
    fixed = torch.randint(short, 2048 if not args.smoke else 40, (args.owners,), generator=g, device=device)
    for rows, cells in ((rows, cells) for rows in args.rows for cells in args.max_seq_len):
        for series, lengths in (("fixed", torch.clamp(fixed, max=cells)),
                                ("to the limit", torch.randint(short, cells + 1, (args.owners,), generator=g,
                                                               device=device))):
            case = step_case(g, args.owners, rows, args.heads, args.kv_heads, args.head_dim, cells, lengths,
                             dtype, device)
            op = lambda: torch.ops.dflash.cached_attention(*case)  # noqa: E731
            pieces = (ca.pieces_programs(torch.device(device), args.kv_heads) * args.kv_heads if ca.in_pieces(cells)
                      else "- (whole runs)")
            gathered = 2 * args.owners * rows * cells * args.kv_heads * args.head_dim * itemsize
            if args.smoke:
                for values in [dict(WAVES=2 * ca.WAVES), dict(STAGES=2), *args.variant]:
                    with patched(**values):
                        torch.testing.assert_close(op().float(), ca.reference(*case).float(), rtol=2e-2, atol=2e-2)
                torch.testing.assert_close(op().float(), ca.reference(*case).float(), rtol=2e-2, atol=2e-2)
                err = check_owners(case, lengths, rows)
                print(f"smoke {rows} rows an owner, {series}, max_seq_len {cells}: the op matches the reference "
                      f"(float64: {err:.1e})")
                continue
            from triton.testing import do_bench

            err = check_owners(case, lengths, rows)
            floor_ms = int(lengths.sum()) * args.kv_heads * args.head_dim * 2 * itemsize / bandwidth * 1e3
            op_ms = do_bench(op, warmup=25, rep=200, return_mode="median")
            twice = "- | -"  # (whole runs: no pieces)
            if ca.in_pieces(cells):
                with patched(WAVES=2 * ca.WAVES):
                    twice_ms = do_bench(op, warmup=25, rep=200, return_mode="median")
                twice = f"{twice_ms * 1e3:.1f} | {twice_ms / floor_ms:.2f}"
            with patched(SPLIT_CELLS=1 << 40):  # every run whole, one program a tile and KV head
                whole_ms = do_bench(op, warmup=25, rep=200, return_mode="median")
            with patched(STAGES=2):
                stages_ms = do_bench(op, warmup=25, rep=200, return_mode="median")
            variants = ""
            for values in args.variant:
                with patched(**values):
                    err = max(err, check_owners(case, lengths, rows))
                    ms = do_bench(op, warmup=25, rep=200, return_mode="median")
                variants += f"{ms * 1e3:.1f} | {ms / floor_ms:.2f} | "
            ref_ms = (do_bench(lambda: ca.reference(*case), warmup=5, rep=50, return_mode="median")
                      if args.reference and gathered <= REFERENCE_BYTES else None)
            ref = (f"{ref_ms * 1e3:.0f} | {ref_ms / op_ms:.1f}" if ref_ms is not None
                   else "- (gather too large) | -" if args.reference else "- | -")
            lines.append(f"| {rows} | {series} | {cells} | {pieces} | {int(lengths.sum())} | "
                         f"{op_ms * 1e3:.1f} | {floor_ms * 1e3:.1f} | {op_ms / floor_ms:.2f} | {twice} | "
                         f"{whole_ms * 1e3:.1f} | {whole_ms / floor_ms:.2f} | {stages_ms * 1e3:.1f} | "
                         f"{stages_ms / floor_ms:.2f} | {variants}{err:.1e} | {ref} |")
            del case
            torch.cuda.empty_cache()
    text = "\n".join(lines)
    print(text)
    if args.out and text:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
