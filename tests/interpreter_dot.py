"""Triton 3.7's interpreter (TRITON_INTERPRET=1) multiplies bfloat16 `tl.dot` operands as
their raw bits: it stores bfloat16 as uint16 and hands those arrays to `np.matmul`
(`InterpreterBuilder.create_dot`), so a product of two bfloat16 tiles comes out as sums of
integers (~1e10 for values of order one). Here bfloat16 operands are widened to the float32
values they hold before the product, which is what the GPU's MMA computes: bfloat16 x
bfloat16 products are exact in float32 and accumulate in float32 (`out_dtype`). Other
dtypes are untouched. Installed by conftest.py under the interpreter; `bench_attention.py
--smoke` installs it too. tests/test_interpreter_dot.py checks it against float64 products.
"""

import numpy as np
import triton.language as tl
from triton.runtime import interpreter

_create_dot = interpreter.InterpreterBuilder.create_dot  # Triton's own


def _widened(t):
    if t.dtype.scalar != tl.bfloat16:
        return t
    bits = t.data.astype(np.uint32) << np.uint32(16)  # a bfloat16 is the top half of a float32
    return interpreter.TensorHandle(bits.view(np.float32), tl.float32)


def _create_dot_bf16(self, a, b, d, input_precision, max_num_imprecise_acc):
    return _create_dot(self, _widened(a), _widened(b), d, input_precision, max_num_imprecise_acc)


def install() -> None:
    interpreter.InterpreterBuilder.create_dot = _create_dot_bf16


def uninstall() -> None:
    interpreter.InterpreterBuilder.create_dot = _create_dot
