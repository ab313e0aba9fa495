"""Config -> `.pte`: trace every method, lower, serialize, write the artifact."""

import platform
from pathlib import Path

import torch

from .. import __version__
from . import artifact, methods
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
        "constants": spec.constants,
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


def trace(spec: methods.ProgramSpec, progress: artifact.Progress) -> dict:
    programs = {}
    with torch.no_grad():
        for m in spec.methods:
            with progress.stage(f"tracing {m.name}"):
                programs[m.name] = torch.export.export(
                    m.module.eval(),
                    methods.example_inputs(m),
                    dynamic_shapes=methods.dynamic_shapes(m, spec.dims),
                    strict=False,
                )
    return programs


def lower_portable(programs: dict, spec: methods.ProgramSpec) -> dict[str, bytes]:
    from executorch.exir import to_edge_transform_and_lower

    edge = to_edge_transform_and_lower(programs, constant_methods=spec.constants)
    return {artifact.PTE: edge.to_executorch().buffer}


def export_program(
    cfg: ExportConfig, output_dir: str | Path, force: bool = False, progress: artifact.Progress | None = None
) -> Path:
    """Export `cfg` into `output_dir`; returns the directory. Raises before writing anything
    when the directory holds another config's artifact and `force` is off."""
    out = Path(output_dir)
    artifact.check_overwrite(out, cfg.digest(), force)
    spec = methods.build(cfg)
    progress = progress or artifact.Progress(total=len(spec.methods) + 2)
    programs = trace(spec, progress)
    with progress.stage(f"lowering and serializing ({cfg.backend})"):
        if cfg.backend == "cuda":
            from ..lowering import cuda

            files, lowering_report = cuda.lower(programs, spec, cfg)
        else:
            files, lowering_report = lower_portable(programs, spec), None
    with progress.stage(f"writing {out}"):
        meta = manifest(cfg, spec)
        if lowering_report is not None:
            meta["lowering"] = lowering_report
        artifact.write_artifact(out, files, cfg.to_yaml(), meta)
    sizes = ", ".join(f"{n} {len(d) / 1e6:.2f} MB" for n, d in files.items())
    progress.finish(f"exported {len(spec.methods)} methods to {out} ({sizes})")
    return out
