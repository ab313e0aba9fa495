"""sm_90's float min and max in the Triton interpreter (TRITON_INTERPRET=1).

`tl.minimum` / `tl.maximum` (and the kernels' helpers built on them) compile to `min.f32` /
`max.f32` on the GPU, which give the other operand where one is NaN; the interpreter computes
them with np.minimum / np.maximum, which keep the NaN. A kernel path that counts on the GPU
dropping NaN (kernels/sampling_rule.py: `_fold_step`'s weights) therefore never runs on the
CPU unless the interpreter does what the GPU does: numpy's fmin / fmax here. The reductions
(`tl.max`, `tl.min`) already drop NaN in the interpreter (np.nanmax / np.nanmin).

- `patch(monkeypatch)`: for one test (tests/kernels/test_kernels.py);
- `DFLASH_GPU_MIN_MAX=1 scripts/test.sh tests/kernels`: every kernel test so (tests/conftest.py).
"""

import numpy as np
from triton.runtime.interpreter import InterpreterBuilder


def _fmin(self, lhs, rhs):
    return self.binary_op(lhs, rhs, np.fmin)


def _fmax(self, lhs, rhs):
    return self.binary_op(lhs, rhs, np.fmax)


_GPU_OPS = {"create_minnumf": _fmin, "create_maxnumf": _fmax}  # the interpreter's builder methods -> sm_90's


def patch(monkeypatch) -> None:
    for name, op in _GPU_OPS.items():
        monkeypatch.setattr(InterpreterBuilder, name, op)


def install() -> None:
    for name, op in _GPU_OPS.items():
        setattr(InterpreterBuilder, name, op)
