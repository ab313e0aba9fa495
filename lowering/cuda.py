"""CUDA programs: fuse the verify heads, then lower every method with its own
`CudaPartitioner` (AOTInductor compiles the graph, the `dflash::` Triton ops
included, into the delegate) and serialize `model.pte` + `aoti_cuda_blob.ptd`.

Works with ExecuTorch 1.2 (torch 2.11) and 1.5 (torch 2.13): the differences are
detected, not assumed (the method-name compile spec is required by 1.2 and only
descriptive in 1.5; 1.5 adds device propagation and different blob keys, both
handled inside ExecuTorch; the .ptd comes from `write_tensor_data_to_file`).
"""

import os
import tempfile
import time
from pathlib import Path

import torch

from ..export import artifact, boundary, methods
from ..export.heads import HEADS
from .errors import LoweringError
from .et_compat import delegate_outputs_in_order
from .fuse_verify import FuseVerifyHeads, called_regions, fused_at_trace, head_paths
from .inductor_compat import no_x_dim_rows_are_scalars
from .shared_state import tensors_shared_on_deepcopy
from .zero_constants import zero_constants_left_out
from . import parallel_compile
from .parallel_compile import classmethod_replaced, compiled_by_workers

PTD = "aoti_cuda_blob.ptd"
KERNELS = __name__.rsplit(".", 2)[0] + ".kernels"  # the module that registers torch.ops.dflash


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


def fuse_heads(programs: dict, modules: dict[str, torch.nn.Module], kinds: tuple[str, ...] = tuple(HEADS)) -> dict:
    """Rewrite every region of the `kinds` (default: the verify heads) of every method; raises
    if one of them stayed ATen."""
    from .. import kernels  # noqa: F401  (registers torch.ops.dflash)

    report = {}
    for name, ep in programs.items():
        expected = called_regions(ep, [path for path, _ in head_paths(modules[name], kinds)])
        result = FuseVerifyHeads(expected=expected, kinds=kinds)(ep)
        report[name] = result.heads
    return report


def _partitioners(methods: list[str]) -> dict:
    """One CudaPartitioner per method. ExecuTorch's own Triton SDPA is off for every dtype:
    its launcher picks a kernel with a Python `if` on the symbolic batch x heads size, a
    guard that narrows the method's dynamic rows to the example's side of the branch
    (qwen3-smoke's target_prefill was serialized for at most 41 rows, and the runtime
    refused 1024); it also takes bfloat16 only. Attention lowers to matmul + softmax
    (SDPBackend.MATH) instead. `check_bounds` catches any other narrowing."""
    from executorch.backends.cuda.cuda_backend import CudaBackend
    from executorch.backends.cuda.cuda_partitioner import CudaPartitioner
    from executorch.exir.backend.compile_spec_schema import CompileSpec

    off = CompileSpec("triton_kernel_mode", b"OFF")
    return {m: [CudaPartitioner([CudaBackend.generate_method_name_compile_spec(m), off])] for m in methods}


def _wrapped(name: str, wrap):
    """Replace CudaBackend's classmethod `name` by `wrap(original_function)` for the block."""
    from executorch.backends.cuda.cuda_backend import CudaBackend

    return classmethod_replaced(CudaBackend, name, wrap)


def timed_compiles(say):
    """While lowering: `say` how long AOTInductor took for each method (the compiles are most
    of a CUDA export's time)."""

    def wrap(original):
        def preprocess(cls, edge_program, compile_specs):
            start = time.perf_counter()
            result = original(cls, edge_program, compile_specs)
            say(f"AOTInductor compiled {cls.method_name_from_compile_specs(compile_specs)} in "
                f"{time.perf_counter() - start:.1f}s")
            return result
        return preprocess

    return _wrapped("preprocess", wrap)


def autotune_options(mode: str) -> dict:
    """Inductor options of `lowering.autotune` (config.py), applied over ExecuTorch's own.
    Every mode keeps the GEMMs on Triton templates (the backend links no cuBLAS): chosen by
    timing (`gemm`, `full`) or the first config of each (`none`)."""
    if mode == "full":
        return {"max_autotune": True}
    if mode == "none":  # deterministic: choices picked without benchmarks (no GPU timing at all)
        return {"max_autotune": False, "max_autotune_gemm": True, "deterministic": True}
    return {"max_autotune": False, "max_autotune_gemm": True}


def compile_options(mode: str):
    """While lowering: AOTInductor compiles with `autotune_options(mode)`."""

    def wrap(original):
        def get_aoti_compile_options(cls, compile_specs):
            return {**original(cls, compile_specs), **autotune_options(mode)}
        return get_aoti_compile_options

    return _wrapped("get_aoti_compile_options", wrap)


def lower_edge(programs: dict, autotune: str = "gemm", constant_methods: dict | None = None,
               zero_constants: bool = False):
    """ExecuTorch's lowering of the traced (fused) methods into CUDA delegates: the
    EdgeProgramManager. Each method is partitioned and compiled on its own, so a worker
    process that lowers one method makes the same delegate (parallel_compile.py).
    `zero_constants`: `lowering.zero_constants` (config.py)."""
    from executorch.exir import EdgeCompileConfig, to_edge_transform_and_lower

    # delegate_outputs_in_order: KV-cache writes before user outputs (et_compat.py);
    # no_x_dim_rows_are_scalars: torch 2.11's split scans of the plain heads (inductor_compat.py);
    # zero_constants_left_out: the all-zero caches serialized with no bytes (zero_constants.py);
    # tensors_shared_on_deepcopy: ExecuTorch's copy of each method shares its weights and caches (shared_state.py)
    with delegate_outputs_in_order(), compile_options(autotune), no_x_dim_rows_are_scalars(), \
            zero_constants_left_out(zero_constants), tensors_shared_on_deepcopy():
        return to_edge_transform_and_lower(
            programs,
            partitioner=_partitioners(list(programs)),
            # The CUDA delegate takes the whole graph; ExecuTorch's official CUDA exports
            # skip the core-ATen check the same way (AOTInductor lowers what it meets).
            compile_config=EdgeCompileConfig(_check_ir_validity=False, _skip_dim_order=True),
            constant_methods=constant_methods,
        )


def auto_jobs(methods: int, cores: int | None = None) -> int:
    """Worker processes for `methods` compiles when the caller does not say: one per method,
    at most half the CPU cores (each compile runs Triton builds and GEMM benchmarks of its
    own on top; benchmarks/RESULTS.md has the export times)."""
    if cores is None:
        cores = os.cpu_count() or 1
    return max(1, min(methods, cores // 2))


def compiles(names: list[str], autotune: str, jobs: int | None, producer: tuple[str, dict] | None, say,
             zero_constants: bool = False):
    """While lowering: the methods' AOTInductor compiles, in `jobs` worker processes that make
    each method with `producer` (parallel_compile.py) when both are given, else here, timed.
    `jobs` None: `auto_jobs`. The workers lower as `lower_edge(autotune, zero_constants)`."""
    from executorch.backends.cuda.cuda_backend import CudaBackend

    if jobs is None:
        jobs = auto_jobs(len(names))
    if jobs <= 1 or len(names) <= 1 or producer is None:
        return timed_compiles(say)
    if not parallel_compile.supported(CudaBackend):
        say("this ExecuTorch compiles a program's methods together (CudaBackend.preprocess_multimethod): "
            "compiling them in this process")
        return timed_compiles(say)
    recipe = (f"{__name__}:lower_edge", {"autotune": autotune, "zero_constants": zero_constants})
    return compiled_by_workers(names, CudaBackend, producer, recipe, jobs, preload=(KERNELS,), say=say)


def _fused_kinds(cfg) -> list[tuple[str, ...]]:
    """The region kinds (lowering/fuse_verify.py: REGIONS) `cfg` fuses, by setting: the verify
    heads and the drafts' argmax (`lowering.fused_verify`), the attention (`fused_attention`);
    and always a hybrid target's recurrence (`delta_rows`: no plain CUDA lowering)."""
    return [kinds for on, kinds in ((cfg.lowering.fused_verify, (*HEADS, "greedy_rows")),
                                    (cfg.lowering.fused_attention, ("cached_attention",)),
                                    (True, ("delta_rows",))) if on]


def traced_fused(spec, cfg):
    """While tracing `spec`'s methods for `prepare`: the regions `cfg` fuses trace as their
    fused op (`fuse_verify.fused_at_trace`: the same fused graphs, a fraction of the time)."""
    return fused_at_trace([m.module for m in spec.methods], sum(_fused_kinds(cfg), ()))


def prepare(programs: dict, spec, cfg) -> dict[str, list[str]]:
    """Fuse every method's verify heads and the drafts' argmax (`lowering.fused_verify`) and the
    target's and drafter's attention (`lowering.fused_attention`), then strip the boundary
    markers of what stays plain ATen, so that goes into the delegate. Returns the fused
    regions by method."""
    modules = {m.name: m.module for m in spec.methods}
    fused = {name: [] for name in programs}
    for kinds in _fused_kinds(cfg):
        for name, regions in fuse_heads(programs, modules, kinds).items():
            fused[name] += regions
    for program in programs.values():
        boundary.strip(program)
    return fused


def lower(programs: dict, spec, cfg, say=lambda text: None, jobs: int | None = 1,
          producer: tuple[str, dict] | None = None, compiling=None) -> tuple[dict[str, bytes], dict]:
    """(files, report) for a CUDA program; `programs` are the traced methods. With `producer`
    ("module:function", options: what makes one method's traced program again, in another
    process) and `jobs` > 1 (None: `auto_jobs`), worker processes compile the methods side by
    side (docs/CONTRACT.md, "Compiling the methods side by side"). `compiling`: a `compiles`
    context the caller has already entered (its workers started before the tracing); then
    `jobs` and `producer` are not used."""
    require_cuda()
    fused = prepare(programs, spec, cfg)
    if compiling is None:
        compiling = compiles(list(programs), cfg.lowering.autotune, jobs, producer, say, cfg.lowering.zero_constants)
    with compiling:
        edge = lower_edge(programs, cfg.lowering.autotune, methods.constant_values(spec), cfg.lowering.zero_constants)
    program = edge.to_executorch(executorch_config())
    check_bounds(program.buffer, spec)
    files = {artifact.PTE: program.buffer}
    with tempfile.TemporaryDirectory() as tmp:
        program.write_tensor_data_to_file(tmp)
        for path in sorted(Path(tmp).glob("*.ptd")):
            files[path.name] = path.read_bytes()
    if PTD not in files:
        raise LoweringError(f"the CUDA lowering wrote no {PTD} (got {sorted(files)}); is every method delegated?")
    report = {
        "fused_verify": cfg.lowering.fused_verify,
        "fused_attention": cfg.lowering.fused_attention,
        "autotune": cfg.lowering.autotune,
        "zero_constants": cfg.lowering.zero_constants,
        "fused_heads": fused,
        "delegates": delegates(program.buffer),
    }
    return files, report


def executorch_config():
    """Method inputs are not planned into the program's arenas: the runtime hands its own
    tensors over by pointer instead of a host memcpy. That is what lets a device tensor go
    in as is (`hidden` from target_verify's GPU output into draft_forward); the CUDA
    backend copies host inputs to the GPU and takes device inputs where they lie."""
    from executorch.exir import ExecutorchBackendConfig
    from executorch.exir.passes import MemoryPlanningPass

    return ExecutorchBackendConfig(memory_planning_pass=MemoryPlanningPass(alloc_graph_input=False))


def _plans(pte: bytes) -> list:
    from executorch.exir._serialize._program import deserialize_pte_binary

    parsed = deserialize_pte_binary(pte)
    return getattr(parsed, "program", parsed).execution_plan  # PTEFile (>= 1.2) or Program


def delegates(pte: bytes) -> dict[str, list[str]]:
    """Method name -> backend ids of its delegates, read back from the serialized program."""
    return {plan.name: [d.id for d in plan.delegates] for plan in _plans(pte)}


def check_bounds(pte: bytes, spec) -> None:
    """Every input of every method is serialized with the capacity its declared dims allow
    (the runtime refuses a larger call). A compiler guard on a dynamic size narrows it
    silently; this names the method, the input and both sizes instead of a runtime error
    at the first large call."""
    declared = {m.name: m for m in spec.methods}
    for plan in _plans(pte):
        method = declared.get(plan.name)
        if method is None:
            continue
        for tensor, index in zip(method.inputs, plan.inputs):
            want = [methods.dim_max(d, spec.dims) for d in tensor.shape]
            got = list(plan.values[index].val.sizes)
            if got != want:
                raise LoweringError(
                    f"{plan.name}: input {tensor.name} was serialized for at most {got}, but its dims "
                    f"{list(tensor.shape)} allow {want}: a guard during the CUDA lowering narrowed a "
                    "dynamic size. Report it with the export log; a smaller limits.max_rows / "
                    "max_owners that fits the bound works around it"
                )
