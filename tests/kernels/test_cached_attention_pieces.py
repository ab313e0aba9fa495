"""`dflash::cached_attention`'s pieces (kernels/cached_attention.py: `cached_attention_plan_kernel`,
`cached_attention_pieces_kernel`, `combine_kernel`) under the Triton interpreter: the launch's work cut into
equal pieces, each segment's partials in the slots of the pieces it spans and nowhere else,
its count of them at its rows. A module of its own: test_cached_attention.py runs each of its
cases under three piece sizes, and checks outputs only."""

import pytest
import torch

from dflash_et.kernels import cached_attention as ca

pytestmark = pytest.mark.usefixtures("one_thread")

SLOTS, HEADS, KV, DIM = 3, 4, 2, 16
CELLS = 4 * ca.BLOCK_N


def expected_pieces(spans: list[int], programs: int, block: int) -> list[tuple[int, int]]:
    """Each one-row segment's (first piece, count of pieces), from the module's rule: the spans
    laid end to end, pieces of max(cdiv(work, programs), cdiv(longest, SPLITS - 1), SPLIT_CELLS)
    cells rounded up to whole blocks, a segment of no cells in the piece its place falls in,
    the last program taking whatever lies past it."""
    work, longest = sum(spans), max(spans)
    size = max(-(-work // programs), -(-longest // (ca.SPLITS - 1)), ca.SPLIT_CELLS)
    size = -(-size // block) * block
    out, at = [], 0
    for span in spans:
        first = min(at // size, programs - 1)
        out.append((first, min((at + max(span, 1) - 1) // size, programs - 1) - first + 1))
        at += span
    return out


def run_keeping_scratch(case, monkeypatch):
    """The op on `case`, and the scratch its launcher allocated (plan, m, l, acc, count), the
    floating ones filled with NaN first: a slot no launch writes stays NaN."""
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
    assert len(made) == 5, [t.shape for t in made]
    return got, made


@pytest.mark.parametrize("block_t", [2, ca.BLOCK_T])
@pytest.mark.parametrize("sms", [4, 64])
def test_each_segment_fills_the_slots_of_the_pieces_it_spans(block_t, sms, monkeypatch):
    """Decode rows (a segment a row), in tiles of BLOCK_R rows, of intervals of 0 to CELLS
    cells, clamped, a tile of empty rows among them: partial slot k of a row holds its k-th
    piece, the slots past its count are never written (NaN as allocated here), the count
    is the rule's (`expected_pieces`), and the rows match the reference. The plan is walked
    in steps of 2 tiles and of BLOCK_T; 4 programs a KV head (pieces of several blocks) and
    64 (most programs past the work)."""
    monkeypatch.setattr(ca, "SPLIT_CELLS", 8)
    monkeypatch.setattr(ca, "CPU_SMS", sms)
    monkeypatch.setattr(ca, "BLOCK_T", block_t)
    meta = ca.launch_meta(torch.float32, HEADS, KV, DIM, CELLS)[0]
    block = meta["BLOCK_R"]
    rows = 5 * block + 3
    g = torch.Generator().manual_seed(8)
    slot = torch.arange(rows) % SLOTS
    lo = torch.randint(-3, 9, (rows,), generator=g)
    hi = torch.randint(0, CELLS + 9, (rows,), generator=g)
    hi[2 * block:3 * block] = lo[2 * block:3 * block]  # a tile whose rows see no cell
    case = (torch.randn(rows, HEADS, DIM, generator=g), torch.randn(SLOTS, CELLS, KV, DIM, generator=g),
            torch.randn(SLOTS, CELLS, KV, DIM, generator=g), slot, lo, hi)
    got, (plan, m, _, _, count) = run_keeping_scratch(case, monkeypatch)
    spans = (hi.clamp(max=CELLS) - lo.clamp(min=0)).clamp(min=0).tolist()
    programs = ca.pieces_programs(torch.device("cpu"), KV)
    assert plan.shape == (2, -(-rows // block)) and plan[0].sum() == sum(spans)
    want = expected_pieces(spans, programs, meta["BLOCK_N"])
    assert count.tolist() == [n for _, n in want]
    assert max(n for _, n in want) > 1  # (some segment does span pieces)
    for row, (_, n) in enumerate(want):
        assert not m[row, :, :n].isnan().any() and m[row, :, n:].isnan().all(), (row, m[row])
    torch.testing.assert_close(got, ca.reference(*case), rtol=1e-5, atol=1e-5)
    assert (got[2 * block:3 * block] == 0).all()


def test_a_segment_spans_at_most_splits_pieces(monkeypatch):
    """One long segment among short ones, more programs than its cells need: the pieces grow
    to 1 / (SPLITS - 1) of it, so it spans SPLITS slots at most however many programs share
    the work."""
    monkeypatch.setattr(ca, "SPLIT_CELLS", 1)
    monkeypatch.setattr(ca, "CPU_SMS", 64)
    monkeypatch.setattr(ca, "BLOCK_N", 8)  # blocks of 4 cells in float32: the pieces' size is the rule's
    meta = ca.launch_meta(torch.float32, HEADS, KV, DIM, CELLS)[0]
    g = torch.Generator().manual_seed(9)
    slot = torch.tensor([0, 1, 2, 0])
    lo, hi = torch.zeros(4, dtype=torch.int64), torch.tensor([3, CELLS, 5, 1])
    case = (torch.randn(4, HEADS, DIM, generator=g), torch.randn(SLOTS, CELLS, KV, DIM, generator=g),
            torch.randn(SLOTS, CELLS, KV, DIM, generator=g), slot, lo, hi)
    want = expected_pieces(hi.tolist(), ca.pieces_programs(torch.device("cpu"), KV), meta["BLOCK_N"])
    assert want[1][1] == ca.SPLITS - 1  # (without that rule: pieces of 8 cells, 33 slots)
    torch.testing.assert_close(torch.ops.dflash.cached_attention(*case), ca.reference(*case), rtol=1e-5, atol=1e-5)


def test_a_launch_of_no_cells_gives_zeros(monkeypatch):
    """Every row's interval empty (or clamped away): the work is 0, one program walks every tile,
    each row counts one piece of empty partials, and the outputs are zeros."""
    monkeypatch.setattr(ca, "SPLIT_CELLS", 8)
    monkeypatch.setattr(ca, "CPU_SMS", 8)
    g = torch.Generator().manual_seed(10)
    rows = 3 * ca.launch_meta(torch.float32, HEADS, KV, DIM, CELLS)[0]["BLOCK_R"] + 1
    slot = torch.arange(rows) % SLOTS
    lo = torch.randint(0, CELLS + 5, (rows,), generator=g)
    hi = torch.where(torch.arange(rows) % 2 == 0, lo, torch.full_like(lo, -1))
    case = (torch.randn(rows, HEADS, DIM, generator=g), torch.randn(SLOTS, CELLS, KV, DIM, generator=g),
            torch.randn(SLOTS, CELLS, KV, DIM, generator=g), slot, lo, hi)
    got, (plan, _, _, _, count) = run_keeping_scratch(case, monkeypatch)
    assert plan[0].sum() == 0 and count.tolist() == [1] * rows
    assert got.shape == (rows, HEADS * DIM) and (got == 0).all()
