"""`dflash-et distill`: a config's drafter distilled on its target's greedy continuations of
the prompts `dflash-et run --seed S` drives (`driver.scenario`, max_owners owners), written
as a z-lab checkpoint with an export config that names it.

The output directory holds `config.json` + `model.safetensors` (the drafter, in the
config's dtype), `export.yaml` (the config with `model.drafter` set to the directory, as
given: relative paths are relative to where dflash-et runs) and `distill.json` (the
recipe, the prompts, the acceptance before and after). It is written under a temporary
name and renamed into place: an interrupted distill leaves nothing.

Why those prompts, and what to expect: `export/models/distill.py`.
"""

import dataclasses
import json
import shutil
import tempfile
from pathlib import Path

from . import builder, driver
from .artifact import ArtifactError, current_umask
from .config import ConfigError, ExportConfig
from .models import checkpoint_writer
from .models.distill import Recipe, distill

EXPORT_CONFIG = "export.yaml"
RECORD = "distill.json"


def eager_program(cfg: ExportConfig):
    """`cfg`'s program as eager modules (`driver.Program.eager`), with its target and drafter
    (shared with the program's methods: loading weights into the drafter changes them)."""
    spec = builder.build(dataclasses.replace(cfg, backend="portable"))
    methods = {m.name: m.module for m in spec.methods}
    return driver.Program.eager(spec), methods["target_verify"].target, methods["draft_forward"].drafter


def distill_checkpoint(cfg: ExportConfig, output_dir: str | Path, seed: int = 0, recipe: Recipe = Recipe(),
                       force: bool = False, say=print) -> Path:
    """Distil `cfg`'s drafter into `output_dir`; returns the directory."""
    if cfg.program != "dflash":
        raise ConfigError(f"dflash-et distill trains a DFlash program's drafter; this config is a {cfg.program} "
                          "program (program: dflash)")
    out = Path(output_dir)
    if out.exists() and not force and (not out.is_dir() or any(out.iterdir())):
        raise ArtifactError(f"{out} already exists; pass --force to replace it, or choose another --output-dir")
    program, target, drafter = eager_program(cfg)
    owners = driver.scenario(program, seed, owners=program.constants["max_owners"])
    prompts = [o.prompt for o in owners]

    def acceptance() -> float:
        return driver.generate(program, [o.fresh() for o in owners]).acceptance_length()

    before = acceptance()
    say(f"distilling {cfg.model.drafter!r} on {cfg.model.target!r}'s greedy continuations of the {len(prompts)} "
        f"prompts of `dflash-et run --seed {seed}` ({recipe.steps} steps)")
    drafter.load_state_dict(distill(target, drafter, prompts, recipe, say=say))
    after = acceptance()
    say(f"mean acceptance length of `dflash-et run --seed {seed}`'s owners on the eager modules: {before:.2f} "
        f"with the drafter as it was, {after:.2f} distilled (max {program.constants['block_size']}; sampling owners "
        "leave the greedy text)")

    exported = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, drafter=str(out)))
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        checkpoint_writer.save_drafter(drafter, tmp)
        (tmp / EXPORT_CONFIG).write_text(exported.to_yaml())
        (tmp / RECORD).write_text(json.dumps({
            "source_config": cfg.to_dict(), "seed": seed, "recipe": dataclasses.asdict(recipe), "prompts": prompts,
            "acceptance_before": before, "acceptance_after": after,
        }, indent=2) + "\n")
        tmp.chmod(0o777 & ~current_umask())  # mkdtemp makes 0700
        if out.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old.", dir=out.parent))
            out.rename(old / out.name)
            shutil.rmtree(old)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    say(f"wrote {out}: the drafter as a z-lab checkpoint, and {out / EXPORT_CONFIG} to export it "
        f"(dflash-et export --config {out / EXPORT_CONFIG})")
    return out
