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
decision runs on those candidates in registers (`decide_filtered`). The rows those
candidates do not settle are decided by `cut_select.py`, in a bounded number of passes.
"""

import triton
import triton.language as tl

from .common import (FLT_MAX, key_value, ordered_key, sanitize, scaled_weight, uniform, weight,
                     weight_scale)
from .scratch import SEARCH_LATER, UNDECIDED, f32_word, f64_word, word_f32, word_f64

INT64_MIN = tl.constexpr(-9223372036854775808)
INT64_MAX = tl.constexpr(9223372036854775807)
SEARCH_PROBES = tl.constexpr(4)  # `search_candidates`' probes per round: log5(V) rounds (8 at V = 151936)
KEY_OFFSET = tl.constexpr(2147483648)  # signed key + KEY_OFFSET = unsigned key
LANE_BITS = tl.constexpr(128)  # logits bits per lane and step: the lane layout of lane_stats,
# combine_lanes and filtered.collect (one 16-byte load per lane)
MISS_MARGIN = tl.constexpr(1e-5)  # `certain_miss`'s margin, a fraction of S
SEARCH_STAGES = tl.constexpr(3)  # `search_light`'s chunk steps in flight


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
    return (key.to(tl.int64) << 32) | (~index.to(tl.int32)).to(tl.uint32, bitcast=True).to(tl.int64)  # (a 32-bit
    # NOT zero-extended: 0xFFFFFFFF - index, without 64-bit arithmetic per logit)


@triton.jit
def _fold_step(raw, start, offs, draft, scale, sampling, lane_max, lane_step, lane_finite, lane_mass,
               lane_below, elem_max, elems, COUNT: tl.constexpr, BELOW: tl.constexpr, BLOCK: tl.constexpr,
               FAST: tl.constexpr, ELEMS: tl.constexpr):
    """One step of `lane_stats`: the [LANES, VEC] logits `raw` (at `offs`, step `start`)
    folded into the per-lane accumulators. The mass below the draft: a step wholly below it
    adds its whole sums; only the one step that holds the draft masks per logit.

    FAST: no per-logit NaN / +inf compare. The float max drops a NaN (IEEE maxNum: the GPU's
    `max.f32`, the interpreter's `nanmax` reduction), as the sanitizing NaN -> -inf would; so
    greedy rows need no second pass for NaN. A sampling row's weights go through max(e, 0):
    one `max.f32` a logit that turns a NaN logit's NaN weight into the 0 of its sanitized
    -inf on the GPU, so a row holding NaN needs no second pass there either. In the
    interpreter numpy's elementwise max keeps NaN (in the weight, and in the lane max after a
    step of only NaN): a NaN lane max or mass, like the +inf weight of a +inf logit,
    sends the row to the sanitizing pass (`lane_stats` checks the lanes after the pass), whose
    result is the same; every other logit gives exactly what the sanitized step gives. +inf
    counts as FLT_MAX on the step's max: min commutes with max.

    ELEMS (and `elems`, uniform over the program): each element's own maximum too ([LANES, VEC]:
    the tokens of one place in the steps, a stride of BLOCK apart), one max a logit; a NaN may
    stay in it (the interpreter's elementwise max keeps it): `filtered.element_bound` sanitizes."""
    x = raw.to(tl.float32)
    if ELEMS:
        if elems:
            elem_max = tl.maximum(elem_max, x)
    if FAST:
        step_max = tl.minimum(tl.max(x, 1), FLT_MAX, propagate_nan=tl.PropagateNan.ALL)
    else:
        x = tl.where(x == x, x, float("-inf"))
        step_max = tl.minimum(tl.max(x, 1), FLT_MAX)
    if COUNT:
        lane_finite += tl.sum((x > float("-inf")).to(tl.int32), 1)
    lane_step = tl.where(step_max > lane_max, start, lane_step)  # earlier steps win ties
    new_max = tl.maximum(lane_max, step_max)
    if sampling:
        m = tl.where(new_max > float("-inf"), new_max, 0.0)
        rescale = scaled_weight(lane_max, m, scale)
        if FAST:
            e = tl.maximum(scaled_weight(x, m[:, None], scale), 0.0)  # (NaN -> 0 on the GPU: see above)
        else:
            e = scaled_weight(tl.minimum(x, FLT_MAX), m[:, None], scale)
        step_sum = tl.sum(e, 1)
        lane_mass = lane_mass * rescale.to(tl.float64) + step_sum.to(tl.float64)
        if BELOW:
            below = tl.where(start + BLOCK <= draft, step_sum, 0.0)
            if (start < draft) & (start + BLOCK > draft):  # (uniform over the program)
                below = tl.sum(tl.where(offs < draft, e, 0.0), 1)
            lane_below = lane_below * rescale.to(tl.float64) + below.to(tl.float64)
    return new_max, lane_step, lane_finite, lane_mass, lane_below, elem_max


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
               PREFIXES: tl.constexpr, elems, ELEMS: tl.constexpr):
    """`lane_stats`' pass over the row (FAST, ELEMS: see `_fold_step`; PREFIXES and the elements'
    segments: see `lane_stats`). With segments (ELEMS 2) a row that keeps its element maxima (a
    top-k row: no mass, no prefixes) takes a copy of the loop of its own: the segments' stores in
    the loop that sums masses took ~28 more registers on sm_90 (the first row launch of
    `dflash_verify`: 4 programs an SM -> 3)."""
    if ELEMS == 2:
        if elems:
            lane_max, lane_step, lane_finite, lane_mass, lane_below, elem_max = _pass_steps(
                row_ptr, vocab, temperature, draft, False, BLOCK, STAGES, lo, COUNT, False, FAST, prefix_ptr, chunk,
                True, False, True, 2)
        else:
            lane_max, lane_step, lane_finite, lane_mass, lane_below, elem_max = _pass_steps(
                row_ptr, vocab, temperature, draft, sampling, BLOCK, STAGES, lo, COUNT, BELOW, FAST, prefix_ptr,
                chunk, prefixes, PREFIXES, False, 0)
    else:
        lane_max, lane_step, lane_finite, lane_mass, lane_below, elem_max = _pass_steps(
            row_ptr, vocab, temperature, draft, sampling, BLOCK, STAGES, lo, COUNT, BELOW, FAST, prefix_ptr, chunk,
            prefixes, PREFIXES, elems, ELEMS)
    return lane_max, lane_step, lane_finite, lane_mass, lane_below, elem_max


@triton.jit
def _pass_steps(row_ptr, vocab, temperature, draft, sampling, BLOCK: tl.constexpr, STAGES: tl.constexpr, lo,
                COUNT: tl.constexpr, BELOW: tl.constexpr, FAST: tl.constexpr, mark_ptr, chunk, marked,
                PREFIXES: tl.constexpr, elems, ELEMS: tl.constexpr):
    """`_lane_pass`' loop: the row's steps folded (the element maxima with ELEMS and `elems`);
    with `marked`, at each chunk end inside the row, PREFIXES: the prefix mass's pair at
    mark_ptr (then the next pair), ELEMS 2: the segment's element maxima (one of the two:
    `_lane_pass`)."""
    VEC: tl.constexpr = LANE_BITS // row_ptr.dtype.element_ty.primitive_bitwidth
    LANES: tl.constexpr = BLOCK // VEC
    MARKS: tl.constexpr = PREFIXES or ELEMS == 2  # (whether a chunk end can do anything)
    lane_max = tl.full((LANES,), float("-inf"), tl.float32)
    lane_step = tl.zeros((LANES,), dtype=tl.int32) + lo
    lane_finite = tl.zeros((LANES,), dtype=tl.int32)
    lane_mass = tl.zeros((LANES,), dtype=tl.float64)
    lane_below = tl.zeros((LANES,), dtype=tl.float64)
    elem_max = tl.full((LANES, VEC), float("-inf"), tl.float32)
    grid = tl.arange(0, LANES)[:, None] * VEC + tl.arange(0, VEC)[None, :]
    full = lo + (vocab - lo) // BLOCK * BLOCK
    scale = weight_scale(temperature)
    until = tl.where(marked & (chunk < vocab), chunk, -1)  # the next chunk end inside the row, or -1
    segment = tl.zeros((), dtype=tl.int32)  # (ELEMS: the segments stored)
    for start in tl.range(lo, full, BLOCK, num_stages=STAGES):  # whole steps: no mask
        raw = tl.load(row_ptr + start + grid)
        lane_max, lane_step, lane_finite, lane_mass, lane_below, elem_max = _fold_step(
            raw, start, start + grid, draft, scale, sampling, lane_max, lane_step, lane_finite, lane_mass,
            lane_below, elem_max, elems, COUNT, BELOW, BLOCK, FAST, ELEMS)
        if MARKS:
            if start + BLOCK == until:  # (uniform over the program)
                if ELEMS == 2:  # this segment's element maxima; the next segment's start from -inf
                    tl.store(mark_ptr.to(tl.pointer_type(tl.float32)) + segment * BLOCK + grid, elem_max)
                    elem_max = tl.full((LANES, VEC), float("-inf"), tl.float32)
                    segment += 1
                else:
                    store_prefix(mark_ptr, lane_max, lane_mass, scale)
                    mark_ptr += 2  # (carried: computing the pair's address from `until` instead drops the
                    # float32 instance's 8-byte stack on sm_90 but slowed the bf16 row launches)
                until = tl.where(until + chunk < vocab, until + chunk, -1)
    if full < vocab:  # the last, partial step
        offs = full + grid
        raw = tl.load(row_ptr + offs, mask=offs < vocab, other=float("-inf"))
        lane_max, lane_step, lane_finite, lane_mass, lane_below, elem_max = _fold_step(
            raw, full, offs, draft, scale, sampling, lane_max, lane_step, lane_finite, lane_mass,
            lane_below, elem_max, elems, COUNT, BELOW, BLOCK, FAST, ELEMS)
    return lane_max, lane_step, lane_finite, lane_mass, lane_below, elem_max


@triton.jit
def lane_stats(row_ptr, vocab, temperature, draft, sampling, BLOCK: tl.constexpr, STAGES: tl.constexpr,
               lo=0, COUNT: tl.constexpr = False, BELOW: tl.constexpr = True, prefix_ptr=0, chunk=1, prefixes=False,
               PREFIXES: tl.constexpr = False, elems=False, ELEMS: tl.constexpr = False):
    """The HBM pass of a row with per-lane accumulators: each lane's (max, step of its
    first max, finite count, mass, mass below draft), masses at the lane's own max.

    Each step loads BLOCK logits as [BLOCK // VEC lanes, VEC contiguous] (VEC: 16 bytes of
    logits, one vector load per lane) and folds them into each lane's online max and sums
    (a reduction inside the thread): no block-wide reduction, so no barrier, in the loop,
    and few instructions per logit (the kernels are bound by the ALU pipe here: ncu on the
    H200): no NaN / +inf compare per logit (the max drops NaN, a weight's max with 0 drops
    it on the GPU; the pass runs again with it on the rare row where a lane ends with a NaN
    max or a non-finite mass: a sampling row with a +inf logit, or NaN in the interpreter:
    `_fold_step`); -0 vs +0 does
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
    pass one block reduction (the alternatives cost about as much: `launch.prefix_chunks`).

    ELEMS (1 or 2, and `elems`): also each element's maximum ([LANES, VEC], see `_fold_step`;
    else a [LANES, VEC] of -inf), the last result. ELEMS 2: an element is one place of the steps
    within one segment of `chunk` logits (lo = 0, a multiple of BLOCK,
    `filtered.element_chunk`): at each segment's end but the row's last, its maxima go to the
    BLOCK float32 from prefix_ptr (then the next BLOCK) and the maxima start again; the last
    segment's are the result (`filtered.store_lanes` stores them after the others).
    `prefixes` and `elems`: one at most."""
    lane_max, lane_step, lane_finite, lane_mass, lane_below, elem_max = _lane_pass(
        row_ptr, vocab, temperature, draft, sampling, BLOCK, STAGES, lo, COUNT, BELOW, True, prefix_ptr, chunk,
        prefixes, PREFIXES, elems, ELEMS)
    bad = (lane_max != lane_max) | (lane_mass != lane_mass) | (lane_mass == float("inf"))
    if tl.sum(bad.to(tl.int32), 0) > 0:  # a NaN or +inf logit: the sanitizing pass (its prefixes replace the first's)
        lane_max, lane_step, lane_finite, lane_mass, lane_below, elem_max = _lane_pass(
            row_ptr, vocab, temperature, draft, sampling, BLOCK, STAGES, lo, COUNT, BELOW, False, prefix_ptr, chunk,
            prefixes, PREFIXES, elems, ELEMS)
    if not COUNT:
        lane_finite = (lane_max > float("-inf")).to(tl.int32)
    return lane_max, lane_step, lane_finite, lane_mass, lane_below, elem_max


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
    _, _, x_max, arg, finite, mass, below, _ = lanes_and_stats(row_ptr, vocab, temperature, draft, sampling, BLOCK,
                                                               STAGES, lo)
    return x_max, arg, finite, mass, below


@triton.jit
def lanes_and_stats(row_ptr, vocab, temperature, draft, sampling, BLOCK: tl.constexpr, STAGES: tl.constexpr,
                    lo=0, BELOW: tl.constexpr = True, prefix_ptr=0, chunk=1, prefixes=False,
                    PREFIXES: tl.constexpr = False, elems=False, ELEMS: tl.constexpr = False):
    """`lane_stats`, then `combine_lanes`: (lane maxima, lane masses, max, argmax, finite count,
    mass S, mass below draft, element maxima); the lanes (and, ELEMS, the elements) for the
    bounds of top-k / top-p rows."""
    lane_max, lane_step, lane_finite, lane_mass, lane_below, elem_max = lane_stats(
        row_ptr, vocab, temperature, draft, sampling, BLOCK, STAGES, lo, False, BELOW, prefix_ptr, chunk, prefixes,
        PREFIXES, elems, ELEMS)
    x_max, arg, finite, mass, below = combine_lanes(row_ptr, lane_max, lane_step, lane_finite, lane_mass,
                                                    lane_below, vocab, temperature, sampling)
    return lane_max, lane_mass, x_max, arg, finite, mass, below, elem_max


@triton.jit
def filters(top_k, top_p, vocab):
    """(top-k on, top-p on) for a sampling row (SPEC.md: NaN top_p is off)."""
    return (top_k > 0) & (top_k < vocab), top_p < 1.0


@triton.jit
def decided_temperature(temperature, top_k, top_p):
    """The temperature a row is decided at: 0 (greedy) where its filters keep one token whatever
    the logits, else its own. top-k 1 keeps rank 0 alone (SPEC.md step 4), top-p <= 0 too (step 6),
    and step 7 then gives rank 0, the argmax: its weight exp(0) = 1 exceeds t = u * 1 (u < 1).
    Such a row takes the greedy path (one pass, no filter) instead of the filtered rows' launches.
    Every kernel that decides a light row takes this temperature."""
    return tl.where((top_k == 1) | (top_p <= 0.0), 0.0, temperature)


@triton.jit
def is_light(temperature, top_k, top_p, vocab):
    """Greedy and temperature-only rows (SPEC.md: NaN temperature is greedy), those that keep one
    token (`decided_temperature`) included."""
    use_k, use_p = filters(top_k, top_p, vocab)
    return ~((decided_temperature(temperature, top_k, top_p) > 0) & (use_k | use_p))


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
def key_weight(key, x_max, temperature):
    """The float64 weight of an unsigned key (`unsigned_key`)."""
    return weight(key_value((key - KEY_OFFSET).to(tl.int32)), x_max, temperature).to(tl.float64)


@triton.jit
def search_candidates(packed, kept, x_max, temperature, u):
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
def certain_miss(mass, below, e_d, u, top_p):
    """Whether a top-p-alone row's token certainly is not its draft d, from its first pass
    alone: S (`mass`), the mass below d and d's weight e_d (0 where d is out of range or not
    finite). The kept set K of SPEC.md's step 6 has a mass S_K in [max(p S, 1), min(S, max(p S, 0)
    + 1)] (rank 0, of weight 1, stays; the last kept token, of weight <= 1, starts below p S), so
    the kept mass below d, P, lies in [below - (S - S_K), below], and t = u S_K. y == d needs
    P <= t < P + e_d: it cannot hold when t's largest value is below P's least, or t's least at
    or above below + e_d, each by MISS_MARGIN S (far above the float error of S and below,
    ~1e-7 S: a row told "miss" misses under any legal summation order). Where the nucleus
    is wide and the draft a likely token (an argmax), most rows are told: (1 - p) / p of t's
    range is left undecided."""
    p = top_p.to(tl.float64)
    kept_lo = tl.maximum(p * mass, 1.0)
    kept_hi = tl.minimum(mass, tl.maximum(p * mass, 0.0) + 1.0)
    margin = MISS_MARGIN * mass
    u64 = u.to(tl.float64)
    below_t = u64 * kept_hi < below - (mass - kept_lo) - margin
    above_t = u64 * kept_lo >= below + e_d + margin
    return (e_d <= 0) | below_t | above_t


@triton.jit
def decide_filtered(temperature, top_p, u, x_max, finite, mass_all, k, want, count, use_k, use_p, packed):
    """The token of a top-k / top-p row from its `count` (<= BUF) candidates `packed` ([BUF]
    packed entries: `pack`, INT64_MIN past count), which in SPEC.md's order start with the
    row's min(count, want) best tokens (a prefix of the order). Resolved there when that
    prefix holds the whole top-k set, or (top-p alone) when its mass reaches top_p * S:
    every later token's C(r-1) is then >= the target. Otherwise UNDECIDED (`cut_select`
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
        token = search_candidates(packed, kept, x_max, temperature, u)
    return token
