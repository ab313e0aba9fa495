"""top-k / top-p rows in two launches: `filtered_pass`, then `filtered_token`.

`filtered_pass` (in the light launch: the same registers and occupancy as the greedy
and temperature-only rows) reads the row once with per-lane accumulators
(`sampling_rule.lane_stats`): max, argmax, finite count, mass S, and each lane's
maximum. The lane maxima bound the kept set from below, with no sort of the row:

- top-k (k <= lanes): the k-th largest lane maximum theta. k lanes hold a token with
  key >= theta, so the k-th best key is >= theta and every top-k token has key >= theta.
- top-p alone: the largest lane maximum theta whose lane maxima at or above it already
  weigh >= top_p * S (with a 1e-5 margin for rounding). The tokens with key >= theta are a
  prefix of SPEC.md's order weighing at least that much, so every later token has
  C(r-1) >= top_p * S: the nucleus lies inside. Two boosted tokens in one lane hide
  each other, so theta goes down to at least the 64th largest lane maximum (all of
  them where their weights never reach the target): the candidates are then a prefix
  whose exact mass the decision checks, and a prefix that falls short of the target
  goes to the general path below.

A second pass (from the row's end: its most recently read part is still in L2) appends
every finite token with key >= theta to the row's candidate buffer, at slots taken with
an atomic counter: no block-wide reduction or barrier per step, and the order of the
slots does not matter (the candidates are sorted afterwards).

`filtered_token` (a second launch, one program per filtered row) sorts the candidates in
registers (256 or BUF of them) and decides there (`sampling_rule.decide_filtered`).
Rows with no bound (top-k > lanes, a top-p nucleus the lane maxima cannot reach:
flat rows) or more than BUF candidates (many ties) take the general path:
`sampling_rule.scan_row` (streaming filter with buffer shrinks), then the same
decision, with its bisection slow path where the candidates do not settle it.
"""

import triton
import triton.language as tl

from .common import key_value, ordered_key, unsigned_key, weight
from .sampling_rule import (KEY_OFFSET, filters, load_row, pack, combine_lanes, decide_filtered,
                            lane_stats, scan_row)

SMALL = tl.constexpr(256)  # candidates sorted by the small decision (else BUF)
MARGIN = tl.constexpr(1.00001)  # top-p bound: lane maxima must weigh this much more than the target
P_RANK = tl.constexpr(63)  # top-p: collect at least down to the 64th largest lane maximum
RESULTS = tl.constexpr(4)  # int64 words of a verify row's decision, after its candidates
STATS = 5  # int64 words of a filtered row's stats, after those: count, x_max, arg, finite, mass


@triton.jit
def stats_of(work, BUF: tl.constexpr):
    """A filtered row's stats in its scratch row: after BUF candidates and RESULTS."""
    return work + BUF + RESULTS


@triton.jit
def threshold(lane_max, x_max, temperature, mass, top_k, top_p, use_k, use_p):
    """The unsigned key bound of the module docstring, or -1 where the lane maxima give none."""
    LANES: tl.constexpr = lane_max.shape[0]
    r = tl.arange(0, LANES)
    s = tl.sort(tl.where(lane_max > float("-inf"), unsigned_key(lane_max), -1), 0, descending=True)
    theta = tl.zeros((), dtype=tl.int64) - 1
    if use_k:
        theta = tl.sum(tl.where(r == top_k - 1, s, 0), 0)  # -1 if that lane is empty
        theta = tl.where(top_k <= LANES, theta, -1)
    elif use_p:
        w = tl.where(s >= 0, weight(key_value((s - KEY_OFFSET).to(tl.int32)), x_max, temperature), 0.0)
        reach = tl.cumsum(w.to(tl.float64), 0) >= top_p.to(tl.float64) * mass * MARGIN
        first = tl.min(tl.where(reach, r, LANES), 0)
        rank = tl.minimum(tl.maximum(first, P_RANK), tl.sum((s >= 0).to(tl.int32), 0) - 1)
        theta = tl.sum(tl.where(r == rank, s, 0), 0)
    return theta


@triton.jit
def collect(row_ptr, vocab, theta, buf_ptr, count_ptr, BLOCK: tl.constexpr, BUF: tl.constexpr):
    """Append every finite token with unsigned key >= theta to buf_ptr (packed as in
    `scan_row`); returns their number (more than BUF: only BUF of them stored)."""
    tl.atomic_xchg(count_ptr, 0)
    tl.debug_barrier()  # the counter is zero before any thread appends
    bound = (theta - KEY_OFFSET).to(tl.int32)
    steps = tl.cdiv(vocab, BLOCK)
    here = tl.zeros((BLOCK,), dtype=tl.int32)
    for i in range(0, steps):
        offs = (steps - 1 - i) * BLOCK + tl.arange(0, BLOCK)
        x, fin = load_row(row_ptr, offs, vocab)
        take = fin & (ordered_key(x) >= bound)
        slot = tl.atomic_add(count_ptr + here, 1, mask=take, sem="relaxed")
        tl.store(buf_ptr + slot, pack(x, offs), mask=take & (slot < BUF))
    tl.debug_barrier()  # every append is done
    return tl.atomic_add(count_ptr, 0)


@triton.jit
def filtered_pass(row_ptr, vocab, temperature, top_k, top_p, buf_ptr, stats_ptr, BLOCK: tl.constexpr,
                  STAGES: tl.constexpr, BUF: tl.constexpr):
    """The HBM work of a filtered row: stats, bound, candidates. Stores (count or -1 without a
    bound, x_max, arg, finite, mass) at stats_ptr for `filtered_token`."""
    use_k, use_p = filters(top_k, top_p, vocab)
    lane_max, lane_step, lane_finite, lane_mass, lane_below = lane_stats(
        row_ptr, vocab, temperature, -1, True, BLOCK, STAGES, 0, True)
    x_max, arg, finite, mass, _ = combine_lanes(row_ptr, lane_max, lane_step, lane_finite, lane_mass, lane_below,
                                                vocab, temperature, True)
    theta = threshold(lane_max, x_max, temperature, mass, top_k, top_p, use_k, use_p)
    count = tl.zeros((), dtype=tl.int64) - 1
    if (theta >= 0) & (finite > 0):
        count = collect(row_ptr, vocab, theta, buf_ptr, stats_ptr, BLOCK, BUF)
    tl.store(stats_ptr, count)
    tl.store(stats_ptr + 1, x_max.to(tl.int32, bitcast=True).to(tl.int64))
    tl.store(stats_ptr + 2, arg.to(tl.int64))
    tl.store(stats_ptr + 3, finite.to(tl.int64))
    tl.store(stats_ptr + 4, mass.to(tl.int64, bitcast=True))


@triton.jit
def filtered_token(row_ptr, vocab, temperature, top_k, top_p, u, buf_ptr, stats_ptr,
                   BLOCK: tl.constexpr, CAP: tl.constexpr, BUF: tl.constexpr, STAGES: tl.constexpr):
    """The token of a filtered row (-1 without a finite logit) from `filtered_pass`'s results."""
    use_k, use_p = filters(top_k, top_p, vocab)
    count = tl.load(stats_ptr)
    x_max = tl.load(stats_ptr + 1).to(tl.int32).to(tl.float32, bitcast=True)
    arg = tl.load(stats_ptr + 2)
    finite = tl.load(stats_ptr + 3)
    mass = tl.load(stats_ptr + 4).to(tl.float64, bitcast=True)
    k = tl.where(use_k, top_k, vocab).to(tl.int64)
    want = tl.minimum(k, CAP)
    token = tl.zeros((), dtype=tl.int64) - 1
    if finite > 0:
        token = tl.zeros((), dtype=tl.int64) - 4  # not decided yet
        if (count >= 0) & (count <= SMALL):
            token = decide_filtered(row_ptr, vocab, temperature, top_p, u, x_max, arg, finite, mass, k, want,
                                    count, use_k, use_p, buf_ptr, BLOCK, SMALL, False)
        elif (count >= 0) & (count <= BUF):
            token = decide_filtered(row_ptr, vocab, temperature, top_p, u, x_max, arg, finite, mass, k, want,
                                    count, use_k, use_p, buf_ptr, BLOCK, BUF, False)
        if token == -4:  # no bound, too many candidates, or a top-p prefix short of the target
            _, _, _, _, _, count = scan_row(row_ptr, vocab, temperature, -1, False, want, buf_ptr,
                                            BLOCK, BUF, STAGES)
            token = decide_filtered(row_ptr, vocab, temperature, top_p, u, x_max, arg, finite, mass, k, want,
                                    count, use_k, use_p, buf_ptr, BLOCK, BUF, True)
    return token
