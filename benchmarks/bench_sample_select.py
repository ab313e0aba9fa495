"""Time the passes of issue #25's sample select on the GPU (`simulate_sample_select.py` has the
design and its pass counts; this measures what one pass of each kind costs).

Four kernels, one program per row, each a stage of the design for one top-k or top-p cut:

1. `first_pass_kernel`: the row's max, mass S and finite count (per-element online max and
   sums, a plain version of `sampling_rule.lane_stats`), and with SAMPLE every RATE-th
   logit stored to the sample (timed both ways: the sample's own cost is the difference).
2. `estimate_kernel`: the sample sorted in SPEC.md's order (packed (key, index), `tl.sort`),
   and the bracket around the estimated cut (the estimator of the simulation: each point
   stands for the row's finite count over its points; top-p puts what the points miss of S
   at the top), and guards G times further out. Also timed: the sample read from the row
   by this kernel (runs of 8 logits, one 32-byte sector each in bf16), which would leave
   the tuned first pass as it is.
3. `bracket_kernel`: one more pass over the row: the exact count and mass above the
   bracket, and its tokens, packed, stored in a list of LIST (a block cumsum places them);
   also timed with the count and mass above both guards (what narrows a missed bracket).
4. `list_kernel`: the list sorted, and the cut from it (exact when the bracket held it).

Launch shapes: the passes 2048 logits a step (the first 4 warps, the bracket 8), the sorts
16 warps; so every variant compiles for sm_90 without spills (checked offline as
`kernel_registers.py` compiles: the bracket pass with guards 187-207 registers, the rest <= 162).

Rows of one kind, 1024 x V (64 owners x 16 rows at V = 151936: issue #25's shape), bf16 or
fp32; the floor is one read of the rows at the measured copy bandwidth, the baseline a
`torch.sort` of the rows. Each stage's median time (triton.testing.do_bench), x floor, the sum
of the stages for a cut found by its first bracket, and the fraction of rows whose bracket
held the cut (the others need another bracket pass: `simulate_sample_select.py` counts them).

    python benchmarks/bench_sample_select.py [--kinds flat power-law peaked] [--dtype bfloat16]
        [--top-p 0.9] [--top-k 0] [--rate 64] [--list 4096] [--fill 0.8]
"""

import argparse
import platform
import sys

import torch
import triton
import triton.language as tl
from triton.testing import do_bench

from dflash_et.export import cases, sampling
from dflash_et.kernels.common import key_value, sanitize, scaled_weight, weight_scale
from dflash_et.kernels.sampling_rule import pack  # (key, index) in one int64: descending is SPEC.md's order

INT64_MIN = tl.constexpr(-9223372036854775808)
INT64_MAX = tl.constexpr(9223372036854775807)


@triton.jit
def _unpack_x(packed):
    return key_value((packed >> 32).to(tl.int32))


@triton.jit
def first_pass_kernel(x_ptr, stride, vocab, temperature, stats_ptr, sample_ptr, n_sample,
                      RATE: tl.constexpr, SAMPLE: tl.constexpr, BLOCK: tl.constexpr):
    """stats_ptr[row] = (max, S, finite count) as float64; with SAMPLE, logit i (i % RATE == 0)
    to sample_ptr[row, i // RATE]."""
    row = tl.program_id(0).to(tl.int64)
    scale = weight_scale(temperature)
    m = tl.full((BLOCK,), float("-inf"), tl.float32)
    s = tl.zeros((BLOCK,), tl.float32)
    n = tl.zeros((BLOCK,), tl.int32)
    for start in range(0, vocab, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        x = sanitize(tl.load(x_ptr + row * stride + offs, mask=offs < vocab, other=float("-inf")))
        if SAMPLE:
            tl.store(sample_ptr + row * n_sample + offs // RATE, x, mask=(offs < vocab) & (offs % RATE == 0))
        new = tl.maximum(m, x)
        safe = tl.where(new > float("-inf"), new, 0.0)
        s = s * tl.exp2((m - safe) * scale) + tl.exp2((x - safe) * scale)
        m = new
        n += (x > float("-inf")).to(tl.int32)
    x_max = tl.max(m, 0)
    mass = tl.sum((s * tl.exp2((m - x_max) * scale)).to(tl.float64), 0)
    tl.store(stats_ptr + row * 3, x_max.to(tl.float64))
    tl.store(stats_ptr + row * 3 + 1, mass)
    tl.store(stats_ptr + row * 3 + 2, tl.sum(n, 0).to(tl.float64))


@triton.jit
def estimate_kernel(sample_ptr, n_sample, x_ptr, stride, vocab, stats_ptr, temperature, goal, bracket_ptr,
                    RATE: tl.constexpr, N: tl.constexpr, M: tl.constexpr, G: tl.constexpr, BY_MASS: tl.constexpr,
                    GATHER: tl.constexpr, RUN: tl.constexpr):
    """bracket_ptr[row] = (first, last, guard above, guard below): packed tokens M and G * M
    sample points either side of the estimated cut (INT64_MAX: from the top; INT64_MIN: to the
    end). goal: top_p, or top_k. GATHER: the sample read from the row here, RUN consecutive
    logits every RUN * RATE (one 32-byte sector per run in bf16), instead of the first pass's."""
    row = tl.program_id(0).to(tl.int64)
    i = tl.arange(0, N)
    if GATHER:
        index = (i // RUN) * (RUN * RATE) + i % RUN
        x = sanitize(tl.load(x_ptr + row * stride + index, mask=index < vocab, other=float("-inf")))
    else:
        index = i * RATE
        x = tl.load(sample_ptr + row * n_sample + i, mask=i < n_sample, other=float("-inf"))
    points = tl.sort(tl.where(x > float("-inf"), pack(x, index), INT64_MIN), descending=True)
    real = points != INT64_MIN
    n_pts = tl.sum(real.to(tl.int32), 0)
    x_max = tl.load(stats_ptr + row * 3).to(tl.float32)
    mass = tl.load(stats_ptr + row * 3 + 1)
    per_point = tl.load(stats_ptr + row * 3 + 2) / tl.maximum(n_pts, 1).to(tl.float64)
    if BY_MASS:
        w = tl.where(real, scaled_weight(_unpack_x(points), x_max, weight_scale(temperature)), 0.0)
        acc = tl.cumsum(w.to(tl.float64), 0) * per_point
        acc += mass - tl.sum(w.to(tl.float64), 0) * per_point  # what the points miss: at the top
        target = goal * mass
    else:
        acc = (i + 1).to(tl.float64) * per_point
        target = goal + tl.zeros((), tl.float64)
    j = tl.minimum(tl.sum((real & (acc < target)).to(tl.int32), 0), n_pts - 1)
    for k in tl.static_range(4):
        at = j + M * (2 * (k % 2) - 1) * (1 + (G - 1) * (k // 2))  # j - M, j + M, j - G M, j + G M
        edge = tl.where(k % 2 == 0, INT64_MAX, INT64_MIN)
        picked = tl.where((at >= 0) & (at < n_pts), tl.sum(tl.where(i == at, points, 0), 0), edge)
        tl.store(bracket_ptr + row * 4 + k, picked)


@triton.jit
def bracket_kernel(x_ptr, stride, vocab, temperature, stats_ptr, bracket_ptr, list_ptr, out_ptr,
                   LIST: tl.constexpr, BLOCK: tl.constexpr, GUARDS: tl.constexpr):
    """out_ptr[row] = (count above the bracket, its mass, the bracket's tokens, and with GUARDS
    count and mass above each guard) as float64; the first LIST of the bracket's tokens,
    packed, to list_ptr[row]."""
    row = tl.program_id(0).to(tl.int64)
    scale = weight_scale(temperature)
    x_max = tl.load(stats_ptr + row * 3).to(tl.float32)
    first = tl.load(bracket_ptr + row * 4)
    last = tl.load(bracket_ptr + row * 4 + 1)
    guard_hi = tl.load(bracket_ptr + row * 4 + 2)
    guard_lo = tl.load(bracket_ptr + row * 4 + 3)
    above_n = tl.zeros((BLOCK,), tl.int32)
    above_mass = tl.zeros((BLOCK,), tl.float32)
    hi_n = tl.zeros((BLOCK,), tl.int32)
    hi_mass = tl.zeros((BLOCK,), tl.float32)
    lo_n = tl.zeros((BLOCK,), tl.int32)
    lo_mass = tl.zeros((BLOCK,), tl.float32)
    count = tl.zeros((), tl.int64)
    for start in range(0, vocab, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        x = sanitize(tl.load(x_ptr + row * stride + offs, mask=offs < vocab, other=float("-inf")))
        p = pack(x, offs)
        finite = x > float("-inf")
        w = scaled_weight(x, x_max, scale)
        above = finite & (p > first)
        above_n += above.to(tl.int32)
        above_mass += tl.where(above, w, 0.0)
        if GUARDS:
            hi = finite & (p > guard_hi)
            hi_n += hi.to(tl.int32)
            hi_mass += tl.where(hi, w, 0.0)
            lo = finite & (p > guard_lo)
            lo_n += lo.to(tl.int32)
            lo_mass += tl.where(lo, w, 0.0)
        member = finite & (p <= first) & (p > last)
        take = member.to(tl.int64)
        n_take = tl.sum(take, 0)
        if n_take > 0:
            pos = count + tl.cumsum(take, 0) - take
            tl.store(list_ptr + row * LIST + pos, p, mask=member & (pos < LIST))
            count += n_take
    out = out_ptr + row * 7
    tl.store(out, tl.sum(above_n, 0).to(tl.float64))
    tl.store(out + 1, tl.sum(above_mass.to(tl.float64), 0))
    tl.store(out + 2, count.to(tl.float64))
    tl.store(out + 3, tl.sum(hi_n, 0).to(tl.float64))
    tl.store(out + 4, tl.sum(hi_mass.to(tl.float64), 0))
    tl.store(out + 5, tl.sum(lo_n, 0).to(tl.float64))
    tl.store(out + 6, tl.sum(lo_mass.to(tl.float64), 0))


@triton.jit
def list_kernel(list_ptr, stats_ptr, bracket_ptr, bracket_out_ptr, temperature, goal, cut_ptr,
                LIST: tl.constexpr, BY_MASS: tl.constexpr):
    """cut_ptr[row] = (the cut, packed; 1 if the bracket held it, else 0). It held the cut if
    it fit the list, its first token is kept and the token after it (if any) is not."""
    row = tl.program_id(0).to(tl.int64)
    above_n = tl.load(bracket_out_ptr + row * 7).to(tl.int64)
    above_mass = tl.load(bracket_out_ptr + row * 7 + 1)
    n = tl.load(bracket_out_ptr + row * 7 + 2).to(tl.int32)
    to_end = tl.load(bracket_ptr + row * 4 + 1) == INT64_MIN
    i = tl.arange(0, LIST)
    real = i < n
    packed = tl.sort(tl.load(list_ptr + row * LIST + i, mask=real, other=INT64_MIN), descending=True)
    if BY_MASS:
        x_max = tl.load(stats_ptr + row * 3).to(tl.float32)
        w = tl.where(real, scaled_weight(_unpack_x(packed), x_max, weight_scale(temperature)), 0.0).to(tl.float64)
        target = goal * tl.load(stats_ptr + row * 3 + 1)
        rank0 = (i + above_n) == 0  # (rank 0 always stays)
        kept = real & ((above_mass + tl.cumsum(w, 0) - w < target) | rank0)
        top_kept = (above_mass < target) | (above_n == 0)
        next_dropped = above_mass + tl.sum(w, 0) >= target
    else:
        kept = real & ((above_n + i).to(tl.float64) < goal)
        top_kept = above_n.to(tl.float64) < goal
        next_dropped = (above_n + n).to(tl.float64) >= goal
    n_kept = tl.sum(kept.to(tl.int32), 0)
    held = (n <= LIST) & (n > 0) & top_kept & (next_dropped | to_end)
    tl.store(cut_ptr + row * 2, tl.sum(tl.where(i == n_kept - 1, packed, 0), 0))
    tl.store(cut_ptr + row * 2 + 1, held.to(tl.int64))


def packed_tokens(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(SPEC.md's sanitized rows, each token packed as the kernels pack it: the smallest int64 for
    a non-finite one). + 0.0 merges -0.0 into 0.0 (one key, as the kernels' `sanitize`)."""
    xs = sampling.sanitize(x) + 0.0
    bits = xs.view(torch.int32)
    key = (bits ^ ((bits >> 31) & 0x7FFFFFFF)).to(torch.int64)
    index = torch.arange(x.shape[-1], dtype=torch.int64, device=x.device)
    return xs, torch.where(xs > float("-inf"), (key << 32) | (0xFFFFFFFF - index), torch.iinfo(torch.int64).min)


def reference_cut(x: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """SPEC.md's cut of each row (one of top-k or top-p), packed as the kernels pack it."""
    xs, packed = packed_tokens(x)
    order = torch.sort(packed, dim=-1, descending=True).values
    if top_k:
        return order[:, top_k - 1]
    hi = (order >> 32).to(torch.int32)
    ox = (hi ^ ((hi >> 31) & 0x7FFFFFFF)).view(torch.float32)
    e = torch.exp((ox - xs.amax(-1, keepdim=True)) / temperature).double()
    e = torch.where(order == torch.iinfo(torch.int64).min, 0.0, e)  # (the non-finite tokens, last)
    before = torch.cumsum(e, -1) - e
    kept = before < top_p * e.sum(-1, keepdim=True)
    kept[:, 0] = True
    return order.gather(-1, (kept.sum(-1, keepdim=True) - 1)).squeeze(-1)


def run(x: torch.Tensor, temperature: float, top_k: int, top_p: float, rate: int, list_size: int,
        block: int = 2048, fill: float = 0.8, guards: int = 4, run_length: int = 8) -> dict:
    """Every stage on rows x; returns the stages' launches (for timing) and the outputs of the
    variant the simulation models (the sample stored by the first pass, no guards)."""
    rows, vocab = x.shape
    dev = x.device
    n_sample = triton.cdiv(vocab, rate)
    n_pow2 = triton.next_power_of_2(n_sample)
    m = max(1, int(fill * list_size / (2 * rate)))  # half the bracket, in points: ~fill x list tokens in all
    by_mass = top_k == 0
    goal = top_p if by_mass else float(top_k)
    stats = torch.empty(rows, 3, dtype=torch.float64, device=dev)
    samples = torch.empty(rows, n_sample, dtype=torch.float32, device=dev)
    bracket = torch.empty(rows, 4, dtype=torch.int64, device=dev)
    listed = torch.empty(rows, list_size, dtype=torch.int64, device=dev)
    out = torch.empty(rows, 7, dtype=torch.float64, device=dev)
    cut = torch.empty(rows, 2, dtype=torch.int64, device=dev)
    spare = {"bracket": torch.empty_like(bracket), "out": torch.empty_like(out)}  # (the variants' outputs)

    def first(sample):
        return lambda: first_pass_kernel[(rows,)](x, x.stride(0), vocab, temperature, stats, samples, n_sample,
                                                  RATE=rate, SAMPLE=sample, BLOCK=block)

    def estimate(gather, into):
        return lambda: estimate_kernel[(rows,)](
            samples, n_sample, x, x.stride(0), vocab, stats, temperature, goal, into, RATE=rate, N=n_pow2, M=m,
            G=max(guards, 1), BY_MASS=by_mass, GATHER=gather, RUN=run_length, num_warps=16)

    def bracket_pass(with_guards, into):
        return lambda: bracket_kernel[(rows,)](x, x.stride(0), vocab, temperature, stats, bracket, listed, into,
                                               LIST=list_size, BLOCK=block, GUARDS=with_guards, num_warps=8)

    stages = {
        "first pass, no sample": first(False),
        "first pass + sample": first(True),
        "estimate (sort the sample)": estimate(False, bracket),
        f"estimate, sample read here ({run_length} in a run)": estimate(True, spare["bracket"]),
        "bracket pass": bracket_pass(False, out),
        "bracket pass + 2 guards": bracket_pass(True, spare["out"]),
        "list (sort, cut)": lambda: list_kernel[(rows,)](
            listed, stats, bracket, out, temperature, goal, cut, LIST=list_size, BY_MASS=by_mass, num_warps=16),
    }
    for name in ("first pass + sample", "estimate (sort the sample)", "bracket pass", "list (sort, cut)"):
        stages[name]()
    return {"stages": stages, "cut": cut[:, 0], "held": cut[:, 1].bool(), "stats": stats, "samples": samples,
            "bracket": bracket, "out": out, "variants": spare}


def copy_bandwidth() -> float:
    from roofline import copy_bandwidth as measured  # (benchmarks/, beside this script)

    return measured()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kinds", nargs="+", default=["flat", "power-law", "peaked"], choices=list(cases.ROW_KINDS))
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--rows", type=int, default=1024)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--top-p", type=float, default=0.9)
    ap.add_argument("--top-k", type=int, default=0, help="a top-k cut instead of top-p")
    ap.add_argument("--rate", type=int, default=64)
    ap.add_argument("--list", type=int, default=4096)
    ap.add_argument("--fill", type=float, default=0.8, help="the bracket's expected tokens, a fraction of the list")
    ap.add_argument("--device", default="cuda", help="cpu: under TRITON_INTERPRET=1 (the tests; times mean nothing)")
    args = ap.parse_args(argv)
    dtype = getattr(torch, args.dtype)
    bw = copy_bandwidth()
    floor_ms = args.rows * args.vocab * dtype.itemsize / bw * 1e3
    device = torch.cuda.get_device_name() if args.device == "cuda" else args.device
    print(f"device {device}, torch {torch.__version__}, triton {triton.__version__}, "
          f"python {platform.python_version()}")
    print(f"{args.rows} x {args.vocab} {args.dtype} rows; T {args.temperature}, "
          + (f"top-k {args.top_k}" if args.top_k else f"top-p {args.top_p}")
          + f"; a sample point per {args.rate} logits, list {args.list}; copy {bw / 1e9:.0f} GB/s, "
          f"floor (one read) {floor_ms * 1e3:.1f} us")
    g = torch.Generator(device=args.device).manual_seed(0)
    for kind in args.kinds:
        x = cases.kind_logits(g, kind, args.rows, args.vocab, dtype)
        got = run(x, args.temperature, args.top_k, args.top_p, args.rate, args.list, fill=args.fill)
        want = reference_cut(x, args.temperature, args.top_k, args.top_p)
        held = got["held"]
        wrong = int((held & (got["cut"] != want)).sum())
        sort_ms = do_bench(lambda: torch.sort(x, dim=-1, descending=True), warmup=10, rep=50, return_mode="median")
        print(f"\n## {kind}: bracket held the cut in {int(held.sum())}/{args.rows} rows, "
              f"{wrong} of those cuts differ from the sort's\n")
        print("| stage | median us | x floor |\n|---|---|---|")
        times = {}
        for name, launch in got["stages"].items():
            times[name] = do_bench(launch, warmup=10, rep=50, return_mode="median")
            print(f"| {name} | {times[name] * 1e3:.1f} | {times[name] / floor_ms:.2f} |")
        total = sum(times[n] for n in ("first pass + sample", "estimate (sort the sample)", "bracket pass",
                                       "list (sort, cut)"))
        print(f"| the four stages (a cut from its first bracket) | {total * 1e3:.1f} | {total / floor_ms:.2f} |")
        print(f"| baseline: torch.sort of the rows | {sort_ms * 1e3:.1f} | {sort_ms / floor_ms:.2f} |")
        print(f"\nthe four stages / torch.sort: {total / sort_ms:.3f}")
        ends = got["variants"]["bracket"]
        between = int(((ends[:, 1] < want) & (want <= ends[:, 0])).sum())
        print(f"the sample read by the estimate: the cut between its bracket's ends in {between}/{args.rows} rows")
    return 0


if __name__ == "__main__":
    sys.exit(main())
