"""The sampling rule of SPEC.md for one row, as `@triton.jit` functions.

Reference: `export/sampling.py`. Token ids are identical except SPEC.md's legal
differences (float32 `exp` ulps, float64 summation order).

One row, one program. The row is read from HBM once (`scan_row`): max, argmax,
finite count, and for sampling rows the mass S and the prefix mass below the
draft with an online max (each weight is rescaled at most a few float32 ulps
from SPEC.md's, far inside its 1e-6 band). That already decides greedy rows and
temperature-only rows ("is y == draft?" needs only S, the mass below the draft
and e_draft: one uniform, no search). The token search runs only where a token
is needed (`search_row`: one more pass, index order, early exit).

top-k / top-p rows never sort the row. A radix select on the order-preserving
32-bit keys (histogram of the top 12 bits fused into the HBM pass, then 10-bit
levels while the row is hot in L2) finds a key bucket holding the CAP best
tokens; one pass compacts those candidates (key, index) into a per-row scratch
slot, and they are sorted in registers into SPEC.md's order (logit descending,
index ascending). top-k, top-p and the inverse CDF then run on the sorted
candidates. Only when the top-p cut falls past the CAP best tokens (a flat
distribution) does the row take the slow path: a bisection over keys with one
mass pass per step, then a mass pass and a search pass under the cut rule.

A *cut rule* describes a prefix of the order: a token with unsigned key u is in
it iff u > cut, or u == cut and fewer than `room` tied tokens sit at lower
indices. cut = -1 keeps every finite token.
"""

import triton
import triton.language as tl

from .common import key_value, ordered_key, sanitize, uniform, unsigned_key, weight

BINS1 = 4096  # level 1: the top 12 key bits (sign, exponent, 3 mantissa bits)
BINS2 = 1024  # levels 2 and 3: 10 bits each
INT64_MIN = -9223372036854775808


@triton.jit
def _load_row(row_ptr, offs, vocab):
    x = sanitize(tl.load(row_ptr + offs, mask=offs < vocab, other=float("-inf")))
    return x, x > float("-inf")


@triton.jit
def scan_row(row_ptr, vocab, temperature, draft, sampling, filtered,
             BLOCK: tl.constexpr, B1: tl.constexpr):
    """The HBM pass: (max, argmax, finite count, mass S, mass below draft, level-1 histogram)."""
    x_max = tl.full((), float("-inf"), tl.float32)
    arg = tl.zeros((), dtype=tl.int32) + vocab
    finite = tl.zeros((), dtype=tl.int32)
    mass = tl.zeros((), dtype=tl.float64)
    below = tl.zeros((), dtype=tl.float64)
    hist = tl.zeros((B1,), dtype=tl.int32)
    for start in range(0, vocab, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        x, fin = _load_row(row_ptr, offs, vocab)
        finite += tl.sum(fin.to(tl.int32), 0)
        block_max = tl.max(x, 0)
        block_arg = tl.min(tl.where(x == block_max, offs, vocab), 0)
        new_max = tl.maximum(x_max, block_max)
        arg = tl.where(block_max > x_max, block_arg, arg)  # earlier blocks win ties
        if sampling:
            rescale = tl.where(new_max > float("-inf"), weight(x_max, new_max, temperature), 1.0)
            e = tl.where(fin, weight(x, new_max, temperature), 0.0).to(tl.float64)
            mass = mass * rescale.to(tl.float64) + tl.sum(e, 0)
            below = below * rescale.to(tl.float64) + tl.sum(tl.where(offs < draft, e, 0.0), 0)
            if filtered:
                hist += tl.histogram((unsigned_key(x) >> 20).to(tl.int32), B1, mask=fin)
        x_max = new_max
    return x_max, arg, finite, mass, below, hist


@triton.jit
def _pick_bucket(hist, want, B: tl.constexpr):
    """Highest bucket b with count(buckets >= b) >= want: (b, count above b, count in b)."""
    bins = tl.arange(0, B)
    total = tl.sum(hist, 0)
    at_or_above = total - (tl.cumsum(hist, 0) - hist)
    b = tl.sum((at_or_above >= want).to(tl.int32), 0) - 1
    above = tl.sum(tl.where(bins > b, hist, 0), 0)
    inside = tl.sum(tl.where(bins == b, hist, 0), 0)
    return b.to(tl.int64), above.to(tl.int64), inside.to(tl.int64)


@triton.jit
def _digit_histogram(row_ptr, vocab, prefix, prefix_shift, digit_shift,
                     BLOCK: tl.constexpr, B: tl.constexpr):
    hist = tl.zeros((B,), dtype=tl.int32)
    for start in range(0, vocab, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        x, fin = _load_row(row_ptr, offs, vocab)
        u = unsigned_key(x)
        hit = fin & ((u >> prefix_shift) == prefix)
        hist += tl.histogram(((u >> digit_shift) & (B - 1)).to(tl.int32), B, mask=hit)
    return hist


@triton.jit
def radix_select(row_ptr, vocab, want, hist1, fits,
                 BLOCK: tl.constexpr, B1: tl.constexpr, B2: tl.constexpr):
    """A cut rule keeping at least the `want` best finite tokens: the bucket-level rule
    as soon as it keeps at most `fits` tokens, else the exact rule (keeps exactly `want`).
    Returns (cut, room, tokens kept)."""
    b1, above1, in1 = _pick_bucket(hist1, want, B1)
    cut = (b1 << 20) - 1
    room = tl.zeros((), dtype=tl.int64)
    kept = above1 + in1
    if kept > fits:
        hist2 = _digit_histogram(row_ptr, vocab, b1, 20, 10, BLOCK, B2)
        b2, above2, in2 = _pick_bucket(hist2, want - above1, B2)
        prefix = (b1 << 10) | b2
        cut = (prefix << 10) - 1
        kept = above1 + above2 + in2
        if kept > fits:
            hist3 = _digit_histogram(row_ptr, vocab, prefix, 10, 0, BLOCK, B2)
            b3, above3, in3 = _pick_bucket(hist3, want - above1 - above2, B2)
            cut = (prefix << 10) | b3
            room = (want - above1 - above2 - above3).to(tl.int64)
            kept = want
    return cut, room, kept


@triton.jit
def _in_rule(u, tie_rank, cut, room):
    return (u > cut) | ((u == cut) & (tie_rank < room))


@triton.jit
def compact(row_ptr, vocab, cut, room, out_ptr, BLOCK: tl.constexpr):
    """Write (key << 32 | ~index) of every token in the rule to out_ptr; returns the count."""
    count = tl.zeros((), dtype=tl.int64)
    ties = tl.zeros((), dtype=tl.int64)
    for start in range(0, vocab, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        x, fin = _load_row(row_ptr, offs, vocab)
        u = unsigned_key(x)
        tie = (fin & (u == cut)).to(tl.int64)
        take = fin & _in_rule(u, ties + tl.cumsum(tie, 0) - tie, cut, room)
        pos = count + tl.cumsum(take.to(tl.int64), 0) - take.to(tl.int64)
        packed = (ordered_key(x).to(tl.int64) << 32) | (0xFFFFFFFF - offs.to(tl.int64))
        tl.store(out_ptr + pos, packed, mask=take)
        count += tl.sum(take.to(tl.int64), 0)
        ties += tl.sum(tie, 0)
    return count


@triton.jit
def rule_mass(row_ptr, vocab, x_max, temperature, cut_k, room_k, pivot, BLOCK: tl.constexpr):
    """Mass of the tokens in rule k whose key is above `pivot`."""
    mass = tl.zeros((), dtype=tl.float64)
    ties = tl.zeros((), dtype=tl.int64)
    for start in range(0, vocab, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        x, fin = _load_row(row_ptr, offs, vocab)
        u = unsigned_key(x)
        tie = (fin & (u == cut_k)).to(tl.int64)
        kept = fin & _in_rule(u, ties + tl.cumsum(tie, 0) - tie, cut_k, room_k) & (u > pivot)
        mass += tl.sum(tl.where(kept, weight(x, x_max, temperature), 0.0).to(tl.float64), 0)
        ties += tl.sum(tie, 0)
    return mass


@triton.jit
def search_row(row_ptr, vocab, x_max, temperature, t, cut_k, room_k, cut_p, room_p, first,
               BLOCK: tl.constexpr):
    """SPEC.md step 7 over the kept set K = rule k and (rule p or the rank-0 token `first`):
    the smallest v in K whose inclusive index-order prefix exceeds t, else the largest v
    in K with e_v > 0."""
    prefix = tl.zeros((), dtype=tl.float64)
    token = tl.zeros((), dtype=tl.int64) - 1
    last = tl.zeros((), dtype=tl.int64) - 1
    ties_k = tl.zeros((), dtype=tl.int64)
    ties_p = tl.zeros((), dtype=tl.int64)
    start = 0
    while (token < 0) & (start < vocab):
        offs = start + tl.arange(0, BLOCK)
        x, fin = _load_row(row_ptr, offs, vocab)
        u = unsigned_key(x)
        tie_k = (fin & (u == cut_k)).to(tl.int64)
        tie_p = (fin & (u == cut_p)).to(tl.int64)
        kept = fin & _in_rule(u, ties_k + tl.cumsum(tie_k, 0) - tie_k, cut_k, room_k)
        kept = kept & (_in_rule(u, ties_p + tl.cumsum(tie_p, 0) - tie_p, cut_p, room_p) | (offs == first))
        e = tl.where(kept, weight(x, x_max, temperature), 0.0).to(tl.float64)
        hit = (prefix + tl.cumsum(e, 0)) > t
        found = tl.min(tl.where(hit, offs, vocab), 0)
        token = tl.where(found < vocab, found.to(tl.int64), token)
        last = tl.maximum(last, tl.max(tl.where(e > 0, offs, -1), 0).to(tl.int64))
        prefix += tl.sum(e, 0)
        ties_k += tl.sum(tie_k, 0)
        ties_p += tl.sum(tie_p, 0)
        start += BLOCK
    return tl.where(token >= 0, token, last)


@triton.jit
def _top_p_cut(row_ptr, vocab, x_max, temperature, cut_k, room_k, target, hi,
               BLOCK: tl.constexpr):
    """Slow path of step 6: the cut rule of top-p by bisection over keys (one mass pass a
    step): the smallest key whose mass strictly above stays under the target, and how
    many tokens tied at it stay (C(r-1) = mass above + m * e_cut < target)."""
    lo = tl.zeros((), dtype=tl.int64) - 1  # mass above key -1 is S_k >= target
    while hi > lo:
        mid = (lo + hi + 1) // 2
        reach = rule_mass(row_ptr, vocab, x_max, temperature, cut_k, room_k, mid, BLOCK) >= target
        lo = tl.where(reach, mid, lo)
        hi = tl.where(reach, hi, mid - 1)
    cut = lo + 1
    above = rule_mass(row_ptr, vocab, x_max, temperature, cut_k, room_k, cut, BLOCK)
    e_cut = weight(key_value((cut - 2147483648).to(tl.int32)), x_max, temperature).to(tl.float64)
    room = tl.where(e_cut > 0, tl.math.ceil((target - above) / tl.where(e_cut > 0, e_cut, 1.0)), 0.0)
    room = tl.minimum(tl.maximum(room, 0.0), vocab * 1.0).to(tl.int64)
    return cut, room


@triton.jit
def decide(row_ptr, vocab, temperature, top_k, top_p, seed, position, draft, scratch_ptr,
           NEED_TOKEN: tl.constexpr, BLOCK: tl.constexpr, CAP: tl.constexpr,
           B1: tl.constexpr = BINS1, B2: tl.constexpr = BINS2):
    """The target's token at `position` for this row, and whether it equals `draft`.

    Returns (token, match, x_max, mass). token is -1 for a row with no finite logit
    and -2 where it was not needed (NEED_TOKEN off, temperature-only row, no match):
    `search_row` with (x_max, mass) finds it later.
    """
    sampling = temperature > 0  # NaN compares false: greedy
    use_k = (top_k > 0) & (top_k < vocab)
    use_p = top_p < 1.0  # NaN compares false: disabled
    filtered = sampling & (use_k | use_p)
    d = tl.where((draft >= 0) & (draft < vocab), draft, -1)
    x_max, arg, finite, mass, below, hist1 = scan_row(
        row_ptr, vocab, temperature, d, sampling, filtered, BLOCK, B1)
    u = uniform(seed, position)
    token = tl.where(finite > 0, arg.to(tl.int64), -1)
    match = (token == d) & (d >= 0)
    if sampling & (finite > 0):
        if filtered:
            token, match = _decide_filtered(
                row_ptr, vocab, temperature, top_k, top_p, u, d, x_max, arg, finite, mass, hist1,
                use_k, use_p, scratch_ptr, BLOCK, CAP, B1, B2)
        else:
            # Temperature only: y == d iff below_d <= t < below_d + e_d.
            x_d, _ = _load_row(row_ptr, tl.maximum(d, 0), vocab)
            e_d = tl.where((d >= 0) & (x_d > float("-inf")), weight(x_d, x_max, temperature), 0.0)
            t = u.to(tl.float64) * mass
            match = (e_d > 0) & (below <= t) & (t < below + e_d.to(tl.float64))
            token = tl.where(match, d.to(tl.int64), -2)
            if NEED_TOKEN:
                token = search_row(row_ptr, vocab, x_max, temperature, t, -1, 0, -1, 0, -1, BLOCK)
    return token, match, x_max, mass


@triton.jit
def _decide_filtered(row_ptr, vocab, temperature, top_k, top_p, u, d, x_max, arg, finite, mass_all,
                     hist1, use_k, use_p, scratch_ptr, BLOCK: tl.constexpr, CAP: tl.constexpr,
                     B1: tl.constexpr, B2: tl.constexpr):
    k = tl.where(use_k, top_k, vocab).to(tl.int64)
    n_kept_k = tl.minimum(k, finite.to(tl.int64))  # size of the top-k set
    want = tl.minimum(n_kept_k, CAP)
    cut, room, _ = radix_select(row_ptr, vocab, want, hist1, CAP, BLOCK, B1, B2)
    count = compact(row_ptr, vocab, cut, room, scratch_ptr, BLOCK)
    tl.debug_barrier()  # the candidates were written by other threads of this program

    # The candidates in SPEC.md's order: key descending, index ascending.
    rank = tl.arange(0, CAP)
    packed = tl.load(scratch_ptr + rank, mask=rank < count, other=INT64_MIN)
    packed = tl.sort(packed, descending=True)
    valid = rank < count
    key = (packed >> 32).to(tl.int32)
    index = 0xFFFFFFFF - (packed & 0xFFFFFFFF)
    e = tl.where(valid, weight(key_value(key), x_max, temperature), 0.0).to(tl.float64)

    whole_k = n_kept_k <= count  # the whole top-k set is among the candidates
    kept = valid & (rank < n_kept_k)
    e = tl.where(kept, e, 0.0)
    total_k = tl.where(whole_k, tl.sum(e, 0), mass_all)  # not whole: top-k is off, S_k = S
    target = top_p.to(tl.float64) * total_k
    before = tl.cumsum(e, 0) - e
    kept_p = kept & ((before < target) | (rank == 0))
    cut_inside = tl.sum((kept & ~kept_p).to(tl.int32), 0) > 0
    kept = tl.where(use_p, kept_p, kept)
    # Without the whole top-k set, S_k is known only when top-k is off (S_k = S).
    resolved = whole_k | (~use_k & use_p & cut_inside)

    token = tl.zeros((), dtype=tl.int64) - 1
    if resolved:
        # Step 7 on the candidates, re-sorted by index.
        total = tl.sum(tl.where(kept, e, 0.0), 0)
        t = u.to(tl.float64) * total
        by_index = tl.sort(tl.where(kept, (index << 32) | (key.to(tl.int64) & 0xFFFFFFFF), -1 ^ INT64_MIN), 0)
        live = rank < tl.sum(kept.to(tl.int32), 0)
        idx2 = by_index >> 32
        e2 = tl.where(live, weight(key_value((by_index & 0xFFFFFFFF).to(tl.int32)), x_max, temperature), 0.0)
        prefix = tl.cumsum(e2.to(tl.float64), 0)
        hit = live & (prefix > t)
        pos = tl.min(tl.where(hit, rank, CAP), 0)
        last = tl.max(tl.where(live & (e2 > 0), rank, -1), 0)
        pos = tl.where(pos < CAP, pos, last)
        token = tl.sum(tl.where(rank == pos, idx2, 0), 0)
    else:
        # Slow path: the kept set reaches past the candidates.
        cut_k = tl.zeros((), dtype=tl.int64) - 1
        room_k = tl.zeros((), dtype=tl.int64)
        if use_k:
            cut_k, room_k, _ = radix_select(row_ptr, vocab, n_kept_k, hist1, 0, BLOCK, B1, B2)
        cut_p = tl.zeros((), dtype=tl.int64) - 1
        room_p = tl.zeros((), dtype=tl.int64)
        if use_p:
            total_k = rule_mass(row_ptr, vocab, x_max, temperature, cut_k, room_k, -1, BLOCK)
            target = top_p.to(tl.float64) * total_k
            hi = tl.zeros((), dtype=tl.int64) + 0xFFFFFFFF
            cut_p, room_p = _top_p_cut(row_ptr, vocab, x_max, temperature, cut_k, room_k, target,
                                       hi, BLOCK)
        total = _rule_total(row_ptr, vocab, x_max, temperature, cut_k, room_k, cut_p, room_p,
                            arg, BLOCK)
        t = u.to(tl.float64) * total
        token = search_row(row_ptr, vocab, x_max, temperature, t, cut_k, room_k, cut_p, room_p,
                           arg, BLOCK)
    return token, (token == d) & (d >= 0)


@triton.jit
def _rule_total(row_ptr, vocab, x_max, temperature, cut_k, room_k, cut_p, room_p, first,
                BLOCK: tl.constexpr):
    """S: the mass of the kept set (rule k and (rule p or the rank-0 token))."""
    mass = tl.zeros((), dtype=tl.float64)
    ties_k = tl.zeros((), dtype=tl.int64)
    ties_p = tl.zeros((), dtype=tl.int64)
    for start in range(0, vocab, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        x, fin = _load_row(row_ptr, offs, vocab)
        u = unsigned_key(x)
        tie_k = (fin & (u == cut_k)).to(tl.int64)
        tie_p = (fin & (u == cut_p)).to(tl.int64)
        kept = fin & _in_rule(u, ties_k + tl.cumsum(tie_k, 0) - tie_k, cut_k, room_k)
        kept = kept & (_in_rule(u, ties_p + tl.cumsum(tie_p, 0) - tie_p, cut_p, room_p) | (offs == first))
        mass += tl.sum(tl.where(kept, weight(x, x_max, temperature), 0.0).to(tl.float64), 0)
        ties_k += tl.sum(tie_k, 0)
        ties_p += tl.sum(tie_p, 0)
    return mass
