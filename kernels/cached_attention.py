"""`dflash::cached_attention`: each row's attention over the cells of its own KV slot that it
may see, and no others (issue #26).

Row r (query heads H, head dim D) attends to cells [lo[r], hi[r]) of slot `slot[r]` of the
caches `k_cache` / `v_cache` [S, T, KV, D]; query head h reads KV head h // G (G = H / KV,
HF's `repeat_kv` order). softmax(q k^T / sqrt(D)) v over those cells, accumulated in float32;
a row whose interval is empty gets zeros. The target's rows see [0, position + 1) of their
slot (`export/models/llama.py`).

Why: the models' reference gathers every row's whole slot ([R, T, KV, D]) and masks it, so a
step's cost grows with rows x `max_seq_len`. Here a program reads only the union of its rows'
intervals: work and memory traffic follow the cells the owners hold. The drafter's block
rows (context + block, causal or not, windowed or not) also see one interval each, once
the block's K/V are in the cache (`export/models/dflash.py`).

Tiles: BLOCK_R rows each. Rows of one slot side by side make a run (a DFlash block's rows, a
prompt chunk's; at worst one row a run). A run of at most BLOCK_R rows is one segment, taken by
the tile its first row falls in, even where it ends in the next tile's rows; a longer run is
cut at the tiles' edges (`_segments`). A program takes segments in turn, so an owner's cells
are read once per segment of its rows, not once per row, and once in all for a run of up to
BLOCK_R rows wherever it begins (cut at fixed rows instead, owners of 15 rows each had most of
their cells read twice). A segment's rows x G query heads (at most QUERIES query vectors: one
`tl.dot` operand) stream the union of the rows' intervals in blocks of BLOCK_N cells, each
query masked to its own row's [lo, hi), with an online softmax (running max and sum, rescaled
accumulator: `_attend`).

Whole runs (`cached_attention_kernel`, slots of fewer than 2 x SPLIT_CELLS cells): one program
per (tile, KV head) reads its tile's segments whole and writes their rows' outputs.

Pieces (longer slots): the launch's work, every segment's union laid end to end in tile order,
is cut into equal pieces of whole blocks, one a program of a fixed grid per KV head
(`pieces_programs`: RESIDENT programs an SM, one wave). `cached_attention_plan_kernel` writes
each tile's work and its longest segment's; each program of `cached_attention_pieces_kernel`
reads that plan, walks the tiles its piece overlaps and, for each segment it overlaps, stores
the partial softmax of the segment's cells in the piece (max, sum, unnormalised accumulator:
float32, [R, H, SPLITS], slot k for the segment's k-th piece) and, from the segment's first
piece, its count of pieces at its rows; `combine_kernel` merges a row's partials, weighting
each by exp(its max - the largest). A piece is at least SPLIT_CELLS cells (its partial, 16 KB
at 32 x 128 queries, then <= 1/32 of its reads) and at least 1/(SPLITS - 1) of the longest
segment (so a segment spans SPLITS pieces at most). Why: when a program's work followed the
owners' lengths (one program a run, or a tile cut into up to 4 pieces), at mixed lengths the
longest ran on after the rest of the GPU idled: 1.63x the floor on the H100 at lengths up to
32k with one a run; 1.17-1.19x on the H200 with up to 4 pieces a tile, where decoding's tiles
(16 one-row runs laid end to end, 8 even pieces) read at 1.03x. In equal pieces: 1.02x on the
H100 (1.10x before), but ~12 us slower on short contexts in long slots, where the plan's launch
and the combine cost more than a tail (benchmarks/RESULTS.md).

Sums in float32: float32 caches multiply in IEEE float32; bfloat16 / float16 q and K go to
the MMA in their own type, whose products are exact in its float32 sums (q k^T as exact as
from float32 copies), and the probabilities are rounded to the caches' type for the second
product, as flash attention does. (Float32 copies of K and V through TF32, the form before,
took ~250 registers against ~170 and ran 1.3x slower on the H200: benchmarks/RESULTS.md.)

`lowering.fused_attention` swaps the target's `layers.CachedAttention` for this op.

Supported domain (`supports`): float32 / bfloat16 / float16, q and caches of one dtype,
H a multiple of KV, D <= 256. Reference: `reference` (`layers.CachedAttention`, the models'
gather + masked SDPA).
"""

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

from ..export.models import layers

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
MAX_HEAD_DIM = 256
BLOCK_N = 64  # cells per step, half types; float32: half as many (tests: lengths around it cover the block edges)
MAX_ROWS = 16  # rows of one run: a DFlash block
QUERIES = 32  # query vectors (rows x query heads of one KV head) per program at most
SPLIT_CELLS = 1024  # cells a piece at least; slots of fewer than twice as many are read in whole runs
SPLITS = 8  # pieces a segment spans at most: its partials' slots ([R, H, SPLITS]: 68 MB at 1024 x 16 x 128)
RESIDENT = 2  # programs an SM holds: shared memory, 77,824 bytes a program at STAGES 3 in a half type
WAVES = 1  # `cached_attention_pieces_kernel`'s programs: WAVES x RESIDENT a streaming multiprocessor
CPU_SMS = 2  # the streaming multiprocessors assumed off a GPU (the interpreter's tests: a few programs)
BLOCK_T = 1024  # tiles a step of `cached_attention_pieces_kernel`'s walk over the plan
STAGES = 3  # the cells loop's software pipeline (Triton's default): its K and V blocks in flight. Shared memory
# in a half type (sm_90, benchmarks/kernel_registers.py): 77,824 bytes at 3, 2 programs an H100 SM; 45,056 at 2,
# 3 an SM (then the registers', 168, bound it)
WARPS = 4  # the kernel's warps (4 x 32 threads over a [QUERIES, BLOCK_N] block of scores)
PLAN_WARPS = 1
COMBINE_WARPS = 2
COMBINE_META = ("GROUPS", "BLOCK_G", "HEAD_DIM", "BLOCK_D", "SPLITS")


def supports(dtype: torch.dtype, heads: int, kv_heads: int, head_dim: int) -> bool:
    return dtype in DTYPES and kv_heads >= 1 and heads % kv_heads == 0 and 1 <= head_dim <= MAX_HEAD_DIM


def reference(q, k_cache, v_cache, slot, lo, hi):  # [R, H, D], [S, T, KV, D] x2, [R] x3 -> [R, H * D]
    """The models' way (the module this op replaces): each row gathers its whole slot and
    masks the cells outside [lo, hi)."""
    return layers.CachedAttention()(q, k_cache, v_cache, slot, lo, hi)


def in_pieces(cells: int) -> bool:
    """Slots of `cells` cells are read in pieces (`cached_attention_pieces_kernel`), not in whole
    runs."""
    return cells >= 2 * SPLIT_CELLS


def pieces_programs(device: torch.device, kv_heads: int) -> int:
    """`cached_attention_pieces_kernel`'s programs per KV head: WAVES x RESIDENT per streaming
    multiprocessor of the device, shared among the KV heads. A constant of the launch, fixed when
    a program is exported (on the GPU it will run on): equal pieces over one wave, so no program
    runs on after the others."""
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else CPU_SMS
    return max(1, WAVES * RESIDENT * sms // kv_heads)


def launch_meta(dtype: torch.dtype, heads: int, kv_heads: int, head_dim: int, cells: int) -> tuple[dict, int]:
    """The kernels' constexprs and warps for one head layout and slot size (the launcher and the
    sm_90 compile check, benchmarks/kernel_registers.py, use the same ones). BLOCK_R x BLOCK_G >=
    16 query vectors: `tl.dot`'s smallest operand. SPLITS: 1 for whole runs, else the partials'
    slots a row."""
    groups = heads // kv_heads
    block_g = triton.next_power_of_2(groups)
    return dict(GROUPS=groups, BLOCK_G=block_g, BLOCK_R=max(1, min(MAX_ROWS, QUERIES // block_g)),
                HEAD_DIM=head_dim, BLOCK_D=max(16, triton.next_power_of_2(head_dim)),
                BLOCK_N=BLOCK_N // 2 if dtype == torch.float32 else BLOCK_N,  # float32 K / V: twice the registers
                SPLITS=SPLITS if in_pieces(cells) else 1), WARPS


@triton.jit
def _segments(w, slots, before_slots, back, rows, BLOCK_R: tl.constexpr):
    """The tile's segments over its window w (rows tile .. tile + 2 x BLOCK_R - 1; `slots` and
    `before_slots` their slots and the slots of the rows before each, loaded by the kernel;
    `back`: the rows before the tile in the run of its first row, up to BLOCK_R). A run of at
    most BLOCK_R rows is one segment, of the tile its first row is in, even where it ends in
    the next tile's rows; a longer run is cut at the tiles' edges. So a program reads an
    owner's cells once, whichever row its rows begin at (a tile of BLOCK_R rows cut at fixed
    rows read the cells of a run across the cut twice: ~1.75x the attention's time at 15 rows
    an owner in the runner, benchmarks/RESULTS.md). Returns (starts: a segment's first row,
    ids: each row's segment, numbered from 1; 0 for rows not the tile's).
    Given loaded values only: its results pick the stores' rows (the package docstring's rule)."""
    k = tl.arange(0, 2 * BLOCK_R)
    valid = w < rows
    run_start = valid & (slots != before_slots)  # (row 0 has none before: before_slots -1 there)
    edge = run_start | ~valid
    run = tl.cumsum(run_start.to(tl.int32), 0)  # 0: the run the tile's first row continues (back > 0)
    # the run of the tile's first row, if it began before the tile, and of its last row, if it began in the
    # tile: only these two may be another tile's or end in the next tile's rows (a run past the window: long)
    short_first = back + tl.min(tl.where(edge, k, 2 * BLOCK_R)) <= BLOCK_R
    last_start = tl.max(tl.where(run_start & (k < BLOCK_R), k, -1))
    short_last = tl.min(tl.where(edge & (k >= BLOCK_R), k, 2 * BLOCK_R)) - last_start <= BLOCK_R
    last = tl.sum(tl.where(k == BLOCK_R - 1, run, 0))
    mine = valid & tl.where(k < BLOCK_R, (run > 0) | ~short_first, (run == last) & (last_start >= 0) & short_last)
    starts = mine & (run_start | (k == 0))
    return starts, tl.where(mine, tl.cumsum(starts.to(tl.int32), 0), 0)


@triton.jit
def _tile_segments(w, b, slots, before_slots, behind, rows, BLOCK_R: tl.constexpr):
    """`_segments` of the tile whose rows' window is w (its first row w[0]), from loaded values
    only (the package docstring's rule): `slots` the window's slots, `before_slots` the slots of
    the rows before each, `behind` the slots of the rows b before the tile (-1 past row 0)."""
    tile = tl.min(w)
    first_slot = tl.sum(tl.where(w == tile, slots, 0))
    back = tl.min(tl.where(behind != first_slot, tile - 1 - b, BLOCK_R))
    return _segments(w, slots, before_slots, back, rows, BLOCK_R)


@triton.jit
def _segment_rows(first, w, starts, ids, none, i, in_group, BLOCK_G: tl.constexpr):
    """The segment that begins at row `first`: (its end, each query vector i's row, whether that
    is the segment's and a real query head), from values only (the package docstring's rule)."""
    stop = tl.min(tl.where((w > first) & ((ids == 0) | starts), w, none))
    row = first + i // BLOCK_G
    return stop, row, (row < stop) & in_group


@triton.jit
def _attend(q, k_ptr, v_ptr, base, c_cell, lo, hi, begin, finish, scale, QUERY_VECTORS: tl.constexpr,
            HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr):
    """The online softmax of queries q [QUERY_VECTORS, BLOCK_D] over cells [begin, finish) of
    one slot and KV head (`base`), each query masked to its own [lo, hi): (running max, sum,
    unnormalised accumulator), float32. Its results are stored as values only, never pick an
    address (the package docstring's rule)."""
    IEEE: tl.constexpr = k_ptr.dtype.element_ty == tl.float32  # float32 caches: IEEE float32 products
    d = tl.arange(0, BLOCK_D)
    m = tl.full([QUERY_VECTORS], float("-inf"), tl.float32)
    total = tl.zeros([QUERY_VECTORS], tl.float32)
    acc = tl.zeros([QUERY_VECTORS, BLOCK_D], tl.float32)
    for start in range(begin, finish, BLOCK_N):
        n = start + tl.arange(0, BLOCK_N)
        at = base + n[:, None].to(tl.int64) * c_cell + d[None, :]
        kv_mask = (n < finish)[:, None] & (d < HEAD_DIM)[None, :]  # past the piece: zeros (no NaN from any cell)
        k = tl.load(k_ptr + at, mask=kv_mask, other=0.0)
        v = tl.load(v_ptr + at, mask=kv_mask, other=0.0)
        if IEEE:
            s = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:  # a half type's products are exact in the float32 sums
            s = tl.dot(q, tl.trans(k), out_dtype=tl.float32)
        sees = (n[None, :] >= lo[:, None]) & (n[None, :] < hi[:, None]) & (n < finish)[None, :]
        s = tl.where(sees, s * scale, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)  # a query that has seen nothing yet
        alpha = tl.exp(m - shift)
        p = tl.exp(s - shift[:, None])
        total = total * alpha + tl.sum(p, axis=1)
        if IEEE:
            acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
        else:  # the probabilities rounded to the half type, as flash attention does
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, out_dtype=tl.float32)
        m = m_new
    return m, total, acc


@triton.jit
def cached_attention_kernel(q_ptr, k_ptr, v_ptr, slot_ptr, lo_ptr, hi_ptr, out_ptr, rows, cells, scale, q_row,
                            q_head, c_slot, c_cell, c_head, GROUPS: tl.constexpr, BLOCK_G: tl.constexpr,
                            BLOCK_R: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                            BLOCK_N: tl.constexpr):
    """Program (tile, kv): for KV head kv, each of the tile's segments over its rows' union of
    intervals, whole: the output of the segment's rows."""
    tile = tl.program_id(0).to(tl.int64) * BLOCK_R
    kv = tl.program_id(1)
    # AOTInductor passes a Python float as fp64 (then p, and its tl.dot, were fp64; the interpreter: a float)
    scale = (tl.zeros((), dtype=tl.float32) + scale).to(tl.float32)
    w = tile + tl.arange(0, 2 * BLOCK_R)  # the tile's rows and the next tile's (where its segments end)
    b = tile - 1 - tl.arange(0, BLOCK_R)  # the rows before it
    starts, ids = _tile_segments(w, b, tl.load(slot_ptr + w, mask=w < rows, other=-1),
                                 tl.load(slot_ptr + w - 1, mask=(w < rows) & (w > 0), other=-1),
                                 tl.load(slot_ptr + b, mask=b >= 0, other=-1), rows, BLOCK_R)
    none = tile + 2 * BLOCK_R  # past the window: no segment left
    d = tl.arange(0, BLOCK_D)
    i = tl.arange(0, BLOCK_R * BLOCK_G)  # query vector i: row first + i // BLOCK_G, head kv * GROUPS + i % BLOCK_G
    heads = kv * GROUPS + i % BLOCK_G
    in_group = i % BLOCK_G < GROUPS  # (BLOCK_G pads the group to a power of two)
    first = tl.min(tl.where(starts, w, none))
    while first < none:  # the tile's segments: rows first .. stop - 1 of one slot
        slot = tl.load(slot_ptr + first)
        stop, row, live = _segment_rows(first, w, starts, ids, none, i, in_group, BLOCK_G)
        lo = tl.where(live, tl.maximum(tl.load(lo_ptr + row, mask=live, other=0), 0), 0)
        hi = tl.where(live, tl.minimum(tl.load(hi_ptr + row, mask=live, other=0), cells), 0)
        begin = tl.min(tl.where(hi > lo, lo, cells))  # the union of the queries' intervals
        finish = tl.max(hi)
        q_at = row[:, None] * q_row + heads[:, None] * q_head + d[None, :]
        q_mask = live[:, None] & (d < HEAD_DIM)[None, :]
        q = tl.load(q_ptr + q_at, mask=q_mask & (begin < finish), other=0.0)
        m, total, acc = _attend(q, k_ptr, v_ptr, slot * c_slot + kv * c_head, c_cell, lo, hi, begin, finish, scale,
                                BLOCK_R * BLOCK_G, HEAD_DIM, BLOCK_D, BLOCK_N)
        out = tl.where(total[:, None] > 0, acc / tl.maximum(total, 1e-30)[:, None], 0.0)
        # out is [R, H * D]: a row's heads side by side, as q's are
        tl.store(out_ptr + q_at, out.to(out_ptr.dtype.element_ty), mask=q_mask)
        first = tl.min(tl.where(starts & (w >= stop), w, none))


@triton.jit
def cached_attention_plan_kernel(slot_ptr, lo_ptr, hi_ptr, plan_ptr, rows, cells, BLOCK_R: tl.constexpr):
    """Program t: tile t's work (its segments' unions laid end to end, as the pieces kernel's walk
    over them finds them) at plan[t], its longest segment's at plan[tiles + t]. Its sums pick no
    store's address here; the pieces kernel loads them (the package docstring's rule)."""
    tile = tl.program_id(0).to(tl.int64) * BLOCK_R
    w = tile + tl.arange(0, 2 * BLOCK_R)  # the tile's rows and the next tile's (where its segments end)
    b = tile - 1 - tl.arange(0, BLOCK_R)  # the rows before it
    starts, ids = _tile_segments(w, b, tl.load(slot_ptr + w, mask=w < rows, other=-1),
                                 tl.load(slot_ptr + w - 1, mask=(w < rows) & (w > 0), other=-1),
                                 tl.load(slot_ptr + b, mask=b >= 0, other=-1), rows, BLOCK_R)
    mine = ids > 0
    lo = tl.maximum(tl.load(lo_ptr + w, mask=mine, other=0), 0)
    hi = tl.minimum(tl.load(hi_ptr + w, mask=mine, other=0), cells)
    same = (ids[:, None] == ids[None, :]) & mine[None, :]
    seg_lo = tl.min(tl.where(same & (hi > lo)[None, :], lo[None, :], cells), 1)
    seg_hi = tl.max(tl.where(same, hi[None, :], 0), 1)
    span = tl.where(starts, tl.maximum(seg_hi - seg_lo, 0), 0)
    tl.store(plan_ptr + tl.program_id(0), tl.sum(span))
    tl.store(plan_ptr + tl.num_programs(0) + tl.program_id(0), tl.max(span))


@triton.jit
def cached_attention_pieces_kernel(q_ptr, k_ptr, v_ptr, slot_ptr, lo_ptr, hi_ptr, plan_ptr, m_ptr, l_ptr, acc_ptr,
                                   count_ptr, rows, cells, scale, q_row, q_head, c_slot, c_cell, c_head,
                                   GROUPS: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_R: tl.constexpr,
                                   HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
                                   SPLITS: tl.constexpr, SPLIT_CELLS: tl.constexpr, BLOCK_T: tl.constexpr):
    """Program (p, kv): for KV head kv, piece p of the launch's work (every tile's, laid end to
    end in tile order, from the plan): for each segment it overlaps, the partial softmax of its
    cells in the piece at the segment's slot k (its k-th piece), and from the segment's first
    piece (KV head 0) the segment's count of pieces at its rows. A segment of no cells has one
    piece, the one its place falls in: empty partials."""
    p = tl.program_id(0)
    kv = tl.program_id(1)
    last = tl.num_programs(0) - 1
    tiles = tl.cdiv(rows, BLOCK_R)
    scale = (tl.zeros((), dtype=tl.float32) + scale).to(tl.float32)  # (fp64 from AOTInductor, as above)
    work = tl.zeros((), dtype=tl.int64)
    longest = tl.zeros((), dtype=tl.int64)
    for t0 in range(0, tiles, BLOCK_T):
        t = t0 + tl.arange(0, BLOCK_T)
        work += tl.sum(tl.load(plan_ptr + t, mask=t < tiles, other=0))
        longest = tl.maximum(longest, tl.max(tl.load(plan_ptr + tiles + t, mask=t < tiles, other=0)))
    size = tl.maximum(tl.maximum(tl.cdiv(work, last + 1), tl.cdiv(longest, SPLITS - 1)), SPLIT_CELLS)
    size = tl.cdiv(size, BLOCK_N) * BLOCK_N  # whole blocks
    if p > tl.minimum(work // size, last):  # past the work
        return
    # the first tile whose work, its end included, reaches this piece
    first_tile = tiles
    tile_at = tl.zeros((), dtype=tl.int64)  # the work of the tiles before it
    laid = tl.zeros((), dtype=tl.int64)
    for t0 in range(0, tiles, BLOCK_T):
        t = t0 + tl.arange(0, BLOCK_T)
        tile_work = tl.load(plan_ptr + t, mask=t < tiles, other=0)
        ends = laid + tl.cumsum(tile_work, 0)
        here = tl.min(tl.where((t < tiles) & (tl.minimum(ends // size, last) >= p), t, tiles))
        take = (first_tile == tiles) & (here < tiles)
        tile_at = tl.where(take, tl.sum(tl.where(t == here, ends - tile_work, 0)), tile_at)
        first_tile = tl.where(take, here, first_tile)
        laid += tl.sum(tile_work)
    num_heads = GROUPS * tl.num_programs(1)
    d = tl.arange(0, BLOCK_D)
    i = tl.arange(0, BLOCK_R * BLOCK_G)  # query vector i: row first + i // BLOCK_G, head kv * GROUPS + i % BLOCK_G
    heads = kv * GROUPS + i % BLOCK_G
    in_group = i % BLOCK_G < GROUPS  # (BLOCK_G pads the group to a power of two)
    t = first_tile
    while (t < tiles) & (tl.minimum(tile_at // size, last) <= p):  # the tiles this piece overlaps
        tile = t.to(tl.int64) * BLOCK_R
        w = tile + tl.arange(0, 2 * BLOCK_R)  # the tile's rows and the next tile's (where its segments end)
        b = tile - 1 - tl.arange(0, BLOCK_R)  # the rows before it
        starts, ids = _tile_segments(w, b, tl.load(slot_ptr + w, mask=w < rows, other=-1),
                                     tl.load(slot_ptr + w - 1, mask=(w < rows) & (w > 0), other=-1),
                                     tl.load(slot_ptr + b, mask=b >= 0, other=-1), rows, BLOCK_R)
        none = tile + 2 * BLOCK_R  # past the window: no segment left
        at = tile_at  # the launch's work before the segment
        first = tl.min(tl.where(starts, w, none))
        while first < none:  # the tile's segments: rows first .. stop - 1 of one slot
            stop, row, live = _segment_rows(first, w, starts, ids, none, i, in_group, BLOCK_G)
            lo = tl.where(live, tl.maximum(tl.load(lo_ptr + row, mask=live, other=0), 0), 0)
            hi = tl.where(live, tl.minimum(tl.load(hi_ptr + row, mask=live, other=0), cells), 0)
            start_at = tl.min(tl.where(hi > lo, lo, cells))  # the union of the queries' intervals
            span = tl.maximum(tl.max(hi) - start_at, 0)
            first_piece = tl.minimum(at // size, last)
            last_piece = tl.minimum((at + tl.maximum(span, 1) - 1) // size, last)
            if (first_piece <= p) & (p <= last_piece):
                begin = start_at + tl.minimum(tl.maximum(p * size - at, 0), span)
                finish = start_at + tl.minimum(tl.maximum((p + 1) * size - at, 0), span)
                slot = tl.load(slot_ptr + first)
                q_at = row[:, None] * q_row + heads[:, None] * q_head + d[None, :]
                q_mask = live[:, None] & (d < HEAD_DIM)[None, :]
                q = tl.load(q_ptr + q_at, mask=q_mask & (begin < finish), other=0.0)
                m, total, acc = _attend(q, k_ptr, v_ptr, slot * c_slot + kv * c_head, c_cell, lo, hi, begin, finish,
                                        scale, BLOCK_R * BLOCK_G, HEAD_DIM, BLOCK_D, BLOCK_N)
                part = (row * num_heads + heads) * SPLITS + (p - first_piece)
                tl.store(m_ptr + part, m, mask=live)
                tl.store(l_ptr + part, total, mask=live)
                tl.store(acc_ptr + part[:, None] * HEAD_DIM + d[None, :], acc, mask=q_mask & (total > 0)[:, None])
                if (p == first_piece) & (kv == 0):
                    tl.store(count_ptr + row, tl.zeros_like(row).to(tl.int32) + (last_piece - first_piece + 1),
                             mask=live)
            at += span
            first = tl.min(tl.where(starts & (w >= stop), w, none))
        tile_at += tl.load(plan_ptr + t)
        t += 1


@triton.jit
def combine_kernel(m_ptr, l_ptr, acc_ptr, count_ptr, out_ptr, GROUPS: tl.constexpr, BLOCK_G: tl.constexpr,
                   HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, SPLITS: tl.constexpr):
    """Program (row, kv): the row's query heads of KV head kv from their partials (the first
    `count_ptr[row]`: its segment's pieces), each weighted by exp(its max - the largest); a head
    no piece saw a cell for gets zeros."""
    row = tl.program_id(0).to(tl.int64)
    num_heads = GROUPS * tl.num_programs(1)
    g = tl.arange(0, BLOCK_G)
    heads = tl.program_id(1) * GROUPS + g
    split = tl.arange(0, SPLITS)
    live = (g < GROUPS)[:, None] & (split < tl.load(count_ptr + row))[None, :]
    part = (row * num_heads + heads)[:, None] * SPLITS + split[None, :]
    m = tl.load(m_ptr + part, mask=live, other=float("-inf"))
    total = tl.load(l_ptr + part, mask=live, other=0.0)
    top = tl.max(m, axis=1)
    w = tl.where(total > 0, tl.exp(m - tl.where(top == float("-inf"), 0.0, top)[:, None]), 0.0)
    d = tl.arange(0, BLOCK_D)
    seen = (total > 0)[:, :, None] & (d < HEAD_DIM)[None, None, :]
    acc = tl.load(acc_ptr + part[:, :, None] * HEAD_DIM + d[None, None, :], mask=seen, other=0.0)
    weight = tl.sum(w * total, axis=1)
    out = tl.sum(w[:, :, None] * acc, axis=1)
    out = tl.where(weight[:, None] > 0, out / tl.maximum(weight, 1e-30)[:, None], 0.0)
    at = row * num_heads * HEAD_DIM + heads[:, None] * HEAD_DIM + d[None, :]
    tl.store(out_ptr + at, out.to(out_ptr.dtype.element_ty), mask=(g < GROUPS)[:, None] & (d < HEAD_DIM)[None, :])


def _check(q, k_cache, v_cache, slot, lo, hi) -> None:
    """Shapes, dtypes and devices only (no data read: capturable in a CUDA graph)."""
    op = "dflash::cached_attention"
    if q.dim() != 3 or k_cache.dim() != 4:
        raise ValueError(f"{op}: q must be [rows, heads, head_dim] and the caches [slots, cells, kv_heads, head_dim], "
                         f"got {tuple(q.shape)} and {tuple(k_cache.shape)}")
    if v_cache.shape != k_cache.shape:
        raise ValueError(f"{op}: v_cache has shape {tuple(v_cache.shape)}, k_cache {tuple(k_cache.shape)}: "
                         "give both caches of one layer")
    rows, heads, dim = q.shape
    kv_heads = k_cache.shape[2]
    if k_cache.shape[3] != dim:
        raise ValueError(f"{op}: q's head_dim {dim} differs from the caches' {k_cache.shape[3]}")
    if not (q.dtype == k_cache.dtype == v_cache.dtype):
        raise ValueError(f"{op}: q, k_cache and v_cache must share one dtype, got {q.dtype}, {k_cache.dtype}, "
                         f"{v_cache.dtype}")
    if not supports(q.dtype, heads, kv_heads, dim):
        raise ValueError(f"{op}: unsupported: dtype {q.dtype} (float32, bfloat16 or float16), {heads} heads over "
                         f"{kv_heads} KV heads (a multiple), head_dim {dim} (at most {MAX_HEAD_DIM})")
    for name, t in (("slot", slot), ("lo", lo), ("hi", hi)):
        if t.dtype != torch.int64 or t.dim() != 1:
            raise ValueError(f"{op}: {name} must be a 1-D int64 tensor, got {t.dtype} of shape {tuple(t.shape)}")
        torch._check(t.shape[0] == rows, lambda: f"{op}: {name} must have one entry per q row ({rows})")
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("slot", slot), ("lo", lo), ("hi", hi)):
        if not t.is_contiguous():
            raise ValueError(f"{op}: {name} must be contiguous; call .contiguous()")
        if t.device != q.device:
            raise ValueError(f"{op}: {name} is on {t.device}, q on {q.device}")


@triton_op("dflash::cached_attention", mutates_args={})
def cached_attention(
    q: torch.Tensor,  # [R, H, D]
    k_cache: torch.Tensor,  # [S, T, KV, D]
    v_cache: torch.Tensor,  # [S, T, KV, D]
    slot: torch.Tensor,  # [R] int64: the row's slot (in range: not checked on the device)
    lo: torch.Tensor,  # [R] int64: first cell the row sees
    hi: torch.Tensor,  # [R] int64: one past the last (clamped to T)
) -> torch.Tensor:  # [R, H * D]
    _check(q, k_cache, v_cache, slot, lo, hi)
    rows, heads, dim = q.shape
    kv_heads = k_cache.shape[2]
    out = q.new_empty((rows, heads * dim))
    if rows == 0:
        return out
    meta, warps = launch_meta(q.dtype, heads, kv_heads, dim, k_cache.shape[1])
    cells, tiles = k_cache.shape[1], triton.cdiv(rows, meta["BLOCK_R"])
    common = (rows, cells, dim ** -0.5, heads * dim, dim, k_cache.stride(0), k_cache.stride(1), k_cache.stride(2))
    tile_meta = {k: meta[k] for k in ("GROUPS", "BLOCK_G", "BLOCK_R", "HEAD_DIM", "BLOCK_D", "BLOCK_N")}
    if meta["SPLITS"] == 1:
        wrap_triton(cached_attention_kernel)[(tiles, kv_heads)](
            q, k_cache, v_cache, slot, lo, hi, out, *common, **tile_meta, num_warps=warps, num_stages=STAGES)
        return out
    plan = torch.empty((2, tiles), dtype=torch.int64, device=q.device)  # each tile's work, its longest segment
    wrap_triton(cached_attention_plan_kernel)[(tiles,)](slot, lo, hi, plan, rows, cells, BLOCK_R=meta["BLOCK_R"],
                                                        num_warps=PLAN_WARPS)
    parts = (rows, heads, meta["SPLITS"])  # the pieces' partials, and each row's count of them
    m, total = (torch.empty(parts, dtype=torch.float32, device=q.device) for _ in range(2))
    acc = torch.empty((*parts, dim), dtype=torch.float32, device=q.device)
    count = torch.empty(rows, dtype=torch.int32, device=q.device)
    wrap_triton(cached_attention_pieces_kernel)[(pieces_programs(q.device, kv_heads), kv_heads)](
        q, k_cache, v_cache, slot, lo, hi, plan, m, total, acc, count, *common, **tile_meta, SPLITS=meta["SPLITS"],
        SPLIT_CELLS=SPLIT_CELLS, BLOCK_T=BLOCK_T, num_warps=warps, num_stages=STAGES)
    wrap_triton(combine_kernel)[(rows, kv_heads)](
        m, total, acc, count, out, **{k: meta[k] for k in COMBINE_META}, num_warps=COMBINE_WARPS)
    return out


@cached_attention.register_fake
def _(q, k_cache, v_cache, slot, lo, hi):
    return q.new_empty((q.shape[0], q.shape[1] * q.shape[2]))
