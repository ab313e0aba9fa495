"""ExecuTorch's lowering without a copy of every method's weights and caches.

`to_edge` and `to_edge_transform_and_lower` deep-copy each method's ExportedProgram before
their passes (ExecuTorch 1.2.0 and 1.5.1, `exir/program/_program.py`:
`copy.deepcopy(ep).transform(...)`), so their passes can rewrite the graph and signature
without touching the caller's program. `copy.deepcopy` copies the tensors too: each method
that holds the KV caches gets its own copy of them, on the device they live on. A CUDA
export traces on the GPU, so an 8k-position qwen3-smoke program (10.7 GB of caches, each held
by two methods) held ~35 GB in the exporting process while lowering (benchmarks/HISTORY.md,
session 54: with its compile workers, more than an 80 GB H100 has); on the CPU at 2048
positions the process grew from 5.0 GB traced to 13.3 GB while lowering.

`tensors_shared_on_deepcopy` makes such a copy share the program's state and constant
tensors (the graph, signature and dicts are still copied): the lowering stays at the traced
programs' size (2048 positions on the CPU: 5.1 GB throughout). The passes replace entries of
the copy's dicts; none writes into a weight or cache tensor, which a later method sharing it
would see (tests/lowering/test_parallel_compile.py: the same program bytes with whole copies).
The caller's programs are not used after the lowering either way.
"""

import contextlib
import copy

import torch
from torch.export import ExportedProgram


def _deepcopy_sharing_tensors(self, memo):
    for t in (*self.state_dict.values(), *self.constants.values()):
        if isinstance(t, torch.Tensor):
            memo.setdefault(id(t), t)  # (the program keeps t alive while the memo holds its id)
    new = self.__class__.__new__(self.__class__)
    memo[id(self)] = new
    new.__dict__.update(copy.deepcopy(self.__dict__, memo))
    return new


@contextlib.contextmanager
def tensors_shared_on_deepcopy():
    """Within: a deep copy of an ExportedProgram shares its state_dict's and constants'
    tensors with the original."""
    original = vars(ExportedProgram).get("__deepcopy__")
    ExportedProgram.__deepcopy__ = _deepcopy_sharing_tensors
    try:
        yield
    finally:
        if original is not None:
            ExportedProgram.__deepcopy__ = original
        else:
            del ExportedProgram.__deepcopy__
