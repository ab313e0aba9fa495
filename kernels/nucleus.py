"""A top-p row's token from a long candidate list: the nucleus by searches over the list.

`filtered.bound_and_collect` collects every token whose key reaches a bound into the row's
candidate list (up to 2 * BUF entries: int32 keys, then int32 indices). Up to BUF of them,
the decision sorts them in registers (`sampling_rule.decide_filtered`). An LLM row's
nucleus can be wider: top-p 0.9 at T = 0.8 over a Gaussian body with a few boosted tokens
reaches ~2400 tokens, and ~4 rows in 1000 collect 2000-4000 candidates at the second bound
(simulated on the benchmark's rows; on the H200, 2-6 undecided rows per 1024, counts up to
3518). Those rows went to the slow path (key searches with passes over the row from HBM
by one program: ~650 us, which the whole launch waited for). Here the list is
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
"""

import triton
import triton.language as tl

from .common import key_value, weight
from .sampling_rule import KEY_OFFSET, PIVOTS, key_weight, tie_room

MASS_AT_KEYS = tl.constexpr(0)  # the mass of the entries with key >= pivot
TIES_BELOW = tl.constexpr(1)  # the number of entries tied at the cut with index < pivot
KEPT_BELOW = tl.constexpr(2)  # the mass of the kept entries with index < pivot


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
    index_ptr): every token with key >= the lowest of them (`filtered.collect`). -4 (not
    decided) when their mass falls short of top_p * S: the row's general path decides then."""
    i = tl.arange(0, LIST)
    live = i < count
    tl.debug_barrier()  # (after a collect by this program: written by other threads)
    key = tl.load(key_ptr + i, mask=live, other=-2147483648)  # past count: below every finite key
    index = tl.load(index_ptr + i, mask=live, other=-1)
    e = tl.where(live, weight(key_value(key), x_max, temperature), 0.0)
    target = top_p.to(tl.float64) * mass
    token = tl.zeros((), dtype=tl.int64) - 4
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
