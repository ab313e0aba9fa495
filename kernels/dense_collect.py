"""A whole-row walk that appends every token above a key bound to a candidate list.

`filtered.collect` reads only the (lane, step) pairs whose lane maximum reaches the
bound, one 16-byte vector per thread and iteration, with an atomic slot per candidate.
A top-p row collected at its lowest lane maximum reads every pair that way, one program
for the whole row, each iteration waiting for its load and then for its slots: the
slowest walk of the launch. `filtered.collect` leaves such a row to `walk_collect` in the decision's
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

from .common import FLT_MAX, ordered_key, sanitize
from .sampling_rule import KEY_OFFSET

WALK_PAIRS = tl.constexpr(256)  # threads per iteration of `walk_collect` (one each at 8 warps)
WALK_BYTES = tl.constexpr(32)  # logits bytes per thread and iteration
WALK_STAGES = tl.constexpr(3)  # software-pipelining depth
WIDE_BINS = tl.constexpr(256)  # `wide_bins`: BINS_PER_UNIT per unit of (x_max - x) / T, the last open
BINS_PER_UNIT = tl.constexpr(8.0)  # (a bin: weights within a factor e^(1/8); 255 bins reach e^-31.9)


@triton.jit
def bin_scale(temperature):
    """Bins per unit of x_max - x at temperature T (T = +inf: one bin; no NaN)."""
    return tl.minimum(BINS_PER_UNIT.value / temperature, FLT_MAX)


@triton.jit
def wide_bins(x, fin, x_max, scale):
    """The counts per bin of (x_max - x) / T of one iteration's logits (`nucleus.wide_bound`'s
    bins): the last bin is open, and holds the logits that are not finite too."""
    d = tl.where(x >= x_max, 0.0, (x_max - x) * scale)  # (inf * 0 or an infinite scale: no NaN)
    bins = tl.where(fin, tl.minimum(d, WIDE_BINS - 1.0), WIDE_BINS - 1.0).to(tl.int32)
    return tl.histogram(tl.reshape(bins, [bins.numel], can_reorder=True), WIDE_BINS)


@triton.jit
def without_padding(acc, start, end, WIDTH: tl.constexpr):
    """`wide_bins` counts of a walk of [start, end), less the positions past `end` that it
    loaded masked (counted in the last bin): the bins of a row walked in chunks add up to
    those of one walk. (V may be a Python int here: no .to() on an expression of it.)"""
    STEP: tl.constexpr = WALK_PAIRS * WIDTH
    padding = (end - start + STEP - 1) // STEP * STEP - (end - start)
    return acc - tl.where(tl.arange(0, WIDE_BINS) == WIDE_BINS - 1, padding, 0).to(tl.int32)


@triton.jit
def walk_collect(row_ptr, start, end, theta, key_ptr, index_ptr, LIST: tl.constexpr, hist_ptr=0, x_max=0.0,
                 scale=0.0, HIST: tl.constexpr = False):
    """Store every finite token of the row's logits [start, end) (the whole row: 0, V) with
    unsigned key >= theta (int64) in index order to the list (int32 `ordered_key`s at
    key_ptr, int32 indices at index_ptr, LIST entries at most); returns their number (more
    than LIST: only LIST stored). WALK_PAIRS threads of WALK_BYTES of contiguous logits per
    iteration (`split_walk` gives each program a multiple of WIDTH logits, so that its loads
    stay aligned vectors). HIST: the same walk also counts its logits per `wide_bins` bin
    (x_max, scale: `bin_scale`) and adds the counts to the WIDE_BINS int32 at hist_ptr."""
    WIDTH: tl.constexpr = WALK_BYTES * 8 // row_ptr.dtype.element_ty.primitive_bitwidth
    bound = (theta - KEY_OFFSET).to(tl.int32)
    count = tl.zeros((), dtype=tl.int32)
    if HIST:
        acc = tl.zeros((WIDE_BINS,), dtype=tl.int32)
    for base in tl.range(start, end, WALK_PAIRS * WIDTH, num_stages=WALK_STAGES):
        offs = base + tl.arange(0, WALK_PAIRS)[:, None] * WIDTH + tl.arange(0, WIDTH)[None, :]
        x = sanitize(tl.load(row_ptr + offs, mask=offs < end, other=float("-inf")))  # (not `load_row`: the
        fin = x > float("-inf")  # keys pick the slots, see the package docstring on the mutation analysis)
        key = ordered_key(x)
        take = (fin & (key >= bound)).to(tl.int32)
        n = tl.sum(take, 1)
        slot = count + (tl.cumsum(n, 0) - n)[:, None] + tl.cumsum(take, 1) - take
        ok = (take > 0) & (slot < LIST)
        tl.store(key_ptr + slot, key, mask=ok)
        tl.store(index_ptr + slot, offs, mask=ok)
        count += tl.sum(n, 0)
        if HIST:
            acc += wide_bins(x, fin, x_max, scale)
    if HIST:
        acc = without_padding(acc, start, end, WIDTH)
        tl.atomic_add(hist_ptr + tl.arange(0, WIDE_BINS), acc, mask=acc != 0, sem="relaxed")
    tl.debug_barrier()  # the list is read by other threads next
    return count.to(tl.int64)
