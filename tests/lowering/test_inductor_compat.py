"""lowering/inductor_compat.py: a load's row variable in a no-x-dim kernel (a split scan's
row, with no tensor dimension) is read as a scalar, where torch 2.11's block-shape rule
indexed a list with None; other variables reach torch's rule unchanged, and the rule is
torch's own again after the block. (The GPU run that motivated it: docs/CONTRACT.md.)"""

import types

import pytest
import sympy
from torch._inductor.codegen.triton import TritonSymbols
from torch._inductor.virtualized import V

from dflash_et.lowering import inductor_compat

pytestmark = pytest.mark.quick

x0, r0 = sympy.Symbol("x0", integer=True), sympy.Symbol("r0_", integer=True)


def _kernel(row_dim):
    """A kernel's range trees as the rule reads them: the row's tensor dimension (None in a
    no-x-dim kernel) and the reduction's, 1."""
    tree = lambda dim: types.SimpleNamespace(root=types.SimpleNamespace(tensor_dim=dim))  # noqa: E731
    return types.SimpleNamespace(range_tree_nodes={x0: tree(row_dim), r0: tree(1)})


def _torch_2_11_rule(cls, expr):
    """torch 2.11's shape of a load: each range variable puts its block at its tree's tensor
    dimension (`shape[tree.tensor_dim]`, a TypeError when that is None)."""
    shape = ["1", "1"]
    for var in expr.free_symbols:
        shape[V.kernel.range_tree_nodes[var].root.tensor_dim] = f"{var.name.upper()}BLOCK"
    return tuple(shape)


def test_a_row_without_a_tensor_dimension_is_a_scalar_and_other_variables_pass_through():
    rule = inductor_compat.block_shape_with_row_scalars(_torch_2_11_rule)
    with V.set_kernel_handler(_kernel(row_dim=None)):
        with pytest.raises(TypeError, match="NoneType"):  # what the H200 showed
            _torch_2_11_rule(TritonSymbols, x0 * 151936 + r0)
        assert rule(TritonSymbols, x0 * 151936 + r0) == ("1", "R0_BLOCK")
        assert rule(TritonSymbols, x0) == ("1", "1")
    with V.set_kernel_handler(_kernel(row_dim=0)):  # a row with a tensor dimension keeps it
        assert rule(TritonSymbols, x0 * 151936 + r0) == ("X0BLOCK", "R0_BLOCK")


def test_torch_s_rule_is_replaced_only_inside_the_block():
    before = TritonSymbols.__dict__["get_block_shape"]
    with inductor_compat.no_x_dim_rows_are_scalars():
        assert TritonSymbols.__dict__["get_block_shape"] is not before
        with V.set_kernel_handler(_kernel(row_dim=None)):
            assert TritonSymbols.get_block_shape(x0) == ()  # torch's own rule, given a constant
    assert TritonSymbols.__dict__["get_block_shape"] is before
