"""`dflash::dflash_verify`: every owner's drafts under that owner's sampling parameters.

Algorithm, four steps (no host synchronisation between their launches):

1. `verify_rows_kernel`, one program per pair slot (SPEC.md's (owner, j) pairs laid
   out as in `export/owners.py`; `launch.decide_config`: 4 KB steps, 4 warps): walks the
   owner layout and reads every row once (`sampling_rule.lane_stats`). Greedy and
   temperature-only rows are decided there (`sampling_rule.light_decision`), without
   searching for the token where "y == draft" can be answered without it: (token or SEARCH_LATER,
   match, x_max, mass) to scratch; a temperature-only row also leaves the prefix mass at
   the end of each of its chunks (`launch.prefix_chunks`: 8 chunks at most; `lane_stats`
   with PREFIXES), so that its search, if any, reads one chunk. A top-k / top-p row
   leaves its lane maxima and masses and its stats in scratch (`filtered.store_lanes`)
   and a mark with its (owner, j) pair; an unused slot gets its own mark.
   A top-p-alone row also sums the mass below its draft, and tells from S, that mass and
   the draft's weight whether its token certainly is not the draft
   (`sampling_rule.certain_miss`; V_MISS): then the owner's accepted count ends at that
   row or before, and its later rows are *moot*. SPEC.md's rationale: only the row where
   verification stops needs its token. On wide rows with likely drafts most rows are told,
   so the select below decides about one row an owner instead of every row.
   A row whose filters keep one token (top-k 1, top-p <= 0: `decided_temperature`) is greedy
   there, and a top-p-alone row whose argmax alone reaches p S (a confident row) is decided
   there too: its token is the argmax.
2. `verify_rows_kernel` again, FILTERED instance (not for the greedy op;
   `launch.filtered_rows_config`: the same step, 8 warps), on the marked rows: a moot row
   is marked MOOT_ROW and left; the others' bound and candidates from the stored lanes
   (`filtered.bound_and_collect`: reads only the lanes that can hold a candidate), decided
   there when <= 256 candidates settle them (one sort entry per thread) or when k tokens tie
   at the max (`filtered.max_ties_token`), else queued for the select. The row's first pass
   stays in launch 1, at that launch's occupancy: the FILTERED instance needs more registers,
   and the pass there ran slower (benchmarks/HISTORY.md, sessions 13-22's tables).
3. `verify_filtered_kernel` (not for the greedy op), six launches, one stage of the sample
   select each (`cut_select.py`: begin, pass, rounds, pass, rounds, search): the decision of
   each top-k / top-p row launch 2 left undecided, from its candidates, then passes over the
   row (a number the design bounds), in launches of their own so that the launches above keep
   their occupancy; the passes split over light programs.
4. `verify_accept_kernel`, one program per owner: the first unmatched j (the last row
   never matches: no draft follows it), then y there: a temperature-only row searches
   only the chunk where its prefix mass crosses t
   (`sampling_rule.light_token_from_prefixes`), instead of a launch that reads the row
   again for chunk stats.

Greedy owners take the argmax path inside the same launch. Invalid, empty and
not-admitted owners give (0, -1) and read nothing.

Supported domain (`supports`): float32 / bfloat16 / float16 logits, 1 <= V <= 2^30.
Reference: `export.heads.DFlashVerify`.
"""

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

from .common import owner_layout, pair_of_slot, uniform, weight
from .launch import supports  # noqa: F401  (this head's domain: the one in launch.py)
from .launch import (SELECT_WARPS, check_inputs, check_length, checked_scratch, decide_config, filtered_rows_config,
                     launch_config, prefix_chunks, select_config, select_programs)
from .cut_select import (SELECT_BEGIN, SELECT_PASS, SELECT_ROUNDS, SELECT_SEARCH, SPLIT_BITS, pass_item, pass_span_bits,
                         select_pass_part, select_rounds, select_search)
from .filtered import (bound_and_collect, element_chunk, elements_of, filtered_token, load_lanes, needs_elements,
                       needs_mass, store_lanes)
from .scratch import (FILTERED_ROW, PASS_ROW, R_MASS, R_MATCH, R_TOKEN, R_X_MAX, S_X_MAX, SEARCH_LATER,
                      UNDECIDED, UNUSED_SLOT, V_MISS, V_QUEUE, V_QUEUED, Scratch, load_f32, load_f64,
                      parts_of, prefixes_of, results_of, scratch_width, stats_of, store_moot, store_pair,
                      store_results, stored_pair, verify_of)
from .sampling_rule import (LANE_BITS, certain_miss, decide_light, decided_temperature, is_light,
                            lanes_and_stats, light_decision, light_token_from_prefixes, load_row, valid_draft)

BLOCK_O = 256  # owners per step of the layout loops (1024: the walk's int64 vectors set the light launch's registers)
BLOCK_J = 64  # pair slots per step of the first-miss loop
GROUP = tl.constexpr(8)  # pair slots a program of the select's begin and rounds launches: 1024 rows in
# 128 programs, one wave at one program an SM (a launch with nothing to do costs one wave)


@triton.jit
def _slot_row(offsets_ptr, tokens_ptr, num_rows, num_owners, BLOCK_O: tl.constexpr):
    """This program's pair slot: (used, owner, j, packed row, draft: the next row's token, -1 after the last)."""
    slot = tl.program_id(0).to(tl.int64)
    used, owner, j, row, n = pair_of_slot(offsets_ptr, num_owners, num_rows, slot, BLOCK_O)
    draft = tl.load(tokens_ptr + tl.minimum(row + 1, num_rows - 1))
    return used, owner, j, row, tl.where(j < n - 1, draft, -1)


@triton.jit
def verify_rows_kernel(logits_ptr, stride, tokens_ptr, offsets_ptr, start_position_ptr,
                       temperature_ptr, top_k_ptr, top_p_ptr, seed_ptr, work_ptr,
                       num_rows, num_owners, vocab, chunk, GREEDY: tl.constexpr, FILTERED: tl.constexpr,
                       BLOCK: tl.constexpr, BUF: tl.constexpr, WORK: tl.constexpr, STAGES: tl.constexpr,
                       BLOCK_O: tl.constexpr):
    """The rows, in two launches of this kernel (two compiled instances, each with the registers
    of its own path). FILTERED=False walks the owner layout for every slot and reads every row
    once: decides greedy and temperature-only rows, leaves the lanes of top-k / top-p rows in
    scratch and marks them PASS_ROW with their pair (`_decide_row`), and marks every unused
    slot UNUSED_SLOT (so that no mark is stale: the scratch is not cleared between calls).
    FILTERED=True takes only the marked rows (the others exit after one load): their bound,
    candidates and small decision (`_filtered_row`)."""
    slot = tl.program_id(0).to(tl.int64)
    work = work_ptr + slot * WORK  # candidates, hot lanes, results, stats
    results = results_of(work, BUF)
    if FILTERED:
        if tl.load(results + R_TOKEN) == PASS_ROW:
            owner, j, row_ptr, draft = stored_pair(results, logits_ptr, stride)
            top_k = tl.load(top_k_ptr + owner)
            top_p = tl.load(top_p_ptr + owner)
            # (top-p alone only: a top-k row is told only without a finite logit or a draft, so its walk
            # over the earlier rows would be j dependent loads, nearly always for nothing)
            if _missed_before(work_ptr, slot, tl.where(needs_mass(top_k, top_p, vocab), j, 0), BUF, WORK):
                store_moot(results)
            else:
                _filtered_row(row_ptr, vocab, tl.load(temperature_ptr + owner), top_k, top_p, seed_ptr + owner,
                              start_position_ptr + owner, j, draft, work, results, BLOCK, BUF)
                if tl.load(results + R_TOKEN) == FILTERED_ROW:  # the select's: its queue (slot from the grid again:
                    # nothing more lives across the decision, whose registers are near the spill)
                    at = tl.atomic_add(verify_of(work_ptr, BUF) + V_QUEUED, 1, sem="relaxed")
                    tl.store(verify_of(work_ptr + at * WORK, BUF) + V_QUEUE, tl.program_id(0).to(tl.int64))
    else:
        if (slot == 0) & (not GREEDY):
            tl.store(verify_of(work_ptr, BUF) + V_QUEUED, 0)  # (the FILTERED launch fills the select's queue)
        used, owner, j, row, draft = _slot_row(offsets_ptr, tokens_ptr, num_rows, num_owners, BLOCK_O)
        row_ptr = logits_ptr + row * stride
        if not used:
            tl.store(results + R_TOKEN, UNUSED_SLOT)
        elif GREEDY:
            zero = tl.zeros((), dtype=tl.int64)
            token, match, x_max, mass = decide_light(row_ptr, vocab, zero.to(tl.float32), zero, zero, draft,
                                                     BLOCK, STAGES)
            store_results(results, token, match, x_max, mass)
        else:
            _decide_row(row_ptr, vocab, tl.load(temperature_ptr + owner), tl.load(top_k_ptr + owner),
                        tl.load(top_p_ptr + owner), seed_ptr + owner, start_position_ptr + owner, owner, j, row,
                        draft, work, results, chunk, BLOCK, BUF, STAGES)


@triton.jit
def _decide_row(row_ptr, vocab, temperature, top_k, top_p, seed_ptr, start_position_ptr, owner, j, row, draft,
                work, results, chunk, BLOCK: tl.constexpr, BUF: tl.constexpr, STAGES: tl.constexpr):
    """The pass of every row of the sampling op, in one copy of `lane_stats` (registers, code
    size): a greedy or temperature-only row is decided (`light_decision`; a temperature-only
    row leaves its chunks' prefix masses for the accept kernel's search); a top-k / top-p row
    (draft -1: no mass below it; the mass only for top-p alone, as in `filtered_lanes`) keeps
    its lanes and stats (`store_lanes`) and its pair (`store_pair`) for the FILTERED launch. A row
    whose filters keep one token is greedy here (`decided_temperature`), and so is a top-p-alone
    row whose argmax alone reaches the nucleus (p S <= 1: its pass gives S)."""
    light = is_light(temperature, top_k, top_p, vocab)
    temperature = decided_temperature(temperature, top_k, top_p)  # (light rows only: the others keep theirs)
    top_p_alone = needs_mass(top_k, top_p, vocab)  # (of a row that is not light)
    draft_in_range = valid_draft(draft, vocab)
    d = tl.where(light | top_p_alone, draft_in_range, -1)
    # (NaN temperature compares false: greedy)
    sampling = tl.where(light, temperature > 0, top_p_alone)
    VEC: tl.constexpr = LANE_BITS // row_ptr.dtype.element_ty.primitive_bitwidth
    elems = ~light & needs_elements(top_k, top_p, vocab, BLOCK // VEC, BLOCK, BUF)
    # a chunk end stores a temperature-only row's prefix mass, or the element maxima of a top-k row's segment
    lane_max, lane_mass, x_max, arg, finite, mass, below, elem_max = lanes_and_stats(
        row_ptr, vocab, temperature, d, sampling, BLOCK, STAGES,
        prefix_ptr=tl.where(elems, elements_of(work, BLOCK // VEC), prefixes_of(work, BUF)),
        chunk=tl.where(elems, element_chunk(vocab, BLOCK, BUF), chunk), prefixes=light & sampling, PREFIXES=True,
        elems=elems, ELEMS=2 if BLOCK < BUF else 1)  # (segments: `filtered.element_count`)
    if light:
        token, match = light_decision(row_ptr, vocab, temperature, tl.load(seed_ptr),
                                      tl.load(start_position_ptr) + j + 1, d, sampling, x_max, arg, finite, mass,
                                      below)
        store_results(results, token, match, x_max, mass)
    elif top_p_alone & (finite > 0) & (top_p.to(tl.float64) * mass <= 1.0):
        # rank 0 alone reaches p S (SPEC.md step 6: rank 1 stays iff C(0) = 1 < p S), so the token is the
        # argmax, as above: decided here (a confident row), and told like a certain miss when it misses
        match = (arg == d) & (d >= 0)
        store_results(results, arg.to(tl.int64), match, x_max, mass)
        tl.store(verify_of(work, BUF) + V_MISS, (~match).to(tl.int64))
    else:
        store_lanes(work, lane_max, lane_mass, stats_of(work, BUF), x_max, arg, finite, mass, BUF, elem_max, elems,
                    vocab)
        store_pair(results, owner, j, row, draft)
        # no finite logit (token -1) or no draft in range: a miss whatever the filters
        miss = (finite == 0) | (draft_in_range < 0)
        if top_p_alone & ~miss:
            u = uniform(tl.load(seed_ptr), tl.load(start_position_ptr) + j + 1)
            x_d, _ = load_row(row_ptr, tl.maximum(d, 0), vocab)
            e_d = tl.where(x_d > float("-inf"), weight(x_d, x_max, temperature), 0.0).to(tl.float64)
            miss = certain_miss(mass, below, e_d, u, top_p)
        tl.store(verify_of(work, BUF) + V_MISS, miss.to(tl.int64))


@triton.jit
def _missed_before(work_ptr, slot, j, BUF: tl.constexpr, WORK: tl.constexpr):
    """Whether an earlier row of this slot's owner (slots slot - j .. slot - 1, the owner's rows
    0 .. j - 1, each a top-k / top-p row like this one) certainly missed its draft (V_MISS): the
    owner's accepted count ends there or before, so this row's decision is not needed (j: the
    row's index; 0, no walk, for a top-k row, told only without a finite logit or a draft). One
    row at a time from the first, until a told one (a vector of them spilled this launch's
    registers): where most rows are told, one load."""
    missed = tl.zeros((), dtype=tl.int64)
    earlier = tl.zeros((), dtype=tl.int64)
    while (earlier < j) & (missed == 0):
        missed = tl.load(verify_of(work_ptr + (slot - j + earlier) * WORK, BUF) + V_MISS)
        earlier += 1
    return missed != 0


@triton.jit
def _filtered_row(row_ptr, vocab, temperature, top_k, top_p, seed_ptr, start_position_ptr, j, draft, work, results,
                  BLOCK: tl.constexpr, BUF: tl.constexpr):
    """A top-k / top-p row's bound and candidates from the lanes of its pass (`bound_and_collect`:
    BLOCK is the pass's step), then its decision when <= 256 candidates settle it; else the
    mark FILTERED_ROW for verify_filtered_kernel (R_PAIR, R_ROW and R_DRAFT keep `store_pair`'s;
    the caller queues the slot: V_QUEUE at the index an atomic add on V_QUEUED gives)."""
    VEC: tl.constexpr = LANE_BITS // row_ptr.dtype.element_ty.primitive_bitwidth
    stats = stats_of(work, BUF)
    lane_max, lane_mass, x_max, arg, finite, mass = load_lanes(work, stats, BLOCK // VEC)
    bound_and_collect(row_ptr, vocab, temperature, top_k, top_p, lane_max, lane_mass, x_max, arg, finite, mass,
                      work, stats, BLOCK, BUF)
    u = uniform(tl.load(seed_ptr), tl.load(start_position_ptr) + j + 1)
    token = filtered_token(row_ptr, vocab, temperature, top_k, top_p, u, work, stats, BLOCK, BUF, True, False)
    if token == UNDECIDED:  # more than the small decision settles: verify_filtered_kernel
        tl.store(results + R_TOKEN, FILTERED_ROW)
    else:
        store_filtered(results, token, draft, vocab)


@triton.jit
def verify_filtered_kernel(logits_ptr, stride, start_position_ptr, temperature_ptr, top_k_ptr, top_p_ptr, seed_ptr,
                           work_ptr, vocab, chunk, num_rows, BLOCK: tl.constexpr, BUF: tl.constexpr, WORK: tl.constexpr,
                           STAGE: tl.constexpr, INLINE: tl.constexpr, LANES: tl.constexpr):
    """Each row the FILTERED row launch marked FILTERED_ROW, decided by the sample select
    (`cut_select.py`), one STAGE of it a launch: SELECT_BEGIN (the row enters it, then its first
    rounds), SELECT_ROUNDS (its next rounds; INLINE: until decided), SELECT_PASS (item (entry, c):
    parts c to c + span - 1 of the pass the queue entry's row wants) or SELECT_SEARCH (step 7).
    A decided row's token goes to its results. Programs: the search's, one a pair slot; begin's
    and the rounds', one for GROUP pair slots (a batch with no such rows pays an eighth of the
    waves), taking the entries of the select's queue (the slots the FILTERED launch left to the
    select, in the order they came; its length in one load) strided by the grid, so that the
    queued rows go to different programs, side by side, however few and wherever they are (one
    top-p owner in a batch of greedy ones; each owner's first row, its later ones moot); the
    pass', a fixed number (`launch.select_programs`) taking its items (the queue's entries x
    SELECT_SPLITS / span spans: `cut_select.pass_span_bits`, from the queue's length) in turn,
    so that such a batch pays one wave, not 16 programs a slot (a loop over all slots around
    the rounds, at their registers, spills)."""
    if STAGE == SELECT_PASS:
        queued = tl.load(verify_of(work_ptr, BUF) + V_QUEUED).to(tl.int32)
        step = tl.num_programs(0)
        span_bits = pass_span_bits(queued, step)
        items = queued << (SPLIT_BITS - span_bits)
        for item in range(tl.program_id(0), items, step):  # (`_select_stage` checks the mark)
            entry, part = pass_item(item, span_bits)
            slot = tl.load(verify_of(work_ptr + entry.to(tl.int64) * WORK, BUF) + V_QUEUE)
            _select_stage(logits_ptr, stride, start_position_ptr, temperature_ptr, top_k_ptr, top_p_ptr, seed_ptr,
                          work_ptr, vocab, chunk, slot, part, 1 << span_bits, BLOCK, BUF, WORK, STAGE, INLINE, LANES)
    elif STAGE == SELECT_SEARCH:
        _select_stage(logits_ptr, stride, start_position_ptr, temperature_ptr, top_k_ptr, top_p_ptr, seed_ptr, work_ptr,
                      vocab, chunk, tl.program_id(0), 0, 1, BLOCK, BUF, WORK, STAGE, INLINE, LANES)
    else:  # (begin and rounds: the queue's entries, strided by the grid; `_select_stage` checks each mark)
        queued = tl.load(verify_of(work_ptr, BUF) + V_QUEUED).to(tl.int32)
        entry = tl.program_id(0)
        while entry < queued:
            slot = tl.load(verify_of(work_ptr + entry.to(tl.int64) * WORK, BUF) + V_QUEUE)
            _select_stage(logits_ptr, stride, start_position_ptr, temperature_ptr, top_k_ptr, top_p_ptr, seed_ptr,
                          work_ptr, vocab, chunk, slot, 0, 1, BLOCK, BUF, WORK, STAGE, INLINE, LANES)
            entry += tl.num_programs(0)


@triton.jit
def _select_stage(logits_ptr, stride, start_position_ptr, temperature_ptr, top_k_ptr, top_p_ptr, seed_ptr, work_ptr,
                  vocab, chunk, slot, part, span, BLOCK: tl.constexpr, BUF: tl.constexpr, WORK: tl.constexpr,
                  STAGE: tl.constexpr, INLINE: tl.constexpr, LANES: tl.constexpr):
    """`verify_filtered_kernel`'s STAGE for one pair slot (part, span: the pass's first part and
    their number)."""
    work = work_ptr + slot.to(tl.int64) * WORK
    results = results_of(work, BUF)
    if tl.load(results + R_TOKEN) == FILTERED_ROW:
        owner, j, row_ptr, draft = stored_pair(results, logits_ptr, stride)
        temperature = tl.load(temperature_ptr + owner)
        stats = stats_of(work, BUF)
        x_max = load_f32(stats + S_X_MAX)
        if STAGE == SELECT_PASS:
            select_pass_part(row_ptr, vocab, temperature, x_max, work, stats, parts_of(work, BUF), part, span, chunk,
                             BUF, LANES)
        else:
            u = uniform(tl.load(seed_ptr + owner), tl.load(start_position_ptr + owner) + j + 1)
            top_k = tl.load(top_k_ptr + owner)
            top_p = tl.load(top_p_ptr + owner)
            token = tl.zeros((), dtype=tl.int64) + UNDECIDED
            if STAGE == SELECT_SEARCH:
                token = select_search(row_ptr, vocab, temperature, u, x_max, stats, LANES)
                store_filtered(results, token, draft, vocab)  # (UNDECIDED only past the loop guard: never)
            else:
                if STAGE == SELECT_BEGIN:
                    token = filtered_token(row_ptr, vocab, temperature, top_k, top_p, u, work, stats, BLOCK, BUF,
                                           False, True)
                if token == UNDECIDED:
                    token = select_rounds(row_ptr, vocab, temperature, top_k, top_p, u, x_max, work, stats,
                                          parts_of(work, BUF), chunk, BUF, INLINE, valid_draft(draft, vocab))
                if token != UNDECIDED:
                    store_filtered(results, token, draft, vocab)


@triton.jit
def store_filtered(results, token, draft, vocab):
    """A top-k / top-p row's decision (`scratch.store_results`): its token, and whether it is the draft."""
    d = valid_draft(draft, vocab)
    zero = tl.zeros((), dtype=tl.float32)
    store_results(results, token, (token == d) & (d >= 0), zero, zero)


@triton.jit
def _first_miss(work_ptr, start, n, BUF: tl.constexpr, WORK: tl.constexpr, BLOCK_J: tl.constexpr):
    """The first unmatched j of an owner with n > 0 rows from slot `start` (the last row never matches)."""
    miss = n - 1
    for base in range(0, n, BLOCK_J):
        j = base + tl.arange(0, BLOCK_J)
        matched = tl.load(results_of(work_ptr + (start + j) * WORK, BUF) + R_MATCH, mask=j < n, other=1)
        miss = tl.minimum(miss, tl.min(tl.where(matched == 0, j, n - 1), 0))
    return miss


@triton.jit
def verify_accept_kernel(logits_ptr, stride, offsets_ptr, start_position_ptr, temperature_ptr,
                         seed_ptr, work_ptr, accepted_ptr, next_token_ptr,
                         num_rows, num_owners, vocab, chunk, GREEDY: tl.constexpr, BLOCK: tl.constexpr,
                         BUF: tl.constexpr, WORK: tl.constexpr, SPLITS: tl.constexpr, BLOCK_O: tl.constexpr,
                         BLOCK_J: tl.constexpr):
    owner = tl.program_id(0).to(tl.int64)
    start, n, first_row = owner_layout(offsets_ptr, num_owners, num_rows, owner, BLOCK_O)
    accepted = tl.zeros((), dtype=tl.int64)
    token = tl.zeros((), dtype=tl.int64) - 1
    if n > 0:
        miss = _first_miss(work_ptr, start, n, BUF, WORK, BLOCK_J)
        accepted = miss
        work = work_ptr + (start + miss) * WORK
        results = results_of(work, BUF)
        token = tl.load(results + R_TOKEN)
        if not GREEDY:  # (the greedy op passes no sampling inputs: compile none of this)
            if token == SEARCH_LATER:  # a temperature-only row: search its token in the chunk that holds it
                u = uniform(tl.load(seed_ptr + owner), tl.load(start_position_ptr + owner) + miss + 1)
                x_max = load_f32(results + R_X_MAX)
                mass = load_f64(results + R_MASS)
                token = light_token_from_prefixes(logits_ptr + (first_row + miss) * stride, vocab,
                                                  tl.load(temperature_ptr + owner), u, x_max, mass,
                                                  prefixes_of(work, BUF), chunk, SPLITS, BLOCK)
    tl.store(accepted_ptr + owner, accepted)
    tl.store(next_token_ptr + owner, token)


def launch(logits, tokens, offsets, start_position, temperature, top_k, top_p, seed,
           greedy: bool = False, cap: int | None = None,
           block: int | None = None, scratch: Scratch | None = None):
    """`scratch`: one of `launch.scratch_for` with the same logits, cap and block, kept by the
    caller to look inside afterwards (by default a fresh one)."""
    num_rows, vocab = logits.shape
    num_owners = offsets.shape[0] - 1
    device = logits.device
    accepted = torch.empty(num_owners, dtype=torch.int64, device=device)
    next_token = torch.empty(num_owners, dtype=torch.int64, device=device)
    _, heavy = launch_config(vocab, cap, block, logits.element_size())
    width = scratch_width(heavy.buf)
    work = checked_scratch(scratch, logits, heavy.buf).work
    if num_rows > 0 and num_owners > 0:
        decide = decide_config(vocab, block, logits.element_size())
        chunk, splits = prefix_chunks(vocab, decide.block)
        select_chunk, select_lanes = select_config(vocab, logits.element_size())
        args = (logits, logits.stride(0), tokens, offsets, start_position, temperature, top_k, top_p,
                seed, work, num_rows, num_owners, vocab, chunk)
        wrap_triton(verify_rows_kernel)[(num_rows,)](
            *args, GREEDY=greedy, FILTERED=False, BLOCK=decide.block, BUF=heavy.buf, WORK=width,
            STAGES=decide.stages, BLOCK_O=BLOCK_O, num_warps=decide.warps)
        if not greedy:
            marked = filtered_rows_config(decide)
            wrap_triton(verify_rows_kernel)[(num_rows,)](
                *args, GREEDY=False, FILTERED=True, BLOCK=marked.block, BUF=heavy.buf, WORK=width,
                STAGES=marked.stages, BLOCK_O=BLOCK_O, num_warps=marked.warps)

            def select(stage, inline=False):  # one stage of the select (pass and search: the light ones)
                grid = ((select_programs(device),) if stage == SELECT_PASS else (num_rows,) if stage == SELECT_SEARCH
                        else (triton.cdiv(num_rows, GROUP.value),))
                light = stage in (SELECT_PASS, SELECT_SEARCH)
                wrap_triton(verify_filtered_kernel)[grid](
                    logits, logits.stride(0), start_position, temperature, top_k, top_p, seed, work, vocab,
                    select_chunk, num_rows, BLOCK=heavy.block, BUF=heavy.buf, WORK=width, STAGE=stage.value,
                    INLINE=inline, LANES=select_lanes, num_warps=SELECT_WARPS if light else heavy.warps)

            select(SELECT_BEGIN)
            select(SELECT_PASS)
            select(SELECT_ROUNDS)  # (a row that wants another pass: the pass launch again, split over the GPU)
            select(SELECT_PASS)
            select(SELECT_ROUNDS, inline=True)  # (every row left decided: the design's bound)
            select(SELECT_SEARCH)
        wrap_triton(verify_accept_kernel)[(num_owners,)](
            logits, logits.stride(0), offsets, start_position, temperature, seed, work, accepted,
            next_token, num_rows, num_owners, vocab, chunk, GREEDY=greedy, BLOCK=decide.block, BUF=heavy.buf,
            WORK=width, SPLITS=splits, BLOCK_O=BLOCK_O, BLOCK_J=BLOCK_J, num_warps=decide.warps)
    else:
        accepted.zero_()
        next_token.fill_(-1)
    return accepted, next_token


@triton_op("dflash::dflash_verify", mutates_args={})
def dflash_verify(
    logits: torch.Tensor,  # [R, V]
    tokens: torch.Tensor,  # [R] int64
    offsets: torch.Tensor,  # [O+1] int64
    start_position: torch.Tensor,  # [O] int64
    temperature: torch.Tensor,  # [O] float32
    top_k: torch.Tensor,  # [O] int64
    top_p: torch.Tensor,  # [O] float32
    seed: torch.Tensor,  # [O] int64
) -> tuple[torch.Tensor, torch.Tensor]:  # accepted [O], next_token [O]
    owner_params = {"start_position": start_position, "temperature": temperature, "top_k": top_k,
                    "top_p": top_p, "seed": seed}
    check_inputs("dflash_verify", logits, tokens=tokens, offsets=offsets, **owner_params)
    check_length("dflash_verify", "tokens", tokens, logits.shape[0], "R (logits rows)")
    for name, t in owner_params.items():
        check_length("dflash_verify", name, t, offsets.shape[0] - 1, "O (offsets entries - 1)")
    return launch(logits, tokens, offsets, start_position, temperature, top_k, top_p, seed)


@dflash_verify.register_fake
def _(logits, tokens, offsets, start_position, temperature, top_k, top_p, seed):
    owners = offsets.shape[0] - 1
    return (offsets.new_empty((owners,), dtype=torch.int64), offsets.new_empty((owners,), dtype=torch.int64))

