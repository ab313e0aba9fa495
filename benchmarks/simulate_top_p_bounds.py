"""Simulate the top-p lane bounds of `kernels/filtered.py` on the benchmark's rows (CPU; not a test).

For each row of `bench_verify.realistic_logits`' kind (a Gaussian body of std 2 plus 24
boosted tokens; here drawn on the CPU, so not the same numbers as on the GPU), it computes
what `filtered.threshold` and `bound_and_collect` would do with the lane maxima and masses
of a pass at the given step: the first bound (the lanes' whole masses reach the target),
whether its candidates' mass falls short (a second collect at the lower bound), and how
many candidates the row ends with. Those counts pick the row's path: <= 256 the small
decision, <= 2 * BUF (4096) the sample select's first round, on the list (`cut_select.py`), more
(or a bound that takes most lanes) the select's passes over the row.

    python benchmarks/simulate_top_p_bounds.py [--rows 1024] [--step-bytes 4096 8192] [--top-p 0.9]

`dflash_verify` reads its rows at 4 KB steps (256 lanes), `sample_rows` its filtered rows at
8 KB steps (512 lanes): the numbers in `filtered.py`'s docstring came from runs like this one.
"""

import argparse
import sys

import torch

from dflash_et.kernels.filtered import MARGIN, P_RANK, SMALL

BOOSTED = 24


def rows(g, n, vocab):
    """`bench_verify.realistic_logits` on the CPU, rounded to bfloat16."""
    x = torch.randn(n, vocab, generator=g) * 2.0
    head = torch.randint(0, vocab, (n, BOOSTED), generator=g)
    x.scatter_add_(1, head, 6.0 + 8.0 * torch.rand(n, BOOSTED, generator=g))
    return x.to(torch.bfloat16).float()


def lanes(x, step):
    """Per-lane (max, mass relative to the row max) of a pass at `step` bf16 logits per step:
    lane l of step s holds the 8 logits from s * step + 8 * l (`sampling_rule.lane_stats`)."""
    n, vocab = x.shape
    steps = -(-vocab // step)
    pad = torch.full((n, steps * step), float("-inf"))
    pad[:, :vocab] = x
    grid = pad.view(n, steps, step // 8, 8)
    return grid.amax(dim=(1, 3)), grid


def simulate(x, step, temperature, top_p):
    """Per row: (nucleus size, candidates at the end, collected twice?)."""
    lane_max, grid = lanes(x, step)
    n_lanes = lane_max.shape[1]
    x_max = x.max(1, keepdim=True).values
    e = torch.exp((x - x_max) / temperature)
    mass = e.sum(1)
    lane_mass = torch.exp((grid - x_max[:, :, None, None]) / temperature).sum(dim=(1, 3))
    ranked, order = lane_max.sort(1, descending=True)
    sorted_e = torch.exp((x.sort(1, descending=True).values - x_max) / temperature)
    target = top_p * mass
    nucleus = ((sorted_e.cumsum(1) - sorted_e) < target[:, None]).sum(1)
    out = []
    for r in range(x.shape[0]):
        goal = float(target[r]) * MARGIN.value
        live = int((ranked[r] > float("-inf")).sum())
        w = torch.exp((ranked[r] - x_max[r]) / temperature).cumsum(0)
        by_rank = lane_mass[r][order[r]].cumsum(0)
        bound_rank = int((w >= goal).nonzero()[0]) if bool((w >= goal).any()) else n_lanes
        lo = int((by_rank >= goal).nonzero()[0]) if bool((by_rank >= goal).any()) else n_lanes - 1
        first = ranked[r, min(max(lo, P_RANK.value), live - 1)]
        second = ranked[r, min(max(bound_rank, P_RANK.value), live - 1)]
        taken = x[r] >= first
        again = bool(e[r][taken].sum() < target[r]) and bool(second < first)
        count = int((x[r] >= second).sum()) if again else int(taken.sum())
        out.append((int(nucleus[r]), count, again))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1024)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--step-bytes", type=int, nargs="+", default=[4096, 8192],
                    help="bytes of bf16 logits per step of the pass (4096: dflash_verify, 8192: sample_rows)")
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--top-p", type=float, default=0.9)
    ap.add_argument("--buf", type=int, default=2048, help="the register decision's BUF (the list holds 2 * BUF)")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    if args.rows < 1 or args.vocab < 16:
        raise SystemExit(f"simulate_top_p_bounds: --rows {args.rows} / --vocab {args.vocab}: need >= 1 / >= 16")
    bad = [b for b in args.step_bytes if b < 16 or b & (b - 1)]
    if bad:
        raise SystemExit(f"simulate_top_p_bounds: --step-bytes {bad}: powers of two >= 16 (16 bytes per lane)")
    if not 0.0 < args.top_p < 1.0:
        raise SystemExit(f"simulate_top_p_bounds: --top-p {args.top_p}: in (0, 1) (1 turns top-p off)")
    x = rows(torch.Generator().manual_seed(args.seed), args.rows, args.vocab)
    print(f"{args.rows} rows, V = {args.vocab}, T = {args.temperature}, top-p {args.top_p}, BUF {args.buf}")
    print("| step | lanes | nucleus p50 / p99 / max | candidates p50 / p99 / max | collected twice | "
          f"> {SMALL.value} | > BUF | > 2 BUF (no list: the select's passes) |")
    print("|---|---|---|---|---|---|---|---|")
    for nbytes in args.step_bytes:
        sim = simulate(x, nbytes // 2, args.temperature, args.top_p)
        nucleus = torch.tensor([s[0] for s in sim]).float()
        count = torch.tensor([s[1] for s in sim]).float()
        q = lambda t: " / ".join(str(int(t.quantile(p))) for p in (0.5, 0.99, 1.0))  # noqa: E731
        print(f"| {nbytes} B | {nbytes // 16} | {q(nucleus)} | {q(count)} | {sum(s[2] for s in sim)} | "
              f"{int((count > SMALL.value).sum())} | {int((count > args.buf).sum())} | "
              f"{int((count > 2 * args.buf).sum())} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
