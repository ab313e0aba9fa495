"""`dflash::cached_attention` (kernels/cached_attention.py) against its reference, the models'
gather + masked SDPA, under the Triton interpreter: intervals of every odd length (0, 1, the
block edges, a whole slot), GQA, float32 to rounding and bfloat16 within its error bound
against float64; the target's own attention; bad input named. Each case runs whole (one piece
a run, as at test sizes) and with runs cut into pieces of a few cells (`split`: the pieces'
partials, empty ones among them, merged by `combine_kernel`, as at long `max_seq_len`)."""

import pytest
import torch
import triton
import triton.language as tl

from dflash_et.kernels import cached_attention as ca
from dflash_et.export.models import layers

pytestmark = pytest.mark.usefixtures("one_thread", "split")

N = ca.BLOCK_N
SLOTS, CELLS, HEADS, KV, DIM = 3, 2 * N + 8, 4, 2, 16


@pytest.fixture(params=[None, 8, 32], ids=["whole", "pieces-8", "pieces-32"])
def split(request, monkeypatch):
    """None: whole runs (CELLS is below 2 x SPLIT_CELLS); else the launch's work in pieces of at
    least that many cells (whole blocks), over 8 programs a KV head."""
    if request.param is not None:
        monkeypatch.setattr(ca, "SPLIT_CELLS", request.param)
        monkeypatch.setattr(ca, "CPU_SMS", 8)  # 8 programs a KV head: pieces of a block or two here
        assert ca.in_pieces(CELLS)
    else:
        assert not ca.in_pieces(CELLS)
    return request.param


def _case(dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    # (slot, lo, hi): empty, one cell, around one and two blocks, a whole slot, clamped, windowed
    spans = [(0, 0, 0), (1, 0, 1), (2, 0, N - 1), (0, 0, N), (1, 0, N + 1), (2, 3, 2 * N + 1), (0, 0, CELLS),
             (1, 5, CELLS + 7), (2, 17, 18), (0, -4, 3), (1, 9, 9)]
    slot, lo, hi = (torch.tensor(c, dtype=torch.int64) for c in zip(*spans))
    q = torch.randn(len(spans), HEADS, DIM, generator=g).to(dtype)
    k = torch.randn(SLOTS, CELLS, KV, DIM, generator=g).to(dtype)
    v = torch.randn(SLOTS, CELLS, KV, DIM, generator=g).to(dtype)
    return q, k, v, slot, lo, hi


def _f64(*ts):
    return [t.double() if t.is_floating_point() else t for t in ts]


def _matches_reference(slot, lo, hi, g):
    """The op on random float32 q and caches (drawn from g) for rows of these slots and intervals
    equals the reference to rounding; returns its output."""
    rows = slot.shape[0]
    q = torch.randn(rows, HEADS, DIM, generator=g)
    k = torch.randn(SLOTS, CELLS, KV, DIM, generator=g)
    v = torch.randn(SLOTS, CELLS, KV, DIM, generator=g)
    got = torch.ops.dflash.cached_attention(q, k, v, slot, lo, hi)
    torch.testing.assert_close(got, ca.reference(q, k, v, slot, lo, hi), rtol=1e-5, atol=1e-5)
    return got


def test_float32_equals_the_reference_to_rounding():
    q, k, v, slot, lo, hi = _case(torch.float32)
    got = torch.ops.dflash.cached_attention(q, k, v, slot, lo, hi)
    want = ca.reference(q, k, v, slot, lo, hi)
    assert got.shape == (q.shape[0], HEADS * DIM) and got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    empty = (torch.minimum(hi, torch.tensor(CELLS)) <= torch.clamp(lo, min=0))
    assert empty.sum() == 2 and (got[empty] == 0).all()  # an empty interval gives zeros
    # the reference itself: cells outside [lo, hi) change nothing
    k2 = k.clone()
    k2[0, 3:] = 100.0  # row 9 sees slot 0's cells [0, 3) only
    torch.testing.assert_close(torch.ops.dflash.cached_attention(q, k2, v, slot, lo, hi)[9], got[9])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_stays_within_its_error_bound_of_float64(dtype):
    q, k, v, slot, lo, hi = _case(dtype, seed=1)
    got = torch.ops.dflash.cached_attention(q, k, v, slot, lo, hi).double()
    exact = ca.reference(*_f64(q, k, v), slot, lo, hi)
    rounded = ca.reference(q, k, v, slot, lo, hi).double()  # the half-precision reference's own error
    eps = torch.finfo(dtype).eps
    assert (got - exact).abs().max() <= 8 * eps * exact.abs().max()
    assert (got - exact).abs().max() <= 2 * (rounded - exact).abs().max() + 2 * eps


def test_the_targets_rows_see_their_slot_up_to_their_position():
    """The target's attention (llama.py: each row sees cells <= its position) is the op with
    lo = 0, hi = position + 1."""
    q, k, v, _, _, _ = _case(torch.float32, seed=2)
    rows = q.shape[0]
    g = torch.Generator().manual_seed(3)
    slot = torch.randint(0, SLOTS, (rows,), generator=g)
    position = torch.randint(0, CELLS, (rows,), generator=g)
    allowed = torch.arange(CELLS)[None, :] <= position[:, None]
    want = layers.attend(q.unsqueeze(1), k[slot], v[slot], allowed.unsqueeze(1)).squeeze(1)
    got = torch.ops.dflash.cached_attention(q, k, v, slot, torch.zeros_like(position), position + 1)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_runs_of_one_slots_rows_share_a_program_and_keep_their_own_intervals():
    """Packed owners: runs of rows of one slot (shorter than, as long as and longer than a
    program's BLOCK_R rows, a slot met again further down, a lone row), each row causal on its
    own position, a few windowed. One program reads a run's cells for all its rows; every
    row still sees only its own interval."""
    block = ca.launch_meta(torch.float32, HEADS, KV, DIM, CELLS)[0]["BLOCK_R"]
    runs = [(0, 5), (1, block), (2, block + 3), (0, 2), (1, 1), (2, 2 * block + 1), (0, 3)]
    slot = torch.cat([torch.full((n,), s, dtype=torch.int64) for s, n in runs])
    rows = slot.shape[0]
    g = torch.Generator().manual_seed(4)
    position = torch.randint(0, CELLS, (rows,), generator=g)
    lo = torch.where(torch.rand(rows, generator=g) < 0.2, position // 2, torch.zeros_like(position))
    _matches_reference(slot, lo, position + 1, g)


def test_pieces_cut_a_tiles_runs_laid_end_to_end():
    """A tile of decode rows (one row a slot in turn, so a run a row, each a long interval): its
    runs' cells laid end to end and cut into pieces that begin and end inside runs; a tile of
    one short run, most pieces past it (empty partials); a tile whose rows see no cell. Each
    row still sees exactly its own cells."""
    block = ca.launch_meta(torch.float32, HEADS, KV, DIM, CELLS)[0]["BLOCK_R"]
    g = torch.Generator().manual_seed(6)
    decode = torch.arange(block) % SLOTS
    slot = torch.cat([decode, torch.zeros(block, dtype=torch.int64), torch.ones(3, dtype=torch.int64)])
    position = torch.cat([torch.randint(CELLS // 2, CELLS, (block,), generator=g), torch.arange(block) % 3,
                          torch.full((3,), -1)])
    got = _matches_reference(slot, torch.zeros_like(position), position + 1, g)
    assert (got[-3:] == 0).all()


def test_owners_of_fewer_rows_than_a_tile_straddle_its_edges():
    """Owners of BLOCK_R - 1 rows (a verify step near the owners' last tokens), then of 9, 1,
    BLOCK_R and BLOCK_R + 2 rows: runs that begin anywhere in a tile and end in the next one
    (one segment, `test_segments_...` below) and a long run cut at the tiles' edges. Each row
    sees exactly its own cells."""
    block = ca.launch_meta(torch.float32, HEADS, KV, DIM, CELLS)[0]["BLOCK_R"]
    sizes = [block - 1] * 4 + [9, 1, block, block + 2, 9]
    slot = torch.cat([torch.full((n,), o % SLOTS, dtype=torch.int64) for o, n in enumerate(sizes)])
    g = torch.Generator().manual_seed(7)
    last = torch.randint(block + 2, CELLS, (len(sizes),), generator=g)  # each owner's last position
    position = torch.cat([last[o] - n + 1 + torch.arange(n) for o, n in enumerate(sizes)])
    _matches_reference(slot, torch.zeros_like(position), position + 1, g)


@triton.jit
def _tiles_segments(slot_ptr, before_ptr, back_ptr, starts_ptr, ids_ptr, rows, BLOCK_R: tl.constexpr):
    """`ca._segments` of each tile, given its rows' slots, the slots before them and `back`."""
    t = tl.program_id(0)
    k = tl.arange(0, 2 * BLOCK_R)
    w = t * BLOCK_R + k
    slots = tl.load(slot_ptr + w, mask=w < rows, other=-1)
    before = tl.load(before_ptr + w, mask=w < rows, other=-1)
    starts, ids = ca._segments(w, slots, before, tl.load(back_ptr + t), rows, BLOCK_R)
    tl.store(starts_ptr + t * 2 * BLOCK_R + k, starts.to(tl.int32))
    tl.store(ids_ptr + t * 2 * BLOCK_R + k, ids)


@pytest.mark.parametrize("seed", range(3))
def test_segments_take_every_row_once_and_a_short_run_whole(seed):
    """Random runs of 1 to 2 x BLOCK_R + 3 rows: every row is in exactly one tile's segments; a
    run of at most BLOCK_R rows is one segment, of the tile its first row is in; a longer run
    is cut at the tiles' edges. (The rule knows no pieces: each `split` runs it alike.)"""
    block, g = 16, torch.Generator().manual_seed(seed)
    sizes = torch.randint(1, 2 * block + 4, (40,), generator=g).tolist()
    slot = torch.cat([torch.full((n,), i % 2, dtype=torch.int32) for i, n in enumerate(sizes)])
    rows = slot.shape[0]
    before = torch.cat([torch.tensor([-1], dtype=torch.int32), slot[:-1]])
    tiles = -(-rows // block)
    back = torch.tensor([next((j for j in range(block) if t * block - 1 - j < 0
                               or slot[t * block - 1 - j] != slot[t * block]), block) for t in range(tiles)],
                        dtype=torch.int32)  # the rows before each tile in its first row's run, up to BLOCK_R
    starts = torch.zeros(tiles, 2 * block, dtype=torch.int32)
    ids = torch.zeros(tiles, 2 * block, dtype=torch.int32)
    _tiles_segments[(tiles,)](slot, before, back, starts, ids, rows, BLOCK_R=block)
    got = set()
    for t in range(tiles):
        for s in ids[t].unique().tolist():
            if s:
                at = (ids[t] == s).nonzero().flatten() + t * block
                assert (at.diff() == 1).all() and starts[t, int(at[0]) - t * block] == 1
                got.add((t, int(at[0]), int(at[-1]) + 1))
    want, a = set(), 0
    for n in sizes:
        cuts = [a, a + n] if n <= block else [a, *range((a // block + 1) * block, a + n, block), a + n]
        want |= {(lo // block, lo, hi) for lo, hi in zip(cuts, cuts[1:])}
        a += n
    assert got == want


@pytest.mark.parametrize("heads,kv,dim", [(6, 2, 24), (5, 5, 16), (16, 2, 8)])
def test_odd_head_layouts_pad_and_mask(heads, kv, dim):
    """3 query heads per KV head over a 24-wide head (both padded), no grouping (1 per KV
    head), 8 per KV head (fewer rows a program)."""
    g = torch.Generator().manual_seed(5)
    slot = torch.tensor([0, 0, 0, 1, 2, 2, 1, 1, 1, 1, 1, 0])
    position = torch.randint(0, CELLS, (slot.shape[0],), generator=g)
    q = torch.randn(slot.shape[0], heads, dim, generator=g)
    k = torch.randn(SLOTS, CELLS, kv, dim, generator=g)
    v = torch.randn(SLOTS, CELLS, kv, dim, generator=g)
    lo = torch.zeros_like(position)
    got = torch.ops.dflash.cached_attention(q, k, v, slot, lo, position + 1)
    torch.testing.assert_close(got, ca.reference(q, k, v, slot, lo, position + 1), rtol=1e-5, atol=1e-5)


def test_bad_input_is_named():
    q, k, v, slot, lo, hi = _case(torch.float32)
    op = torch.ops.dflash.cached_attention
    with pytest.raises(ValueError, match="share one dtype"):
        op(q.half(), k, v, slot, lo, hi)
    with pytest.raises(ValueError, match="slot must be a 1-D int64"):
        op(q, k, v, slot.int(), lo, hi)
    with pytest.raises(ValueError, match="a multiple"):
        op(torch.randn(q.shape[0], 3, DIM), k, v, slot, lo, hi)
    with pytest.raises(ValueError, match="head_dim 8 differs"):
        op(q[..., :8].contiguous(), k, v, slot, lo, hi)
    with pytest.raises(ValueError, match="give both caches"):
        op(q, k, v[:2], slot, lo, hi)
    with pytest.raises(RuntimeError, match="one entry per q row"):
        op(q, k, v, slot[:3], lo, hi)
