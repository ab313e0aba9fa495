"""Config -> `.pte`: trace every method, lower, serialize, write the artifact."""

import contextlib
import dataclasses
import platform
import warnings
from pathlib import Path

import torch

from .. import __version__
from ..lowering import cuda as cuda_lowering
from ..lowering.shared_state import tensors_shared_on_deepcopy
from . import artifact, boundary, builder, methods
from . import config as config_mod
from .config import ExportConfig


def versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {"dflash_et": __version__, "torch": torch.__version__, "python": platform.python_version()}
    try:
        out["executorch"] = version("executorch")
    except PackageNotFoundError:
        out["executorch"] = "unknown"
    return out


def manifest(cfg: ExportConfig, spec: methods.ProgramSpec) -> dict:
    return {
        "format": "dflash-et artifact",
        "contract_version": methods.CONTRACT_VERSION,
        "config_digest": cfg.digest(),
        "program": cfg.program,
        "backend": cfg.backend,
        "variant": cfg.variant,
        "versions": versions(),
        "dims": {name: {"min": lo, "max": hi} for name, (lo, hi) in spec.dims.items()},
        "constants": methods.constant_names(spec),
        "methods": {
            m.name: {
                "inputs": [t.to_json() for t in m.inputs],
                "outputs": [t.to_json() for t in m.outputs],
                **({"head": m.head} if m.head else {}),
                **({"notes": m.notes} if m.notes else {}),
            }
            for m in spec.methods
        },
    }


def trace(spec: methods.ProgramSpec, progress: artifact.Progress, device: str = "cpu") -> dict:
    """torch.export every method (the verify heads and the attention inside keep their
    boundary markers, `boundary.py`: the CUDA lowering fuses them or strips them, the portable
    lowering strips them)."""
    programs = {}
    with torch.no_grad():
        for m in spec.methods:
            with progress.stage(f"tracing {m.name}"):
                module = m.module.eval().to(device)
                inputs = tuple(t.to(device) for t in methods.example_inputs(m, spec.trace_sizes))
                programs[m.name] = torch.export.export(
                    module,
                    inputs,
                    dynamic_shapes=methods.dynamic_shapes(m, spec.dims),
                    strict=False,
                )
    return programs


def traced_cuda_method(method: str, config: dict, device: str = "cuda") -> dict:
    """{method: its traced program, heads fused or stripped} for the CUDA config `config`
    (`ExportConfig.to_dict()`): what `export_program` hands the CUDA lowering, made again in
    a worker process of lowering/parallel_compile.py."""
    cfg = config_mod.from_dict(config)
    spec = builder.build(cfg)
    spec = dataclasses.replace(spec, methods=[m for m in spec.methods if m.name == method])
    with cuda_lowering.traced_fused(spec, cfg):
        programs = trace(spec, artifact.Progress(total=1), device=device)  # to the worker's log
    cuda_lowering.prepare(programs, spec, cfg)
    return programs


def executorch_config(spec: methods.ProgramSpec):
    """`to_executorch` settings: with shared state, mutable buffers (KV caches) are planned
    once for the whole program, keyed by their names, so a write by one method is read by
    the next (by default each method would get its own copy)."""
    from executorch.exir import ExecutorchBackendConfig
    from executorch.exir.passes import MemoryPlanningPass

    if not spec.shared_state:
        return None
    return ExecutorchBackendConfig(
        memory_planning_pass=MemoryPlanningPass(share_mutable_buffers=True),  # fresh: it keeps state
        emit_mutable_buffer_names=True,
    )


def lower_portable(
    programs: dict, spec: methods.ProgramSpec, progress: artifact.Progress | None = None
) -> dict[str, bytes]:
    """Edge-lower each method on its own (one progress stage each: this is the slow part,
    ~30 ms per graph node, fake-tensor re-traces), then plan memory and emit them together as
    one program. `to_edge`, not `to_edge_transform_and_lower`: without a partitioner the
    latter re-traces every graph once more (a functionalization before its decompositions),
    for the same edge graphs (both tiny DFlash configs gave the same bytes either way,
    compared by hand with ExecuTorch 1.5.1)."""
    from executorch.exir import EdgeCompileConfig, EdgeProgramManager, to_edge

    stage = progress.stage if progress is not None else (lambda _: contextlib.nullcontext())
    edge = {}
    for name, program in programs.items():
        boundary.strip(program)  # the CPU program keeps the plain ATen heads
        # (to_edge's copy of the method shares its weights and caches: lowering/shared_state.py)
        with stage(f"lowering {name} (portable)"), tensors_shared_on_deepcopy():
            edge[name] = to_edge({name: program}).exported_program(name)  # (checks the edge dialect)
    with stage("planning memory and serializing"), warnings.catch_warnings():
        # KV caches are mutated buffers whose initial contents are not serialized; that is
        # the contract (docs/CONTRACT.md), not a problem to report on every export.
        warnings.filterwarnings("ignore", message="Mutation on a buffer in the model is detected")
        # Each method's own `to_edge` has checked its edge dialect; with the default config the
        # manager checks every method again, and so does each program `to_executorch` builds
        # (~12% of a tiny DFlash export; the same bytes either way).
        manager = EdgeProgramManager(edge, constant_methods=methods.constant_values(spec),
                                     compile_config=EdgeCompileConfig(_check_ir_validity=False))
        return {artifact.PTE: manager.to_executorch(executorch_config(spec)).buffer}


def export_program(
    cfg: ExportConfig,
    output_dir: str | Path,
    force: bool = False,
    progress: artifact.Progress | None = None,
    jobs: int | None = None,
) -> Path:
    """Export `cfg` into `output_dir`; returns the directory. Raises before writing anything
    when the directory holds another config's artifact and `force` is off. `jobs`: CUDA
    only, worker processes compiling the methods side by side (1: in this process; None:
    `lowering.cuda.auto_jobs`)."""
    out = Path(output_dir)
    artifact.check_overwrite(out, cfg.digest(), force)
    spec = builder.build(cfg)
    lowering_stages = 1 if cfg.backend == "cuda" else len(spec.methods) + 1
    progress = progress or artifact.Progress(total=len(spec.methods) + lowering_stages + 1)
    if cfg.backend == "cuda":
        cuda_lowering.require_cuda()  # before minutes of tracing
        # The compile workers start now: each makes its method while this process traces them all.
        compiling = cuda_lowering.compiles(
            [m.name for m in spec.methods], cfg.lowering.autotune, jobs,
            (f"{__name__}:traced_cuda_method", {"config": cfg.to_dict()}), progress.say, cfg.lowering.zero_constants)
        with compiling:
            with cuda_lowering.traced_fused(spec, cfg):  # (as the workers trace)
                programs = trace(spec, progress, device="cuda")
            with progress.stage(f"lowering and serializing ({cfg.backend}; AOTInductor compiles each method)"):
                files, lowering_report = cuda_lowering.lower(programs, spec, cfg, say=progress.say,
                                                             compiling=contextlib.nullcontext())
        fused = lowering_report["fused_heads"]
        progress.say("fused verify heads: " + ", ".join(
            f"{name} {len(heads)}" + (f" ({', '.join(heads)})" if heads else "") for name, heads in fused.items())
            if cfg.lowering.fused_verify else "fused verify heads: none (lowering.fused_verify: false)")
    else:
        programs = trace(spec, progress, device="cpu")
        files, lowering_report = lower_portable(programs, spec, progress), None
    with progress.stage(f"writing {out}"):
        meta = manifest(cfg, spec)
        if lowering_report is not None:
            meta["lowering"] = lowering_report
        artifact.write_artifact(out, files, cfg.to_yaml(), meta)
    sizes = ", ".join(f"{n} {len(d) / 1e6:.2f} MB" for n, d in files.items())
    progress.finish(f"exported {len(spec.methods)} methods to {out} ({sizes})")
    return out
