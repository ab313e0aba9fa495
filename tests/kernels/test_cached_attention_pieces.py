"""`dflash::cached_attention`'s pieces picked at run time (kernels/cached_attention.py:
`_pieces_at_most`), under the Triton interpreter. A module of its own: test_cached_attention.py
runs each of its cases under three piece sizes, and this rule is the same under each."""

import pytest
import torch

from dflash_et.kernels import cached_attention as ca

pytestmark = pytest.mark.usefixtures("one_thread")

N = ca.BLOCK_N
SLOTS, CELLS, HEADS, KV, DIM = 3, 2 * N + 8, 4, 2, 16


@pytest.mark.parametrize("tiles", [1, 3])
def test_a_busy_launch_cuts_its_tiles_into_fewer_pieces_at_run_time(tiles, monkeypatch):
    """`splits_for` picks the pieces from the launch's (tile, KV head) pairs inside the kernel,
    not at the trace: an exported program is traced at its most rows and runs at any. Here
    pieces of 8 cells, PIECES_FEW 4 below MANY_PROGRAMS 4 pairs, PIECES_MANY 2 from there: a
    tile of 1 x 2 pairs fills all four pieces' partials, 3 x 2 pairs the first two only (the
    others left as allocated: NaN here, which the combine must not read), and the rows match
    the reference."""
    monkeypatch.setattr(ca, "SPLIT_CELLS", 8)
    monkeypatch.setattr(ca, "PIECES_FEW", 4)
    monkeypatch.setattr(ca, "PIECES_MANY", 2)
    monkeypatch.setattr(ca, "MANY_PROGRAMS", 4)
    block = ca.launch_meta(torch.float32, HEADS, KV, DIM, CELLS)[0]["BLOCK_R"]
    rows = tiles * block
    g = torch.Generator().manual_seed(8)
    slot = torch.arange(rows) % SLOTS  # decode rows: a run a row, each of 64 cells or more
    lo, hi = torch.zeros(rows, dtype=torch.int64), torch.randint(N, CELLS + 1, (rows,), generator=g)
    case = (torch.randn(rows, HEADS, DIM, generator=g), torch.randn(SLOTS, CELLS, KV, DIM, generator=g),
            torch.randn(SLOTS, CELLS, KV, DIM, generator=g), slot, lo, hi)
    made, empty = [], torch.empty

    def nan_empty(*shape, **kw):
        t = empty(*shape, **kw)
        if t.is_floating_point():
            t.fill_(float("nan"))
            made.append(t)
        return t

    monkeypatch.setattr(torch, "empty", nan_empty)
    got = torch.ops.dflash.cached_attention(*case)
    monkeypatch.setattr(torch, "empty", empty)
    m = made[0]  # the partials' maxima [rows, HEADS, 4]
    assert m.shape == (rows, HEADS, 4)
    pieces = 4 if tiles * KV < 4 else 2
    assert not m[:, :, :pieces].isnan().any() and m[:, :, pieces:].isnan().all()
    torch.testing.assert_close(got, ca.reference(*case), rtol=1e-5, atol=1e-5)
