"""The sampling rule of SPEC.md for one row, as `@triton.jit` functions.

Reference: `export/sampling.py`. Token ids are identical except SPEC.md's legal
differences (float32 `exp` ulps, float64 summation order).

One streaming pass over the row from HBM (`lane_stats`, software-pipelined, per-lane
accumulators, no block-wide reduction in the loop): max, argmax, finite count, and
for sampling rows the mass S and the prefix mass below the draft, with an online max
(each weight is at most a few float32 ulps from SPEC.md's, far inside its 1e-6
band). That decides greedy and temperature-only rows (`decide_light`, or per chunk of
a row split across programs, combined by `light_token_from_chunks`): "is y ==
draft?" needs only S, the mass below the draft and e_draft (one uniform, no search).
The token search (`search_light`, one more pass over the row or one chunk, early
exit) runs only where a token is needed.

top-k / top-p rows never sort the row: `filtered.py` bounds their kept set from the
same pass's lane maxima and collects the few candidates above the bound; their
decision runs on those candidates in registers (`decide_filtered`). The general
path here serves rows that bound does not settle: `scan_row`, a streaming threshold
filter keeping every token that can still be among the row's `want` best (want =
min(top_k, CAP)) in a per-row scratch buffer of BUF packed (key, index) entries;
when it fills, it is sorted in registers, cut back to the `want` best, and the
threshold rises to the want-th key (later ties rank below it: higher index). After
the pass the buffer, sorted in SPEC.md's order (logit descending, index ascending),
starts with exactly the row's `want` best tokens. Only when the kept set reaches past
them (top-k > CAP, or a top-p cut beyond the CAP best tokens: flat rows) does the
row take the slow path (`slow_token`): searches over keys, PIVOTS keys per count or
mass pass (`_largest_true_key`, inside a key range that `nucleus._cut_bracket` may
narrow), then a mass pass and a search pass (`search_row`).

A *cut rule* describes a prefix of the order: a token with unsigned key u is in
it iff u > cut, or u == cut and fewer than `room` tied tokens sit at lower
indices. cut = -1 keeps every finite token.
"""

import triton
import triton.language as tl

from .common import (FLT_MAX, key_value, ordered_key, sanitize, scaled_weight, uniform, unsigned_key, weight,
                     weight_scale)
from .scratch import SEARCH_LATER, UNDECIDED, f32_word, f64_word, word_f32, word_f64

INT64_MIN = tl.constexpr(-9223372036854775808)
INT64_MAX = tl.constexpr(9223372036854775807)
SEARCH_PROBES = tl.constexpr(4)  # `_search_candidates`' probes per round: log5(V) rounds (8 at V = 151936)
KEY_OFFSET = tl.constexpr(2147483648)  # signed key + KEY_OFFSET = unsigned key
FLT_MAX_KEY = tl.constexpr(4286578687)  # the unsigned key of FLT_MAX (a sanitized +inf)
KEY_TOP = tl.constexpr(4294967295)  # the largest unsigned key (no upper bound on a cut)
LANE_BITS = tl.constexpr(128)  # logits bits per lane and step: the lane layout of lane_stats,
# combine_lanes and filtered.collect (one 16-byte load per lane)
PIVOTS = tl.constexpr(4)  # keys tried per pass by the slow path's search (33 bits in 15 passes)
SEARCH_STAGES = tl.constexpr(3)  # `search_light`'s chunk steps in flight
SLOW_STAGES = tl.constexpr(2)  # the slow path's passes (deeper pipelines ran slower)


@triton.jit
def load_row(row_ptr, offs, vocab):
    x = sanitize(tl.load(row_ptr + offs, mask=offs < vocab, other=float("-inf")))
    return x, x > float("-inf")


@triton.jit
def pack(x, offs):
    """(signed key << 32) | ~index: descending order is SPEC.md's order."""
    return pack_key(ordered_key(x), offs)


@triton.jit
def pack_key(key, index):
    """`pack` of an int32 `ordered_key`."""
    return (key.to(tl.int64) << 32) | (0xFFFFFFFF - index.to(tl.int64))


@triton.jit
def _shrink(buf_ptr, count, want, BUF: tl.constexpr):
    """Sort the buffer, keep its `want` best entries; returns (count, threshold key)."""
    slots = tl.arange(0, BUF)
    tl.debug_barrier()  # entries were stored by other threads
    packed = tl.sort(tl.load(buf_ptr + slots, mask=slots < count, other=INT64_MIN), descending=True)
    tl.debug_barrier()  # every thread has loaded before any overwrites
    keep = tl.minimum(count, want)
    tl.store(buf_ptr + slots, packed, mask=slots < keep)
    theta = tl.sum(tl.where(slots == keep - 1, packed >> 32, 0), 0) + KEY_OFFSET
    return keep, theta


@triton.jit
def scan_row(row_ptr, vocab, want, buf_ptr, BLOCK: tl.constexpr, BUF: tl.constexpr, STAGES: tl.constexpr):
    """The general filter of top-k / top-p rows: one HBM pass leaving the row's `want` best
    tokens (packed) in buf_ptr; returns (how many entries it holds, the row's finite count).
    (The row's max, argmax and mass come from `lane_stats`.)"""
    count = tl.zeros((), dtype=tl.int64)
    finite = tl.zeros((BLOCK,), dtype=tl.int32)  # per thread: reduced once, after the pass
    theta = tl.zeros((), dtype=tl.int64) - 1  # unsigned key threshold; -1 takes every finite token
    strict = tl.zeros((), dtype=tl.int1)  # after a shrink, ties at theta rank below the buffer
    for start in tl.range(0, vocab, BLOCK, num_stages=STAGES):
        offs = start + tl.arange(0, BLOCK)
        x = sanitize(tl.load(row_ptr + offs, mask=offs < vocab, other=float("-inf")))  # (not `load_row`: the
        fin = x > float("-inf")  # keys pick the slots, see the package docstring on the mutation analysis)
        finite += fin.to(tl.int32)
        u = unsigned_key(x)
        take = fin & ((u > theta) | ((u == theta) & ~strict))
        n_take = tl.sum(take.to(tl.int64), 0)
        if n_take > 0:
            if count + n_take > BUF:
                count, theta = _shrink(buf_ptr, count, want, BUF)
                strict = tl.full((), 1, tl.int1)
                take = fin & (u > theta)
                n_take = tl.sum(take.to(tl.int64), 0)
            pos = count + tl.cumsum(take.to(tl.int64), 0) - take.to(tl.int64)
            tl.store(buf_ptr + pos, pack(x, offs), mask=take)
            count += n_take
    return count, tl.sum(finite.to(tl.int64), 0)


@triton.jit
def _max_nan(a, b):
    """max that keeps a NaN (the same on the GPU and in the interpreter, unlike tl.maximum's default)."""
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _fold_step(raw, start, offs, draft, scale, sampling, lane_max, lane_step, lane_finite, lane_mass,
               lane_below, COUNT: tl.constexpr, BELOW: tl.constexpr, BLOCK: tl.constexpr, FAST: tl.constexpr):
    """One step of `lane_stats`: the [LANES, VEC] logits `raw` (at `offs`, step `start`)
    folded into the per-lane accumulators. The mass below the draft: a step wholly below it
    adds its whole sums; only the one step that holds the draft masks per logit.

    FAST: no per-logit NaN / +inf handling. The step's max keeps a NaN, so a NaN logit
    leaves NaN in its lane's max, and a +inf logit leaves +inf in its lane's mass (every
    other logit gives exactly what the sanitized step gives): `lane_stats` checks the lanes
    after the pass. +inf counts as FLT_MAX on the step's max: min commutes with max."""
    x = raw.to(tl.float32)
    if FAST:
        step_max = tl.minimum(tl.reduce(x, 1, _max_nan), FLT_MAX, propagate_nan=tl.PropagateNan.ALL)
    else:
        x = tl.where(x == x, x, float("-inf"))
        step_max = tl.minimum(tl.max(x, 1), FLT_MAX)
    if COUNT:
        lane_finite += tl.sum((x > float("-inf")).to(tl.int32), 1)
    lane_step = tl.where(step_max > lane_max, start, lane_step)  # earlier steps win ties
    new_max = _max_nan(lane_max, step_max)
    if sampling:
        m = tl.where(new_max > float("-inf"), new_max, 0.0)
        rescale = scaled_weight(lane_max, m, scale)
        if FAST:
            e = scaled_weight(x, m[:, None], scale)
        else:
            e = scaled_weight(tl.minimum(x, FLT_MAX), m[:, None], scale)
        step_sum = tl.sum(e, 1)
        lane_mass = lane_mass * rescale.to(tl.float64) + step_sum.to(tl.float64)
        if BELOW:
            below = tl.where(start + BLOCK <= draft, step_sum, 0.0)
            if (start < draft) & (start + BLOCK > draft):  # (uniform over the program)
                below = tl.sum(tl.where(offs < draft, e, 0.0), 1)
            lane_below = lane_below * rescale.to(tl.float64) + below.to(tl.float64)
    return new_max, lane_step, lane_finite, lane_mass, lane_below


@triton.jit
def store_prefix(prefix_ptr, lane_max, lane_mass, scale):
    """The lanes' mass so far as one (max M, mass at M) pair at prefix_ptr (two int64 words):
    the row's prefix mass up to this step, for `light_token_from_prefixes`."""
    x_max = tl.max(lane_max, 0)
    m = tl.where(x_max > float("-inf"), x_max, 0.0)
    tl.store(prefix_ptr, f32_word(x_max))
    tl.store(prefix_ptr + 1, f64_word(tl.sum(lane_mass * scaled_weight(lane_max, m, scale).to(tl.float64), 0)))


@triton.jit
def _lane_pass(row_ptr, vocab, temperature, draft, sampling, BLOCK: tl.constexpr, STAGES: tl.constexpr, lo,
               COUNT: tl.constexpr, BELOW: tl.constexpr, FAST: tl.constexpr, prefix_ptr, chunk, prefixes,
               PREFIXES: tl.constexpr):
    """`lane_stats`' pass over the row (FAST: see `_fold_step`; PREFIXES: see `lane_stats`)."""
    VEC: tl.constexpr = LANE_BITS // row_ptr.dtype.element_ty.primitive_bitwidth
    LANES: tl.constexpr = BLOCK // VEC
    lane_max = tl.full((LANES,), float("-inf"), tl.float32)
    lane_step = tl.zeros((LANES,), dtype=tl.int32) + lo
    lane_finite = tl.zeros((LANES,), dtype=tl.int32)
    lane_mass = tl.zeros((LANES,), dtype=tl.float64)
    lane_below = tl.zeros((LANES,), dtype=tl.float64)
    grid = tl.arange(0, LANES)[:, None] * VEC + tl.arange(0, VEC)[None, :]
    full = lo + (vocab - lo) // BLOCK * BLOCK
    scale = weight_scale(temperature)
    until = tl.where(prefixes & (chunk < vocab), chunk, -1)  # (PREFIXES) the next chunk end inside the row, or -1
    for start in tl.range(lo, full, BLOCK, num_stages=STAGES):  # whole steps: no mask
        raw = tl.load(row_ptr + start + grid)
        lane_max, lane_step, lane_finite, lane_mass, lane_below = _fold_step(
            raw, start, start + grid, draft, scale, sampling, lane_max, lane_step, lane_finite, lane_mass,
            lane_below, COUNT, BELOW, BLOCK, FAST)
        if PREFIXES:
            if start + BLOCK == until:  # (uniform over the program)
                store_prefix(prefix_ptr, lane_max, lane_mass, scale)
                prefix_ptr += 2  # (carried: computing the pair's address from `until` instead drops the
                # float32 instance's 8-byte stack on sm_90 but slowed the bf16 row launches)
                until = tl.where(until + chunk < vocab, until + chunk, -1)
    if full < vocab:  # the last, partial step
        offs = full + grid
        raw = tl.load(row_ptr + offs, mask=offs < vocab, other=float("-inf"))
        lane_max, lane_step, lane_finite, lane_mass, lane_below = _fold_step(
            raw, full, offs, draft, scale, sampling, lane_max, lane_step, lane_finite, lane_mass,
            lane_below, COUNT, BELOW, BLOCK, FAST)
    return lane_max, lane_step, lane_finite, lane_mass, lane_below


@triton.jit
def lane_stats(row_ptr, vocab, temperature, draft, sampling, BLOCK: tl.constexpr, STAGES: tl.constexpr,
               lo=0, COUNT: tl.constexpr = False, BELOW: tl.constexpr = True, prefix_ptr=0, chunk=1, prefixes=False,
               PREFIXES: tl.constexpr = False):
    """The HBM pass of a row with per-lane accumulators: each lane's (max, step of its
    first max, finite count, mass, mass below draft), masses at the lane's own max.

    Each step loads BLOCK logits as [BLOCK // VEC lanes, VEC contiguous] (VEC: 16 bytes of
    logits, one vector load per lane) and folds them into each lane's online max and sums
    (a reduction inside the thread): no block-wide reduction, so no barrier, in the loop,
    and few instructions per logit (the kernels are bound by the ALU pipe here: ncu on the
    H200): no NaN / +inf handling per logit (the pass runs again with it, on the rare
    row where a lane ends with a NaN max or a non-finite mass: `_fold_step`); -0 vs +0 does
    not matter to max, argmax or weights (they compare equal); no argmax per logit (each
    lane keeps the step where its max first rose; `combine_lanes` reloads those steps);
    no finite mask (exp2 of -inf is 0, from a lane max made finite); the finite count
    only with COUNT (else 0/1: is there a finite logit); the mass below draft only with
    BELOW (top-k / top-p rows have no use for it), masked per logit in the one step that
    holds the draft. A step's VEC weights are summed
    in float32 (relative error under 4 ulps, far inside SPEC.md's 1e-6 band), then
    widened once per lane and step. Each weight is exp((x - m) / T) times exp((m - max) / T)
    rescales: a few float32 ulps from SPEC.md's. With `lo`, the logits [lo, vocab) only
    (one chunk of a split row: `vocab` is then the chunk's end).

    PREFIXES (and `prefixes` true; lo = 0, `chunk` a multiple of BLOCK): at the end of every
    `chunk` logits but the row's last, the row's prefix mass so far (`store_prefix`: a block
    reduction of the lanes) into the word pairs from prefix_ptr, so that a search for the
    token needs to read one chunk (`light_token_from_prefixes`). Each chunk end costs the
    pass one block reduction (the alternatives cost about as much: `launch.prefix_chunks`)."""
    lane_max, lane_step, lane_finite, lane_mass, lane_below = _lane_pass(
        row_ptr, vocab, temperature, draft, sampling, BLOCK, STAGES, lo, COUNT, BELOW, True, prefix_ptr, chunk,
        prefixes, PREFIXES)
    bad = (lane_max != lane_max) | (lane_mass != lane_mass) | (lane_mass == float("inf"))
    if tl.sum(bad.to(tl.int32), 0) > 0:  # a NaN or +inf logit: the sanitizing pass (its prefixes replace the first's)
        lane_max, lane_step, lane_finite, lane_mass, lane_below = _lane_pass(
            row_ptr, vocab, temperature, draft, sampling, BLOCK, STAGES, lo, COUNT, BELOW, False, prefix_ptr, chunk,
            prefixes, PREFIXES)
    if not COUNT:
        lane_finite = (lane_max > float("-inf")).to(tl.int32)
    return lane_max, lane_step, lane_finite, lane_mass, lane_below


@triton.jit
def combine_lanes(row_ptr, lane_max, lane_step, lane_finite, lane_mass, lane_below, vocab, temperature,
                  sampling):
    """`lane_stats` folded to the row's (max, argmax, finite count, mass S, mass below draft).
    The argmax (lowest index of the max): the lanes holding the row max reload the step
    where their max first rose (16 bytes each) and take the lowest index holding it."""
    VEC: tl.constexpr = LANE_BITS // row_ptr.dtype.element_ty.primitive_bitwidth
    LANES: tl.constexpr = lane_max.shape[0]
    x_max = tl.max(lane_max, 0)
    holds = (lane_max == x_max) & (lane_max > float("-inf"))
    offs = lane_step[:, None] + tl.arange(0, LANES)[:, None] * VEC + tl.arange(0, VEC)[None, :]
    x, _ = load_row(row_ptr, offs, tl.where(holds[:, None], vocab, 0))
    arg = tl.min(tl.min(tl.where(x == x_max, offs, vocab), 1), 0)
    finite = tl.sum(lane_finite, 0)
    mass = tl.zeros((), dtype=tl.float64)
    below = tl.zeros((), dtype=tl.float64)
    if sampling:
        to_max = tl.where(lane_max > float("-inf"), weight(lane_max, x_max, temperature), 0.0).to(tl.float64)
        mass = tl.sum(lane_mass * to_max, 0)
        below = tl.sum(lane_below * to_max, 0)
    return x_max, arg, finite, mass, below


@triton.jit
def scan_lanes(row_ptr, vocab, temperature, draft, sampling, BLOCK: tl.constexpr, STAGES: tl.constexpr,
               lo=0):
    """The HBM pass of greedy and temperature-only rows: (max, argmax, finite count, mass S,
    mass below draft) (see `lane_stats`)."""
    _, _, x_max, arg, finite, mass, below = lanes_and_stats(row_ptr, vocab, temperature, draft, sampling, BLOCK,
                                                            STAGES, lo)
    return x_max, arg, finite, mass, below


@triton.jit
def lanes_and_stats(row_ptr, vocab, temperature, draft, sampling, BLOCK: tl.constexpr, STAGES: tl.constexpr,
                    lo=0, BELOW: tl.constexpr = True, prefix_ptr=0, chunk=1, prefixes=False,
                    PREFIXES: tl.constexpr = False):
    """`lane_stats`, then `combine_lanes`: (lane maxima, lane masses, max, argmax, finite count,
    mass S, mass below draft); the lanes for the bounds of top-k / top-p rows."""
    lane_max, lane_step, lane_finite, lane_mass, lane_below = lane_stats(
        row_ptr, vocab, temperature, draft, sampling, BLOCK, STAGES, lo, False, BELOW, prefix_ptr, chunk, prefixes,
        PREFIXES)
    x_max, arg, finite, mass, below = combine_lanes(row_ptr, lane_max, lane_step, lane_finite, lane_mass,
                                                    lane_below, vocab, temperature, sampling)
    return lane_max, lane_mass, x_max, arg, finite, mass, below


@triton.jit
def filters(top_k, top_p, vocab):
    """(top-k on, top-p on) for a sampling row (SPEC.md: NaN top_p is off)."""
    return (top_k > 0) & (top_k < vocab), top_p < 1.0


@triton.jit
def is_light(temperature, top_k, top_p, vocab):
    """Greedy and temperature-only rows (SPEC.md: NaN temperature is greedy)."""
    use_k, use_p = filters(top_k, top_p, vocab)
    return ~((temperature > 0) & (use_k | use_p))


@triton.jit
def store_chunk(part_ptr, x_max, arg, finite, mass):
    """One chunk's partial results, as four int64 words."""
    tl.store(part_ptr, f32_word(x_max))
    tl.store(part_ptr + 1, arg.to(tl.int64))
    tl.store(part_ptr + 2, finite.to(tl.int64))
    tl.store(part_ptr + 3, f64_word(mass))


@triton.jit
def chunk_stats(row_ptr, vocab, temperature, c, chunk, part_ptr, BLOCK: tl.constexpr, STAGES: tl.constexpr):
    """Chunk c of a greedy or temperature-only row, read and stored (`store_chunk`) at part_ptr;
    a chunk past the row stores max -inf, nothing else."""
    lo = c * chunk
    x_max, arg, finite, mass, _ = scan_lanes(row_ptr, tl.minimum(lo + chunk, vocab), temperature, -1,
                                             temperature > 0, BLOCK, STAGES, lo)
    store_chunk(part_ptr, x_max, arg, finite, mass)


@triton.jit
def light_token_from_chunks(row_ptr, vocab, temperature, u, part_ptr, chunk, SPLITS: tl.constexpr,
                            BLOCK: tl.constexpr):
    """The token of a greedy or temperature-only row from its chunks' partials (`store_chunk`;
    unused chunks hold max -inf): max and argmax (lowest index) over the chunks; for
    temperature rows t = u * S with S the chunks' masses rescaled to the row max, and the
    search runs in the one chunk where the chunks' prefix mass first exceeds t (else the
    last chunk with mass), from that chunk's preceding mass."""
    c = tl.arange(0, SPLITS)
    m = word_f32(tl.load(part_ptr + c * 4))
    a = tl.load(part_ptr + c * 4 + 1)
    finite = tl.sum(tl.load(part_ptr + c * 4 + 2), 0)
    x_max = tl.max(m, 0)
    token = tl.min(tl.where(m == x_max, a, INT64_MAX), 0)
    token = tl.where(finite > 0, token, -1)
    if (temperature > 0) & (finite > 0):
        scale = tl.where(m > float("-inf"), weight(m, x_max, temperature), 0.0).to(tl.float64)
        mass = word_f64(tl.load(part_ptr + c * 4 + 3)) * scale
        prefix = tl.cumsum(mass, 0)
        t = u.to(tl.float64) * tl.sum(mass, 0)
        hit = tl.min(tl.where(prefix > t, c, SPLITS), 0)
        at = tl.where(hit < SPLITS, hit, tl.max(tl.where(mass > 0, c, 0), 0))
        before = tl.sum(tl.where(c < at, mass, 0.0), 0)
        lo = at * chunk
        token = search_light(row_ptr, x_max, temperature, t, lo, tl.minimum(lo + chunk, vocab), before, BLOCK)
    return token


@triton.jit
def light_token_from_prefixes(row_ptr, vocab, temperature, u, x_max, mass, prefix_ptr, chunk,
                              SPLITS: tl.constexpr, BLOCK: tl.constexpr):
    """The token of a temperature-only row (T > 0, a finite logit) from its pass's (max, mass
    S) and the prefix masses it stored at the end of each chunk but the last (`lane_stats`
    with PREFIXES; SPLITS >= the row's chunks): t = u * S, and the search runs in the first
    chunk whose end prefix (rescaled to the row max) exceeds t, from the prefix before it.
    The last chunk ends at S itself, which t < S does not reach. A prefix is rescaled twice
    (lanes to their max at the chunk end, that max to the row's: float32 weights, a few ulps
    from SPEC.md's), far inside the 1e-6 * S band where a decision may differ."""
    c = tl.arange(0, SPLITS)
    inside = c < (vocab + chunk - 1) // chunk - 1  # chunks that end inside the row
    m = word_f32(tl.load(prefix_ptr + 2 * c, mask=inside, other=0))
    s = word_f64(tl.load(prefix_ptr + 2 * c + 1, mask=inside, other=0))
    p = tl.where(m > float("-inf"), s * weight(m, x_max, temperature).to(tl.float64), 0.0)
    p = tl.where(inside, p, mass)
    t = u.to(tl.float64) * mass
    at = tl.min(tl.where(p > t, c, (vocab - 1) // chunk), 0)
    before = tl.sum(tl.where(c == at - 1, p, 0.0), 0)
    lo = at * chunk
    return search_light(row_ptr, x_max, temperature, t, lo, tl.minimum(lo + chunk, vocab), before, BLOCK)


@triton.jit
def _in_rule(u, tie_rank, cut, room):
    return (u > cut) | ((u == cut) & (tie_rank < room))


@triton.jit
def _kept(x, fin, offs, ties_k, cut_k, room_k, ties_p, cut_p, room_p, first):
    """Kept set K = rule k and (rule p or the rank-0 token `first`), with running tie counts."""
    u = unsigned_key(x)
    tie_k = (fin & (u == cut_k)).to(tl.int64)
    tie_p = (fin & (u == cut_p)).to(tl.int64)
    kept = fin & _in_rule(u, ties_k + tl.cumsum(tie_k, 0) - tie_k, cut_k, room_k)
    kept = kept & (_in_rule(u, ties_p + tl.cumsum(tie_p, 0) - tie_p, cut_p, room_p) | (offs == first))
    return kept, ties_k + tl.sum(tie_k, 0), ties_p + tl.sum(tie_p, 0)


@triton.jit
def search_row(row_ptr, vocab, x_max, temperature, t, cut_k, room_k, cut_p, room_p, first,
               BLOCK: tl.constexpr):
    """SPEC.md step 7 over the kept set of cut rules: the smallest v in K whose inclusive
    index-order prefix exceeds t, else the largest v in K with e_v > 0."""
    prefix = tl.zeros((), dtype=tl.float64)
    token = tl.zeros((), dtype=tl.int64) - 1
    last = tl.zeros((), dtype=tl.int64) - 1
    ties_k = tl.zeros((), dtype=tl.int64)
    ties_p = tl.zeros((), dtype=tl.int64)
    start = tl.zeros((), dtype=tl.int32)
    while (token < 0) & (start < vocab):
        offs = start + tl.arange(0, BLOCK)
        x, fin = load_row(row_ptr, offs, vocab)
        kept, ties_k, ties_p = _kept(x, fin, offs, ties_k, cut_k, room_k, ties_p, cut_p, room_p, first)
        e = tl.where(kept, weight(x, x_max, temperature), 0.0).to(tl.float64)
        hit = (prefix + tl.cumsum(e, 0)) > t
        found = tl.min(tl.where(hit, offs, vocab), 0)
        token = tl.where(found < vocab, found.to(tl.int64), token)
        last = tl.maximum(last, tl.max(tl.where(e > 0, offs, -1), 0).to(tl.int64))
        prefix += tl.sum(e, 0)
        start += BLOCK
    return tl.where(token >= 0, token, last)


@triton.jit
def search_light(row_ptr, x_max, temperature, t, lo, hi, prefix0, BLOCK: tl.constexpr):
    """SPEC.md step 7 for a temperature-only row (every finite token kept), over [lo, hi)
    whose preceding mass is prefix0: the smallest v whose inclusive prefix exceeds t, else
    the largest v with e_v > 0. A step's weights are summed first (float32, widened: one
    reduction per step); only the step where the prefix crosses t runs the index-order
    float64 cumsum. [lo, hi) is one chunk of a row (a few steps): the steps are read in a
    software-pipelined loop without an early exit (a loop that exits waits out each step's
    load). The fallback (rounding left no crossing) scans back from hi, past lo
    when [lo, hi) holds no weight (a chunk picked on prefixes whose difference is rounding)."""
    prefix = tl.zeros((), dtype=tl.float64) + prefix0
    token = tl.zeros((), dtype=tl.int64) - 1
    for start in tl.range(lo, hi, BLOCK, num_stages=SEARCH_STAGES):
        offs = start + tl.arange(0, BLOCK)
        x, fin = load_row(row_ptr, offs, hi)
        e = tl.where(fin, weight(x, x_max, temperature), 0.0)
        step = tl.sum(e, 0).to(tl.float64)
        if (token < 0) & (prefix + step > t):  # (later steps leave the token as it is)
            found = tl.min(tl.where(prefix + tl.cumsum(e.to(tl.float64), 0) > t, offs, hi), 0)
            token = tl.where(found < hi, found.to(tl.int64), token)
        prefix += step
    end = tl.zeros((), dtype=tl.int32) + hi
    while (token < 0) & (end > 0):
        offs = end - BLOCK + tl.arange(0, BLOCK)
        x = sanitize(tl.load(row_ptr + offs, mask=(offs >= 0) & (offs < hi), other=float("-inf")))
        e = tl.where(x > float("-inf"), weight(x, x_max, temperature), 0.0)
        token = tl.max(tl.where(e > 0, offs, -1), 0).to(tl.int64)
        end -= BLOCK
    return token


@triton.jit
def rule_total(row_ptr, vocab, x_max, temperature, cut_k, room_k, cut_p, room_p, first, BLOCK: tl.constexpr):
    """The mass of the kept set of the cut rules (ties ranked by index: a cumsum per step)."""
    total = tl.zeros((), dtype=tl.float64)
    ties_k = tl.zeros((), dtype=tl.int64)
    ties_p = tl.zeros((), dtype=tl.int64)
    for start in tl.range(0, vocab, BLOCK, num_stages=SLOW_STAGES):
        offs = start + tl.arange(0, BLOCK)
        x, fin = load_row(row_ptr, offs, vocab)
        kept, ties_k, ties_p = _kept(x, fin, offs, ties_k, cut_k, room_k, ties_p, cut_p, room_p, first)
        total += tl.sum(tl.where(kept, weight(x, x_max, temperature), 0.0).to(tl.float64), 0)
    return total


@triton.jit
def _totals_above(row_ptr, vocab, x_max, temperature, pivots, COUNT: tl.constexpr, BLOCK: tl.constexpr):
    """For each of the [P] unsigned-key pivots: the mass (COUNT: the number) of the finite
    tokens with key > pivot. Per-thread [P, BLOCK] float64 accumulators, reduced once after
    the (software-pipelined) pass: no block-wide step in the loop."""
    P: tl.constexpr = pivots.shape[0]
    acc = tl.zeros((P, BLOCK), dtype=tl.float64)
    for start in tl.range(0, vocab, BLOCK, num_stages=SLOW_STAGES):
        offs = start + tl.arange(0, BLOCK)
        x, fin = load_row(row_ptr, offs, vocab)
        above = fin[None, :] & (unsigned_key(x)[None, :] > pivots[:, None])
        if COUNT:
            acc += above.to(tl.float64)
        else:
            acc += tl.where(above, weight(x, x_max, temperature).to(tl.float64)[None, :], 0.0)
    return tl.sum(acc, 1)


@triton.jit
def _total_above(row_ptr, vocab, x_max, temperature, pivot, COUNT: tl.constexpr, BLOCK: tl.constexpr):
    """`_totals_above` of one pivot."""
    return tl.sum(_totals_above(row_ptr, vocab, x_max, temperature, tl.zeros((1,), dtype=tl.int64) + pivot,
                                COUNT, BLOCK), 0)


@triton.jit
def _largest_true_key(row_ptr, vocab, x_max, temperature, lo, hi_key, target, COUNT: tl.constexpr,
                      BLOCK: tl.constexpr):
    """The largest key c in [lo, hi_key] whose total over keys >= c (COUNT: tokens, else mass)
    reaches `target`, given that lo's does (lo = -1: every key's) and that the answer is at
    most hi_key: a search over PIVOTS keys per pass (the totals fall as c rises, so the
    pivots that reach it are a prefix); each pass narrows [lo, hi_key] 5-fold.

    bfloat16 / float16 rows: a search over the values the dtype holds (7 or 9 passes instead
    of 14). Their keys' low SHIFT bits are all zeros (x >= 0) or all ones (x < 0), so
    key >> SHIFT orders them and "key >= q << SHIFT" is "key >> SHIFT >= q". +inf sanitized
    to FLT_MAX is no bfloat16 / float16 value: its group (shared with bfloat16's largest
    finite value) takes one more pass to tell FLT_MAX's key from the group's. The search
    starts one group below lo's (lo need not be a value's key: `nucleus._cut_bracket`'s is
    a bin edge's), so the answer, in a group above, is a value's key."""
    BF16: tl.constexpr = row_ptr.dtype.element_ty == tl.bfloat16
    F16: tl.constexpr = row_ptr.dtype.element_ty == tl.float16
    SHIFT: tl.constexpr = 16 if BF16 else (13 if F16 else 0)
    LOW: tl.constexpr = 65535 if BF16 else 8191  # (1 << SHIFT) - 1
    TOP_Q: tl.constexpr = 65535 if BF16 else (524287 if F16 else 4294967295)  # 0xFFFFFFFF >> SHIFT
    HALF_Q: tl.constexpr = 32768 if BF16 else 262144  # KEY_OFFSET >> SHIFT: groups of x >= 0 from here
    FLT_MAX_Q: tl.constexpr = 65407 if BF16 else 523263  # FLT_MAX_KEY >> SHIFT
    q = lo >> SHIFT  # (lo = -1 stays -1)
    if SHIFT > 0:
        q = tl.where(lo >= 0, q - 1, q)
    hi = tl.minimum(tl.zeros((), dtype=tl.int64) + TOP_Q, hi_key >> SHIFT)
    i = tl.arange(0, PIVOTS).to(tl.int64) + 1
    q_lo = q
    while hi > q:
        pivots = q + ((hi - q) * i + PIVOTS) // (PIVOTS + 1)  # in (q, hi], ascending
        reach = _totals_above(row_ptr, vocab, x_max, temperature, (pivots << SHIFT) - 1, COUNT, BLOCK) >= target
        q = tl.max(tl.where(reach, pivots, q), 0)
        hi = tl.min(tl.where(reach, hi, pivots - 1), 0)
    c = lo
    if SHIFT > 0:
        if q > q_lo:  # the key of the value in group q (the low bits: ones below 0.0, zeros from it)
            c = tl.where(q < HALF_Q, (q << SHIFT) | LOW, q << SHIFT)
        if (q == FLT_MAX_Q) & (c < FLT_MAX_KEY):  # (also when lo was already in that group)
            if _total_above(row_ptr, vocab, x_max, temperature, FLT_MAX_KEY - 1, COUNT, BLOCK) >= target:
                c = FLT_MAX_KEY + tl.zeros((), dtype=tl.int64)
    else:
        c = q
    return c


@triton.jit
def key_weight(key, x_max, temperature):
    """The float64 weight of an unsigned key (`unsigned_key`)."""
    return weight(key_value((key - KEY_OFFSET).to(tl.int32)), x_max, temperature).to(tl.float64)


@triton.jit
def tie_room(target, above, e_cut, vocab):
    """How many tied tokens at a top-p cut stay: they share the weight e_cut, and the m-th
    (by index) stays iff above + m * e_cut < target, `above` being the mass above the cut."""
    room = tl.math.ceil((target - above) / tl.where(e_cut > 0, e_cut, 1.0))
    room = tl.where(e_cut > 0, room, tl.where(above < target, vocab * 1.0, 0.0))
    return tl.minimum(tl.maximum(room, 0.0), vocab * 1.0).to(tl.int64)


@triton.jit
def _slow_rules(row_ptr, vocab, x_max, temperature, top_p, k, use_k, use_p, mass_all, lo_p, hi_p,
                BLOCK: tl.constexpr):
    """Cut rules of top-k and top-p by a search over keys (the kept set reaches past the
    candidates). Every pass counts or sums the tokens above a key, with no tie rule: the
    top-k set's total is the mass above cut_k plus room_k tied weights (top-p alone: the
    row's mass S, `mass_all`), and for keys above cut_k (where the top-p cut lies) "kept by
    top-k and above c" is "above c". [lo_p, hi_p]: unsigned keys known to hold the top-p
    cut (-1, KEY_TOP: none known)."""
    cut_k = tl.zeros((), dtype=tl.int64) - 1
    room_k = tl.zeros((), dtype=tl.int64)
    if use_k:  # the k-th best key: the largest c with count(u >= c) >= k
        cut_k = _largest_true_key(row_ptr, vocab, x_max, temperature, cut_k, tl.zeros((), dtype=tl.int64) + KEY_TOP,
                                  k.to(tl.float64), True, BLOCK)
        room_k = k - _total_above(row_ptr, vocab, x_max, temperature, cut_k, True, BLOCK).to(tl.int64)
    cut_p = tl.zeros((), dtype=tl.int64) - 1
    room_p = tl.zeros((), dtype=tl.int64)
    if use_p:
        total_k = mass_all
        if use_k:
            total_k = _total_above(row_ptr, vocab, x_max, temperature, cut_k, False, BLOCK)
            if (room_k > 0) & (cut_k >= 0):  # (cut_k = -1: fewer than k finite tokens, all kept)
                total_k += room_k.to(tl.float64) * key_weight(cut_k, x_max, temperature)
        target = top_p.to(tl.float64) * total_k
        # The cut: the smallest key whose kept mass strictly above stays under the target;
        # the largest c with mass(u > c - 1) >= target is one below it (at least cut_k: every
        # key up to cut_k has the whole top-k set above it).
        cut_p = _largest_true_key(row_ptr, vocab, x_max, temperature, tl.maximum(cut_k, lo_p), hi_p, target, False,
                                  BLOCK)
        above = _total_above(row_ptr, vocab, x_max, temperature, cut_p, False, BLOCK)
        room_p = tie_room(target, above, key_weight(cut_p, x_max, temperature), vocab)
    return cut_k, room_k, cut_p, room_p


@triton.jit
def _search_candidates(packed, kept, x_max, temperature, u):
    """Step 7 on kept candidates (registers): the smallest kept index whose inclusive prefix
    mass in index order exceeds t = u * S, found by a search over the index (SEARCH_PROBES
    probes per round, one masked sum of the kept weights each, in one reduction), else the
    largest kept index of positive weight (SPEC.md's rounding rule: the search starts there
    and moves below it only where a prefix exceeds t). No second sort (by index): a sort
    network of BUF entries is tens of compare-and-swap stages, hundreds of IR operations,
    and the work of Triton's coalescing passes grows with memory operations x kernel size
    (without the sort, each kernel that decides filtered rows compiles for sm_90 in about
    half the time; benchmarks/HISTORY.md, session 42). The prefixes are sums in another order than a running
    sum's: SPEC.md's legal difference (within 1e-6 * S of t)."""
    index = 0xFFFFFFFF - (packed & 0xFFFFFFFF)
    e = tl.where(kept, weight(key_value((packed >> 32).to(tl.int32)), x_max, temperature), 0.0).to(tl.float64)
    t = u.to(tl.float64) * tl.sum(e, 0)
    lo = tl.zeros((), dtype=tl.int64) - 1  # prefix(lo) <= t (none below index 0)
    hi = tl.max(tl.where(kept & (e > 0), index, -1), 0)  # prefix(hi) > t, or hi is the rounding rule's token
    probe = 1 + tl.arange(0, SEARCH_PROBES)
    while hi - lo > 1:  # (hi - lo) / (SEARCH_PROBES + 1) per round, each round one reduction
        mids = tl.minimum(lo + tl.maximum((hi - lo) // (SEARCH_PROBES + 1), 1) * probe, hi - 1)
        above = tl.sum(tl.where(index[:, None] <= mids[None, :], e[:, None], 0.0), 0) > t
        hi = tl.min(tl.where(above, mids, hi), 0)
        lo = tl.max(tl.where(above, lo, mids), 0)
    return hi


@triton.jit
def valid_draft(draft, vocab):
    """The draft token, or -1 where there is none (out of range: never matches)."""
    return tl.where((draft >= 0) & (draft < vocab), draft, -1)


@triton.jit
def decide_light(row_ptr, vocab, temperature, seed, position, draft, BLOCK: tl.constexpr,
                 STAGES: tl.constexpr):
    """The token of a greedy or temperature-only row at `position`, and whether it equals
    `draft`: one HBM pass (`scan_lanes`), then `light_decision`. Returns (token, match,
    x_max, mass)."""
    sampling = temperature > 0  # NaN compares false: greedy
    d = valid_draft(draft, vocab)
    x_max, arg, finite, mass, below = scan_lanes(row_ptr, vocab, temperature, d, sampling, BLOCK, STAGES)
    token, match = light_decision(row_ptr, vocab, temperature, seed, position, d, sampling, x_max, arg, finite,
                                  mass, below)
    return token, match, x_max, mass


@triton.jit
def light_decision(row_ptr, vocab, temperature, seed, position, d, sampling, x_max, arg, finite, mass, below):
    """(token, match) of a greedy or temperature-only row from its pass (`scan_lanes`, with
    d = `valid_draft`): token is -1 for a row with no finite logit, SEARCH_LATER for a
    temperature-only row whose draft does not match: `search_light` with (x_max, mass) finds
    it later, only where it is needed. Temperature only: y == d iff
    below_d <= t < below_d + e_d, with t = u * S."""
    token = tl.where(finite > 0, arg.to(tl.int64), -1)
    match = (token == d) & (d >= 0)
    if sampling & (finite > 0):
        u = uniform(seed, position)
        x_d, _ = load_row(row_ptr, tl.maximum(d, 0), vocab)
        e_d = tl.where((d >= 0) & (x_d > float("-inf")), weight(x_d, x_max, temperature), 0.0)
        t = u.to(tl.float64) * mass
        match = (e_d > 0) & (below <= t) & (t < below + e_d.to(tl.float64))
        token = tl.where(match, d.to(tl.int64), SEARCH_LATER)
    return token, match


@triton.jit
def slow_token(row_ptr, vocab, temperature, top_p, u, x_max, arg, mass_all, k, use_k, use_p, lo_p, hi_p,
               BLOCK: tl.constexpr):
    """The token of a top-k / top-p row from passes over the row (the kept set reaches past
    the candidates): the cuts by key searches (`_slow_rules`; [lo_p, hi_p] holds the top-p
    cut), the kept mass, then SPEC.md step 7."""
    cut_k, room_k, cut_p, room_p = _slow_rules(row_ptr, vocab, x_max, temperature, top_p, k, use_k, use_p, mass_all,
                                               lo_p, hi_p, BLOCK)
    total = rule_total(row_ptr, vocab, x_max, temperature, cut_k, room_k, cut_p, room_p, arg, BLOCK)
    return search_row(row_ptr, vocab, x_max, temperature, u.to(tl.float64) * total, cut_k, room_k, cut_p, room_p, arg,
                      BLOCK)


@triton.jit
def decide_filtered(temperature, top_p, u, x_max, finite, mass_all, k, want, count, use_k, use_p, packed):
    """The token of a top-k / top-p row from its `count` (<= BUF) candidates `packed` ([BUF]
    packed entries: `pack`, INT64_MIN past count), which in SPEC.md's order start with the
    row's min(count, want) best tokens (a prefix of the order). Resolved there when that
    prefix holds the whole top-k set, or (top-p alone) when its mass reaches top_p * S:
    every later token's C(r-1) is then >= the target. Otherwise UNDECIDED (`slow_token`
    decides from passes over the row)."""
    BUF: tl.constexpr = packed.shape[0]
    rank = tl.arange(0, BUF)
    packed = tl.sort(packed, descending=True)
    n_best = tl.minimum(count, want)
    # (finite may be the kernel's `vocab` argument: torch's mutation analysis of the kernels during
    # AOTInductor export passes it as a Python int, which has no .to(): that analysis failed on the
    # H200 and assumed every input mutated)
    n_kept_k = tl.minimum(k, finite + tl.zeros((), dtype=tl.int64))  # size of the top-k set
    whole_k = n_kept_k <= n_best  # the whole top-k set is among the candidates
    kept = rank < tl.minimum(n_kept_k, n_best)
    e = tl.where(kept, weight(key_value((packed >> 32).to(tl.int32)), x_max, temperature), 0.0)
    e = e.to(tl.float64)
    total_k = tl.where(whole_k, tl.sum(e, 0), mass_all)  # not whole: top-k is off, S_k = S
    target = top_p.to(tl.float64) * total_k
    kept_p = kept & (((tl.cumsum(e, 0) - e) < target) | (rank == 0))
    reach = tl.sum(e, 0) >= target
    kept = tl.where(use_p, kept_p, kept)
    # Without the whole top-k set, S_k is known only when top-k is off (S_k = S).
    resolved = whole_k | (~use_k & use_p & reach)
    token = tl.zeros((), dtype=tl.int64) + UNDECIDED
    if resolved:
        token = _search_candidates(packed, kept, x_max, temperature, u)
    return token
