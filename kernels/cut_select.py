"""The token of a top-k / top-p row that its candidates do not settle, in a bounded number of
passes over the row: the sample select (issue #25; designed and simulated in
`benchmarks/simulate_sample_select.py`).

It runs after the row's first pass (which gave x_max and, for top-p alone, S), in six
launches that each head makes in this order (`sample_rows`: its FILTERED launch begins), the
row's stage in its scratch (`S_PHASE`):
- *begin* (one program takes a few rows in turn): the row enters (`select_begin`), then its
  rounds (`select_rounds`) until one wants a pass;
- *pass* (light items, taken in turn by a fixed set of programs): each reads a span of the
  row's SELECT_SPLITS parts (`select_pass_part`; the span from how many rows there are:
  `pass_span_bits`); the next launch sums the spans (`_fold_parts`);
- *rounds* (likewise): the pass folded in, then the rounds until the cut is found or another
  pass is wanted; then *pass* and *rounds* again, the last rounds reading any further pass in
  this program itself (so the bound below holds within the launches): a row that wants a
  second pass (a top-p row whose bracket missed the cut, a list that overflowed) reads it split
  over the GPU, not in one program an SM (top-p worst 4.3-4.9x -> 3.5-4.3x the floor, H100,
  benchmarks/HISTORY.md, session 70);
- *search* (one light program a row): step 7 by a pass (`select_search`), where the list
  does not hold the kept set.
The rounds (~250 registers: one 8-warp program an SM; `verify.GROUP` rows a program in
`dflash_verify`) select in the list without sorting it (`_descend`, below); the passes run at
4 warps and ~110 registers, 4 programs an SM, and split a row over the GPU when rows are few
(`sample_rows`). A pass's time is not its instructions alone: halving the count pass's cut its
launch by a quarter, 3 steps in flight instead of 1 another sixth (5 gained nothing more), and
each item pays its state's loads, its pipeline's fill and its sums: whole rows an item where
the rows are many cut the launch by an eighth (benchmarks/HISTORY.md, sessions 68-69).

The cuts are found in SPEC.md's order, each token packed as (key, index)
(`sampling_rule.pack`: descending is the order, ties at the cut in index order included), so
"above a threshold" is one int64 compare. A *region* (bot, top] of packed values is known
to hold the cut, with the exact count and mass of the tokens above each end.

- A list round: the row's candidate list (`filtered.collect`'s, or the last pass's), every
  token of a range (lo, hi] of the order, in no order. If the cut is inside, it is exact there
  (the ranks and masses above hi are exact: `_list_cut`); otherwise the range's two ends narrow
  the region. No pass.
- A pass round: LIST points of the row (`_store_sample`: runs of RUN tokens spread evenly over
  the row) that fall inside the region estimate where the cut falls (each point stands
  for the region's tokens over its points; top-p: with its own weight, and the region's
  mass that the points miss is put at its top, where the heavy tokens are); then one pass
  over the row (`_threshold_pass`) counts and sums exactly above 4 thresholds: the points
  `half` places either side of the estimate (the bracket, about FILL x LIST tokens) and
  GUARD x `half` places out; it stores the bracket's tokens in the list. If the bracket
  held the cut, the next round is a list round; else the thresholds narrow the region.
  (A count goal whose list starts at the row's top, top-k's first pass from an element bound,
  has a pass of its own that weighs nothing: `_count_pass`, by `_row_pass`.)
  After BRACKETS such passes in a row, or where fewer than MIN_POINTS points fall in the
  region, the 4 thresholds split the region's range of keys in 5 equal parts instead (a
  region of one key: its range of indices), and a region of at most LIST tokens is listed
  whole.
- top-k + top-p: the top-k cut first, then the top-p cut inside the top-k set (S_k exact
  from the top-k cut's list), first in the same list, in the same round.
- Step 7: from the list when it holds the whole kept set (`_index_search`), else one pass over
  the row in index order (`_search_pass`).

Nothing is sorted: each order statistic a round needs (the cut in a list, the estimate's
points, step 7's index) is the largest code whose sum from the top reaches a goal, found by
binary lifting over the tokens' codes with one block-wide reduction a bit (`_descend`; a
4096-entry sort cost several times that: benchmarks/RESULTS.md). A descent needs the key codes'
bits only (`_key_codes`: as few as the keys span, ~16 at most in bfloat16), then the place
among one key's tokens, which weigh the same: in the list (in no order) a count, a min or max
of their indices, or, strictly inside a run of ties, a descent over those indices
(`_list_cut`); among the sample's points (in index order by slot) a count or one scan
(`_estimate`, `_within_key`); the estimate's four ranks share each bit's reduction
(`_descend_ranks`). Step 7 in the list descends over the indices (`_index_search`).
The search's state lives in the row's scratch record between rounds and launches (`scratch`:
the region, the goal, the list, the cut, the stage), the list is read from scratch where it is
used, so little is live across a descent, and the launches compile for sm_90 without a stack
frame.

The bound, passes over the row after its first: at most BRACKETS bracket passes a row; per cut,
at most 14 key splits (32-bit keys, each pass leaves a fifth of the key range: 5^14 > 2^32),
ceil(log5(V / LIST)) index splits (a region of one key) and one pass that lists the region;
then step 7. At V = 151936 and LIST = 4096: 3 + 2 x (14 + 3 + 1) + 1 = 40 for top-k + top-p,
22 for one cut. The kernel counts its passes in the row's stats (`scratch.S_PASSES`): the
tests check the bound, and `benchmarks/count_select_passes.py` counts them at V = 151936 on
every row kind and mode (at most 2 after the first, step 7 included; benchmarks/HISTORY.md,
session 48).

Tokens are SPEC.md's: the cut decisions compare exact counts, and float64 masses summed per
lane (16-byte lanes of float32 weights, as `sampling_rule.lane_stats`) or over the list's
tokens (float32 weights summed in float64): sums in another order, SPEC.md's legal difference.
"""

import triton
import triton.language as tl

from .common import FLT_MAX, key_value, ordered_key, sanitize, scaled_weight, weight_scale
from .sampling_rule import INT64_MAX, INT64_MIN, KEY_OFFSET, LANE_BITS, filters, pack, pack_key
from .scratch import (PH_PASS, PH_ROUNDS, PH_SEARCH, S_BOUND, S_BRACKETS, S_COUNT, S_FILL, S_FINITE_N, S_HAVE_LIST,
                      S_LIST_N, S_LIST_PARTS, S_PASSES, S_PHASE, S_SEARCH_LO, S_SEARCH_PREFIX, S_THRESHOLDS,
                      SELECT_SPLITS, UNDECIDED, clear_parts, f64_word, load_cut, load_f64, load_goal, load_list,
                      load_parts, load_parts_mass_above, load_region, part_of, store_cut, store_goal, store_list,
                      store_part, store_region)

RUN = tl.constexpr(8)  # consecutive tokens per run of a sample of >= RUN_POINTS: a 32-byte sector of bf16 logits
RUN_POINTS = tl.constexpr(1024)  # (smaller samples, test sizes: single tokens, as a bracket spans few points)
FILL = tl.constexpr(0.8)  # a bracket's expected tokens, a fraction of the list
GUARD = tl.constexpr(4)  # the guard thresholds: this many bracket half-widths from the estimate
MIN_POINTS = tl.constexpr(4)  # fewer sample points than this in the region: split it instead
BRACKETS = tl.constexpr(3)  # bracket passes per row before the splits
ROUNDS = tl.constexpr(160)  # a guard on the loop (the bound above is far below: never reached)
PASS_STAGES = tl.constexpr(4)  # async-copy stages of the pass launch's passes: 3 steps in flight a program (at 2,
# the count pass took ~20% longer and top-p rows ~5%; 8 gained nothing more: benchmarks/HISTORY.md, session 68)
SEARCH_STEPS = tl.constexpr(8)  # pass steps per chunk of `_search_pass` (one block-wide reduction each)
# the stages of the select, one a launch (each head's select kernel takes one as STAGE)
SELECT_BEGIN = tl.constexpr(0)  # a row enters the select (`select_begin`), then its first rounds
SELECT_ROUNDS = tl.constexpr(1)  # `select_rounds`
SELECT_PASS = tl.constexpr(2)  # `select_pass_part`, up to SELECT_SPLITS items a row
SELECT_SEARCH = tl.constexpr(3)  # `select_search`
SPLIT_BITS = tl.constexpr(4)  # log2(SELECT_SPLITS): `_search_start`'s lifting steps
assert 1 << SPLIT_BITS.value == SELECT_SPLITS.value
PASS_FIXED = tl.constexpr(1)  # what a pass item costs besides its reads, in parts' reads (`pass_span_bits`)
PASS_LANES = tl.constexpr(256)  # lanes of a pass step (4 KB of logits: a lane a thread at 8 warps)
SAMPLE_CHUNK = tl.constexpr(1024)  # sample points gathered per step (`_store_sample`: independent loads)
LOW_BITS = tl.constexpr(4294967295)  # the packed index part: 0xFFFFFFFF - index
FLT_MAX_KEY = tl.constexpr(2139095039)  # ordered_key(FLT_MAX): 0x7F7FFFFF


@triton.jit
def listed_entries(list_ptr, n, lo, hi, N: tl.constexpr):
    """The first N slots of a list of packed tokens: its first n entries, those in (lo, hi] only;
    INT64_MIN elsewhere."""
    i = tl.arange(0, N)
    tl.debug_barrier()  # (the list was stored by other threads)
    p = tl.load(list_ptr + i, mask=i < n, other=INT64_MIN)
    return tl.where((p > lo) & (p <= hi), p, INT64_MIN)


@triton.jit
def _store_sample(row_ptr, vocab, list_ptr, N: tl.constexpr):
    """The sample, into the list's N slots, packed (INT64_MIN for a NaN or -inf logit): N tokens
    in N / R runs of R consecutive ones (R = RUN, or 1 below RUN_POINTS points), the runs evenly
    spread over the row (V > N here: the runs do not overlap)."""
    R: tl.constexpr = RUN if N >= RUN_POINTS else 1
    C: tl.constexpr = SAMPLE_CHUNK if SAMPLE_CHUNK < N else N
    stride = (tl.zeros((), dtype=tl.float32) + vocab) / (N // R)  # (float: an int64 division per element is a
    # software routine on the GPU, heavy in registers)
    tl.debug_barrier()  # (every thread has read the list before it is overwritten)
    for base in range(0, N, C):  # (SAMPLE_CHUNK at a time: a gather's addresses take registers per element)
        i = base + tl.arange(0, C)
        index = ((i // R).to(tl.float32) * stride).to(tl.int32) + i % R
        x = sanitize(tl.load(row_ptr + index, mask=index < vocab, other=float("-inf")))
        tl.store(list_ptr + i, tl.where(x > float("-inf"), pack(x, index), INT64_MIN))


@triton.jit
def packed_index(p):
    """The vocabulary index of packed tokens (`sampling_rule.pack`'s low 32 bits, 0xFFFFFFFF - index)."""
    return (p & LOW_BITS) ^ LOW_BITS


@triton.jit
def weights32(p, x_max, scale):
    """float32 weights of packed tokens (0 for INT64_MIN); scale: `common.weight_scale`."""
    e = scaled_weight(key_value((p >> 32).to(tl.int32)), x_max, scale)
    return tl.where(p != INT64_MIN, e, 0.0)


@triton.jit
def packed_weights(p, x_max, scale):
    """`weights32` as float64 (what the masses sum)."""
    return weights32(p, x_max, scale).to(tl.float64)


@triton.jit
def _holds_cut(t, above_n, above_m, goal, by_mass, n_finite):
    """Whether the cut is at or below threshold t: some token is at or below t (fewer than the
    row's n_finite above it) and the first of them is kept, from the exact count and mass of
    the tokens above t. INT64_MAX is above every token, INT64_MIN below every one."""
    kept = tl.where(by_mass, (above_m < goal) | (above_n == 0), above_n.to(tl.float64) < goal)
    return (t == INT64_MAX) | ((t != INT64_MIN) & (above_n < n_finite) & kept)


@triton.jit
def _lowest_inf():
    """The packed value of a -inf logit at index 0, the highest of any -inf token: the passes
    raise their thresholds to it, so that no -inf token is above one."""
    return pack_key(ordered_key(tl.full((), float("-inf"), tl.float32)), tl.zeros((), dtype=tl.int32))


@triton.jit
def _claim(member, fill_ptr):
    """Each lane's first slot for a step's listed tokens (member, [LANES, VEC]): one atomic add
    on the fill word a lane that lists any (`_threshold_pass`). int32 (a slot is below V): the
    slots' addresses, bounds and increments in 32 bits (the count pass's step, bf16: 227 -> 214
    SASS instructions)."""
    claimed = tl.sum(member.to(tl.int32), 1)
    return tl.atomic_add(fill_ptr + tl.zeros_like(claimed), claimed, mask=claimed > 0, sem="relaxed").to(tl.int32)


@triton.jit
def _scatter(p, member, at, list_ptr, LIST: tl.constexpr):
    """A step's listed tokens (packed p where member, [LANES, VEC]) stored from each lane's claimed
    slot at (`_claim`), the first LIST slots only."""
    VEC: tl.constexpr = p.shape[1]
    column = tl.arange(0, VEC)[None, :]
    for v in tl.static_range(VEC):  # (one lane's register v each: no layout of its own for the scattered stores)
        m_v = tl.sum(tl.where(column == v, member, False).to(tl.int32), 1) > 0
        tl.store(list_ptr + at, tl.sum(tl.where(column == v, p, 0), 1), mask=m_v & (at < LIST))
        at += m_v.to(at.dtype)


@triton.jit
def _store_members(p, member, fill_ptr, list_ptr, LIST: tl.constexpr):
    """A pass step's listed tokens (packed p where member, [LANES, VEC]) stored in the list: each
    lane claims its slots (`_claim`), the first LIST claimed stored (`_scatter`)."""
    _scatter(p, member, _claim(member, fill_ptr), list_ptr, LIST)


@triton.jit
def _threshold_step(row_ptr, offs, hi, x_max, scale, t0, t1, t2, t3, fill_ptr, list_ptr, n0, n1, n2, n3, nf, m0, m1,
                    m2, m3, mf, low, LIST: tl.constexpr, MASKED: tl.constexpr):
    """One step of `_threshold_pass`: its accumulators, updated (a step whole inside the range
    loads without a mask; MASKED: the logits below hi only)."""
    if MASKED:
        x = sanitize(tl.load(row_ptr + offs, mask=offs < hi, other=float("-inf")))
    else:
        x = sanitize(tl.load(row_ptr + offs))
    key = ordered_key(x)
    p = pack_key(key, offs)  # (-inf above no threshold: `_threshold_pass` raised them)
    w = scaled_weight(x, x_max, scale)  # (0 for -inf)
    a0 = p > t0
    a1 = p > t1
    a2 = p > t2
    a3 = p > t3
    n0 += tl.sum(a0.to(tl.int32), 1)
    n1 += tl.sum(a1.to(tl.int32), 1)
    n2 += tl.sum(a2.to(tl.int32), 1)
    n3 += tl.sum(a3.to(tl.int32), 1)
    nf += tl.sum((x > float("-inf")).to(tl.int32), 1)
    m0 += tl.sum(tl.where(a0, w, 0.0), 1).to(tl.float64)
    m1 += tl.sum(tl.where(a1, w, 0.0), 1).to(tl.float64)
    m2 += tl.sum(tl.where(a2, w, 0.0), 1).to(tl.float64)
    m3 += tl.sum(tl.where(a3, w, 0.0), 1).to(tl.float64)
    mf += tl.sum(w, 1).to(tl.float64)
    low = tl.minimum(low, tl.min(tl.where(x > float("-inf"), key, 2147483647), 1))
    _store_members(p, a2 & ~a1, fill_ptr, list_ptr, LIST)
    return n0, n1, n2, n3, nf, m0, m1, m2, m3, mf, low


@triton.jit
def _threshold_pass(row_ptr, lo, hi, x_max, scale, stats_ptr, list_ptr, LIST: tl.constexpr, LANES: tl.constexpr,
                    STAGES: tl.constexpr):
    """One pass over the row's logits [lo, hi): for each of the 4 packed thresholds in the row's stats
    (S_THRESHOLDS, descending), the count and mass of the finite tokens above it; the
    tokens between thresholds 2 and 1 (t2 < p <= t1) stored in the list (the first LIST to
    claim a slot, in no order: each lane claims its slots with an atomic add on S_FILL, so the
    loop has no block-wide reduction or scan). Returns ([4] counts, [4] masses, a packed value just
    above none and at or below every finite token (key << 32; INT64_MAX for none), the row's
    finite tokens and their mass).

    Few instructions per logit, as `sampling_rule.lane_stats` (~61 SASS instructions a logit on
    sm_90, ~3x its memory time at the H100's issue rate): LANES lanes of VEC logits a step (16
    bytes, one thread each), every per-lane sum inside its thread (VEC float32 weights summed,
    then widened once a lane and step), 4 thresholds as 4 scalars (a [lanes, VEC, 4] tensor
    spread them over threads: ~250 instructions a logit on sm_90), steps whole inside the row
    without a mask,
    the thresholds raised to at least every -inf token's packed value (the same finite
    tokens above each; no -inf above any). The thresholds come from scratch: they pick the
    list's slots (the package docstring's rule for torch's mutation analysis)."""
    VEC: tl.constexpr = LANE_BITS // row_ptr.dtype.element_ty.primitive_bitwidth
    STEP: tl.constexpr = LANES * VEC
    DEPTH: tl.constexpr = STAGES if row_ptr.dtype.element_ty == tl.bfloat16 else 2  # (float16 and float32: ptxas
    # gives the pass launch a stack frame at 3 stages or more)
    lowest_inf = _lowest_inf()
    t0 = tl.maximum(tl.load(stats_ptr + S_THRESHOLDS), lowest_inf)
    t1 = tl.maximum(tl.load(stats_ptr + S_THRESHOLDS + 1), lowest_inf)
    t2 = tl.maximum(tl.load(stats_ptr + S_THRESHOLDS + 2), lowest_inf)
    t3 = tl.maximum(tl.load(stats_ptr + S_THRESHOLDS + 3), lowest_inf)
    grid = tl.arange(0, LANES)[:, None] * VEC + tl.arange(0, VEC)[None, :]
    n0 = tl.zeros((LANES,), dtype=tl.int32)
    n1 = tl.zeros((LANES,), dtype=tl.int32)
    n2 = tl.zeros((LANES,), dtype=tl.int32)
    n3 = tl.zeros((LANES,), dtype=tl.int32)
    nf = tl.zeros((LANES,), dtype=tl.int32)
    m0 = tl.zeros((LANES,), dtype=tl.float64)
    m1 = tl.zeros((LANES,), dtype=tl.float64)
    m2 = tl.zeros((LANES,), dtype=tl.float64)
    m3 = tl.zeros((LANES,), dtype=tl.float64)
    mf = tl.zeros((LANES,), dtype=tl.float64)
    low = tl.full((LANES,), 2147483647, dtype=tl.int32)
    fill = stats_ptr + S_FILL
    whole = lo + (hi - lo) // STEP * STEP
    for start in tl.range(lo, whole, STEP, num_stages=DEPTH):
        n0, n1, n2, n3, nf, m0, m1, m2, m3, mf, low = _threshold_step(
            row_ptr, start + grid, hi, x_max, scale, t0, t1, t2, t3, fill, list_ptr, n0, n1, n2, n3, nf, m0, m1,
            m2, m3, mf, low, LIST, False)
    if whole < hi:
        n0, n1, n2, n3, nf, m0, m1, m2, m3, mf, low = _threshold_step(
            row_ptr, whole + grid, hi, x_max, scale, t0, t1, t2, t3, fill, list_ptr, n0, n1, n2, n3, nf, m0, m1,
            m2, m3, mf, low, LIST, True)
    q = tl.arange(0, 4)
    above_n = tl.where(q == 0, tl.sum(n0, 0), tl.where(q == 1, tl.sum(n1, 0),
                                                        tl.where(q == 2, tl.sum(n2, 0), tl.sum(n3, 0))))
    above_m = tl.where(q == 0, tl.sum(m0, 0), tl.where(q == 1, tl.sum(m1, 0),
                                                        tl.where(q == 2, tl.sum(m2, 0), tl.sum(m3, 0))))
    n_finite = tl.sum(nf, 0)
    lowest = tl.where(n_finite > 0, tl.min(low, 0).to(tl.int64) << 32, INT64_MAX)
    return above_n.to(tl.int64), above_m, lowest, n_finite.to(tl.int64), tl.sum(mf, 0)


@triton.jit
def _listed_key(x, offs):
    """The packed tokens of raw float32 logits x at offs, as the list holds them: sanitized
    (+inf as FLT_MAX, -0 as +0; NaN's key, as no token listed, any)."""
    return pack_key(ordered_key(tl.minimum(x, FLT_MAX, propagate_nan=tl.PropagateNan.ALL) + 0.0), offs)


@triton.jit
def _tally(x, member, n, nf, low, FINITE: tl.constexpr):
    """A count-pass step's accumulators, updated from its float32 logits x and its tokens above t
    (member): the count above t; FINITE: the finite count and the lowest finite logit too."""
    n += tl.sum(member.to(tl.int32), 1)
    if FINITE:
        finite = x > float("-inf")  # (not NaN)
        nf += tl.sum(finite.to(tl.int32), 1)
        low = tl.minimum(low, tl.min(tl.where(finite, x, float("inf")), 1))
    return n, nf, low


@triton.jit
def _step_threshold(start, lim, x_at, x_above, STEP: tl.constexpr):
    """The float a count-pass step's logits compare with (`_count_pass`): x_at for a step whole
    below the tie index lim, x_above for one at or above it, NaN (no token above) for the step
    that straddles it."""
    return tl.where(lim >= start + STEP, x_at, tl.where(lim <= start, x_above, float("nan")))


@triton.jit
def _count_step(row_ptr, start, grid, hi, xs, xt, lim, fill_ptr, list_ptr, n, nf, low, LIST: tl.constexpr,
                MASKED: tl.constexpr, TIES: tl.constexpr, FINITE: tl.constexpr):
    """One step of `_count_pass` over the logits start + grid, its tokens stored at once: its
    accumulators, updated. A token is above t where its logit is above xs (the step's own
    threshold: `_count_pass`); TIES, where above t's logit xt or equal to it below index lim;
    FINITE: the finite count and the lowest too. MASKED as `_threshold_step`'s; the load written
    out in each step, not a helper's: the logits pick the list's slots, and a helper given the row
    would count it as written (the package docstring's rule)."""
    offs = start + grid
    if MASKED:
        x = tl.load(row_ptr + offs, mask=offs < hi, other=float("-inf")).to(tl.float32)
    else:
        x = tl.load(row_ptr + offs).to(tl.float32)
    if TIES:
        clamped = tl.minimum(x, FLT_MAX, propagate_nan=tl.PropagateNan.ALL)  # (+inf as sanitized; NaN stays)
        member = (clamped > xt) | ((clamped == xt) & (grid < lim - start))
    else:
        member = x > xs  # (NaN: false)
    n, nf, low = _tally(x, member, n, nf, low, FINITE)
    if LIST > 0:  # (LIST 0: the count alone: `benchmarks/bench_count_pass.py` times what the list costs)
        _store_members(_listed_key(x, offs), member, fill_ptr, list_ptr, LIST)
    return n, nf, low


@triton.jit
def _count_pass(row_ptr, lo, hi, t, fill_ptr, list_ptr, LIST: tl.constexpr, LANES: tl.constexpr,
                STAGES: tl.constexpr):
    """`_threshold_pass` for a count goal whose list starts at the row's top (thresholds 0 and 1
    INT64_MAX, 2 and 3 one packed value t: top-k's first pass from an element bound): the
    finite tokens above t counted and stored in the list, the row's finite count and its lowest
    token; no weight, no mass (a count goal's rounds read none of this pass's: nothing is above
    the list's top). Fewer instructions a step than `_threshold_pass`'s (sm_90, 8 logits a
    thread: 488; 244 in session 68, the launch 580 -> 420 us on top-k 1000:
    benchmarks/HISTORY.md), fewer again where it compares the float logits: a token
    is above t = (key, ~i) where its logit is above t's (xt, the key's float) or equals it below
    index i (lim), which needs no key a logit and no sanitizing (NaN compares false: above
    nothing, not finite; +inf above all as FLT_MAX). A step whole below lim or at or above it
    compares once a logit: with xs the next float below xt (at or above xt) or xt itself; the one
    step that straddles lim counts no token in the loop, and again after it with the ties
    (`_count_step`'s TIES). The keys and floats agree in order but at zero, where -0 and +0
    compare equal, one key sanitized (0): so t's key -1 (-0's, no token's) counts as -2 without
    ties, and the float below +0 is -0's next, not -0. Returns `_threshold_pass`'s values, the
    masses 0.

    Without its list the pass reads at memory speed; the list costs its instructions, ~11 a logit
    whether listed or not (the key, the slot's address and bound, the predicated store). 4-byte
    logits (4 a thread a step) hold a step's stores to the next, when the claim is back, their
    loads prefetched into registers; 2-byte logits (8 a thread) store at once from a pipelined
    load, as holding took more instructions than it hid latency (`bench_count_pass.py`, H100:
    float32 308 -> 272 us, bf16 265 -> 289; benchmarks/HISTORY.md, session 72)."""
    VEC: tl.constexpr = LANE_BITS // row_ptr.dtype.element_ty.primitive_bitwidth
    STEP: tl.constexpr = LANES * VEC
    HOLD: tl.constexpr = VEC <= 4  # (4-byte logits: a step's stores held to the next; see above)
    t = tl.maximum(t, _lowest_inf())
    tk = (t >> 32).to(tl.int32)
    lim = tl.minimum(~t & LOW_BITS, tl.full((), 2147483647, tl.int64)).to(tl.int32)  # (ties below this index: ~i > t's)
    lim = tl.where(tk == -1, 0, lim)
    tk = tl.where(tk == -1, -2, tk)
    xt = key_value(tk)  # (+inf or NaN past FLT_MAX: no sanitized logit above or equal)
    x_above = tl.where(tk >= FLT_MAX_KEY, float("inf"), xt)  # (raw logits: +inf is above no threshold here)
    below = tl.where(tk - 1 == -1, -2, tk - 1)
    x_at = tl.where(below >= FLT_MAX_KEY, float("inf"), key_value(below))  # (the float below xt: above it is at or
    # above xt; not -inf: -inf's key has lim 0)
    grid = tl.arange(0, LANES)[:, None] * VEC + tl.arange(0, VEC)[None, :]
    n = tl.zeros((LANES,), dtype=tl.int32)
    nf = tl.zeros((LANES,), dtype=tl.int32)
    low = tl.full((LANES,), float("inf"), dtype=tl.float32)
    whole = lo + (hi - lo) // STEP * STEP
    if HOLD:  # the steps whole inside the row, written here (the package docstring's rule: the logits pick the
        # list's slots): each step's slots claimed in it, its tokens stored in the next, when the claim is back
        # (`_claim`'s round trip to L2, not waited on a step); the logits loaded two steps ahead into registers
        # (a value carried across steps stops Triton's pipelining)
        last = tl.maximum(whole - STEP, lo)  # (the prefetches past the last step read it again)
        ahead_1 = tl.load(row_ptr + lo + grid, mask=tl.zeros_like(grid) + lo < whole, other=0.0)
        ahead_2 = tl.load(row_ptr + tl.minimum(lo + STEP, last) + grid, mask=tl.zeros_like(grid) + lo < whole,
                          other=0.0)
        held = tl.zeros((LANES, VEC), dtype=tl.float32)  # (the last step's logits, members and claims)
        held_member = tl.zeros((LANES, VEC), dtype=tl.int1)
        held_at = tl.zeros((LANES,), dtype=tl.int32)
        held_start = lo
        for start in tl.range(lo, whole, STEP, num_stages=1):
            x = ahead_1.to(tl.float32)
            ahead_1 = ahead_2
            ahead_2 = tl.load(row_ptr + tl.minimum(start + 2 * STEP, last) + grid)
            member = x > _step_threshold(start, lim, x_at, x_above, STEP)  # (NaN: false)
            n, nf, low = _tally(x, member, n, nf, low, True)
            if LIST > 0:  # (LIST 0: the count alone: `benchmarks/bench_count_pass.py` times what the list costs)
                at = _claim(member, fill_ptr)
                _scatter(_listed_key(held, held_start + grid), held_member, held_at, list_ptr, LIST)
                held = x
                held_member = member
                held_at = at
                held_start = start
        if LIST > 0:
            _scatter(_listed_key(held, held_start + grid), held_member, held_at, list_ptr, LIST)
    else:
        for start in tl.range(lo, whole, STEP, num_stages=STAGES):
            n, nf, low = _count_step(row_ptr, start, grid, hi, _step_threshold(start, lim, x_at, x_above, STEP), xt,
                                     lim, fill_ptr, list_ptr, n, nf, low, LIST, False, False, True)
    straddle = lo + (lim - lo) // STEP * STEP
    if (lo < lim) & (straddle < whole) & (straddle < lim):  # (its tokens above t: none counted in the loop)
        n, nf, low = _count_step(row_ptr, straddle, grid, hi, xt, xt, lim, fill_ptr, list_ptr, n, nf, low, LIST,
                                 False, True, False)
    if whole < hi:
        n, nf, low = _count_step(row_ptr, whole, grid, hi, xt, xt, lim, fill_ptr, list_ptr, n, nf, low, LIST, True,
                                 True, True)
    q = tl.arange(0, 4)
    above_n = tl.where(q < 2, 0, tl.sum(n, 0)).to(tl.int64)
    n_finite = tl.sum(nf, 0)
    low_key = ordered_key(tl.minimum(tl.min(low, 0), FLT_MAX) + 0.0)  # (+inf as FLT_MAX)
    lowest = tl.where(n_finite > 0, low_key.to(tl.int64) << 32, INT64_MAX)
    return above_n, tl.zeros((4,), dtype=tl.float64), lowest, n_finite.to(tl.int64), tl.zeros((), dtype=tl.float64)


@triton.jit
def _row_pass(row_ptr, lo, hi, x_max, scale, stats_ptr, list_ptr, LIST: tl.constexpr, LANES: tl.constexpr,
              STAGES: tl.constexpr, COUNT: tl.constexpr):
    """The pass a pass round wants over the row's logits [lo, hi): with COUNT, `_count_pass` where
    the goal is a count and the thresholds are its form, else `_threshold_pass` (which counts the
    same: the rounds launch's own pass, its registers at the limit). STAGES: the loads' pipeline
    depth (PASS_STAGES in the pass launch; 2 where the rounds launch reads a pass itself, which
    spilled at more; the count pass over 4-byte logits prefetches its own)."""
    by_mass = load_goal(stats_ptr)[1]  # (a barrier first: stored by other threads)
    t1 = tl.load(stats_ptr + S_THRESHOLDS + 1)  # (descending: t0 >= t1)
    t2 = tl.load(stats_ptr + S_THRESHOLDS + 2)
    if COUNT & (~by_mass) & (t1 == INT64_MAX) & (t2 == tl.load(stats_ptr + S_THRESHOLDS + 3)):
        above_n, above_m, lowest, n_finite, m_finite = _count_pass(row_ptr, lo, hi, t2, stats_ptr + S_FILL, list_ptr,
                                                                   LIST, LANES, STAGES)
    else:
        above_n, above_m, lowest, n_finite, m_finite = _threshold_pass(row_ptr, lo, hi, x_max, scale, stats_ptr,
                                                                       list_ptr, LIST, LANES, STAGES)
    return above_n, above_m, lowest, n_finite, m_finite


@triton.jit
def _estimate(list_ptr, pts, n_pts, top, c_top, m_top, bot, c_bot, m_bot, exact_bot, goal, by_mass, x_max, scale,
              rate, LIST: tl.constexpr, KEY_SHIFT: tl.constexpr):
    """The 4 thresholds of a bracket pass, descending, from the region's sample points (pts, in no
    order of key; in index order by slot; n_pts of them): the points `half` and GUARD x `half`
    places either side of the point where the estimated count or mass from the top reaches the
    goal (the region's ends past the points). No sort: each place is found by a descent over the
    points' key codes (`_descend`, `_descend_ranks`: as many steps as the region's keys span, not
    the slot's bits too), then within that key's points, which are in SPEC.md's order by slot: by a
    count for the mass (they weigh the same), by one scan a rank (`_within_key`). While no pass has
    counted the region's bottom, the low guard is the bottom itself (a count of the row's finite
    tokens)."""
    # tokens per point: exact over the region's points, else (the region reaches the row's
    # end, whose finite count no pass has counted yet) the sample's rate V / LIST
    per_point = tl.where(exact_bot, (c_bot - c_top).to(tl.float64) / tl.maximum(n_pts, 1).to(tl.float64), rate)
    # the points' key codes, above 0 for none: unsigned 32-bit (float32 keys span under 2^32 - 1)
    real = pts != INT64_MIN
    k = tl.where(real, _key_codes(pts, KEY_SHIFT)[0] + 1, 0).to(tl.uint32)
    nbits = bit_length(tl.max(k, 0).to(tl.int64))
    if by_mass:
        # each point stands for per_point tokens of its weight; the region's mass that misses
        # (heavy tokens between the points) is put at its top, where they are
        e = weights32(pts, x_max, scale) * per_point.to(tl.float32)
        points_mass = tl.sum(e.to(tl.float64), 0)
        carry = m_top + ((m_bot - m_top) - points_mass)
        x, above = _descend(k, e, carry, goal, nbits, False)  # the key of the point that reaches the goal
        x = x.to(k.dtype)
        # the points whose sum from the top, themselves included, is still short of it: those of
        # higher keys, then the first of that key's points, which weigh the same (c of them: c
        # times the weight, exact in float64)
        same = k == x
        e_x = tl.max(tl.where(same, e, 0.0), 0).to(tl.float64)
        n_same = tl.sum(same.to(tl.int64), 0)
        c = tl.minimum(tl.maximum((goal - above) / tl.where(e_x > 0, e_x, 1.0), -1.0), LIST + 1.0).to(tl.int64)
        c = tl.where(above + c.to(tl.float64) * e_x < goal, c, c - 1)  # (the quotient's rounding: one either way)
        c = tl.where(above + (c + 1).to(tl.float64) * e_x < goal, c + 1, c)
        short = tl.where(e_x > 0, tl.minimum(tl.maximum(c, 0), n_same), n_same)
        j = tl.where(carry + points_mass >= goal, tl.sum((k > x).to(tl.int64), 0) + short, n_pts)
    else:
        i = tl.arange(0, LIST)
        j = tl.sum(((i < n_pts) & (c_top.to(tl.float64) + (i + 1).to(tl.float64) * per_point < goal)).to(tl.int64), 0)
    j = tl.minimum(j, n_pts - 1)
    half = tl.maximum((1.0 / per_point * (FILL * LIST / 2)).to(tl.int64), 1)
    q = tl.arange(0, 4)
    at = j + tl.where(q == 0, -GUARD * half, tl.where(q == 1, -half, tl.where(q == 2, half, GUARD * half)))
    # the points at those places (the (a + 1)-th from the top), the four found side by side; a
    # place outside the points takes the region's end below
    slot = _within_key(k, tl.minimum(tl.maximum(at, 0), n_pts - 1) + 1, nbits)
    picked = tl.load(list_ptr + slot)
    t = tl.where(at < 0, top, tl.where(at >= n_pts, bot, picked))
    return tl.where((q == 3) & ~exact_bot, bot, t)


@triton.jit
def _within_key(k, ranks, nbits):
    """The slots of the points of given ranks from the top ([G] int64, each 1 to the points'
    count), the points in SPEC.md's order: key code k descending ([N] unsigned, 0 for none and
    above 0 for a point), then slot ascending (the sample is in index order). The key of each by
    `_descend_ranks` (nbits steps), then its place among that key's points: the first of them by
    a min along the slots (a key of one point: every key of a row of distinct values), another
    by one scan along the slots."""
    x, n_above = _descend_ranks(k, ranks, nbits)
    x = x.to(k.dtype)
    want = ranks - n_above  # (the place among that key's points)
    G: tl.constexpr = ranks.shape[0]
    N: tl.constexpr = k.shape[0]
    g = tl.arange(0, G)
    slots = tl.zeros((G,), dtype=tl.int32)
    for q in tl.static_range(G):  # (one goal at a time: a [G, N] scan's registers spill)
        x_q = tl.sum(tl.where(g == q, x, 0), 0)
        want_q = tl.sum(tl.where(g == q, want, 0), 0)
        slot = tl.min(tl.where(k == x_q, tl.arange(0, N), N), 0)
        if want_q > 1:
            seen = tl.cumsum((k == x_q).to(tl.int32), 0)  # that key's points up to each slot
            slot = tl.sum((seen < want_q).to(tl.int32), 0)  # (the slots before the wanted one)
        slots = tl.where(g == q, slot, slots)
    return slots


@triton.jit
def _split(top, bot, vocab):
    """4 thresholds, descending, that split the region (bot, top] in 5: equal ranges of its keys,
    or of its indices where it holds one key (its range clamped to the row's indices)."""
    q = (4 - tl.arange(0, 4)).to(tl.int64)  # 4, 3, 2, 1
    k_top = (top >> 32) - ((top & LOW_BITS) == 0).to(tl.int64)  # p <= K << 32: key <= K - 1
    k_bot = (bot >> 32) + ((bot & LOW_BITS) == LOW_BITS).to(tl.int64)  # p > K << 32 | LOW: key >= K + 1
    by_key = (k_bot + 1 + ((k_top - k_bot) * q) // 5) << 32  # "p > K << 32" is "key >= K"
    lo = tl.maximum(bot, (k_bot << 32) | (LOW_BITS - (tl.zeros((), dtype=tl.int64) + vocab)))  # p > lo: index < V
    hi = tl.minimum(top, (k_bot << 32) | LOW_BITS)
    by_index = lo + ((hi - lo) * q) // 5
    return tl.where(k_top > k_bot, by_key, by_index)


@triton.jit
def _kept_weights(row_ptr, vocab, x_max, scale, cut, offs):
    """The float32 weights of the logits at offs, 0 outside the kept set {p >= cut}."""
    x = sanitize(tl.load(row_ptr + offs, mask=offs < vocab, other=float("-inf")))
    return tl.where((x > float("-inf")) & (pack(x, offs) >= cut), scaled_weight(x, x_max, scale), 0.0)


@triton.jit
def _search_pass(row_ptr, lo, vocab, x_max, scale, t, cut, prefix, LANES: tl.constexpr):
    """SPEC.md step 7 over the kept set {p >= cut}: the smallest index whose inclusive prefix
    mass in index order exceeds t, else the largest kept index of positive weight; from logit
    lo on (a multiple of the step), `prefix` the kept mass before it. The row in
    chunks of SEARCH_STEPS steps of LANES lanes (as `_threshold_pass`: per-lane sums, VEC
    float32 weights summed then widened, no block-wide reduction inside a chunk), one reduction
    a chunk; the chunk where the prefix crosses t read again a step at a time, and the step
    where it crosses by a float64 prefix of its weights. Stops at the crossing."""
    VEC: tl.constexpr = LANE_BITS // row_ptr.dtype.element_ty.primitive_bitwidth
    STEP: tl.constexpr = LANES * VEC
    grid = tl.arange(0, LANES)[:, None] * VEC + tl.arange(0, VEC)[None, :]
    token = tl.zeros((), dtype=tl.int64) - 1
    start = lo + tl.zeros((), dtype=tl.int32)
    while (token < 0) & (start < vocab):
        lanes = tl.zeros((LANES,), dtype=tl.float64)
        for k in tl.range(0, SEARCH_STEPS, num_stages=PASS_STAGES):
            lanes += tl.sum(_kept_weights(row_ptr, vocab, x_max, scale, cut, start + k * STEP + grid), 1).to(tl.float64)
        if prefix + tl.sum(lanes, 0) > t:  # the crossing is in this chunk: its steps again, one at a time
            k = 0
            while (token < 0) & (k < SEARCH_STEPS):
                offs = start + k * STEP + grid
                e = _kept_weights(row_ptr, vocab, x_max, scale, cut, offs).to(tl.float64)
                lane_e = tl.sum(e, 1)
                step = tl.sum(lane_e, 0)
                if prefix + step > t:  # inclusive prefixes: the lanes' before each, then along the lane
                    inclusive = prefix + (tl.cumsum(lane_e, 0) - lane_e)[:, None] + tl.cumsum(e, 1)
                    found = tl.min(tl.min(tl.where(inclusive > t, offs, vocab), 1), 0)
                    token = tl.where(found < vocab, found.to(tl.int64), token)
                prefix += step
                k += 1
        else:
            prefix += tl.sum(lanes, 0)
        start += SEARCH_STEPS * STEP
    if token < 0:  # rounding left no prefix above t: the largest kept index of positive weight
        last = tl.full((LANES,), -1, dtype=tl.int32)
        for base in range(0, vocab, STEP):
            offs = base + grid
            kept = _kept_weights(row_ptr, vocab, x_max, scale, cut, offs) > 0
            last = tl.maximum(last, tl.max(tl.where(kept, offs, -1), 1))
        token = tl.max(last.to(tl.int64), 0)
    return token


@triton.jit
def _index_search(list_ptr, n, cut, x_max, scale, u, draft, LIST: tl.constexpr):
    """SPEC.md step 7 over the kept set, every token >= cut among the list's first n slots: the
    smallest index whose inclusive prefix mass (in index order) exceeds t = u * S (S: their
    mass), else the largest of positive weight. The draft (-1: none) first: it is the token
    when its prefix before it is at most t and its weight takes the prefix above t (two sums
    over the list: a row whose draft is accepted needs no more, SPEC.md's rationale); else one
    `_descend` over the indices (no sort)."""
    vals = listed_entries(list_ptr, n, cut - 1, INT64_MAX, LIST)
    e = packed_weights(vals, x_max, scale)
    index = packed_index(vals)
    total = tl.sum(e, 0)
    t = u.to(tl.float64) * total
    below = tl.sum(tl.where(index < draft, e, 0.0), 0)
    e_d = tl.sum(tl.where(index == draft, e, 0.0), 0)  # (0 where the draft is not kept, or none)
    token = tl.zeros((), dtype=tl.int64) + draft
    if (below > t) | (t >= below + e_d):  # (a draft outside the set, of weight 0, never takes it above t)
        i_max = tl.max(tl.where(vals != INT64_MIN, index, -1), 0)
        codes = tl.where(vals != INT64_MIN, i_max - index, -1).to(tl.int32)  # (the mass of codes >= x: the prefix
        # up to index i_max - x; int32 codes: V <= 2^30)
        last = tl.max(tl.where(e > 0, index, -1), 0)
        x = _descend(codes, e, total * 0.0, t, bit_length(tl.max(codes, 0).to(tl.int64)), True)[0]
        token = tl.where(total > t, i_max - x, last)
    return token


@triton.jit
def coarse_key(key, KEY_SHIFT: tl.constexpr):
    """An int32 key without the KEY_SHIFT low bits that every value of the row's dtype leaves
    constant (`_key_codes`): one code per value, in the keys' order. FLT_MAX (a sanitized +inf,
    of no 16-bit dtype) is the code just above its dtype's largest (that of +inf); int32 still."""
    return (key >> KEY_SHIFT) + (key == FLT_MAX_KEY).to(key.dtype)


@triton.jit
def bit_length(x):
    """The bits of int64 x >= 0 (0 for 0 or less)."""
    b = tl.arange(0, 64).to(tl.int64)
    return tl.sum(((b < 63) & ((tl.full((64,), 1, tl.int64) << b) <= x)).to(tl.int64), 0)


@triton.jit
def _descend(codes, w, base, goal, nbits, STRICT: tl.constexpr):
    """The largest x in [0, 2^nbits) with base plus the weights w of the entries of code >= x
    reaching the goal (>=; > with STRICT; float64 sums), by binary lifting: nbits steps of one
    block-wide reduction each ([N] int64 or int32 codes, -1 for no entry, or uint32 ones, 0 for
    none and the entries above 0, as `_estimate`'s; [N] float32 or float64
    w: float64 where the registers allow, as no step widens them then). 0 where no x > 0 reaches
    it: the caller checks x = 0 (every entry) itself. Counts: `_descend_ranks`.
    Returns (x, base plus the weights of the entries of code > x): the sum at the last candidate
    turned down, which is x + 1 (each later candidate is lower; the bits below it all taken); base
    where none was."""
    x = tl.zeros((), dtype=tl.int64)
    above = base
    for i in range(0, nbits):
        cand = x + (tl.full((), 1, tl.int64) << (nbits - 1 - i))  # (x's bit there is 0)
        s = base + tl.sum(tl.where(codes >= cand.to(codes.dtype), w, 0.0).to(tl.float64), 0)
        if STRICT:
            take = s > goal
        else:
            take = s >= goal
        x = tl.where(take, cand, x)
        above = tl.where(take, above, s)
    return x, above


@triton.jit
def _descend_ranks(codes, goals, nbits):
    """`_descend` counting (each entry weighs 1, base 0) for several goals at once ([G] int64, each
    >= 1): for each, the largest x in [0, 2^nbits) with at least that many entries of code >= x
    ([G] int64), and the entries of code > x ([G] int32; as `_descend`'s sum above). One block-wide
    reduction a bit for all of them (a [G, N] sum along N): about the instructions of G descents one
    after the other, one reduction waited on a bit instead of G."""
    x = tl.zeros(goals.shape, dtype=tl.int64)
    above = tl.zeros(goals.shape, dtype=tl.int32)
    for i in range(0, nbits):
        cand = x + (tl.full((), 1, tl.int64) << (nbits - 1 - i))  # (x's bit there is 0)
        n = tl.sum((codes[None, :] >= cand.to(codes.dtype)[:, None]).to(tl.int32), 1)
        take = n >= goals
        x = tl.where(take, cand, x)
        above = tl.where(take, above, n)
    return x, above


@triton.jit
def _key_codes(vals, KEY_SHIFT: tl.constexpr):
    """Packed tokens' `coarse_key` codes less the lowest (int64; for INT64_MIN slots: any value),
    and the lowest: the key codes of `_estimate` and `_list_cut`."""
    k = coarse_key((vals >> 32).to(tl.int32), KEY_SHIFT).to(tl.int64)
    k_min = tl.min(tl.where(vals != INT64_MIN, k, INT64_MAX), 0)
    return k - k_min, k_min


@triton.jit
def _list_cut(list_ptr, n, lo, hi, c_hi, m_hi, goal, by_mass, x_max, scale, LIST: tl.constexpr,
              KEY_SHIFT: tl.constexpr):
    """The cut among the list's tokens (`listed_entries`, in no order; c_hi / m_hi: the count and
    mass above them): (the cut, the tokens it keeps, their mass). The kept set is a prefix of
    SPEC.md's order: top-k's first goal - c_hi; top-p's every token with less than the goal above
    it (the first always where nothing is above the list). Its last token, the cut, is the first
    whose sum from the top (c_hi or m_hi, and itself, included) reaches the goal. No sort: its key
    by one `_descend` over the key codes alone (as many steps as the list's keys span), then its
    place among that key's tokens, which weigh the same: the j-th, j from the sum above the key
    by one division (a count, or j times one weight: exact in float64); the j-th lowest index by
    a max, a min or, strictly inside a run of ties, a descent counting over their indices alone.
    (The list is read again after the key's descent: only the key codes and weights are live
    across it; the sum above the key is summed again there, which kept the select's launches
    free of a stack frame.)"""
    vals = listed_entries(list_ptr, n, lo, hi, LIST)
    real = vals != INT64_MIN
    k = tl.where(real, _key_codes(vals, KEY_SHIFT)[0] + 1, 0).to(tl.uint32)  # (0: no token)
    w = tl.where(by_mass, weights32(vals, x_max, scale), real.to(tl.float32))  # (float32: the registers)
    base = tl.where(by_mass, m_hi, c_hi.to(tl.float64))
    x = _descend(k, w, base, goal, bit_length(tl.max(k, 0).to(tl.int64)), False)[0]
    # x: the cut's key (the sum is constant between two keys of the list, so the largest code that
    # reaches the goal is a key of it); 0 where the list falls short of the goal: every token kept
    first = base >= goal  # (none kept but, for top-p, the first: see `_holds_cut`)
    every = (x == 0) & ~first
    vals = listed_entries(list_ptr, n, lo, hi, LIST)  # (read again: only k and w were live across the descent)
    real = vals != INT64_MIN
    k = tl.where(real, _key_codes(vals, KEY_SHIFT)[0] + 1, 0).to(tl.uint32)
    x = tl.where(first, tl.max(k, 0), tl.where(every, tl.min(tl.where(real, k, 0xFFFFFFFF), 0), x.to(tl.uint32)))
    same = real & (k == x)
    n_same = tl.sum(same.to(tl.int64), 0)
    w = tl.where(by_mass, packed_weights(vals, x_max, scale), real.to(tl.float64))
    above = base + tl.sum(tl.where(k > x, w, 0.0), 0)  # (the sum short of the goal, above the cut's key)
    w_x = tl.max(tl.where(same, w, 0.0), 0)
    key_bits = tl.max(tl.where(same, vals >> 32, INT64_MIN), 0) << 32  # (one key: the same code)
    low = vals & LOW_BITS  # (within a key, the packed order: 0xFFFFFFFF - index, the lowest index highest)
    top = tl.max(tl.where(same, low, -1), 0)
    bottom = tl.min(tl.where(same, low, INT64_MAX), 0)
    codes = tl.where(same, low - bottom, -1).to(tl.int32)  # (V <= 2^30)
    j = tl.minimum((goal - above).to(tl.float32) / tl.where(w_x > 0, w_x, 1.0).to(tl.float32),
                   n_same + 1.0).to(tl.int64)  # (float32: within one either way of the count, set right below)
    j = tl.where(above + j.to(tl.float64) * w_x >= goal, j, j + 1)
    j = tl.where((j > 1) & (above + (j - 1).to(tl.float64) * w_x >= goal), j - 1, j)
    j = tl.where(first, 1, tl.where(every, n_same, tl.minimum(tl.maximum(j, 1), n_same)))
    at = tl.where(j == 1, top, bottom)
    if (j > 1) & (j < n_same):  # (ties at the cut: the j-th of that key's tokens from the top, by their indices)
        c = tl.zeros((), dtype=tl.int32)
        nbits = bit_length(top - bottom)
        for i in range(0, nbits):
            cand = c + (tl.full((), 1, tl.int32) << (nbits - 1 - i).to(tl.int32))
            c = tl.where(tl.sum((codes >= cand).to(tl.int32), 0) >= j, cand, c)
        at = bottom + c
    cut = key_bits | at
    some = (base < goal) | (by_mass & (c_hi == 0))
    vals = listed_entries(list_ptr, n, cut - 1, hi, LIST)
    kept = (vals != INT64_MIN) & (tl.zeros_like(vals) + some.to(tl.int64) != 0)  # (the interpreter fails on an
    # [N] & a boolean scalar here)
    return cut, tl.sum(kept.to(tl.int64), 0), tl.sum(tl.where(kept, packed_weights(vals, x_max, scale), 0.0), 0)


@triton.jit
def _list_round(list_ptr, stats_ptr, use_p, top_p, x_max, scale, LIST: tl.constexpr, KEY_SHIFT: tl.constexpr):
    """A list round: the cut, if the list holds it (`_list_cut`, `store_cut`; for top-k with top-p,
    top-p's search starts, first in the same list: top-k's kept set is in it, so the search goes
    on there in this call); else the list's ends narrow the region, and a pass round follows.
    Returns whether the search is done."""
    done = tl.zeros((), dtype=tl.int1)
    again = ~done
    while again:
        again = done
        n, lo, hi, c_hi, m_hi, c_lo, m_lo = load_list(stats_ptr)
        goal, by_mass = load_goal(stats_ptr)
        n_finite = tl.load(stats_ptr + S_FINITE_N)
        # the list's end: as the pass that stored the list counted it (its sum in another order could
        # put a cut the pass saw inside the list outside it); else summed over the list (read again by
        # `_list_cut`)
        if c_lo < 0:
            vals = listed_entries(list_ptr, n, lo, hi, LIST)
            m_lo = m_hi + tl.sum(packed_weights(vals, x_max, scale), 0)
            c_lo = c_hi + tl.sum((vals != INT64_MIN).to(tl.int64), 0)
        top_in = _holds_cut(hi, c_hi, m_hi, goal, by_mass, n_finite)
        if top_in & ~_holds_cut(lo, c_lo, m_lo, goal, by_mass, n_finite):  # the cut is in the list
            cut, n_kept, kept_mass = _list_cut(list_ptr, n, lo, hi, c_hi, m_hi, goal, by_mass, x_max, scale, LIST,
                                               KEY_SHIFT)
            s_kept = m_hi + kept_mass
            store_cut(stats_ptr, cut, s_kept, c_hi == 0)
            done = by_mass | ~use_p
            if not done:  # top-k's cut: top-p's next, inside the top-k set (S_k exact), first in this list
                store_goal(stats_ptr, top_p.to(tl.float64) * s_kept, done | True)
                store_region(stats_ptr, INT64_MAX, c_hi * 0, s_kept * 0.0, cut - 1, c_hi + n_kept, s_kept, done | True)
                store_list(stats_ptr, n, cut - 1, hi, c_hi, m_hi, c_hi + n_kept, s_kept)
                again = ~done
        else:  # the cut is below the list, or above it
            top, c_top, m_top, bot, c_bot, m_bot, exact = load_region(stats_ptr)
            if top_in:
                store_region(stats_ptr, lo, c_lo, m_lo, bot, c_bot, m_bot, exact)
            else:
                store_region(stats_ptr, top, c_top, m_top, hi, c_hi, m_hi, exact | True)
            tl.store(stats_ptr + S_HAVE_LIST, 0)
    return done


@triton.jit
def _thresholds(row_ptr, vocab, list_ptr, stats_ptr, x_max, scale, LIST: tl.constexpr, KEY_SHIFT: tl.constexpr):
    """A pass round's 4 thresholds, to S_THRESHOLDS: the whole region where it fits the list; a
    top-k cut's first, where the row came with a bound and no list (`filtered.element_bound`, or
    lanes too many to collect): every token at or above the bound, which holds the cut (k tokens
    or more are there); else a bracket from the sample's points in the region (`_store_sample`,
    `_estimate`; BRACKETS a row, that one included), else a split."""
    tl.debug_barrier()  # (stored by other threads)
    brackets = tl.load(stats_ptr + S_BRACKETS)
    top, c_top, m_top, bot, c_bot, m_bot, exact = load_region(stats_ptr)
    goal, by_mass = load_goal(stats_ptr)
    t = tl.where(tl.arange(0, 4) < 2, top, bot)  # (the whole region, where it fits the list)
    if c_bot - c_top > LIST:  # (an upper bound of the region's tokens)
        bound = tl.load(stats_ptr + S_BOUND)
        low = ((bound - KEY_OFFSET) << 32) - 1  # (packed: just below the bound's key, every index)
        split = brackets >= BRACKETS
        if (brackets == 0) & ~by_mass & (tl.load(stats_ptr + S_COUNT) < 0) & (bound >= 0) & (low < top):
            t = tl.where(tl.arange(0, 4) < 2, top, low)
            tl.store(stats_ptr + S_BRACKETS, brackets + 1)
        elif not split:
            _store_sample(row_ptr, vocab, list_ptr, LIST)
            pts = listed_entries(list_ptr, LIST, bot, top, LIST)
            n_pts = tl.sum((pts != INT64_MIN).to(tl.int64), 0)
            split = n_pts < MIN_POINTS
            if not split:
                t = _estimate(list_ptr, pts, n_pts, top, c_top, m_top, bot, c_bot, m_bot, exact, goal, by_mass, x_max,
                              scale, (tl.zeros((), dtype=tl.int64) + vocab).to(tl.float64) / LIST, LIST, KEY_SHIFT)
                tl.store(stats_ptr + S_BRACKETS, brackets + 1)
        if split:
            t = _split(top, bot, vocab)
    tl.store(stats_ptr + S_THRESHOLDS + tl.arange(0, 4), t)
    tl.store(stats_ptr + S_FILL, 0)  # (the pass's lanes claim list slots from it)


@triton.jit
def _narrow(stats_ptr, above_n, above_m, lowest, n_finite, m_finite, LIST: tl.constexpr):
    """After a pass: the region between the lowest threshold the cut is at or below and the highest
    it is above (exact counts and masses there); a list round next if the bracket (thresholds 1
    and 2) holds the cut and its list is complete. The region's bottom is at least just below the
    row's lowest token (exact there: every finite token above it)."""
    tl.debug_barrier()  # (stored by other threads)
    t = tl.load(stats_ptr + S_THRESHOLDS + tl.arange(0, 4))
    top, c_top, m_top, bot, c_bot, m_bot, exact = load_region(stats_ptr)
    goal, by_mass = load_goal(stats_ptr)
    tl.store(stats_ptr + S_FINITE_N, n_finite)
    if lowest - 1 >= bot:  # (the same tokens; keys below the lowest are no longer split)
        bot = lowest - 1
        c_bot = n_finite
        m_bot = m_finite
        exact = exact | True
    inside = _holds_cut(t, above_n, above_m, goal, by_mass, n_finite)
    low_in = tl.min(tl.where(inside, t, INT64_MAX), 0)  # the lowest threshold the cut is at or below
    if low_in < top:
        top = low_in
        c_top = tl.max(tl.where(inside, above_n, -1), 0)
        m_top = tl.max(tl.where(inside, above_m, -1.0), 0)
    high_out = tl.max(tl.where(inside, INT64_MIN, t), 0)  # the highest it is above
    if high_out > bot:
        bot = high_out
        c_bot = tl.min(tl.where(inside, INT64_MAX, above_n), 0)
        m_bot = tl.min(tl.where(inside, float("inf"), above_m), 0)
        exact = exact | True
    store_region(stats_ptr, top, c_top, m_top, bot, c_bot, m_bot, exact)
    q = tl.arange(0, 4)
    first_in = tl.sum(tl.where(q == 1, inside.to(tl.int32), 0), 0) > 0
    last_in = tl.sum(tl.where(q == 2, inside.to(tl.int32), 0), 0) > 0
    c_first = tl.sum(tl.where(q == 1, above_n, 0), 0)
    stored = tl.sum(tl.where(q == 2, above_n, 0), 0) - c_first
    if first_in & ~last_in & (stored <= LIST):  # the bracket holds the cut: a list round next
        tl.store(stats_ptr + S_HAVE_LIST, 1)
        m_first = tl.sum(tl.where(q == 1, above_m, 0.0), 0)
        m_last = tl.sum(tl.where(q == 2, above_m, 0.0), 0)
        store_list(stats_ptr, stored, tl.sum(tl.where(q == 2, t, 0), 0), tl.sum(tl.where(q == 1, t, 0), 0), c_first,
                   m_first, c_first + stored, m_last)


@triton.jit
def select_begin(vocab, top_k, top_p, mass, listed, bound, stats_ptr, BUF: tl.constexpr):
    """A top-k / top-p row (temperature > 0, a finite logit) enters the select: its state, in PH_ROUNDS.
    mass: S (top-p alone; unread with top-k); listed: the candidates `filtered.collect` left in the
    list (every finite token with unsigned key >= bound; -1 or more than the list holds: none usable)."""
    LIST: tl.constexpr = 2 * BUF
    use_k, use_p = filters(top_k, top_p, vocab)
    zero = tl.zeros((), dtype=tl.int64)
    store_goal(stats_ptr, tl.where(use_k, top_k.to(tl.float64), top_p.to(tl.float64) * mass), ~use_k)
    store_region(stats_ptr, INT64_MAX, zero, zero.to(tl.float64), INT64_MIN, zero + vocab, mass, zero != 0)
    store_list(stats_ptr, listed, ((bound - KEY_OFFSET) << 32) - 1, zero + INT64_MAX, zero, zero.to(tl.float64),
               zero - 1, zero.to(tl.float64))
    tl.store(stats_ptr + S_HAVE_LIST, ((listed >= 0) & (listed <= LIST)).to(tl.int64))
    tl.store(stats_ptr + S_BRACKETS, 0)
    tl.store(stats_ptr + S_PASSES, 0)
    tl.store(stats_ptr + S_FINITE_N, zero + vocab)
    tl.store(stats_ptr + S_LIST_PARTS, 0)
    tl.store(stats_ptr + S_PHASE, PH_ROUNDS)


@triton.jit
def _fold_parts(stats_ptr, parts_ptr, vocab, chunk, LIST: tl.constexpr):
    """A split pass's parts (`select_pass_part`: the first part of each span holds its counts, the
    others none), summed (`scratch.load_parts`: the same sums whichever program ran first), then
    `_narrow`."""
    above_n, above_m, lowest, n_finite, m_finite = load_parts(parts_ptr, tl.arange(0, SELECT_SPLITS) * chunk < vocab)
    _narrow(stats_ptr, above_n, above_m, lowest, n_finite, m_finite, LIST)


@triton.jit
def _search_start(list_ptr, stats_ptr, parts_ptr, vocab, chunk, cut, x_max, scale, t, LIST: tl.constexpr):
    """Where step 7's pass starts (S_SEARCH_LO, S_SEARCH_PREFIX): where the cut is in the list of a
    split pass (S_LIST_PARTS: its span), each span's kept mass is its mass above the list (its
    pass's count) plus the listed kept tokens' inside it, so the pass starts at the span where the
    prefix crosses t (t = u S_kept) and reads one span, not the row; else at the row's start.
    Span sums and the pass's differ in order only (SPEC.md's legal difference): the pass goes on
    past the span if its own sums cross later."""
    lo = tl.zeros((), dtype=tl.int64)
    prefix = tl.zeros((), dtype=tl.float64)
    tl.debug_barrier()  # (stored by other threads)
    span = tl.load(stats_ptr + S_LIST_PARTS).to(tl.int32)
    if span != 0:
        c = tl.arange(0, SELECT_SPLITS)
        live = c * chunk < vocab
        above = tl.cumsum(load_parts_mass_above(parts_ptr, 1, live), 0)  # (threshold 1: the list's top; parts <= c)
        vals = listed_entries(list_ptr, tl.load(stats_ptr + S_LIST_N), cut - 1, INT64_MAX, LIST)  # (the split
        # pass's list: (t2, t1] only; its kept tokens)
        e = weights32(vals, x_max, scale)
        index = packed_index(vals).to(tl.int32)  # (V <= 2^30)
        # the parts whose prefix (the parts up to them) is at most t, a run from part 0 that ends
        # at a span's end: their number m by binary lifting (steps of a span or more), one sum
        # over the list a step; the pass starts at part m (before: the prefix of the first m
        # parts, kept with m)
        n_live = tl.sum(live.to(tl.int32), 0)
        m = tl.zeros((), dtype=tl.int32)
        before = tl.zeros((), dtype=tl.float64)
        span_bits = (span >= 2).to(tl.int32) + (span >= 4) + (span >= 8) + (span >= 16)  # (a power of two <= 16)
        for i in range(0, tl.full((), SPLIT_BITS + 1, tl.int32) - span_bits):
            step = m + (tl.full((), SELECT_SPLITS, tl.int32) >> i)  # (16, 8, 4, 2, 1: down to the span)
            upto = (tl.sum(tl.where(c == step - 1, above, 0.0), 0)
                    + tl.sum(tl.where(index < step * chunk, e, 0.0).to(tl.float64), 0))
            fits = (step <= n_live) & (upto <= t)
            m = tl.where(fits, step, m)
            before = tl.where(fits, upto, before)
        if m < n_live:
            lo = m.to(tl.int64) * chunk
            prefix = before
    tl.store(stats_ptr + S_SEARCH_LO, lo)
    tl.store(stats_ptr + S_SEARCH_PREFIX, f64_word(prefix))


@triton.jit
def select_rounds(row_ptr, vocab, temperature, top_k, top_p, u, x_max, list_ptr, stats_ptr, parts_ptr, chunk,
                  BUF: tl.constexpr, INLINE: tl.constexpr, draft=-1):
    """The rounds of a row in the select (the module docstring's), from its state: a row whose
    split pass ran since it asked (PH_PASS) folds the parts first. Until the cut is found, or,
    without INLINE, until a pass round wants its pass (PH_PASS: the pass launch reads it, split
    over its items); INLINE: each pass read here by this program (the last rounds
    launch, which finishes every row: the bound's passes). A row whose list holds its kept set
    gets its token here (step 7 from the list, its draft checked first: `_index_search`; draft -1:
    none); else PH_SEARCH (`select_search`). Returns the
    token, or UNDECIDED. The state lives in the row's stats between rounds (`scratch`), so that
    little is live across each round's descents; passes are counted at S_PASSES."""
    LIST: tl.constexpr = 2 * BUF
    DT: tl.constexpr = row_ptr.dtype.element_ty
    KEY_SHIFT: tl.constexpr = 16 if DT == tl.bfloat16 else 13 if DT == tl.float16 else 0  # (`coarse_key`)
    scale = weight_scale(temperature)
    use_p = filters(top_k, top_p, vocab)[1]
    token = tl.zeros((), dtype=tl.int64) + UNDECIDED
    tl.debug_barrier()  # (stored by other threads)
    phase = tl.load(stats_ptr + S_PHASE)
    if phase == PH_PASS:
        _fold_parts(stats_ptr, parts_ptr, vocab, chunk, LIST)
        tl.store(stats_ptr + S_PASSES, tl.load(stats_ptr + S_PASSES) + 1)
        phase = phase * 0 + PH_ROUNDS
    if phase == PH_ROUNDS:
        done = phase != phase
        wanted = phase != phase
        rounds = tl.zeros((), dtype=tl.int32)
        while (~done) & (~wanted) & (rounds < ROUNDS):
            rounds += 1
            tl.debug_barrier()  # (stored by other threads)
            if tl.load(stats_ptr + S_HAVE_LIST) != 0:
                if _list_round(list_ptr, stats_ptr, use_p, top_p, x_max, scale, LIST, KEY_SHIFT):
                    done = ~done
                    cut, _, listed = load_cut(stats_ptr)
                    if listed:  # (the list holds the whole kept set: step 7 from it)
                        token = _index_search(list_ptr, tl.load(stats_ptr + S_LIST_N), cut, x_max, scale, u, draft,
                                              LIST)
            else:
                _thresholds(row_ptr, vocab, list_ptr, stats_ptr, x_max, scale, LIST, KEY_SHIFT)
                if INLINE:
                    tl.debug_barrier()  # (stored by other threads)
                    above_n, above_m, lowest, n_finite, m_finite = _row_pass(
                        row_ptr, 0, vocab, x_max, scale, stats_ptr, list_ptr, LIST, PASS_LANES, 2, False)
                    tl.store(stats_ptr + S_PASSES, tl.load(stats_ptr + S_PASSES) + 1)
                    tl.store(stats_ptr + S_LIST_PARTS, 0)
                    _narrow(stats_ptr, above_n, above_m, lowest, n_finite, m_finite, LIST)
                else:
                    wanted = ~wanted
        phase = tl.where(wanted, PH_PASS, tl.where(done, PH_SEARCH, PH_ROUNDS)).to(tl.int64)
        if token != UNDECIDED:  # (step 7 from the list)
            phase = phase * 0
        elif done:
            cut, s_kept, _ = load_cut(stats_ptr)
            _search_start(list_ptr, stats_ptr, parts_ptr, vocab, chunk, cut, x_max, scale, u.to(tl.float64) * s_kept,
                          LIST)
        tl.store(stats_ptr + S_PHASE, phase)
    return token


@triton.jit
def pass_span_bits(rows, programs):
    """log2 of the parts of a row (up to SELECT_SPLITS) that one item of the pass launch reads,
    where `rows` rows may want a pass and `programs` programs take the items in turn: the fewest
    waves of items times an item's time (its parts' reads plus PASS_FIXED), ties to the longer
    items. Each item pays its state's loads, its pipeline's fill and its sums: 1024 rows over
    528 programs read whole rows (2 waves of 17 against 32 of 2 a part at a time), 64 rows two
    parts an item (one wave of 3). A function of the counts only, so that every program finds
    the same span."""
    best = tl.zeros((), dtype=tl.int32)
    least = tl.full((), float("inf"), tl.float32)
    waves = tl.fdiv(rows.to(tl.float32), programs.to(tl.float32))  # (a quotient a wave off where it is whole at
    # most: an estimate; an integer division's routine took ~30 registers more in the pass launch)
    for b in tl.static_range(SPLIT_BITS + 1):  # (span 2^b)
        cost = tl.ceil(waves * (SELECT_SPLITS >> b)) * ((SELECT_SPLITS >> (SPLIT_BITS - b)) + PASS_FIXED)
        best = tl.where(cost <= least, b, best)
        least = tl.minimum(cost, least)
    return best


@triton.jit
def pass_item(item, bits):
    """(entry, first part) of item `item` of the pass launch at 2^bits parts an item: the
    SELECT_SPLITS >> bits items of an entry (a row or a queue slot) side by side."""
    per_entry = SPLIT_BITS - bits
    return item >> per_entry, (item & ((1 << per_entry) - 1)) << bits


@triton.jit
def select_pass_part(row_ptr, vocab, temperature, x_max, list_ptr, stats_ptr, parts_ptr, c, span, chunk,
                     BUF: tl.constexpr, LANES: tl.constexpr):
    """Parts c to c + span - 1 of the pass a row in PH_PASS wants (`_row_pass` over its logits
    [c chunk, (c + span) chunk)): their counts to part c's words of `parts_of`, none to the
    others (programs past the row's end: nothing); part 0's program stores the span
    (S_LIST_PARTS: `_search_start` starts step 7 at a span's start)."""
    tl.debug_barrier()  # (stored by other threads)
    if (tl.load(stats_ptr + S_PHASE) == PH_PASS) & (c * chunk < vocab):
        lo = c * chunk
        above_n, above_m, lowest, n_finite, m_finite = _row_pass(
            row_ptr, lo, lo + tl.minimum(span * chunk, vocab - lo), x_max, weight_scale(temperature), stats_ptr,
            list_ptr, 2 * BUF, LANES, PASS_STAGES, True)
        store_part(part_of(parts_ptr, c), above_n, above_m, lowest, n_finite, m_finite)
        clear_parts(parts_ptr, c + 1, c + span)
        if c == 0:
            tl.store(stats_ptr + S_LIST_PARTS, span.to(tl.int64))


@triton.jit
def select_search(row_ptr, vocab, temperature, u, x_max, stats_ptr, LANES: tl.constexpr):
    """Step 7 of a row in PH_SEARCH by `_search_pass`, from where `_search_start` put it (the
    part where the prefix crosses t, or the row's start): its token, else UNDECIDED (a row not
    in PH_SEARCH)."""
    token = tl.zeros((), dtype=tl.int64) + UNDECIDED
    tl.debug_barrier()  # (stored by other threads)
    if tl.load(stats_ptr + S_PHASE) == PH_SEARCH:
        cut, s_kept, _ = load_cut(stats_ptr)
        token = _search_pass(row_ptr, tl.load(stats_ptr + S_SEARCH_LO).to(tl.int32), vocab, x_max,
                             weight_scale(temperature), u.to(tl.float64) * s_kept, cut,
                             load_f64(stats_ptr + S_SEARCH_PREFIX), LANES)
        tl.store(stats_ptr + S_PASSES, tl.load(stats_ptr + S_PASSES) + 1)
        tl.store(stats_ptr + S_PHASE, 0)
    return token
