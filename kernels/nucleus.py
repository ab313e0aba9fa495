"""A top-p row's token from a long candidate list: the nucleus by searches over the list.

`filtered.bound_and_collect` collects every token whose key reaches a bound into the row's
candidate list (up to 2 * BUF entries: int32 keys, then int32 indices). Up to BUF of them,
the decision sorts them in registers (`sampling_rule.decide_filtered`). An LLM row's
nucleus can be wider: top-p 0.9 at T = 0.8 over a Gaussian body with a few boosted tokens
reaches ~2400 tokens, and ~4 rows in 1000 collect 2000-4000 candidates at the second bound
(simulated on the benchmark's rows; a few such rows per 1024 on the H200 too). Those rows
went to the slow path (key searches with passes over the row from HBM by one program,
which the whole launch waited for). Here the list is
read once into registers (no sort) and SPEC.md's top-p rule runs as searches whose every
step is PIVOTS masked sums over the list.

Top-p alone (top-k off; S = the row's mass): the list holds every token with key >= its
lowest key, a prefix of SPEC.md's order. When its mass reaches the target top_p * S,
the kept set K lies inside it:

1. cut = the largest key c with mass(key >= c) >= target, so above = mass(key > cut) is
   below the target; the m-th tied token at the cut (by index) is kept iff
   above + m * e_cut < target: the first `room` ties (`sampling_rule.tie_room`).
2. When the ties outnumber the room, the kept ties are those up to the room-th tie's
   index (a search over indices for it).
3. Step 7: t = u * S_K; the largest c with mass(K, index < c) <= t is the smallest v in K
   whose inclusive index-order prefix exceeds t (c is in K with e_c > 0); if rounding
   leaves no such c below V, the largest v in K with e_v > 0.

Sums are float64 in another order than the reference's (SPEC.md's legal differences).

A top-p row whose list falls short of the target (its nucleus reaches below every lane
maximum: a wide nucleus in the Gaussian body) or overflows it gets a list of its own first
(`wide_list`): one pass counts its tokens per bin of (x_max - x) / T (`wide_bound`); the
lowest bin edge with at most 15 / 16 of LIST tokens above it is the bound, unless the bins'
largest weights show that those tokens cannot reach the target (a flat row: no second
pass); a second pass appends every token above the bound (`dense_collect.walk_collect`;
both passes in its layout: 32 bytes per thread and iteration, 3 stages). The bound is the
higher of that edge and the bracket's lo below (fewer tokens, still surely reaching the
target). `split_walk` runs both passes in chunks over many programs and calls
`wide_bound_of` on the bins they added up. On the benchmark's LLM-like rows a few in
4096 have a nucleus over 1024 tokens or more candidates than the list holds; most are
decided here, a nucleus of thousands of tokens still takes the general path, and the flat
rows pay the counting pass (benchmarks/RESULTS.md's history, session 15 onwards).

The general path gets what the same bins tell (`_cut_bracket`): keys lo <= cut <= hi from
the bins' mass bounds, a few bins apart (0.25-1.6 units of x / T on the test's rows), which
start its key searches narrow (a bfloat16 row: ~log5 of the values in the bracket instead
of 7 passes over 2^16 values; float32: the keys in it instead of 2^32), and whether the CAP
best tokens surely fall short (then no `scan_row` pass and no sorts: they cannot decide).
"""

import triton
import triton.language as tl

from .common import key_value, unsigned_key, weight
from .dense_collect import (BINS_PER_UNIT, WALK_BYTES, WALK_PAIRS, WALK_STAGES, WIDE_BINS, bin_scale, walk_collect,
                            wide_bins, without_padding)
from .sampling_rule import KEY_OFFSET, KEY_TOP, PIVOTS, key_weight, load_row, tie_room
from .scratch import UNDECIDED

MASS_AT_KEYS = tl.constexpr(0)  # the mass of the entries with key >= pivot
TIES_BELOW = tl.constexpr(1)  # the number of entries tied at the cut with index < pivot
KEPT_BELOW = tl.constexpr(2)  # the mass of the kept entries with index < pivot
WIDE_SLACK = tl.constexpr(16)  # `wide_list` leaves 1 / 16 of the list free (256 of 4096 entries): the
# pass's bins and the collect's key comparisons may round differently at a bin edge


@triton.jit
def _in_nucleus(key, index, cut, tie_end, first):
    """K: above the cut, the ties at it below tie_end, and the rank-0 token `first`."""
    return (key > cut) | ((key == cut) & (index < tie_end)) | (index == first)


@triton.jit
def _list_total(key, index, e, pivot, cut, tie_end, first, MODE: tl.constexpr):
    """One of the totals above (MODE) over the list, for a scalar pivot."""
    if MODE == MASS_AT_KEYS:
        val = tl.where(key >= pivot, e, 0.0)
    elif MODE == TIES_BELOW:
        val = tl.where((key == cut) & (index < pivot), 1.0, 0.0)
    else:
        val = tl.where(_in_nucleus(key, index, cut, tie_end, first) & (index < pivot), e, 0.0)
    return tl.sum(val.to(tl.float64), 0)


@triton.jit
def _list_largest(key, index, e, lo, hi, target, cut, tie_end, first, MODE: tl.constexpr):
    """The largest c in [lo, hi] whose total (MODE) is >= target (MASS_AT_KEYS, falling in
    c) or <= target (the others, rising in c), given that lo's is: PIVOTS pivots per step."""
    while hi > lo:
        new_lo = lo
        new_hi = hi
        for p in tl.static_range(PIVOTS):
            pivot = lo + ((hi - lo) * (p + 1) + PIVOTS) // (PIVOTS + 1)  # in (lo, hi], ascending
            total = _list_total(key, index, e, pivot, cut, tie_end, first, MODE)
            if MODE == MASS_AT_KEYS:
                ok = total >= target
            else:
                ok = total <= target
            new_lo = tl.where(ok, tl.maximum(new_lo, pivot), new_lo)
            new_hi = tl.where(ok, new_hi, tl.minimum(new_hi, pivot - 1))
        lo = new_lo
        hi = new_hi
    return lo


@triton.jit
def nucleus_token(key_ptr, index_ptr, count, x_max, temperature, top_p, mass, u, first, vocab,
                  LIST: tl.constexpr):
    """The token of a top-p-alone row with mass S = `mass` and rank-0 token `first`, from
    its `count` (<= LIST) candidates (int32 `ordered_key`s at key_ptr, int32 indices at
    index_ptr): every token with key >= the lowest of them (`filtered.collect`). UNDECIDED
    when their mass falls short of top_p * S: the row's general path decides then."""
    i = tl.arange(0, LIST)
    live = i < count
    tl.debug_barrier()  # (after a collect by this program: written by other threads)
    key = tl.load(key_ptr + i, mask=live, other=-2147483648)  # past count: below every finite key
    index = tl.load(index_ptr + i, mask=live, other=-1)
    e = tl.where(live, weight(key_value(key), x_max, temperature), 0.0)
    target = top_p.to(tl.float64) * mass
    token = tl.zeros((), dtype=tl.int64) + UNDECIDED
    if tl.sum(e.to(tl.float64), 0) >= target:
        zero = tl.zeros((), dtype=tl.int64)
        lo = tl.min(tl.where(live, key, 2147483647), 0).to(tl.int64)
        cut = _list_largest(key, index, e, lo, tl.max(key, 0).to(tl.int64), target, zero, zero, zero, MASS_AT_KEYS)
        above = tl.sum(tl.where(key > cut, e, 0.0).to(tl.float64), 0)
        room = tie_room(target, above, key_weight(cut + KEY_OFFSET, x_max, temperature), vocab)
        tie_end = zero + vocab
        if room < tl.sum((key == cut).to(tl.int64), 0):  # the room-th tie's index bounds the kept ties
            tie_end = tl.where(room > 0, _list_largest(key, index, e, zero, zero + vocab, (room - 1).to(tl.float64),
                                                  cut, zero, zero, TIES_BELOW) + 1, 0)
        kept = _in_nucleus(key, index, cut, tie_end, first)
        t = u.to(tl.float64) * tl.sum(tl.where(kept, e, 0.0).to(tl.float64), 0)
        c = _list_largest(key, index, e, zero, zero + vocab, t, cut, tie_end, first, KEPT_BELOW)
        last = tl.max(tl.where(kept & (e > 0), index, -1), 0).to(tl.int64)
        token = tl.where(c < vocab, c, last)
    return token


@triton.jit
def _cut_bracket(acc, top, x_max, scale, mass, target, CAP: tl.constexpr):
    """What `wide_bound`'s bins tell of a top-p-alone row's cut (the largest key c with
    mass(key >= c) >= target; the row's mass S = `mass`) for the general path: unsigned keys
    (lo, hi) with lo <= cut <= hi, and whether the CAP best tokens surely fall short of the
    target (then `scan_row`'s candidates cannot decide the row). Bin j's weights lie in
    [e^(-(j+1) / 8), e^(-j / 8)] (the open bin 255: [0, e^(-255 / 8)]), so the mass of bins
    0..b lies between the sums of those bounds, tightened by S minus the other bins' (0.01 %
    margin: float32 weights and bins round far closer). The first bins that surely reach the
    target lie above the edge below them, so the cut is at least that edge's key; the last
    bins that surely fall short hold every token above the edge above them, so the cut is
    below that edge's key. Each edge is taken one bin further out (the bins' float32
    arithmetic and a key may round differently at an edge); the cut is at most x_max's key
    (for a target above 0).
    No edges where they would round by more than a bin: T = +inf (one bin) or bins narrower
    than 2^-16 of |x_max| (`top`: bin b's largest weight, as `wide_bound` has it)."""
    b = tl.arange(0, WIDE_BINS)
    n = acc.to(tl.float64)
    most = n * top  # bin b's mass at most
    least = n * tl.where(b < WIDE_BINS - 1, tl.exp(-(b + 1).to(tl.float32) / BINS_PER_UNIT).to(tl.float64), 0.0)
    above_most = tl.cumsum(most, 0)  # bins 0..b
    above_least = tl.cumsum(least, 0)
    upper = tl.minimum(above_most, mass - (tl.sum(least, 0) - above_least))
    lower = tl.maximum(above_least, mass - (tl.sum(most, 0) - above_most))
    first = tl.min(tl.where(lower >= target * 1.0001, b, WIDE_BINS), 0)  # bins 0..first surely reach the target
    last = tl.max(tl.where(upper * 1.0001 < target, b, -1), 0)  # bins 0..last surely fall short of it
    useful = (scale > 0) & (tl.abs(x_max) * scale <= 65536.0)
    lo = tl.where(useful & (first < WIDE_BINS), unsigned_key(x_max - (first + 2).to(tl.float32) / scale), -1)
    hi = tl.where(useful & (last >= 0), unsigned_key(x_max - (last - 1).to(tl.float32) / scale) - 1, KEY_TOP)
    hi = tl.where(target > 0, tl.minimum(hi, unsigned_key(x_max)), hi)  # (target <= 0: every key's mass reaches it)
    before = (tl.cumsum(acc, 0) - acc).to(tl.int64)  # tokens in the bins above bin b
    best = tl.minimum(acc.to(tl.int64), tl.maximum(CAP - before, 0))  # bin b's share of the CAP best tokens
    cap_short = tl.sum(best.to(tl.float64) * top, 0) * 1.0001 < target
    return lo, hi, cap_short


@triton.jit
def wide_bound(row_ptr, vocab, x_max, temperature, room, mass, target, CAP: tl.constexpr):
    """One pass: the row's counts per `dense_collect.wide_bins` bin of (x_max - x) / T, then
    `wide_bound_of` them."""
    scale = bin_scale(temperature)
    acc = tl.zeros((WIDE_BINS,), dtype=tl.int32)
    WIDTH: tl.constexpr = WALK_BYTES * 8 // row_ptr.dtype.element_ty.primitive_bitwidth
    for base in tl.range(0, vocab, WALK_PAIRS * WIDTH, num_stages=WALK_STAGES):  # (`walk_collect`'s layout)
        offs = base + tl.arange(0, WALK_PAIRS)[:, None] * WIDTH + tl.arange(0, WIDTH)[None, :]
        x, fin = load_row(row_ptr, offs, vocab)
        acc += wide_bins(x, fin, x_max, scale)
    return wide_bound_of(without_padding(acc, 0, vocab, WIDTH), x_max, scale, room, mass, target, CAP)


@triton.jit
def wide_bound_of(acc, x_max, scale, room, mass, target, CAP: tl.constexpr):
    """From a row's counts per bin (`wide_bound`'s pass, or `split_walk`'s chunks added up):
    the unsigned key of the lowest bin edge x_max - b * T / BINS_PER_UNIT (b >= 1) with at
    most `room` finite tokens at or above it; -1 when the first bin holds more (T = +inf:
    every finite token in it), or when those tokens cannot reach `target` (the mass at the
    row max: bin j's weights are at most e^(-j / BINS_PER_UNIT), 0.1 % margin): a flat
    row's nucleus, wider than the list, costs no collect. The bound is raised to
    `_cut_bracket`'s lo of the same bins where that is higher (a shorter list)."""
    b = tl.arange(0, WIDE_BINS)
    fits = (tl.cumsum(acc, 0) <= room) & (b < WIDE_BINS - 1)  # bins 0..b hold at most room tokens
    last = tl.max(tl.where(fits, b, -1), 0)
    top = tl.exp(-b.to(tl.float32) / BINS_PER_UNIT).to(tl.float64)  # the largest weight in bin b
    reach = tl.sum(tl.where(b <= last, acc.to(tl.float64) * top, 0.0), 0) * 1.001 >= target
    edge = x_max - (last + 1).to(tl.float32) / scale
    lo, hi, cap_short = _cut_bracket(acc, top, x_max, scale, mass, target, CAP)
    # (lo <= the cut: where it is above that edge, its fewer tokens surely reach the target; on
    # the H200 a bound at the edge alone gave ~3400-token lists where the nucleus had fewer)
    return tl.where((last >= 0) & reach, tl.maximum(unsigned_key(edge), lo), -1), lo, hi, cap_short


@triton.jit
def wide_list(row_ptr, vocab, x_max, temperature, mass, target, key_ptr, index_ptr, LIST: tl.constexpr,
              CAP: tl.constexpr):
    """A top-p row's own list (see the module docstring) for the mass `target` (of the row's
    `mass`): its length, or -1 without one (no bound that can reach the target, or more
    tokens above it than LIST); and `_cut_bracket`'s (lo, hi, CAP best fall short) for the
    general path."""
    theta, lo, hi, cap_short = wide_bound(row_ptr, vocab, x_max, temperature, LIST - LIST // WIDE_SLACK, mass, target,
                                          CAP)
    # The bound through memory (the list's first word, before the walk fills it): it picks the
    # walk's slots, and a helper's result would count as a write to the row for torch's
    # mutation analysis (the package docstring).
    theta_ptr = key_ptr.to(tl.pointer_type(tl.int64))
    tl.store(theta_ptr, theta)
    tl.debug_barrier()
    theta = tl.load(theta_ptr)
    tl.debug_barrier()  # every thread has it before the walk overwrites the word
    count = tl.zeros((), dtype=tl.int64) - 1
    if theta >= 0:
        count = walk_collect(row_ptr, 0, vocab, theta, key_ptr, index_ptr, LIST)
    return tl.where(count <= LIST, count, -1), lo, hi, cap_short
