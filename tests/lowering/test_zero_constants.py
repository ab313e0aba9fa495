"""lowering/zero_constants.py: inside the block, AOTInductor records an all-zero constant (a
cache) with no bytes and leaves it out of the weights blob, while every other constant keeps
its bytes; outside it, torch's serializer is its own again. Compiled here by AOTInductor for
the CPU, C++ code only (the CUDA path serializes constants with the same code). The runtime's
side, the runner's zero-constants patch, is the GPU test `test_caches_left_out_of_the_blob_are_
zeroed_at_load` (tests/examples/test_cuda_runner_gpu.py; not yet run)."""

import ctypes
import re
from pathlib import Path

import pytest
import torch

from dflash_et.lowering import zero_constants


class Cached(torch.nn.Module):
    """A weight, a zero cache written in place (as a KV cache is), and a weight with one nonzero value."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(8, 8, generator=torch.Generator().manual_seed(0)))
        self.register_buffer("cache", torch.zeros(3, 16, 8))
        v = torch.zeros(8, 8)
        v[5, 3] = 2.0
        self.v = torch.nn.Parameter(v)

    def forward(self, x, slot):
        self.cache.index_copy_(0, slot, (x @ self.w @ self.v).expand(16, 8).unsqueeze(0).contiguous())
        return self.cache.sum(1)


def _compile(tmp_path: Path) -> tuple[dict[str, int], bytes]:
    """(data_size by constant, the weights blob) of the module's AOTInductor C++ package, with
    the zeros left out. (Without the block the cache's data_size is its 1536 bytes and the blob
    holds them; not compiled here: ~15 s more of CI on a cold cache.)"""
    m = Cached()
    args = (torch.randn(1, 8), torch.tensor([1]))
    ep = torch.export.export(m, args)
    options = {"aot_inductor.package": True, "aot_inductor.package_constants_in_so": False,
               "aot_inductor.package_constants_on_disk_format": "binary_blob",  # ExecuTorch 1.2's CUDA options
               "aot_inductor.package_cpp_only": True, "aot_inductor.output_path": str(tmp_path / "out")}
    with zero_constants.zero_constants_left_out(), torch.no_grad():
        paths = [Path(p) for p in torch._inductor.aot_compile(ep.module(), args, options=options)
                 if isinstance(p, str)]
    cpp = next(p for p in paths if p.name.endswith(".wrapper.cpp")).read_text()
    names = dict(re.findall(r'constants_info_\[(\d+)\]\.name = "(\w+)";', cpp))
    sizes = {names[i]: int(n) for i, n in re.findall(r"constants_info_\[(\d+)\]\.data_size = (\d+);", cpp)}
    blob = next(p for p in paths if p.name.endswith("_weights.blob")).read_bytes()
    return sizes, blob


def test_an_all_zero_constant_is_recorded_with_no_bytes_and_the_others_keep_theirs(tmp_path):
    sizes, blob = _compile(tmp_path)
    assert sizes == {"w": 256, "cache": 0, "v": 256}
    m = Cached()
    assert blob == b"".join(t.detach().contiguous().view(torch.uint8).numpy().tobytes() for t in (m.w, m.v))


def test_the_stand_in_reads_as_no_bytes_where_torch_2_11_reads_a_constant():
    # torch 2.11's serializer (codecache `_to_bytes`): `nbytes` bytes from `data_ptr()` of the
    # storage's `.cpu()`, through a ctypes array (a null address raised "NULL pointer access").
    t = torch.zeros(4, 5).as_subclass(zero_constants.ZeroStandIn)
    storage = t.untyped_storage().cpu()
    raw = ctypes.cast(storage.data_ptr(), ctypes.POINTER(ctypes.c_ubyte * storage.nbytes()))
    assert bytes(raw.contents) == b"" and t.untyped_storage().nbytes() == 0
    assert (t.shape, t.stride(), t.dtype, t.device, t.storage_offset()) == ((4, 5), (5, 1), torch.float32,
                                                                             torch.device("cpu"), 0)


@pytest.mark.parametrize("t, zero", [(torch.zeros(3), True), (-torch.zeros(3), True), (torch.zeros(0), False),
                                     (torch.tensor([0.0, 1e-45]), False), (torch.zeros(2, dtype=torch.int64), True),
                                     (torch.tensor([0.0, float("nan")]), False),
                                     (torch.zeros(4)[1:], False)])  # (offset 1: the runner's patch allocates at 0)
def test_which_tensors_are_all_zero(t, zero):
    assert zero_constants.is_all_zero(t) is zero


def test_torch_s_method_is_its_own_outside_the_block():
    from torch._inductor.graph import GraphLowering

    before = GraphLowering.__dict__["get_original_value_of_constant"]
    with zero_constants.zero_constants_left_out():
        assert GraphLowering.__dict__["get_original_value_of_constant"] is not before
    assert GraphLowering.__dict__["get_original_value_of_constant"] is before
    with zero_constants.zero_constants_left_out(False):  # off: nothing replaced
        assert GraphLowering.__dict__["get_original_value_of_constant"] is before
