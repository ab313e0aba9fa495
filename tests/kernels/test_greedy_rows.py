"""`dflash::greedy_rows` (the drafts' argmax) against its reference, `layers.GreedyRows`
(CPU: TRITON_INTERPRET=1): the same token on every row, exactly (nothing random)."""

import pytest
import torch
from conftest import DEVICE

from dflash_et import kernels  # noqa: F401  (registers torch.ops.dflash)
from dflash_et.export.models import layers
from dflash_et.kernels import greedy_rows

NAN, INF = float("nan"), float("inf")


def _check(x: torch.Tensor, block: int | None = None) -> torch.Tensor:
    got = greedy_rows.launch(x.to(DEVICE), block=block).cpu()
    want = layers.GreedyRows()(x)
    assert torch.equal(got, want), f"kernel {got.tolist()}, reference {want.tolist()}"
    return got


@pytest.mark.quick
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_crafted_rows_give_the_spec_token(dtype):
    """Ties take the lowest index, NaN counts as -inf, +inf as float32's largest value, and a
    row with no finite logit gives -1; in the masked last step too."""
    vocab = 37  # with block 16: two whole steps and a masked one
    big = torch.finfo(dtype).max
    rows, want = [], []

    def row(entries: dict[int, float], token: int, fill: float = -1.0):
        r = torch.full((vocab,), fill)
        for i, v in entries.items():
            r[i] = v
        rows.append(r)
        want.append(token)

    row({5: 3.0, 20: 3.0}, 5)  # a tie: the first
    row({36: 9.0}, 36)  # the maximum on the last logit (masked step)
    row({0: 2.0}, 0)
    row({3: NAN, 7: 1.0}, 7)  # NaN is -inf
    row({30: INF, 31: INF}, 30)  # two +inf: the first
    # +inf is float32's largest value: it ties with float32's (the first wins) and beats a
    # half-precision maximum
    row({10: big, 12: INF}, 10 if dtype == torch.float32 else 12)
    row({12: INF, 14: big}, 12)
    row({}, -1, fill=-INF)  # no finite logit
    row({4: NAN, 9: NAN}, -1, fill=NAN)
    row({8: NAN, 33: -INF}, -1, fill=-INF)
    row({17: -INF, 18: -5.0}, 18, fill=-INF)  # one finite logit
    x = torch.stack(rows).to(dtype)
    for block in (16, None):
        assert _check(x, block).tolist() == want


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_random_rows_over_many_steps(dtype):
    """Rows of 1000 logits in 16-logit steps (63 online-max steps, ties frequent in bf16 from
    rounding), and a vocabulary of one."""
    g = torch.Generator().manual_seed(7)
    x = (torch.randn(24, 1000, generator=g) * 3).round().to(dtype)  # integer logits: many ties
    _check(x, block=16)
    _check(torch.randn(5, 1, generator=g).to(dtype))


def test_no_rows_and_bad_inputs():
    assert greedy_rows.launch(torch.zeros(0, 9, device=DEVICE)).shape == (0,)
    with pytest.raises(ValueError, match=r"logits must be \[rows, V\]"):
        torch.ops.dflash.greedy_rows(torch.zeros(9, device=DEVICE))
    with pytest.raises(ValueError, match="logits dtype torch.float64 is not supported"):
        torch.ops.dflash.greedy_rows(torch.zeros(2, 9, dtype=torch.float64, device=DEVICE))
    with pytest.raises(ValueError, match="contiguous"):
        torch.ops.dflash.greedy_rows(torch.zeros(9, 2, device=DEVICE).t())
