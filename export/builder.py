"""A config's program: its methods with their modules, inputs, outputs and constants.

Above `methods` (the heads program and the specs) and `dflash_program` (the target +
drafter program, which builds on `methods`): the one place that picks between them.
"""

from . import dflash_program, methods
from .config import ExportConfig
from .methods import ProgramSpec


def build(cfg: ExportConfig) -> ProgramSpec:
    if cfg.program == "heads":
        return methods.heads_program(cfg)
    return dflash_program.build(cfg)
