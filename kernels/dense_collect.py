"""A whole-row walk that appends every token above a key bound to a candidate list.

`filtered.collect` reads only the (lane, step) pairs whose lane maximum reaches the
bound, one 16-byte vector per thread and iteration, with an atomic slot per candidate.
A top-p row collected at its lowest lane maximum reads every pair that way: ~100 us for a
V = 151936 bf16 row in one program on the H200 (each iteration waits for its load, then
for its slots). `filtered.collect` leaves such a row to `walk_collect` in the decision's
launch (whose registers it fits), where `split_walk` shares it out over 32 programs (each
walks a chunk); `nucleus.wide_list` collects with it too.

Here each thread reads WALK_BYTES of contiguous logits per iteration through the
software pipeline (async copies keep the loads in flight, not registers), and the slots
come from a running count and a prefix sum over the iteration's threads: no round trip
to memory per iteration, and the list is in index order (its sums do not depend on
which thread got there first).
"""

import triton
import triton.language as tl

from .common import ordered_key
from .sampling_rule import KEY_OFFSET, load_row

WALK_PAIRS = tl.constexpr(256)  # threads per iteration of `walk_collect` (one each at 8 warps)
WALK_BYTES = tl.constexpr(32)  # logits bytes per thread and iteration
WALK_STAGES = tl.constexpr(3)  # software-pipelining depth


@triton.jit
def walk_collect(row_ptr, start, end, theta, key_ptr, index_ptr, LIST: tl.constexpr):
    """Store every finite token of the row's logits [start, end) (the whole row: 0, V) with
    unsigned key >= theta (int64) in index order to the list (int32 `ordered_key`s at
    key_ptr, int32 indices at index_ptr, LIST entries at most); returns their number (more
    than LIST: only LIST stored). WALK_PAIRS threads of WALK_BYTES of contiguous logits per
    iteration (`split_walk` gives each program a multiple of WIDTH logits, so that its loads
    stay aligned vectors)."""
    WIDTH: tl.constexpr = WALK_BYTES * 8 // row_ptr.dtype.element_ty.primitive_bitwidth
    bound = (theta - KEY_OFFSET).to(tl.int32)
    count = tl.zeros((), dtype=tl.int32)
    for base in tl.range(start, end, WALK_PAIRS * WIDTH, num_stages=WALK_STAGES):
        offs = base + tl.arange(0, WALK_PAIRS)[:, None] * WIDTH + tl.arange(0, WIDTH)[None, :]
        x, fin = load_row(row_ptr, offs, end)
        key = ordered_key(x)
        take = (fin & (key >= bound)).to(tl.int32)
        n = tl.sum(take, 1)
        slot = count + (tl.cumsum(n, 0) - n)[:, None] + tl.cumsum(take, 1) - take
        ok = (take > 0) & (slot < LIST)
        tl.store(key_ptr + slot, key, mask=ok)
        tl.store(index_ptr + slot, offs, mask=ok)
        count += tl.sum(n, 0)
    tl.debug_barrier()  # the list is read by other threads next
    return count.to(tl.int64)
