"""fast_interpreter.py (installed by conftest.py) computes what Triton's own interpreter
computes: a kernel that reduces with our combine functions (a max that keeps NaN, on rows
with NaN, infinities and ties, along each axis and over the whole block; an order-sensitive
combine, the first non-zero; a tuple combine, max with the lowest index, on rows without
NaN) through @triton.jit helpers gives the same bits with both installed and with neither;
and the builtins it lists were read before the interpreter patched any."""

import os

import numpy as np
import pytest
import torch
import triton
import triton.language as tl
from triton.runtime import interpreter

import fast_interpreter

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="Triton's interpreter is not on")


@triton.jit
def _max_nan(a, b):  # a max that keeps a NaN (the same on the GPU and in the interpreter)
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _first_nonzero(a, b):  # associative, not commutative
    return tl.where(a != 0, a, b)


@triton.jit
def _max_lowest_index(v1, i1, v2, i2):
    take = (v1 > v2) | ((v1 == v2) & (i1 < i2))
    return tl.where(take, v1, v2), tl.where(take, i1, i2)


@triton.jit
def _reduce_kernel(x_ptr, rows_ptr, cols_ptr, all_ptr, index_ptr, R: tl.constexpr, C: tl.constexpr,
                   MODE: tl.constexpr):
    r = tl.arange(0, R)[:, None]
    c = tl.arange(0, C)[None, :]
    x = tl.load(x_ptr + r * C + c)
    if MODE == 0:
        tl.store(rows_ptr + tl.arange(0, R), tl.reduce(x, 1, _max_nan))
        tl.store(cols_ptr + tl.arange(0, C), tl.reduce(x, 0, _max_nan))
        tl.store(all_ptr, tl.reduce(x, None, _max_nan))
        kept = tl.reduce(x, 1, _max_nan, keep_dims=True)
        tl.store(all_ptr + 1 + r, kept)
    else:
        tl.store(rows_ptr + tl.arange(0, R), tl.reduce(x, 1, _first_nonzero))
        tl.store(cols_ptr + tl.arange(0, C), tl.reduce(x, 0, _first_nonzero))
        tl.store(all_ptr, tl.reduce(x, None, _first_nonzero))
        _, index = tl.reduce((x, r * C + c), 1, _max_lowest_index)
        tl.store(index_ptr + tl.arange(0, R), index)


def _run(x: torch.Tensor, mode: int) -> list[torch.Tensor]:
    rows, cols = x.shape
    out = [torch.zeros(rows), torch.zeros(cols), torch.zeros(1 + rows), torch.zeros(rows, dtype=torch.int32)]
    _reduce_kernel[(1,)](x, *out, R=rows, C=cols, MODE=mode)
    return out


def _bits(t: torch.Tensor) -> np.ndarray:
    return t.numpy().view(np.int32)  # NaN compared by its bits


@pytest.mark.parametrize("shape", [(8, 16), (1, 32), (4, 1)])
@pytest.mark.parametrize("mode", [0, 1])
def test_pairwise_reduce_equals_triton_s_element_wise_reduce(shape, mode):
    assert interpreter.ReduceOps.generic_reduce is fast_interpreter._pairwise  # conftest installed it
    g = torch.Generator().manual_seed(sum(shape) + mode)
    x = torch.randint(-3, 4, shape, generator=g).float()  # ties and zeros
    # (NaN only for the max: max-with-lowest-index compares, and with a NaN it is no longer
    # associative, so no two reduction orders need agree.)
    specials = torch.tensor([float("nan") if mode == 0 else 5.0, float("inf"), float("-inf"), 0.0])
    pick = torch.rand(shape, generator=g) < 0.2
    x[pick] = specials[torch.randint(0, 4, shape, generator=g)][pick]
    pairwise = _run(x, mode)
    fast_interpreter.uninstall()
    try:
        element_wise = _run(x, mode)
    finally:
        fast_interpreter.install()
    for a, b in zip(pairwise, element_wise):
        assert np.array_equal(_bits(a), _bits(b)), (x, a, b)
    if mode == 0 and bool(torch.isnan(x).any()):
        assert bool(torch.isnan(pairwise[2][0]))  # the whole block's max keeps a NaN


def test_the_listed_builtins_are_triton_s_own_functions():
    listed = {id(pkg): dict(fast_interpreter._BUILTINS[id(pkg)]) for pkg in (tl, tl.tensor)}
    assert {"load", "store", "where", "maximum", "arange"} <= set(listed[id(tl)])
    assert {"__add__", "__lt__", "to"} <= set(listed[id(tl.tensor)])
    assert all(tl.core.is_builtin(f) for f in listed[id(tl)].values())  # not the interpreter's wrappers
