"""Whole-row collects split over the programs of `dflash_verify`'s decision launch.

`filtered.collect` leaves a top-p row whose bound takes most of its lanes (count WALK_ROW)
to a whole-row walk (`dense_collect.walk_collect`). Done by the row's own program in
`verify_filtered_kernel`, that walk took 64 us for V = 151936 bf16 on the H200 (one program
reads 304 KB at ~5 GB/s) while the launch's other programs had exited: on the benchmark's
LLM-like rows (64 x 16, T = 0.8, top-p 0.9) each input of 1024 rows had 5-8 such rows, with
171-2247 candidates, and the launch waited ~130 us for them (the walk, then their sort).

Here the FILTERED row launch queues such rows (`queue_walk`). In the decision launch, every
program without a row of its own to decide takes chunks by an atomic ticket
(`split_walks`): ticket t is chunk t % SPLIT of queued row t // SPLIT, walked into that
chunk's segment of the row's list (SEGMENT = 2 * BUF / SPLIT entries; the chunk's count in
the row's hot-lane words). The program that finishes a row's last chunk (an atomic count
of finished chunks, fences on both sides) packs the segments in chunk order (`_pack`): the
list `walk_collect` gives, in index order, so the decision's sums do not depend on which
program finished first. It then takes no more tickets and decides that row: a program
decides one row at most (the programs with a row of their own take no ticket), and the
tickets never run out of takers (each queued row's own program has no row of its own). A
chunk with more than SEGMENT candidates leaves the row's count at WALK_ROW: the deciding
program walks the whole row itself, as before.
"""

import os

import triton
import triton.language as tl

from .dense_collect import WALK_BYTES, WALK_PAIRS, walk_collect
from .filtered import HOT_WORDS, keys_of, results_of, stats_of

SPLIT = tl.constexpr(32)  # chunks per queued row


def walk_chunk(vocab: int, itemsize: int) -> int:
    """Logits per program of a split walk: V / SPLIT, rounded up to whole WALK_BYTES vectors
    per thread (16 logits at least: an integer argument divisible by 16 tells Triton that
    every chunk starts aligned, so its loads stay vectors)."""
    width = max(16, WALK_BYTES.value // itemsize)
    per = -(-vocab // SPLIT.value)
    return -(-per // width) * width


def fences() -> bool:
    """Whether the kernels fence the split walk's hand-over (not in the interpreter, which runs
    programs one after another and has no inline assembly)."""
    return os.environ.get("TRITON_INTERPRET", "0") != "1"


def queue_words(num_rows):
    """int64 words of the queue: [rows queued, tickets taken, the queued rows' pair slots]."""
    return 2 + num_rows


@triton.jit
def _fence(FENCE: tl.constexpr):
    """fence.acq_rel.gpu in every thread (CUDA's __threadfence): its global stores before any
    later store or atomic, seen from the whole GPU; its later loads after them."""
    if FENCE:
        tl.inline_asm_elementwise("fence.acq_rel.gpu;\n\tmov.u32 $0, $1;", "=r,r",
                                  [tl.zeros((WALK_PAIRS,), dtype=tl.int32)], dtype=tl.int32, is_pure=False,
                                  pack=1)


@triton.jit
def queue_walk(queue_ptr, slot, buf_ptr, BUF: tl.constexpr):
    """Queue the whole-row walk of this program's row (pair slot `slot`, scratch row at
    buf_ptr) for the decision launch. queue_ptr: `queue_words`; the first row launch zeroes
    its two counts."""
    tl.static_assert(2 * SPLIT + 1 <= HOT_WORDS)  # finished chunks, chunk counts, chunk starts
    q = tl.atomic_add(queue_ptr, 1)
    tl.store(buf_ptr + 2 * BUF, 0)  # no chunk finished yet
    tl.store(queue_ptr + 2 + q, slot)


@triton.jit
def split_walks(logits_ptr, stride, vocab, chunk, work_ptr, queue_ptr, asked, BUF: tl.constexpr,
                WORK: tl.constexpr, FENCE: tl.constexpr):
    """Take tickets (chunks of the `asked` queued rows) until they run out or this program
    finishes a row's last chunk; returns that row's pair slot (its list packed), else -1."""
    total = asked * SPLIT
    decide = tl.zeros((), dtype=tl.int64) - 1
    t = tl.atomic_add(queue_ptr + 1, 1)
    while t < total:
        slot = tl.load(queue_ptr + 2 + t // SPLIT)
        work = work_ptr + slot * WORK
        row_ptr = logits_ptr + tl.load(results_of(work, BUF) + 2) * stride  # (`verify.store_pair`'s row)
        if walk_part(row_ptr, vocab, chunk, (t % SPLIT).to(tl.int32), work, stats_of(work, BUF), BUF, FENCE):
            decide = slot
            t = total
        else:
            t = tl.atomic_add(queue_ptr + 1, 1)
    return decide


@triton.jit
def walk_part(row_ptr, vocab, chunk, part, buf_ptr, stats_ptr, BUF: tl.constexpr, FENCE: tl.constexpr):
    """Chunk `part` of a queued row's walk (logits [part * chunk, + chunk), at the bound in
    its stats) into its segment of the row's list; true for the program that finished the
    row's last chunk, which has packed the list (`_pack`) and decides the row next."""
    SEGMENT: tl.constexpr = 2 * BUF // SPLIT
    tl.static_assert(SEGMENT * SPLIT == 2 * BUF)
    hot = buf_ptr + 2 * BUF  # [finished chunks, SPLIT chunk counts, SPLIT chunk starts]
    start = part * chunk
    n = walk_collect(row_ptr, start, tl.minimum(start + chunk, vocab), tl.load(stats_ptr + 5),
                     keys_of(buf_ptr) + part * SEGMENT, keys_of(buf_ptr) + 2 * BUF + part * SEGMENT, SEGMENT)
    tl.store(hot + 1 + part, n)
    _fence(FENCE)  # this program's segment and count, before the count of finished chunks
    tl.debug_barrier()
    last = tl.atomic_add(hot, 1, sem="acq_rel", scope="gpu") == SPLIT - 1
    if last:
        tl.debug_barrier()
        _fence(FENCE)  # the other programs' segments, before this one reads them
        _pack(buf_ptr, stats_ptr, BUF)
    return last


@triton.jit
def _pack(buf_ptr, stats_ptr, BUF: tl.constexpr):
    """The segments, moved to the front of the list in chunk order (each in index order), and
    their total as the row's count; if a chunk overflowed its segment, nothing: the count
    stays WALK_ROW."""
    SEGMENT: tl.constexpr = 2 * BUF // SPLIT
    hot = buf_ptr + 2 * BUF
    c = tl.arange(0, SPLIT)
    counts = tl.load(hot + 1 + c, cache_modifier=".cg")
    if tl.max(counts, 0) <= SEGMENT:
        tl.store(hot + 1 + SPLIT + c, tl.cumsum(counts, 0) - counts)
        tl.debug_barrier()  # the starts, stored by other threads
        i = tl.arange(0, 2 * BUF)
        at = i % SEGMENT
        live = at < tl.load(hot + 1 + i // SEGMENT, cache_modifier=".cg")
        to = tl.load(hot + 1 + SPLIT + i // SEGMENT) + at
        key = tl.load(keys_of(buf_ptr) + i, mask=live, other=0, cache_modifier=".cg")
        index = tl.load(keys_of(buf_ptr) + 2 * BUF + i, mask=live, other=0, cache_modifier=".cg")
        tl.debug_barrier()  # every entry loaded before any moves (to <= i)
        tl.store(keys_of(buf_ptr) + to, key, mask=live)
        tl.store(keys_of(buf_ptr) + 2 * BUF + to, index, mask=live)
        tl.store(stats_ptr, tl.sum(counts, 0))
        tl.debug_barrier()
