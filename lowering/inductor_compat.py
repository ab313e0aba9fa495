"""What torch 2.11's Inductor gets wrong in the CUDA lowering, put right for the block.

A split scan (a long `cumsum` over the vocab, for few rows: the plain heads' tie counts,
seen on the H200, and presumably their inverse CDF; `lowering.fused_verify: false`) is generated with no tensor dimension for
its row (a "no x dim" kernel: one row per program). A load whose address depends on the row
alone (a per-row value such as the row's cut) then fails in `TritonSymbols.get_block_shape`:
torch 2.11 indexes the block shape with the row's tensor dimension, which is None ("list
indices must be integers or slices, not NoneType", seen on the H200 for qwen3-smoke's
`target_prefill`, the row count dynamic). Later torch releases treat such a variable as
a scalar, and so does `no_x_dim_rows_are_scalars`: it drops those variables from the
expression before torch's own rule sees it. Where torch already copes, nothing changes;
where 2.11 raised, the load is one scalar per program, which is what the kernel computes
(on the H200, `sample_rows` compiled this way gave the eager module's 64/64 tokens).
"""

import contextlib

from .parallel_compile import classmethod_replaced


def _row_scalars(expr, kernel) -> dict:
    """The range variables of `expr` whose tree has no tensor dimension, each mapped to 0."""
    scalars = {}
    for var in expr.free_symbols:
        node = kernel.range_tree_nodes.get(var)
        if node is not None and node.root.tensor_dim is None:
            scalars[var] = 0
    return scalars


def block_shape_with_row_scalars(original):
    """`TritonSymbols.get_block_shape` that reads a no-tensor-dimension row variable as a scalar."""

    def get_block_shape(cls, expr):
        from torch._inductor.virtualized import V

        scalars = _row_scalars(expr, V.kernel)
        return original(cls, expr.subs(scalars) if scalars else expr)

    return get_block_shape


@contextlib.contextmanager
def no_x_dim_rows_are_scalars():
    """While lowering: Inductor's Triton code generation reads a load's row-only address in a
    no-x-dim kernel as a scalar (see the module docstring)."""
    from torch._inductor.codegen.triton import TritonSymbols

    with classmethod_replaced(TritonSymbols, "get_block_shape", block_shape_with_row_scalars):
        yield
