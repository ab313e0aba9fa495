"""`dflash::delta_rows` (kernels/delta_rows.py) against its reference, `qwen3_5.DeltaRows` (the
scan of the portable programs), under the Triton interpreter: rows of several slots
interleaved, a slot without rows, a lone row, padding rows in the scratch slot, no rows;
GQA (value heads over fewer key heads), value dims in more than one block, odd head dims;
float32 to rounding, bfloat16 within its error bound against float64; bad input named."""

import pytest
import torch

from dflash_et.export.models import qwen3_5
from dflash_et.kernels import delta_rows as dr

pytestmark = pytest.mark.usefixtures("one_thread")


def _config(dk=8, dv=dr.BLOCK_V + 8, hk=2, hv=4, kernel=4) -> qwen3_5.HybridConfig:
    return qwen3_5.HybridConfig(vocab_size=11, hidden_size=16, intermediate_size=16, num_layers=1, num_heads=2,
                                num_kv_heads=1, head_dim=8, layer_types=("linear_attention",),
                                linear_num_key_heads=hk, linear_num_value_heads=hv, linear_key_head_dim=dk,
                                linear_value_head_dim=dv, linear_conv_kernel_dim=kernel)


def _case(cfg, slots, dtype, seed=0):
    """Slot 0: four rows, interleaved with slot 2's two; slot 1: none; slot 3: one; the
    scratch slot (last): two padding rows at the end. Windows and states start non-zero."""
    g = torch.Generator().manual_seed(seed)
    slot = torch.tensor(slots, dtype=torch.int64)
    rows, hv, c, k = len(slots), cfg.linear_num_value_heads, cfg.conv_dim, cfg.linear_conv_kernel_dim
    n = int(slot.max()) + 1 if slots else 5
    r = lambda *shape: torch.randn(*shape, generator=g)  # noqa: E731
    inputs = [slot, r(rows, c), 2 * r(rows, hv), r(rows, hv), r(c, k) / 2, r(hv) / 2, r(hv), r(n, k - 1, c),
              r(n, hv, cfg.linear_key_head_dim, cfg.linear_value_head_dim)]
    return [t if t.dtype == torch.int64 or i == 8 else t.to(dtype) for i, t in enumerate(inputs)]


SLOTS = [0, 2, 0, 0, 3, 2, 0, 4, 4]  # slot 1 has no rows; 4 stands for the scratch slot


def _reference(cfg, inputs):
    with torch.no_grad():
        return qwen3_5.DeltaRows(cfg)(*inputs)


@pytest.mark.parametrize("shape", [dict(), dict(dk=5, dv=3, hk=1, hv=3, kernel=2), dict(dk=16, dv=8, hk=2, hv=2)])
def test_float32_equals_the_reference_to_rounding(shape):
    cfg = _config(**shape)
    inputs = _case(cfg, SLOTS, torch.float32)
    before = [t.clone() for t in inputs]
    got = torch.ops.dflash.delta_rows(*inputs)
    want = _reference(cfg, inputs)
    for name, a, b in zip(("windows", "states", "core"), got, want):
        assert a.shape == b.shape and a.dtype == b.dtype, name
        torch.testing.assert_close(a, b, rtol=2e-5, atol=2e-5, msg=name)
    assert all(torch.equal(a, b) for a, b in zip(inputs, before))  # the inputs are left as they were
    assert torch.equal(got[0][1], inputs[7][1]) and torch.equal(got[1][1], inputs[8][1])  # no rows: kept
    assert not torch.equal(got[1][0], inputs[8][0])  # (and the others moved)


def test_no_rows_returns_the_state_as_it_was():
    cfg = _config()
    inputs = _case(cfg, [], torch.float32)
    windows, states, core = torch.ops.dflash.delta_rows(*inputs)
    assert core.shape == (0, cfg.linear_num_value_heads, cfg.linear_value_head_dim)
    assert torch.equal(windows, inputs[7]) and torch.equal(states, inputs[8])


def test_rows_in_order_equal_their_slot_run_alone():
    """A slot's rows advance in order whatever rows of other slots sit between them."""
    cfg = _config()
    inputs = _case(cfg, SLOTS, torch.float32, seed=3)
    mine = [i for i, s in enumerate(SLOTS) if s == 0]
    alone = [inputs[0][mine], *(t[mine] for t in inputs[1:4]), *inputs[4:]]
    _, states, core = torch.ops.dflash.delta_rows(*inputs)
    _, states_alone, core_alone = torch.ops.dflash.delta_rows(*alone)
    torch.testing.assert_close(core[mine], core_alone, rtol=0, atol=0)
    torch.testing.assert_close(states[0], states_alone[0], rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_stays_within_its_error_bound_of_float64(dtype):
    cfg = _config()
    inputs = _case(cfg, SLOTS, dtype, seed=1)
    got = torch.ops.dflash.delta_rows(*inputs)
    exact = _reference(cfg, [t.double() if t.is_floating_point() else t for t in inputs])
    rounded = _reference(cfg, inputs)  # the half-precision reference's own error
    eps = torch.finfo(dtype).eps
    for name, a, e, r in zip(("windows", "states", "core"), got, exact, rounded):
        err, own = (a.double() - e).abs().max(), (r.double() - e).abs().max()
        assert err <= 2 * own + 4 * eps * e.abs().max(), (name, float(err), float(own))


def test_bad_input_is_named():
    cfg = _config()
    inputs = _case(cfg, SLOTS, torch.float32)
    bad = list(inputs)
    bad[2] = inputs[2][:, :1]
    with pytest.raises(ValueError, match=r"a must have shape \(9, 4\)"):
        torch.ops.dflash.delta_rows(*bad)
    bad = list(inputs)
    bad[8] = inputs[8].double()
    with pytest.raises(ValueError, match="states must be float32"):
        torch.ops.dflash.delta_rows(*bad)
    bad = list(inputs)
    bad[4] = inputs[4][:, :1].contiguous()  # a conv of one tap: no window
    bad[7] = inputs[7][:, :0]
    with pytest.raises(ValueError, match="conv kernel 1"):
        torch.ops.dflash.delta_rows(*bad)
