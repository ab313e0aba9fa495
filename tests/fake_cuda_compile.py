"""A stand-in for CudaBackend's compile, so the CUDA lowering runs without a GPU: its
`preprocess` does what ExecuTorch 1.2's does to its input (slice_copy / select_copy
rewritten into views in place, so the caller sees the change) and returns what 1.2's
returns (named data: the method's `.so` in the program, its weights blob in
aoti_cuda_blob.ptd), with bytes that are hashes of the graph it compiled and of the
weights' values (deterministic, and different for any other graph or method). On
ExecuTorch 1.5 it also restores 1.2's method-by-method compiles (1.5's CudaBackend
compiles all methods in one `preprocess_multimethod`).

`install(setattr)` puts it in place (a test passes `monkeypatch.setattr`); a process
started with DFLASH_FAKE_AOTI=1 installs it when it imports this module (the worker
processes of lowering/parallel_compile.py preload it).
"""

import hashlib
import inspect
import os

import torch

CALLS: list[str] = []  # the methods compiled in this process


def preprocess(cls, edge_program, compile_specs):
    from executorch.backends.aoti.passes.replace_view_copy_with_view import ReplaceViewCopyWithViewPass
    from executorch.exir._serialize._named_data_store import NamedDataStore
    from executorch.exir.backend.backend_details import PreprocessResult

    # As ExecuTorch 1.2's AotiBackend.preprocess does first: slice_copy / select_copy become
    # views, in place on the graph it was handed (the caller sees the change).
    ReplaceViewCopyWithViewPass()(edge_program.graph_module)
    method = next(s.value.decode() for s in compile_specs if s.key == "method_name")
    graph = hashlib.sha256(edge_program.graph_module.code.encode() + str(edge_program.graph_signature).encode())
    weights = hashlib.sha256()
    for name, t in sorted({**edge_program.state_dict, **edge_program.constants}.items()):
        weights.update(name.encode() + t.detach().cpu().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())
    CALLS.append(method)
    store = NamedDataStore()
    store.add_named_data(f"{method}_so_blob", b"fake so " + graph.digest(), 1, None)
    store.add_named_data(f"{method}_weights_blob", b"fake weights " + weights.digest(), 1, "aoti_cuda_blob")
    return PreprocessResult(processed_bytes=b"", debug_handle_map={},
                            data_store_output=store.get_named_data_store_output())


def install(set_attribute) -> None:
    from executorch.backends.cuda.cuda_backend import CudaBackend
    from executorch.exir.backend.backend_details import BackendDetails

    set_attribute(CudaBackend, "preprocess", classmethod(preprocess))
    if "preprocess_multimethod" in vars(CudaBackend):  # ExecuTorch >= 1.5: back to 1.2's method by method
        set_attribute(CudaBackend, "preprocess_multimethod",
                      inspect.getattr_static(BackendDetails, "preprocess_multimethod"))


def out_of_memory(method, **options):
    """A producer that fails in the worker as a compile that ran the GPU out of memory does."""
    raise RuntimeError(f"CUDA out of memory. Tried to allocate 1.02 GiB ({method})")


def drafter_perturbed(programs, **options):
    """A recipe that lowers draft_forward with other weights than the main process has (one
    value changed), target_verify as it is."""
    from dflash_et.lowering import cuda

    if "draft_forward" in programs:
        weight = next(iter(programs["draft_forward"].state_dict.values()))
        weight.view(-1)[0] += 1.0
    return cuda.lower_edge(programs, **options)


if os.environ.get("DFLASH_FAKE_AOTI") == "1":
    install(setattr)
