"""Two costs of Triton 3.7's interpreter (TRITON_INTERPRET=1) that our kernel tests pay
over and over, removed without changing what a kernel computes. Installed by conftest.py.

- **`tl.reduce` with a combine function not its own** (`tl.sort`'s `xor_sum`, in every round of
  kernels/cut_select.py; until session 50 also a NaN-keeping max in the first pass over every
  row). The interpreter reduces one element at a time in Python, wrapping each scalar in a
  tensor: 86% of an interpreter test's time in a profile, when that max was there. Here the
  same combine function is applied to whole slices, pairing neighbours (elements 2i and
  2i+1) until one is left. `tl.reduce` asks only for an associative combine function, and
  neighbour pairs keep the left-to-right order, so the result is one the element-wise fold
  could give: for the combine functions of a max, the same bits. The reductions the
  interpreter already does in numpy (sum, min, max, argmin, argmax) are untouched.
- **Re-patching the language at every @triton.jit helper call.** Before each call the
  interpreter looks for triton.language's builtins with `inspect.getmembers` over five
  modules and classes (~1.5 ms; half of a test's time once the first cost is gone). The
  builtins never change, so they are listed once, here, before any kernel runs; each call
  wraps those of them not wrapped already, as Triton's own code does.

tests/test_fast_interpreter.py compares both with Triton's own code.
"""

import inspect

import numpy as np
import triton
import triton.language as tl
from triton.runtime import interpreter

if not (hasattr(interpreter, "ReduceOps") and hasattr(interpreter, "_patch_builtin")
        and hasattr(interpreter, "_patch_attr")):
    raise ImportError(f"tests/fast_interpreter.py was written for Triton 3.7's interpreter; Triton "
                      f"{triton.__version__} lacks what it replaces: update it or drop it from conftest.py")

_element_wise = interpreter.ReduceOps.generic_reduce  # Triton's own, kept for the comparison tests
_patch_builtin = interpreter._patch_builtin


def _pairwise(self, input):
    original_axis = self.axis
    input, axis = self.unravel(input, self.axis)
    dtypes = [arg.dtype for arg in input]
    data = [arg.handle.data for arg in input]
    while data[0].shape[axis] > 1:
        n = data[0].shape[axis]
        pairs = n // 2
        left = [np.take(d, np.arange(0, 2 * pairs, 2), axis=axis) for d in data]
        right = [np.take(d, np.arange(1, 2 * pairs, 2), axis=axis) for d in data]
        out = self.combine_fn.fn(*(self.to_tensor(x, t) for x, t in zip(left, dtypes)),
                                 *(self.to_tensor(x, t) for x, t in zip(right, dtypes)))
        out = out if isinstance(out, tuple) else (out,)
        merged = []
        for o, d in zip(out, data):
            value = o.handle.data if hasattr(o, "handle") else o  # a Python constant from the combine function
            value = np.broadcast_to(np.asarray(value, dtype=d.dtype), left[0].shape).astype(d.dtype)
            if n % 2:  # the last element waits for the next round, still last
                value = np.concatenate([value, np.take(d, [n - 1], axis=axis)], axis=axis)
            merged.append(value)
        data = merged
    ret = []
    for d, t in zip(data, dtypes):
        d = np.squeeze(d, axis)
        if self.keep_dims:
            if original_axis is not None:
                d = np.expand_dims(d, axis)
            else:
                d = d.reshape((1,) * len(input[0].handle.data.shape))
        elif original_axis is None:
            d = d.item()
        ret.append(self.to_tensor(d, t))
    return ret


def builtins_of(pkg) -> list[tuple[str, object]]:
    """(name, function) of every triton.language builtin that `pkg` holds."""
    return [(name, member) for name, member in inspect.getmembers(pkg) if tl.core.is_builtin(member)]


# What the interpreter's `_patch_lang` patches (triton.language and its core, their tensor
# class, triton.language.math, the tensor descriptor base), read before any kernel ran.
_BUILTINS = {id(pkg): builtins_of(pkg) for pkg in (tl, tl.core, tl.tensor, tl.math, tl.core.tensor_descriptor_base)}


def _patch_listed_builtins(pkg, builder, scope):
    members = _BUILTINS.get(id(pkg))
    if members is None:
        return _patch_builtin(pkg, builder, scope)
    for name, member in members:
        if getattr(pkg, name, None) is member:  # as Triton's: only what is not wrapped already
            interpreter._patch_attr(pkg, name, member, builder, scope)


def install() -> None:
    interpreter.ReduceOps.generic_reduce = _pairwise
    interpreter._patch_builtin = _patch_listed_builtins


def uninstall() -> None:
    interpreter.ReduceOps.generic_reduce = _element_wise
    interpreter._patch_builtin = _patch_builtin
