"""CUDA programs: fuse the verify heads, then lower every method with its own
`CudaPartitioner` (AOTInductor compiles the graph, the `dflash::` Triton ops
included, into the delegate) and serialize `model.pte` + `aoti_cuda_blob.ptd`.

Works with ExecuTorch 1.2 (torch 2.11) and 1.5 (torch 2.13): the differences are
detected, not assumed (the method-name compile spec is required by 1.2 and only
descriptive in 1.5; 1.5 adds device propagation and different blob keys, both
handled inside ExecuTorch; the .ptd comes from `write_tensor_data_to_file`).
"""

import tempfile
from pathlib import Path

import torch

from ..export import artifact, boundary, methods
from .errors import LoweringError
from .et_compat import delegate_outputs_in_order
from .fuse_verify import FuseVerifyHeads, head_paths

PTD = "aoti_cuda_blob.ptd"


def require_cuda() -> None:
    if not torch.cuda.is_available():
        raise LoweringError(
            "backend: cuda needs a CUDA GPU to compile the delegates (torch.cuda.is_available() is "
            "False); export on a GPU machine, or use backend: portable"
        )
    try:
        from executorch.backends.cuda.cuda_partitioner import CudaPartitioner  # noqa: F401
    except ImportError as e:
        raise LoweringError(f"this ExecuTorch install has no CUDA backend ({e}); install an ExecuTorch "
                            "with backends.cuda (>= 1.2)") from None


def fuse_heads(programs: dict, modules: dict[str, torch.nn.Module]) -> dict:
    """Rewrite every head of every method; raises if a configured head stayed ATen."""
    from .. import kernels  # noqa: F401  (registers torch.ops.dflash)

    report = {}
    for name, ep in programs.items():
        expected = [path for path, _ in head_paths(modules[name])]
        result = FuseVerifyHeads(expected=expected)(ep)
        report[name] = result.heads
    return report


def _partitioners(methods: list[str]) -> dict:
    from executorch.backends.cuda.cuda_backend import CudaBackend
    from executorch.backends.cuda.cuda_partitioner import CudaPartitioner

    return {m: [CudaPartitioner([CudaBackend.generate_method_name_compile_spec(m)])] for m in methods}


def lower(programs: dict, spec, cfg) -> tuple[dict[str, bytes], dict]:
    """(files, report) for a CUDA program; `programs` are the traced methods."""
    from executorch.exir import EdgeCompileConfig, to_edge_transform_and_lower

    require_cuda()
    modules = {m.name: m.module for m in spec.methods}
    if cfg.lowering.fused_verify:
        fused = fuse_heads(programs, modules)
    else:
        fused = {name: [] for name in programs}
        for program in programs.values():
            boundary.strip(program)  # the plain ATen heads go into the delegate
    with delegate_outputs_in_order():  # KV-cache writes before user outputs (et_compat.py)
        edge = to_edge_transform_and_lower(
            programs,
            partitioner=_partitioners(list(programs)),
            # The CUDA delegate takes the whole graph; ExecuTorch's official CUDA exports
            # skip the core-ATen check the same way (AOTInductor lowers what it meets).
            compile_config=EdgeCompileConfig(_check_ir_validity=False, _skip_dim_order=True),
            constant_methods=methods.constant_values(spec),
        )
    program = edge.to_executorch()
    files = {artifact.PTE: program.buffer}
    with tempfile.TemporaryDirectory() as tmp:
        program.write_tensor_data_to_file(tmp)
        for path in sorted(Path(tmp).glob("*.ptd")):
            files[path.name] = path.read_bytes()
    if PTD not in files:
        raise LoweringError(f"the CUDA lowering wrote no {PTD} (got {sorted(files)}); is every method delegated?")
    report = {
        "fused_verify": cfg.lowering.fused_verify,
        "fused_heads": fused,
        "delegates": delegates(program.buffer),
    }
    return files, report


def delegates(pte: bytes) -> dict[str, list[str]]:
    """Method name -> backend ids of its delegates, read back from the serialized program."""
    from executorch.exir._serialize._program import deserialize_pte_binary

    parsed = deserialize_pte_binary(pte)
    program = getattr(parsed, "program", parsed)  # PTEFile (>= 1.2) or Program
    return {plan.name: [d.id for d in plan.delegates] for plan in program.execution_plan}
