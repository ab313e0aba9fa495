"""interpreter_dot.py (installed by conftest.py): `tl.dot` of bfloat16 tiles equals the float64
product of their values to float32 accumulation, where Triton's own interpreter multiplies their
bits; float16 and float32 tiles are untouched."""

import os

import pytest
import torch
import triton
import triton.language as tl

import interpreter_dot

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="Triton's interpreter is not on")


@triton.jit
def _dot_kernel(a_ptr, b_ptr, out_ptr, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr):
    m, n, k = tl.arange(0, M), tl.arange(0, N), tl.arange(0, K)
    a = tl.load(a_ptr + m[:, None] * K + k[None, :])
    b = tl.load(b_ptr + n[:, None] * K + k[None, :])
    tl.store(out_ptr + m[:, None] * N + n[None, :], tl.dot(a, tl.trans(b), out_dtype=tl.float32))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_dot_of_bfloat16_tiles_is_the_product_of_their_values(dtype):
    g = torch.Generator().manual_seed(0)
    a = (torch.randn(16, 32, generator=g) * 3).to(dtype)
    b = (torch.randn(16, 32, generator=g) * 3).to(dtype)
    exact = a.double() @ b.double().T  # (bfloat16 / float16 products are exact in float32)
    out = torch.empty(16, 16)
    _dot_kernel[(1,)](a, b, out, 16, 16, 32)
    tolerance = 32 * 2.0 ** -23 * (a.double().abs() @ b.double().abs().T)  # float32 accumulation of 32 terms
    assert ((out.double() - exact).abs() <= tolerance).all()
    if dtype == torch.bfloat16:  # Triton's own create_dot: the bits' product, far off
        interpreter_dot.uninstall()
        try:
            _dot_kernel[(1,)](a, b, out, 16, 16, 32)
        finally:
            interpreter_dot.install()
        assert not ((out.double() - exact).abs() <= tolerance).all()
