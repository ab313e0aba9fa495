"""Whole-row collects split over the programs of `dflash_verify`'s decision launch.

`filtered.collect` leaves a top-p row whose bound takes most of its lanes (count WALK_ROW)
to a whole-row walk (`dense_collect.walk_collect`). Done by the row's own program in
`verify_filtered_kernel`, one program reads the whole row while the launch's other programs
have exited, and the launch waits for it (and, where that list falls short of the target,
for two more single-program passes of `nucleus.wide_list`); the benchmark's LLM-like rows
have a few such rows per 1024 (benchmarks/RESULTS.md's history, sessions 20-21).

Here the FILTERED row launch queues such rows (`queue_walk`). In the decision launch, every
program without a row of its own to decide takes chunks by an atomic ticket
(`split_walks`), in two phases of SPLIT chunks per queued row; every first-phase ticket
comes before every second-phase one.

1. Chunk c of a row walks logits [c * chunk, + chunk) at the row's bound into its segment of
   the row's list (SEGMENT = 2 * BUF / SPLIT entries; the chunk's count in the hot words),
   and adds the chunk's counts per bin of (x_max - x) / T (`dense_collect.wide_bins`) to the
   row's bins. The program that finishes the row's last chunk (an atomic count of finished
   chunks, acq_rel at GPU scope, see below) packs the segments in chunk order (`_pack`): the list
   `walk_collect` gives, in index order, so the decision's sums do not depend on which
   program finished first. If that list reaches the target (or the row is not top-p alone,
   or a chunk overflowed its segment: the decision walks the whole row, as before), that
   program decides the row. If it falls short (or more candidates than the list holds), the
   row's bins, added up, are `wide_list`'s counting pass: their bound (`nucleus.wide_bound_of`)
   is published for phase 2, or, without one, the program decides the row (its general
   path, bracketed by the same bins).
2. The row's second-phase chunks wait for that outcome (a takers' spin on the row's state: every
   first-phase chunk is held by a running program that waits for nothing, so the spin ends),
   then walk at the bins' bound; the program that finishes the last one packs the list
   (`wide_list`'s) and decides the row. A decided row's second-phase tickets are skipped: its
   first taker moves the ticket count past them (an atomic max).

Hand-overs between programs (a chunk's segment and bins to the row's packer, phase 1's
outcome to phase 2) follow the cooperative-groups grid-sync pattern: the writer's threads
store, the program's barrier, one atomic with release (acq_rel) at GPU scope; the reader's
acquire atomic, the program's barrier, its threads' loads. PTX's causality order runs through
both barriers, so no fence instruction is needed; Triton has one only as inline assembly,
which torch's mutation analysis cannot read (AOTInductor export then copies every input of
the kernel, the logits among them: `tests/kernels/test_kernels_compile.py`).

A program decides one row at most (the programs with a row of their own take no ticket),
and the tickets never run out of takers (each queued row's own program has no row of its
own; a program stops taking tickets only when they run out or it decides a row).
"""

import triton
import triton.language as tl

from .dense_collect import WALK_BYTES, WIDE_BINS, bin_scale, walk_collect
from .filtered import _candidate_mass
from .scratch import (BINS_LIST, BINS_NO_LIST, DONE, HOT_WORDS, NOT_READY, S_BINS, S_COUNT, S_MASS, S_WALK_BOUND,
                      S_WIDE_HI, S_WIDE_LO, S_WIDE_SHORT, S_X_MAX, SPLIT, W_BINS, W_COUNTS, W_FINISHED, W_STARTS,
                      W_STATE, WALK_ROW, hot_of, keys_of, load_f32, load_f64, results_of, stats_of, stored_pair)
from .nucleus import WIDE_SLACK, wide_bound_of
from .sampling_rule import filters


def walk_chunk(vocab: int, itemsize: int) -> int:
    """Logits per program of a split walk: V / SPLIT, rounded up to whole WALK_BYTES vectors
    per thread (16 logits at least: an integer argument divisible by 16 tells Triton that
    every chunk starts aligned, so its loads stay vectors)."""
    width = max(16, WALK_BYTES.value // itemsize)
    per = -(-vocab // SPLIT.value)
    return -(-per // width) * width


@triton.jit
def queue_walk(queue_ptr, slot, buf_ptr, BUF: tl.constexpr):
    """Queue the whole-row walk of this program's row (pair slot `slot`, scratch row at
    buf_ptr) for the decision launch. queue_ptr: `scratch.queue_words`; the first row launch zeroes
    its two counts."""
    tl.static_assert(W_BINS + WIDE_BINS // 2 <= HOT_WORDS)
    hot = hot_of(buf_ptr, BUF)
    tl.store(hot + W_FINISHED, 0)  # no chunk finished yet
    tl.store(hot + W_STATE, NOT_READY)
    tl.store(hot + W_BINS + tl.arange(0, WIDE_BINS // 2), 0)
    q = tl.atomic_add(queue_ptr, 1)
    tl.store(queue_ptr + 2 + q, slot)


@triton.jit
def split_walks(logits_ptr, stride, vocab, chunk, work_ptr, queue_ptr, asked, temperature_ptr, top_k_ptr, top_p_ptr,
                BUF: tl.constexpr, WORK: tl.constexpr, CAP: tl.constexpr):
    """Take tickets (2 * SPLIT chunks of each of the `asked` queued rows) until they run out
    or this program finishes the last work of a row; returns that row's place in the queue (its
    decision's list, or its bins, ready: its pair slot is word 2 + place of the queue), else -1.
    (Not the slot itself: the caller's stores go to that slot's scratch row, and a helper's
    result would count as a write to every argument, the logits among them, for torch's
    mutation analysis: the package docstring.)"""
    per_phase = asked * SPLIT
    decide = tl.zeros((), dtype=tl.int64) - 1
    t = tl.atomic_add(queue_ptr + 1, 1)
    while t < 2 * per_phase:
        second = t >= per_phase
        u = tl.where(second, t - per_phase, t)
        slot = tl.load(queue_ptr + 2 + u // SPLIT)
        work = work_ptr + slot * WORK
        hot = hot_of(work, BUF)
        stats = stats_of(work, BUF)
        owner, _, row_ptr, _ = stored_pair(results_of(work, BUF), logits_ptr, stride)
        theta = tl.load(stats + S_WALK_BOUND)
        if second:
            theta = _await(hot + W_STATE)
        temperature = tl.load(temperature_ptr + owner)
        last = tl.zeros((), dtype=tl.int1)
        if theta < 0:  # DONE (decided after phase 1): no ticket of the row's phase 2 has work
            tl.atomic_max(queue_ptr + 1, per_phase + (u // SPLIT + 1) * SPLIT)
        else:
            last = walk_part(row_ptr, vocab, chunk, (u % SPLIT).to(tl.int32), theta, temperature, work, stats, BUF)
        if last:
            if second:
                decide = u // SPLIT
            else:
                bound = _first_outcome(work, stats, vocab, temperature, tl.load(top_k_ptr + owner),
                                       tl.load(top_p_ptr + owner), BUF, CAP)
                if bound < 0:
                    decide = u // SPLIT
                else:
                    tl.store(hot + W_FINISHED, 0)  # no chunk of phase 2 finished yet
                tl.debug_barrier()  # the stats, the list and the reset count, before the state
                tl.atomic_xchg(hot + W_STATE, tl.where(bound >= 0, bound, DONE), sem="release", scope="gpu")
        if decide >= 0:
            t = 2 * per_phase
        else:
            t = tl.atomic_add(queue_ptr + 1, 1)
    return decide


@triton.jit
def _await(state_ptr):
    """A queued row's phase-2 state, once phase 1 has set it (DONE or the bound)."""
    state = tl.atomic_add(state_ptr, 0, sem="acquire", scope="gpu")
    while state == NOT_READY:
        state = tl.atomic_add(state_ptr, 0, sem="acquire", scope="gpu")
    tl.debug_barrier()  # the stats and the reset count, after the state
    return state


@triton.jit
def _first_outcome(work, stats, vocab, temperature, top_k, top_p, BUF: tl.constexpr, CAP: tl.constexpr):
    """After phase 1 of a queued row (its list packed, or its count left at WALK_ROW or past the
    list): the bound of phase 2, or -1 when phase 1 settles what the decision gets. A top-p-alone
    row whose list falls short of the target or overflows gets its bins' verdict
    (`nucleus.wide_bound_of`, as `wide_list` gives it; S_BINS and S_WIDE_* for `filtered_token`):
    with a bound, the count goes back to WALK_ROW and the bound to the stats (phase 2 packs
    its list there; a segment overflow leaves the decision a whole walk at that bound)."""
    count = tl.load(stats + S_COUNT)
    x_max = load_f32(stats + S_X_MAX)
    mass = load_f64(stats + S_MASS)
    use_k, use_p = filters(top_k, top_p, vocab)
    top_p_alone = use_p & ~use_k
    target = top_p.to(tl.float64) * mass
    short = top_p_alone & (count > 2 * BUF)
    if top_p_alone & (count >= 0) & (count <= 2 * BUF):
        short = _candidate_mass(work, count, x_max, temperature) < target
    bound = tl.zeros((), dtype=tl.int64) - 1
    if short:
        acc = tl.load((hot_of(work, BUF) + W_BINS).to(tl.pointer_type(tl.int32)) + tl.arange(0, WIDE_BINS),
                      cache_modifier=".cg")
        LIST: tl.constexpr = 2 * BUF
        bound, lo, hi, cap_short = wide_bound_of(acc, x_max, bin_scale(temperature), LIST - LIST // WIDE_SLACK, mass,
                                                 target, CAP)
        tl.store(stats + S_WIDE_LO, lo)
        tl.store(stats + S_WIDE_HI, hi)
        tl.store(stats + S_WIDE_SHORT, cap_short.to(tl.int64))
        tl.store(stats + S_BINS, tl.where(bound >= 0, BINS_LIST, BINS_NO_LIST))
        if bound >= 0:
            tl.store(stats + S_COUNT, WALK_ROW)
            tl.store(stats + S_WALK_BOUND, bound)
    return bound


@triton.jit
def walk_part(row_ptr, vocab, chunk, part, theta, temperature, buf_ptr, stats_ptr, BUF: tl.constexpr):
    """Chunk `part` of a queued row's walk (logits [part * chunk, + chunk), at the bound theta)
    into its segment of the row's list, its counts per bin added to the row's bins; true for
    the program that finished the phase's last chunk, which has packed the list (`_pack`)."""
    SEGMENT: tl.constexpr = 2 * BUF // SPLIT
    tl.static_assert(SEGMENT * SPLIT == 2 * BUF)
    hot = hot_of(buf_ptr, BUF)
    end = tl.minimum((part + 1) * chunk, vocab)
    start = tl.minimum(part * chunk, end)
    x_max = load_f32(stats_ptr + S_X_MAX)
    n = walk_collect(row_ptr, start, end, theta, keys_of(buf_ptr) + part * SEGMENT,
                     keys_of(buf_ptr) + 2 * BUF + part * SEGMENT, SEGMENT,
                     (hot + W_BINS).to(tl.pointer_type(tl.int32)), x_max, bin_scale(temperature), True)
    tl.store(hot + W_COUNTS + part, n)
    tl.debug_barrier()  # this program's segment, count and bins, before the count of finished chunks
    last = tl.atomic_add(hot + W_FINISHED, 1, sem="acq_rel", scope="gpu") == SPLIT - 1
    if last:
        tl.debug_barrier()  # the other programs' segments, before this one reads them
        _pack(buf_ptr, stats_ptr, BUF)
    return last


@triton.jit
def _pack(buf_ptr, stats_ptr, BUF: tl.constexpr):
    """The segments, moved to the front of the list in chunk order (each in index order), and
    their total as the row's count; if a chunk overflowed its segment, only a total past the
    list (nothing reads the list then), else nothing: the count stays WALK_ROW."""
    SEGMENT: tl.constexpr = 2 * BUF // SPLIT
    hot = hot_of(buf_ptr, BUF)
    c = tl.arange(0, SPLIT)
    counts = tl.load(hot + W_COUNTS + c, cache_modifier=".cg")
    total = tl.sum(counts, 0)
    if tl.max(counts, 0) <= SEGMENT:
        tl.store(hot + W_STARTS + c, tl.cumsum(counts, 0) - counts)
        tl.debug_barrier()  # the starts, stored by other threads
        i = tl.arange(0, 2 * BUF)
        at = i % SEGMENT
        live = at < tl.load(hot + W_COUNTS + i // SEGMENT, cache_modifier=".cg")
        to = tl.load(hot + W_STARTS + i // SEGMENT) + at
        key = tl.load(keys_of(buf_ptr) + i, mask=live, other=0, cache_modifier=".cg")
        index = tl.load(keys_of(buf_ptr) + 2 * BUF + i, mask=live, other=0, cache_modifier=".cg")
        tl.debug_barrier()  # every entry loaded before any moves (to <= i)
        tl.store(keys_of(buf_ptr) + to, key, mask=live)
        tl.store(keys_of(buf_ptr) + 2 * BUF + to, index, mask=live)
        tl.store(stats_ptr + S_COUNT, total)
    elif total > 2 * BUF:
        tl.store(stats_ptr + S_COUNT, total)
    tl.debug_barrier()
