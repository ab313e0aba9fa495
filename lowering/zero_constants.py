"""All-zero constants out of the CUDA blob: AOTInductor records them with no bytes, and the
runtime allocates and zeroes them when it loads the method.

The KV and context caches are mutable constants of every method's delegate, zeros when
exported, and AOTInductor serializes every constant into the weights blob that the `.ptd`
carries: 14.9 GB for `qwen3-smoke-8k-sampling-cuda`, ~45 GB at 32768 positions (CONTRACT.md,
"Caches"). No Inductor option leaves a constant out. Inductor takes each constant's bytes, and
the size it records for it (`constants_info_[i].data_size`, which the compiled library reads
the blob by), from `GraphLowering.get_original_value_of_constant`; while lowering,
`zero_constants_left_out` makes that return, for a constant whose values are all zero, a
stand-in whose storage reports 0 bytes (the shape, strides, dtype and device stay the
tensor's). The library then records `data_size = 0` for it, the blob holds nothing for it,
and at load AOTInductor's `load_constants` asks the shim for a tensor over a null pointer
(`aoti_torch_create_tensor_from_blob_v2`).

ExecuTorch 1.2.0's shim refuses a null pointer; the runner's patch
`executorch-v1.2.0-zero-constants.patch` allocates the tensor on the device and zeroes it
instead. So a program exported this way (`lowering.zero_constants: true`) loads only in a
runtime with that patch; any other refuses it at load ("data is null"), it does not run
with wrong values. It also needs a torch whose `load_constants` keeps its blob offsets in
step past a zero-size constant (torch 2.13's does, since pytorch PR #172748 of January 2026;
torch 2.11's, which the GPU machine exports with, ran token-identical with 10 zero buffers:
benchmarks/HISTORY.md, session 54): the compiled library comes from the torch that exports.
"""

import contextlib
import ctypes

import torch
from torch.utils.weak import WeakIdKeyDictionary

_ONE_BYTE = ctypes.create_string_buffer(1)  # a valid address for a copy of 0 bytes from it


class _NoBytes:
    """The storage a stand-in reports: 0 bytes, at a valid address (torch 2.11's serializer
    reads `nbytes` bytes from `data_ptr()` of `.cpu()`; 2.13's skips a 0-byte constant)."""

    def __init__(self, device: torch.device):
        self.device = device

    def nbytes(self) -> int:
        return 0

    def size(self) -> int:
        return 0

    def cpu(self) -> "_NoBytes":
        return self

    def data_ptr(self) -> int:
        return ctypes.addressof(_ONE_BYTE)


class ZeroStandIn(torch.Tensor):
    """A constant that is all zeros, seen by Inductor's serializer as having no bytes."""

    def untyped_storage(self):  # noqa: D102  (the only thing a stand-in changes)
        return _NoBytes(self.device)


def is_all_zero(t: torch.Tensor) -> bool:
    """A dense tensor with elements at storage offset 0 (what the runner's patch allocates),
    every one of them zero (a -0 comes back as +0: equal to it in every comparison)."""
    return (isinstance(t, torch.Tensor) and t.layout == torch.strided and not t.is_mkldnn and t.numel() > 0
            and t.storage_offset() == 0 and not bool(t.any()))


def stand_in(original):
    """`GraphLowering.get_original_value_of_constant` that gives a stand-in for an all-zero
    constant (checked once per tensor while it lives: Inductor asks several times)."""
    seen = WeakIdKeyDictionary()

    def get_original_value_of_constant(self, name: str) -> torch.Tensor:
        t = original(self, name)
        if t not in seen:
            seen[t] = is_all_zero(t)
        return t.as_subclass(ZeroStandIn) if seen[t] else t

    return get_original_value_of_constant


@contextlib.contextmanager
def zero_constants_left_out(on: bool = True):
    """While lowering (if `on`): every all-zero constant is serialized with no bytes (see the
    module docstring for what that needs of the runtime)."""
    if not on:
        yield
        return
    from torch._inductor.graph import GraphLowering

    original = GraphLowering.get_original_value_of_constant
    GraphLowering.get_original_value_of_constant = stand_in(original)
    try:
        yield
    finally:
        GraphLowering.get_original_value_of_constant = original
