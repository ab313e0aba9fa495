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

Kernel: one program per (tile of BLOCK_R rows, KV head, piece). Rows of one slot side by
side make a run (a DFlash block's rows, a prompt chunk's; at worst one row a run). A run of at
most BLOCK_R rows is one segment, taken by the tile its first row falls in, even where it ends
in the next tile's rows; a longer run is cut at the tiles' edges (`_segments`). A program takes
its tile's segments in turn, so an owner's cells are read once per segment of its rows, not
once per row, and once in all for a run of up to BLOCK_R rows wherever it begins (cut at
fixed rows instead, owners of 15 rows each had most of their cells read twice). A segment's
rows x G query heads (at most QUERIES query vectors: one `tl.dot` operand) stream the union
of the rows' intervals in blocks of BLOCK_N cells, each query masked to its own row's
[lo, hi), with an online softmax (running max and sum, rescaled accumulator).

Pieces: with slots of `cells` >= 2 x SPLIT_CELLS, the tile's work, its segments' unions laid
end to end (`_tile_work`), is cut into pieces of whole blocks, at least SPLIT_CELLS cells each,
one a program, as many as `splits_for` gives the launch's (tile, KV head) pairs at most (picked
in the kernel: the row count is dynamic in an exported program); a piece may begin and end
inside a segment. For each segment, a program stores the partial softmax of its cells in the
piece (max, sum, unnormalised accumulator: float32, [R, H, SPLITS]; empty where it holds none:
every segment of a piece past the tile's work, without reading a cell), and `combine_kernel`
merges them per row, weighting each by exp(its max - the largest). Why: one program a run made the
longest owner's cells one program's work, so at mixed lengths most of the GPU idled at the
end (1.63x the floor on the H100 at lengths up to 32k, against 1.14x in pieces:
benchmarks/RESULTS.md); and pieces cut run by run left the program of a tile of many short
runs (decoding: a row an owner, 16 runs a tile) a piece of every run to read in turn, the
first pieces of each run all on the same programs.

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
SPLIT_CELLS = 1024  # cells a piece at least (its partial, 16 KB at 32 x 128, is then <= 1/32 of its reads)
MAX_SPLITS = 16  # pieces a tile's work at most (the partials of 1024 rows x 16 heads x 128: 136 MB of float32)
PIECES_MANY, PIECES_FEW = 4, 8  # pieces a tile at most where (tile, KV head) pairs are many / few (`splits_for`)
MANY_PROGRAMS = 256  # (tile, KV head) pairs from which they are many
STAGES = 3  # the cells loop's software pipeline (Triton's default): its K and V blocks in flight. Shared memory
# in a half type (sm_90, benchmarks/kernel_registers.py): 77,824 bytes at 3, 2 programs an H100 SM; 45,056 at 2,
# 3 an SM (then the registers', 168, bound it)
COMBINE_WARPS = 2
COMBINE_META = ("GROUPS", "BLOCK_G", "BLOCK_R", "HEAD_DIM", "BLOCK_D", "SPLITS", "BUSY_SPLITS", "BUSY_PROGRAMS")


def supports(dtype: torch.dtype, heads: int, kv_heads: int, head_dim: int) -> bool:
    return dtype in DTYPES and kv_heads >= 1 and heads % kv_heads == 0 and 1 <= head_dim <= MAX_HEAD_DIM


def reference(q, k_cache, v_cache, slot, lo, hi):  # [R, H, D], [S, T, KV, D] x2, [R] x3 -> [R, H * D]
    """The models' way (the module this op replaces): each row gathers its whole slot and
    masks the cells outside [lo, hi)."""
    return layers.CachedAttention()(q, k_cache, v_cache, slot, lo, hi)


def splits_for(cells: int, programs: int) -> int:
    """Pieces a tile's work is cut into at most, for slots of `cells` cells and a launch of
    `programs` (tile, KV head) pairs: none below 2 x SPLIT_CELLS cells; else PIECES_MANY where the
    pairs alone nearly fill the GPU (a verify step: 64 tiles x 8 KV heads), PIECES_FEW where they
    are few (decoding, a row an owner: 4 x 8). Pieces past a tile's work still cost their
    programs, and a launch of 16 pieces a tile took ~1.6x the time of one of 4 at 16 rows an
    owner of 128-2048 cells; decoding wants more, 8 (benchmarks/HISTORY.md, session 59).
    The kernel applies it at run time (`_pieces_at_most`): a program's row count is dynamic."""
    if cells < 2 * SPLIT_CELLS:
        return 1
    return min(MAX_SPLITS, PIECES_MANY if programs >= MANY_PROGRAMS else PIECES_FEW)


def launch_meta(dtype: torch.dtype, heads: int, kv_heads: int, head_dim: int, cells: int) -> tuple[dict, int]:
    """The kernel's constexprs and warps for one head layout and slot size (the launcher and the
    sm_90 compile check, benchmarks/kernel_registers.py, use the same ones). BLOCK_R x BLOCK_G >=
    16 query vectors: `tl.dot`'s smallest operand. SPLITS: the pieces of a launch of few programs
    (the grid's third dimension, the partials' layout); BUSY_SPLITS those of a launch of
    BUSY_PROGRAMS or more. Not from the row count: an exported program is traced at its largest
    (`export/methods.trace_sizes`) and runs at any, so `_pieces_at_most` picks at run time (picked
    at the trace, decoding's 64 rows ran in a verify step's 4 pieces: a one-row call's kernels
    2969 us against 2655 picked at run time in the runner's profile, benchmarks/HISTORY.md,
    session 60)."""
    groups = heads // kv_heads
    block_g = triton.next_power_of_2(groups)
    block_r = max(1, min(MAX_ROWS, QUERIES // block_g))
    splits, busy = splits_for(cells, 0), splits_for(cells, MANY_PROGRAMS)
    assert busy <= splits, f"the pieces of a busy launch ({busy}) exceed those of an idle one ({splits})"
    return dict(GROUPS=groups, BLOCK_G=block_g, BLOCK_R=block_r, HEAD_DIM=head_dim,
                BLOCK_D=max(16, triton.next_power_of_2(head_dim)),
                BLOCK_N=BLOCK_N // 2 if dtype == torch.float32 else BLOCK_N,  # float32 K / V: twice the registers
                SPLITS=splits, BUSY_SPLITS=busy, BUSY_PROGRAMS=MANY_PROGRAMS, SPLIT_CELLS=SPLIT_CELLS), 4


@triton.jit
def _pieces_at_most(tiles, kv_heads, SPLITS: tl.constexpr, BUSY_SPLITS: tl.constexpr, BUSY_PROGRAMS: tl.constexpr):
    """`splits_for` for this launch's (tile, KV head) pairs, at run time: the pieces a tile's work
    is cut into at most; a program of a later piece stores nothing and `combine_kernel` reads
    none of its partials."""
    return tl.where(tiles * kv_heads >= BUSY_PROGRAMS, BUSY_SPLITS, SPLITS)


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
def _tile_work(lo_ptr, hi_ptr, w, starts, ids, cells):
    """The cells of the tile's segments laid end to end: each segment's union of intervals, as
    the kernel's loop over them finds it, summed (a match of rows to segments: a loop over them
    here took ~80 more registers in the whole kernel on sm_90). Its result picks no store's
    address (the package docstring's rule)."""
    mine = ids > 0
    lo = tl.maximum(tl.load(lo_ptr + w, mask=mine, other=0), 0)
    hi = tl.minimum(tl.load(hi_ptr + w, mask=mine, other=0), cells)
    same = (ids[:, None] == ids[None, :]) & mine[None, :]
    seg_lo = tl.min(tl.where(same & (hi > lo)[None, :], lo[None, :], cells), 1)
    seg_hi = tl.max(tl.where(same, hi[None, :], 0), 1)
    return tl.sum(tl.where(starts, tl.maximum(seg_hi - seg_lo, 0), 0))


@triton.jit
def cached_attention_kernel(q_ptr, k_ptr, v_ptr, slot_ptr, lo_ptr, hi_ptr, out_ptr, m_ptr, l_ptr, acc_ptr, rows,
                            cells, scale, q_row, q_head, c_slot, c_cell, c_head,
                            GROUPS: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_R: tl.constexpr,
                            HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
                            SPLITS: tl.constexpr, BUSY_SPLITS: tl.constexpr, BUSY_PROGRAMS: tl.constexpr,
                            SPLIT_CELLS: tl.constexpr):
    """Program (tile, kv, split): for KV head kv, piece `split` of the tile's work (the cells of
    each of its segments, laid end to end). SPLITS 1: the output of the segments' rows; else,
    for each segment, the partial softmax (m, l, acc) of its cells in the piece (none: empty)
    for `combine_kernel`; nothing from a piece past this launch's `_pieces_at_most`."""
    tile = tl.program_id(0).to(tl.int64) * BLOCK_R
    kv = tl.program_id(1)
    split = tl.program_id(2)
    if SPLITS > 1:
        limit = _pieces_at_most(tl.num_programs(0), tl.num_programs(1), SPLITS, BUSY_SPLITS, BUSY_PROGRAMS)
        if split >= limit:
            return
    num_heads = GROUPS * tl.num_programs(1)
    # AOTInductor passes a Python float as fp64 (then p, and its tl.dot, were fp64; the interpreter: a float)
    scale = (tl.zeros((), dtype=tl.float32) + scale).to(tl.float32)
    IEEE: tl.constexpr = k_ptr.dtype.element_ty == tl.float32  # float32 caches: IEEE float32 products
    w = tile + tl.arange(0, 2 * BLOCK_R)  # the tile's rows and the next tile's (where its segments end)
    slots = tl.load(slot_ptr + w, mask=w < rows, other=-1)
    before_slots = tl.load(slot_ptr + w - 1, mask=(w < rows) & (w > 0), other=-1)
    b = tile - 1 - tl.arange(0, BLOCK_R)
    first_slot = tl.sum(tl.where(w == tile, slots, 0))
    back = tl.min(tl.where(tl.load(slot_ptr + b, mask=b >= 0, other=-1) != first_slot, tile - 1 - b, BLOCK_R))
    starts, ids = _segments(w, slots, before_slots, back, rows, BLOCK_R)
    none = tile + 2 * BLOCK_R  # past the window: no segment left
    d = tl.arange(0, BLOCK_D)
    i = tl.arange(0, BLOCK_R * BLOCK_G)  # query vector i: row first + i // BLOCK_G, head kv * GROUPS + i % BLOCK_G
    heads = kv * GROUPS + i % BLOCK_G
    in_group = i % BLOCK_G < GROUPS  # (BLOCK_G pads the group to a power of two)
    piece_lo = tl.zeros((), dtype=tl.int64)  # this program's piece of the work laid end to end
    piece_hi = piece_lo
    pieces = tl.full((), 1, tl.int64)
    if SPLITS > 1:
        work = _tile_work(lo_ptr, hi_ptr, w, starts, ids, cells)
        pieces = tl.minimum(tl.maximum(tl.cdiv(work, SPLIT_CELLS), 1), limit)
        size = tl.cdiv(tl.cdiv(work, pieces), BLOCK_N) * BLOCK_N  # whole blocks, at least SPLIT_CELLS cells
        piece_lo = split * size
        piece_hi = piece_lo + size
    laid = tl.zeros((), dtype=tl.int64)  # the work of the segments before this one
    first = tl.min(tl.where(starts, w, none))
    while first < none:  # the tile's segments: rows first .. stop - 1 of one slot
        slot = tl.load(slot_ptr + first)
        stop = tl.min(tl.where((w > first) & ((ids == 0) | starts), w, none))
        row = first + i // BLOCK_G
        live = (row < stop) & in_group
        # a piece past the tile's work (short segments) reads no interval (so no cell) and stores empty partials;
        # its program still costs: 16 pieces a tile at 16 rows an owner of 128-2048 cells took 250.8 us on the
        # H100, 258.5 with the intervals read, 156.4 in 4 pieces (benchmarks/HISTORY.md, session 59: `splits_for`)
        reads = live & (split < pieces)
        lo = tl.where(reads, tl.maximum(tl.load(lo_ptr + row, mask=reads, other=0), 0), 0)
        hi = tl.where(reads, tl.minimum(tl.load(hi_ptr + row, mask=reads, other=0), cells), 0)
        start_at = tl.min(tl.where(hi > lo, lo, cells))  # the union of the queries' intervals
        end_at = tl.max(hi)
        begin = start_at
        finish = end_at
        if SPLITS > 1:  # the segment's cells in this program's piece
            span = tl.maximum(end_at - start_at, 0)
            begin = start_at + tl.minimum(tl.maximum(piece_lo - laid, 0), span)
            finish = start_at + tl.minimum(tl.maximum(piece_hi - laid, 0), span)
            laid += span
        q_at = row[:, None] * q_row + heads[:, None] * q_head + d[None, :]
        q_mask = live[:, None] & (d < HEAD_DIM)[None, :]
        q = tl.load(q_ptr + q_at, mask=q_mask & (begin < finish), other=0.0)
        base = slot * c_slot + kv * c_head
        m = tl.full([BLOCK_R * BLOCK_G], float("-inf"), tl.float32)
        total = tl.zeros([BLOCK_R * BLOCK_G], tl.float32)
        acc = tl.zeros([BLOCK_R * BLOCK_G, BLOCK_D], tl.float32)
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
        if SPLITS == 1:
            out = tl.where(total[:, None] > 0, acc / tl.maximum(total, 1e-30)[:, None], 0.0)
            # out is [R, H * D]: a row's heads side by side, as q's are
            tl.store(out_ptr + q_at, out.to(out_ptr.dtype.element_ty), mask=q_mask)
        else:  # partial [rows, H, SPLITS] (acc: x HEAD_DIM); acc only where the piece saw a cell
            part = (row * num_heads + heads) * SPLITS + split
            tl.store(m_ptr + part, m, mask=live)
            tl.store(l_ptr + part, total, mask=live)
            tl.store(acc_ptr + part[:, None] * HEAD_DIM + d[None, :], acc, mask=q_mask & (total > 0)[:, None])
        first = tl.min(tl.where(starts & (w >= stop), w, none))


@triton.jit
def combine_kernel(m_ptr, l_ptr, acc_ptr, out_ptr, GROUPS: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_R: tl.constexpr,
                   HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, SPLITS: tl.constexpr, BUSY_SPLITS: tl.constexpr,
                   BUSY_PROGRAMS: tl.constexpr):
    """Program (row, kv): the row's query heads of KV head kv from their partials (the first
    `_pieces_at_most` of SPLITS), each weighted by exp(its max - the largest); a head no piece saw
    a cell for gets zeros."""
    row = tl.program_id(0).to(tl.int64)
    num_heads = GROUPS * tl.num_programs(1)
    g = tl.arange(0, BLOCK_G)
    heads = tl.program_id(1) * GROUPS + g
    limit = _pieces_at_most(tl.cdiv(tl.num_programs(0), BLOCK_R), tl.num_programs(1), SPLITS, BUSY_SPLITS,
                            BUSY_PROGRAMS)
    split = tl.arange(0, SPLITS)
    live = (g < GROUPS)[:, None] & (split < limit)[None, :]
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
    splits = meta["SPLITS"]
    parts = (rows, heads, splits)  # the pieces' partials (SPLITS 1: none; the output is written at once)
    m, total = (torch.empty(parts if splits > 1 else 0, dtype=torch.float32, device=q.device) for _ in range(2))
    acc = torch.empty((*parts, dim) if splits > 1 else 0, dtype=torch.float32, device=q.device)
    wrap_triton(cached_attention_kernel)[(triton.cdiv(rows, meta["BLOCK_R"]), kv_heads, splits)](
        q, k_cache, v_cache, slot, lo, hi, out, m, total, acc, rows, k_cache.shape[1], dim ** -0.5,
        heads * dim, dim, k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), **meta, num_warps=warps,
        num_stages=STAGES,
    )
    if splits > 1:
        wrap_triton(combine_kernel)[(rows, kv_heads)](
            m, total, acc, out, **{k: meta[k] for k in COMBINE_META}, num_warps=COMBINE_WARPS)
    return out


@cached_attention.register_fake
def _(q, k_cache, v_cache, slot, lo, hi):
    return q.new_empty((q.shape[0], q.shape[1] * q.shape[2]))
