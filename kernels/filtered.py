"""top-k / top-p rows: their pass (`filtered_lanes`), their bound and candidates
(`bound_and_collect`), then their token (`filtered_token`).

`filtered_lanes` reads the row once with per-lane accumulators
(`sampling_rule.lane_stats`): max, argmax, whether a logit is finite, the mass S
(top-p alone), and each lane's maximum. In `dflash_verify` that pass runs in the launch
that decides the light rows (its occupancy), which leaves the lanes in scratch
(`store_lanes`) for the FILTERED launch; `sample_rows` runs both halves in one program
(`filtered_pass`). The lane maxima bound the kept set from below, with no sort of the row:

- top-k (k <= lanes): the k-th largest lane maximum theta. k lanes hold a token with
  key >= theta, so the k-th best key is >= theta and every top-k token has key >= theta.
  A bound at the row's max (k or more tokens tie there, e.g. a row of one repeated logit)
  with no list: the k lowest indices holding it are the top-k set (`max_ties_token`). For
  k above the lanes, a sample of the row tells such a row (`sample_ties_at_max`); else, up
  to half the elements (`element_count`: 2048 at V = 151936, 4096 in `sample_rows`' bfloat16
  pass), the pass keeps each element's max too (`needs_elements`; an element is one place
  of the steps in one segment of the row, `element_chunk`: its tokens are its own), and the
  k-th largest of them bounds the same way (`element_bound`): no list (the collect reads
  whole lanes), but the select's first pass lists every token at or above it
  (`cut_select._thresholds`): the top-k set and the tokens that share its elements, where
  they fit the list one pass; above, no bound (the select).
- top-p alone: the tokens with key >= theta are a prefix of SPEC.md's order; once its
  mass reaches top_p * S, every later token has C(r-1) >= top_p * S and the nucleus lies
  inside. The largest lane maximum whose lane maxima's weights reach the target (1e-5
  margin) is such a bound, but a low one where boosted tokens share lanes (one hides
  the others): thousands of candidates. So the first try is the largest lane maximum
  whose lanes' whole masses reach the target (usually tens of candidates); if the
  collected mass falls short, the row is collected again at the true bound. Both are
  taken no higher than the 16th largest lane maximum (fewer second tries). Simulated on
  the benchmark's LLM-like rows (Gaussian body, 24 boosted tokens, V = 151936 bf16,
  T = 0.8, top-p 0.9; 1024 rows, 512 lanes): the lanes' masses reach the target by the
  3rd lane maximum in half the rows, the 11th in 99 %; at the 16th, 16 hot lanes on
  average and 7 rows in 1024 collected again (at the 64th, as before: 65 hot lanes, so 4x
  the collect's work, and 3 rows). A row collected again at a bound no lane maximum
  reaches (its lanes' maxima never reach the target: a nucleus wide in the body) takes
  every lane (no list, below: the select's passes decide it); with 512 lanes (8 KB steps)
  2900-4300 candidates, with 256 (the 4 KB steps of `dflash_verify`'s pass) up to ~2100
  (simulated, 2048 rows: `benchmarks/simulate_top_p_bounds.py`).

A second pass appends every finite token with key >= theta to the row's candidate
list, at slots taken with an atomic counter: no block-wide reduction or barrier per
step, and the order of the slots does not matter (the candidates are sorted afterwards).
It reads and computes only on the lanes whose maximum reaches theta: their (lane, step)
pairs, compacted (`collect`). Where half the lanes or more reach it (a top-p row collected
again at its lowest lane maximum), that would walk the whole row 16 bytes per thread at a
time in one program, which the whole FILTERED launch of `dflash_verify` would wait for:
`collect` leaves such a row without a list (count -1).

`filtered_token` is one dispatch: the small decision (`sampling_rule.decide_filtered`, up to
SMALL candidates sorted in registers, in the launch that collected them) where it settles the
row; a top-k row tied at its max, one walk (`max_ties_token`); else the sample select
(`cut_select`: the candidates, if the list holds them, are its first round), a bounded number
of passes whatever the row holds.
"""

import triton
import triton.language as tl

from .common import ordered_key, sanitize, unsigned_key, weight, weight_scale
from .cut_select import bit_length, coarse_key, listed_entries, packed_weights, select_begin
from .sampling_rule import (INT64_MAX, INT64_MIN, KEY_OFFSET, LANE_BITS, decide_filtered, filters, key_weight,
                            lanes_and_stats)
from .scratch import (HOT_WORDS, S_ARG, S_BOUND, S_COUNT, S_FINITE, S_MASS, S_X_MAX, UNDECIDED, hot_of,
                      load_f32, load_f64, store_stats)

SMALL = tl.constexpr(256)  # candidates sorted by the small decision (more: `cut_select`)
SAMPLE_RUNS = tl.constexpr(256)  # `sample_ties_at_max`: runs of one 16-byte load (a thread each at 8 warps)
MARGIN = tl.constexpr(1.00001)  # top-p bounds: aim this much above the target (rounding)
P_RANK = tl.constexpr(15)  # top-p: collect at least down to the 16th largest lane maximum
LANE_SHIFT = tl.constexpr(11)  # lane ranks packed under the lane keys in `threshold`'s sort (lanes <= 2048)
LANE_MASK = tl.constexpr(2047)
COLLECT_PAIRS = tl.constexpr(256)  # collect's (lane, step) pairs per iteration: one per thread at 8 warps


@triton.jit
def _rank_value(s, rank):
    """s[rank] of a 1-D tensor (a scalar rank)."""
    return tl.sum(tl.where(tl.arange(0, s.shape[0]) == rank, s, 0), 0)


@triton.jit
def threshold(lane_max, lane_mass, x_max, temperature, mass, top_k, top_p, use_k, use_p, scratch_ptr):
    """(first, second) unsigned key bounds of the module docstring (-1: none). top-k: the
    k-th largest lane maximum, twice. top-p: first from the lanes' masses, second from their
    maxima' weights (a true bound, lower); both at least the P_RANK-th lane maximum.
    scratch_ptr: LANES int64 words (the candidate list, before `collect` fills it) where
    top-p puts the lanes' masses in the order of their maxima."""
    LANES: tl.constexpr = lane_max.shape[0]
    tl.static_assert(LANES <= LANE_MASK + 1)
    r = tl.arange(0, LANES)
    live = lane_max > float("-inf")
    keys = tl.where(live, unsigned_key(sanitize(lane_max)), -1)
    ranked = tl.sort((keys << LANE_SHIFT) | r, 0, descending=True)  # (an empty lane: -1 after the shift back)
    s = ranked >> LANE_SHIFT
    lanes = tl.sum(live.to(tl.int32), 0)
    first = tl.zeros((), dtype=tl.int64) - 1
    second = tl.zeros((), dtype=tl.int64) - 1
    if use_k:
        first = tl.where(top_k <= LANES, _rank_value(s, top_k - 1), -1)  # -1 if that lane is empty
        second = first
    elif use_p:
        target = top_p.to(tl.float64) * mass * MARGIN
        reach = tl.cumsum(tl.where(s >= 0, key_weight(s, x_max, temperature), 0.0), 0) >= target
        bound_rank = tl.min(tl.where(reach, r, LANES), 0)  # LANES: never (all lanes, below)
        # The smallest rank whose lanes' whole masses reach the target: the lanes' masses in
        # the order of their maxima (through scratch: a gather), summed. (Lanes tied with the
        # rank where the sum crosses have the same key: the bound is that key either way.)
        lane_s = tl.where(live, lane_mass * weight(lane_max, x_max, temperature).to(tl.float64), 0.0)
        mass_ptr = scratch_ptr.to(tl.pointer_type(tl.float64))
        tl.store(mass_ptr + r, lane_s)
        tl.debug_barrier()  # stored by other threads
        by_rank = tl.load(mass_ptr + (ranked & LANE_MASK))
        lo = tl.min(tl.where(tl.cumsum(by_rank, 0) >= target, r, LANES - 1), 0)
        first = _rank_value(s, tl.minimum(tl.maximum(lo, P_RANK), lanes - 1))
        second = _rank_value(s, tl.minimum(tl.maximum(bound_rank, P_RANK), lanes - 1))
    return first, second


@triton.jit
def sample_ties_at_max(row_ptr, vocab, top_k, x_max):
    """For a top-k row whose k exceeds the lanes (no lane bound): the unsigned key of its max
    where a sample of the row says k tokens or more likely tie there, else -1. The sample:
    SAMPLE_RUNS runs of VEC consecutive tokens (one 16-byte load each), evenly spread, at least
    4 runs' length apart; with n points, about E = k n / V of them fall among k tokens, and it
    takes lo = E + 3 sqrt(E) + 2 points at the max. A false alarm costs a walk only:
    `max_ties_token` counts the tokens at the max, and the select decides a row with fewer."""
    VEC: tl.constexpr = LANE_BITS // row_ptr.dtype.element_ty.primitive_bitwidth
    runs = tl.minimum(vocab // (4 * VEC), SAMPLE_RUNS)
    stride = vocab // tl.maximum(runs, 1)
    r = tl.arange(0, SAMPLE_RUNS)
    offs = (r * stride)[:, None] + tl.arange(0, VEC)[None, :]
    x = sanitize(tl.load(row_ptr + offs, mask=(r < runs)[:, None], other=float("-inf")))
    top = sanitize(x_max)
    at_max = tl.sum(tl.sum(((x > float("-inf")) & (ordered_key(x) == ordered_key(top))).to(tl.int32), 1), 0)
    expect = top_k.to(tl.float32) * (runs * VEC).to(tl.float32) / vocab
    lo = tl.ceil(expect + 3.0 * tl.sqrt(expect) + 2.0).to(tl.int32)
    return tl.where((runs > 0) & (at_max >= lo), unsigned_key(top), -1)


@triton.jit
def max_ties_token(row_ptr, vocab, x_max, top_k, top_p, u, BLOCK: tl.constexpr):
    """The token of a top-k row whose bound is its max key, so that (`threshold`: k lanes hold
    it) at least k tokens hold the max: the top-k set is the k lowest indices holding it
    (SPEC.md step 3), each of weight exp(0) = 1. top-p keeps its first m = ceil(p k) (rank r
    stays iff C(r-1) = r < p k, rank 0 always), and step 7 (t = u m, the prefix of the i-th
    kept token i + 1) gives the (floor(t) + 1)-th of them: the same float64 products as the
    reference's. One walk in index order, BLOCK tokens a step, until the k-th token holding the
    max; UNDECIDED where the row ends first (a `sample_ties_at_max` bound promises no count).
    A row of one repeated logit takes one step where the select took its index splits."""
    k = top_k.to(tl.int32)  # (k < V <= 2^30: int32 counts and indices)
    kept = tl.where(top_p < 1.0, tl.ceil(top_p.to(tl.float64) * k.to(tl.float64)).to(tl.int32), k)
    m = tl.minimum(tl.maximum(kept, 1), k)
    j = (u.to(tl.float64) * m.to(tl.float64)).to(tl.int32)  # (t < m: u < 1; truncation is floor, t >= 0)
    key_max = ordered_key(sanitize(x_max))
    i = tl.arange(0, BLOCK)
    seen = tl.zeros((), dtype=tl.int32)
    token = tl.zeros((), dtype=tl.int32) + UNDECIDED
    start = tl.zeros((), dtype=tl.int32)
    while (start < vocab) & (seen < k):
        offs = start + i
        x = sanitize(tl.load(row_ptr + offs, mask=offs < vocab, other=float("-inf")))
        hit = (x > float("-inf")) & (ordered_key(x) == key_max)
        c = tl.sum(hit.to(tl.int32), 0)
        if (seen <= j) & (seen + c > j):  # (uniform over the program)
            ranks = seen + tl.cumsum(hit.to(tl.int32), 0)
            token = tl.min(tl.where(hit & (ranks == j + 1), offs, vocab), 0)
        seen += c
        start += BLOCK
    return tl.where(seen >= k, token, UNDECIDED).to(tl.int64)


@triton.jit
def collect(row_ptr, vocab, theta, lane_max, buf_ptr, count_ptr, BLOCK: tl.constexpr, BUF: tl.constexpr):
    """Append every finite token with unsigned key >= theta to the candidate list at buf_ptr
    (packed: `sampling_rule.pack`, 2 * BUF entries at most); returns their number (more than
    2 * BUF: only that many stored). Only the lanes whose maximum reaches theta
    (`lane_stats`' layout: lane l of step s holds the VEC logits from s * BLOCK + l * VEC)
    can hold one: the work is their (lane, step) pairs, compacted, COLLECT_PAIRS pairs of VEC
    logits per iteration (for top-k 50, ~50 hot lanes of 256: ~15 iterations instead of a
    pass of 74 steps that computes on every lane). Launch it with 8 warps: the iterations
    are latency-bound (a load, then an atomic per candidate), so the pairs per iteration
    set the time of a top-p row collected at a low bound, which walks its whole row this
    way (software pipelining of the loop ran slower; 2 pairs per thread took 252 registers on
    sm_90). A row where half the lanes or more reach theta gets no list (-1): the walk of its
    pairs would take as many iterations as one of the whole row (`cut_select` decides it)."""
    VEC: tl.constexpr = LANE_BITS // row_ptr.dtype.element_ty.primitive_bitwidth
    LANES: tl.constexpr = BLOCK // VEC
    tl.static_assert(LANES <= 2 * HOT_WORDS)
    hot_ptr = hot_of(buf_ptr, BUF).to(tl.pointer_type(tl.int32))  # the hot lanes' list: after the candidates
    lane = tl.arange(0, LANES)
    bound = (theta - KEY_OFFSET).to(tl.int32)
    hot = (lane_max > float("-inf")) & (ordered_key(sanitize(lane_max)) >= bound)
    n_hot = tl.sum(hot.to(tl.int32), 0)
    tl.store(hot_ptr + tl.cumsum(hot.to(tl.int32), 0) - 1, lane, mask=hot)
    tl.atomic_xchg(count_ptr, 0)
    tl.debug_barrier()  # the list is stored and the counter zero before any thread reads or appends
    PAIRS: tl.constexpr = LANES if LANES < COLLECT_PAIRS else COLLECT_PAIRS  # (lane, step) pairs per iteration
    counter = count_ptr.to(tl.pointer_type(tl.int32)) + tl.zeros((PAIRS, VEC), dtype=tl.int32)
    whole = 2 * n_hot >= LANES  # most lanes: as many iterations as a walk of the whole row
    pairs = tl.where(whole, 0, n_hot * tl.cdiv(vocab, BLOCK))
    per_step = tl.maximum(n_hot, 1)
    for base in range(0, pairs, PAIRS):
        i = base + tl.arange(0, PAIRS)
        live = i < pairs
        at = tl.load(hot_ptr + i % per_step, mask=live, other=0)
        offs = ((i // per_step) * BLOCK + at * VEC)[:, None] + tl.arange(0, VEC)[None, :]
        x = sanitize(tl.load(row_ptr + offs, mask=live[:, None] & (offs < vocab), other=float("-inf")))
        take = (x > float("-inf")) & (ordered_key(x) >= bound)
        slot = tl.atomic_add(counter, 1, mask=take, sem="relaxed")
        # packed as `sampling_rule.pack`: its two 32-bit halves apiece (little-endian), ~index below
        # the key (a 64-bit pack per logit left a 24-byte stack on sm_90)
        words = buf_ptr.to(tl.pointer_type(tl.int32)) + 2 * slot
        tl.store(words, ~offs, mask=take & (slot < 2 * BUF))
        tl.store(words + 1, ordered_key(x), mask=take & (slot < 2 * BUF))
    tl.debug_barrier()  # every append is done
    count = tl.atomic_add(count_ptr.to(tl.pointer_type(tl.int32)), 0).to(tl.int64)
    return tl.where(whole, -1, count)


@triton.jit
def _candidate_mass(buf_ptr, count, x_max, temperature):
    """The mass of `count` (<= 2 * BUF) collected candidates."""
    scale = weight_scale(temperature)
    total = tl.zeros((), dtype=tl.float64)
    for base in range(0, count, SMALL):
        i = base + tl.arange(0, SMALL)
        total += tl.sum(packed_weights(tl.load(buf_ptr + i, mask=i < count, other=INT64_MIN), x_max, scale), 0)
    return total


@triton.jit
def filtered_pass(row_ptr, vocab, temperature, top_k, top_p, buf_ptr, stats_ptr, BLOCK: tl.constexpr,
                  STAGES: tl.constexpr, BUF: tl.constexpr):
    """The HBM work of a filtered row in one program: `filtered_lanes`, then `bound_and_collect`."""
    lane_max, lane_mass, x_max, arg, finite, mass, elem_max = filtered_lanes(row_ptr, vocab, temperature, top_k,
                                                                             top_p, buf_ptr, BLOCK, STAGES, BUF)
    # Through scratch, as `dflash_verify`'s launches hand them over: the bound they give picks the
    # collect's slots, and a helper's result would count as a write to the row for torch's
    # mutation analysis (the package docstring).
    store_lanes(buf_ptr, lane_max, lane_mass, stats_ptr, x_max, arg, finite, mass, BUF, elem_max,
                needs_elements(top_k, top_p, vocab, lane_max.shape[0], BLOCK, BUF), vocab)
    tl.debug_barrier()  # stored by other threads
    lane_max, lane_mass, x_max, arg, finite, mass = load_lanes(buf_ptr, stats_ptr, lane_max.shape[0])
    bound_and_collect(row_ptr, vocab, temperature, top_k, top_p, lane_max, lane_mass, x_max, arg, finite, mass,
                      buf_ptr, stats_ptr, BLOCK, BUF)


@triton.jit
def filtered_lanes(row_ptr, vocab, temperature, top_k, top_p, buf_ptr, BLOCK: tl.constexpr, STAGES: tl.constexpr,
                   BUF: tl.constexpr):
    """A filtered row's pass: (lane maxima, lane masses, x_max, arg, lanes holding a finite logit,
    mass S). The mass only for top-p alone: with top-k, S_k is the top-k set's own (from its
    candidates), and `decide_filtered` never reads S there (`cut_select` sums what it needs).
    No finite count either (3 instructions per logit): `cut_select`'s passes count it where it
    is needed; `finite` > 0 iff the row has a finite logit.
    The element maxima for a top-k row whose k exceeds the lanes (`needs_elements`): all but the
    last segment's stored in buf_ptr's list as the pass goes (`store_lanes`' layout).
    (`verify_rows_kernel` runs the same `lanes_and_stats` in the launch that decides the light rows.)"""
    VEC: tl.constexpr = LANE_BITS // row_ptr.dtype.element_ty.primitive_bitwidth
    elems = needs_elements(top_k, top_p, vocab, BLOCK // VEC, BLOCK, BUF)
    lane_max, lane_mass, x_max, arg, finite, mass, _, elem_max = lanes_and_stats(
        row_ptr, vocab, temperature, -1, needs_mass(top_k, top_p, vocab), BLOCK, STAGES, 0, False,
        prefix_ptr=elements_of(buf_ptr, BLOCK // VEC), chunk=element_chunk(vocab, BLOCK, BUF), elems=elems,
        ELEMS=2 if BLOCK < BUF else 1)  # (segments: `element_count`)
    return lane_max, lane_mass, x_max, arg, finite, mass, elem_max


@triton.jit
def needs_mass(top_k, top_p, vocab):
    """Whether a filtered row's pass sums the mass S: only for top-p alone (`filtered_lanes`)."""
    use_k, _ = filters(top_k, top_p, vocab)
    return ~use_k


@triton.jit
def needs_elements(top_k, top_p, vocab, LANES: tl.constexpr, BLOCK: tl.constexpr, BUF: tl.constexpr):
    """Whether a filtered row's pass (BLOCK logits a step) keeps its element maxima (`lane_stats`'
    ELEMS): a top-k row whose k exceeds the lanes, up to half the elements (`element_count`).
    Nearer the elements the k-th largest maximum lies among the lowest, far below the cut, and
    the tokens above it overflow the list: at V = 151936 (the kernels in the interpreter, one
    row a kind, session 70) top-k 2000 of 2048 elements took 3 passes after the first on every
    kind, 2 without a bound (the select's bracket)."""
    use_k, _ = filters(top_k, top_p, vocab)
    return use_k & (top_k > LANES) & (2 * top_k <= element_count(BLOCK, BUF))


@triton.jit
def element_count(BLOCK: tl.constexpr, BUF: tl.constexpr):
    """The element maxima of a pass of BLOCK logits a step: BUF (half as many as the list holds
    tokens: 2048 at V = 151936), or BLOCK where a step holds more (`sample_rows`' bfloat16 pass:
    4096), so a row's steps fall in BUF // BLOCK segments or one (`element_chunk`). More
    elements make the k-th largest maximum a closer bound: at top-k 1000 on every row kind at
    V = 151936 (session 70, a CPU count), the tokens at or above it in float32's 1024 elements
    of a whole row up to ~6200 on rows of many ties, more than the list holds (4096), in 2048
    ~1900. 4096 (two segments in bfloat16) cost its top-k 1000 rows ~0.2x of the floor in the
    row launches (the FILTERED launch's `element_bound` over twice the maxima) for lists that
    fit already (H100, session 70). A runtime value (`element_bound` takes it as a constexpr)."""
    return tl.full((), BUF if BLOCK < BUF else BLOCK, tl.int32)


@triton.jit
def element_chunk(vocab, BLOCK: tl.constexpr, BUF: tl.constexpr):
    """The logits of each segment of a row whose pass keeps its element maxima (`element_count`):
    its steps split evenly, the last segment shorter; each element the tokens of one place of
    the steps within one segment."""
    return tl.cdiv(tl.cdiv(vocab, BLOCK), element_count(BLOCK, BUF) // BLOCK) * BLOCK


@triton.jit
def elements_of(buf_ptr, LANES: tl.constexpr):
    """The element maxima's words in a filtered row's list (`store_lanes`): after the lanes'."""
    return buf_ptr + LANES + LANES // 2


@triton.jit
def store_lanes(buf_ptr, lane_max, lane_mass, stats_ptr, x_max, arg, finite, mass, BUF: tl.constexpr, elem_max,
                elems, vocab):
    """A filtered row's pass results, for `bound_and_collect` in a later launch: the lane
    masses (float64) at words [0, LANES) of its candidate list, the lane maxima (float32) at
    words [LANES, 1.5 LANES), with `elems` the element maxima (float32, `element_count`) after
    them: the pass stored each segment's but the last (`element_chunk`), the last segment's are
    elem_max, and any segment past the row's holds -inf (`load_lanes` and `element_bound` read
    them before `bound_and_collect` overwrites the list); the row's stats in its STATS words
    (`scratch.store_stats`)."""
    LANES: tl.constexpr = lane_max.shape[0]
    BLOCK: tl.constexpr = elem_max.shape[0] * elem_max.shape[1]
    tl.static_assert(3 * LANES + BLOCK <= 4 * BUF)  # the 1.5 LANES + `element_count` / 2 words fit the
    tl.static_assert(3 * LANES + BUF <= 4 * BUF)  # 2 * BUF of the list
    r = tl.arange(0, LANES)
    tl.store(buf_ptr.to(tl.pointer_type(tl.float64)) + r, lane_mass)
    tl.store((buf_ptr + LANES).to(tl.pointer_type(tl.float32)) + r, lane_max)
    if elems:
        at = tl.arange(0, elem_max.shape[0])[:, None] * elem_max.shape[1] + tl.arange(0, elem_max.shape[1])[None, :]
        last = tl.cdiv(vocab, element_chunk(vocab, BLOCK, BUF)) - 1  # (the segments the pass stored)
        maxima = elements_of(buf_ptr, LANES).to(tl.pointer_type(tl.float32))
        tl.store(maxima + last * BLOCK + at, elem_max)
        for s in range(last + 1, element_count(BLOCK, BUF) // BLOCK):
            tl.store(maxima + s * BLOCK + at, tl.full(elem_max.shape, float("-inf"), tl.float32))
    store_stats(stats_ptr, tl.zeros((), dtype=tl.int64) - 1, x_max, arg, finite, mass)


@triton.jit
def element_bound(buf_ptr, top_k, LANES: tl.constexpr, E: tl.constexpr, KEY_SHIFT: tl.constexpr):
    """The unsigned key of the k-th largest of `store_lanes`' E element maxima (-1 where fewer
    than k of them are finite): each is a distinct token's logit (an element's tokens are its
    own), so k tokens have a key at or above it, and so does every top-k token. By binary
    lifting over the maxima's codes (`cut_select.coarse_key`: the KEY_SHIFT low bits the row's
    dtype leaves constant dropped) less the smallest: one count over the E maxima a bit of the
    codes' range (at most 16 in a 16-bit dtype, ~8-10 on LLM rows whose maxima share a sign;
    32 before), then the key of that code."""
    maxima = elements_of(buf_ptr, LANES).to(tl.pointer_type(tl.float32)) + tl.arange(0, E)
    x = sanitize(tl.load(maxima))
    finite = x > float("-inf")
    n_finite = tl.sum(finite.to(tl.int32), 0)
    codes = tl.where(finite, coarse_key(ordered_key(x), KEY_SHIFT), -2147483648)  # (int32: no finite code is the least)
    hi = tl.max(codes, 0).to(tl.int64)
    lo = tl.min(tl.where(finite, codes, 2147483647), 0).to(tl.int64)
    nbits = bit_length(hi - lo)
    k = top_k.to(tl.int32)
    d = tl.zeros((), dtype=tl.int64)  # (every finite code is at or above lo + 0: at least k of them, or no bound)
    for i in range(0, nbits):
        cand = d | (tl.full((), 1, tl.int64) << (nbits - 1 - i))
        at = tl.minimum(lo + cand, 2147483647).to(tl.int32)  # (past every code where lo + cand is not an int32)
        d = tl.where(tl.sum((codes >= at).to(tl.int32), 0) >= k, cand, d)
    x = sanitize(tl.load(maxima))  # (read again: only the codes were live across the lifting)
    key = tl.max(tl.where(codes == (lo + d).to(tl.int32), unsigned_key(x), -1), 0)  # (one key a code)
    return tl.where(n_finite >= k, key, -1)


@triton.jit
def load_lanes(buf_ptr, stats_ptr, LANES: tl.constexpr):
    """`store_lanes`' (lane maxima, lane masses, x_max, arg, finite, mass)."""
    r = tl.arange(0, LANES)
    lane_mass = tl.load(buf_ptr.to(tl.pointer_type(tl.float64)) + r)
    lane_max = tl.load((buf_ptr + LANES).to(tl.pointer_type(tl.float32)) + r)
    x_max = load_f32(stats_ptr + S_X_MAX)
    mass = load_f64(stats_ptr + S_MASS)
    arg = tl.load(stats_ptr + S_ARG)
    finite = tl.load(stats_ptr + S_FINITE)
    tl.debug_barrier()  # every thread has loaded before `threshold` and `collect` overwrite the list
    return lane_max, lane_mass, x_max, arg, finite, mass


@triton.jit
def bound_and_collect(row_ptr, vocab, temperature, top_k, top_p, lane_max, lane_mass, x_max, arg, finite, mass,
                      buf_ptr, stats_ptr, BLOCK: tl.constexpr, BUF: tl.constexpr):
    """The bound (`threshold`) and the candidates (`collect`) of a filtered row from its pass
    (`filtered_lanes`, BLOCK its step); stores (count or -1 without a bound, x_max, arg,
    finite, mass) at stats_ptr for `filtered_token`. A top-p row whose first candidates
    fall short of the target is collected again at the second, lower bound. A top-k row whose
    k exceeds the lanes has no list: its bound is its max where a sample says k tokens tie
    there (`sample_ties_at_max`; `max_ties_token` decides it), else the k-th largest element
    maximum up to the elements (`element_bound`: the select's first pass lists the tokens at or
    above it), else none (the select)."""
    LANES: tl.constexpr = lane_max.shape[0]
    DT: tl.constexpr = row_ptr.dtype.element_ty
    VEC: tl.constexpr = LANE_BITS // DT.primitive_bitwidth
    KEY_SHIFT: tl.constexpr = 16 if DT == tl.bfloat16 else 13 if DT == tl.float16 else 0  # (`cut_select.coarse_key`)
    use_k, use_p = filters(top_k, top_p, vocab)
    first, second = threshold(lane_max, lane_mass, x_max, temperature, mass, top_k, top_p, use_k, use_p, buf_ptr)
    above_lanes = use_k & (top_k > LANES)
    if above_lanes & (finite > 0):
        # through scratch: a bound picks the collect's slots (the package docstring's rule)
        ties = sample_ties_at_max(row_ptr, vocab, top_k, x_max)
        if (ties < 0) & needs_elements(top_k, top_p, vocab, LANES, LANES * VEC, BUF):
            ELEMENTS: tl.constexpr = BUF if LANES * VEC < BUF else LANES * VEC  # (`element_count`)
            ties = element_bound(buf_ptr, top_k, LANES, ELEMENTS, KEY_SHIFT)
        tl.store(stats_ptr + S_BOUND, ties)
        tl.debug_barrier()  # stored by other threads
        first = tl.load(stats_ptr + S_BOUND)
    count = tl.zeros((), dtype=tl.int64) - 1
    theta = tl.where((first >= 0) & (finite > 0), first, -1)
    tl.store(stats_ptr + S_BOUND, theta)
    theta = tl.where(above_lanes, -1, theta)  # (a bound at the max, or from the elements: no list)
    while theta >= 0:  # at most twice (one copy of the collect loop: registers)
        count = collect(row_ptr, vocab, theta, lane_max, buf_ptr, stats_ptr, BLOCK, BUF)
        tl.store(stats_ptr + S_BOUND, theta)  # the list's bound, for `cut_select`
        retry = (second < theta) & (count >= 0) & (count <= 2 * BUF)  # top-p only (an overflow would only grow)
        if retry:
            retry = _candidate_mass(buf_ptr, count, x_max, temperature) < top_p.to(tl.float64) * mass
        theta = tl.where(retry, second, -1)
    store_stats(stats_ptr, count, x_max, arg, finite, mass)


@triton.jit
def filtered_token(row_ptr, vocab, temperature, top_k, top_p, u, buf_ptr, stats_ptr, BLOCK: tl.constexpr,
                   BUF: tl.constexpr, SMALL_DECISION: tl.constexpr, SELECT: tl.constexpr):
    """The token of a filtered row (-1 without a finite logit) from `bound_and_collect`'s results:
    SMALL_DECISION, the decision from <= SMALL candidates (a few registers per thread); a top-k
    row whose bound is its max and whose candidates are no list, from the tokens tied at the
    max (`max_ties_token`). A row these do not settle is UNDECIDED; with SELECT it enters the
    sample select (`cut_select.select_begin`: the caller's `select_rounds` and later launches
    decide it)."""
    use_k, use_p = filters(top_k, top_p, vocab)
    tl.debug_barrier()  # (the stats were stored by other threads of this program)
    count = tl.load(stats_ptr + S_COUNT)
    x_max = load_f32(stats_ptr + S_X_MAX)
    finite = tl.load(stats_ptr + S_FINITE)
    mass = load_f64(stats_ptr + S_MASS)
    token = tl.zeros((), dtype=tl.int64) - 1
    if finite > 0:  # (lanes holding a finite logit: not the count of finite logits)
        token = tl.zeros((), dtype=tl.int64) + UNDECIDED
        if SMALL_DECISION:
            # The candidates are every token at or above the bound, a prefix of the order: with
            # top-k and a bound, k lanes hold a finite logit, so the top-k set has exactly k tokens
            # (V stands in for the finite count); for top-p alone V only makes the candidates count
            # as the whole row when they are all V tokens.
            if (count >= 0) & (count <= SMALL) & (count <= 2 * BUF):  # (BUF < SMALL with test overrides)
                k = tl.where(use_k, top_k, vocab).to(tl.int64)
                token = decide_filtered(temperature, top_p, u, x_max, vocab, mass, k, k, count, use_k, use_p,
                                        listed_entries(buf_ptr, count, INT64_MIN, INT64_MAX, SMALL))
        # a top-k bound at the max with no list that holds the cut: k tokens or more tie at the max
        bound = tl.load(stats_ptr + S_BOUND)
        at_max = use_k & (bound == unsigned_key(sanitize(x_max)))
        if (token == UNDECIDED) & at_max & ((count < 0) | (count > 2 * BUF)):
            token = max_ties_token(row_ptr, vocab, x_max, top_k, top_p, u, BLOCK)
        if SELECT:
            if token == UNDECIDED:  # the sample select: its first rounds follow in this program (`select_rounds`)
                select_begin(vocab, top_k, top_p, mass, count, bound, stats_ptr, BUF)
    return token
