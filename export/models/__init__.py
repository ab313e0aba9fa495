"""Target and DFlash drafter models, their checkpoints and the embedded presets.

`load(model_cfg, limits)` resolves `model.target` / `model.drafter` (a preset
name or a checkpoint directory), checks that the drafter fits the target and
the limits, and returns both with KV / context caches of `limits.max_owners`
slots x `limits.max_seq_len` positions. A target checkpoint is a Llama-family
model (`llama.Target`) or a Qwen3.5 hybrid (`qwen3_5.HybridTarget`, whose
verify calls keep one drafter block of pending rows per slot).
"""

from pathlib import Path

import torch

from ..config import ConfigError, LimitsConfig, ModelConfig
from . import checkpoint, presets
from .dflash import Drafter, DrafterConfig
from .llama import Target, TargetConfig
from .qwen3_5 import HybridConfig, HybridTarget

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}

__all__ = [
    "Drafter", "DrafterConfig", "HybridConfig", "HybridTarget", "Target", "TargetConfig", "check_pair",
    "drafter_config", "load", "load_drafter", "load_target", "target_config",
]


def _resolve(name: str, table: dict, key: str) -> Path | None:
    """None for a preset, the directory for a checkpoint; an error for anything else."""
    if name in table:
        return None
    path = Path(name)
    if path.is_dir():
        return path
    why = "is not a directory" if path.exists() else "does not exist"
    raise ConfigError(
        f"{key} {name!r} is neither a preset ({', '.join(table)}) nor a checkpoint directory ({path} {why})"
    )


def target_config(model_cfg: ModelConfig) -> tuple[TargetConfig | HybridConfig, Path | None]:
    """The target's architecture and its checkpoint directory (None for a preset)."""
    directory = _resolve(model_cfg.target, presets.TARGETS, "model.target")
    if directory is None:
        return presets.TARGETS[model_cfg.target], None
    if checkpoint.is_hybrid(directory):
        return checkpoint.hybrid_config(directory)[0], directory
    return checkpoint.target_config(directory), directory


def drafter_config(model_cfg: ModelConfig) -> tuple[DrafterConfig, Path | None]:
    directory = _resolve(model_cfg.drafter, presets.DRAFTERS, "model.drafter")
    if directory is None:
        return presets.DRAFTERS[model_cfg.drafter], None
    return checkpoint.drafter_config(directory), directory


def load_target(model_cfg: ModelConfig, limits: LimitsConfig) -> Target | HybridTarget:
    dtype = DTYPES[model_cfg.dtype]
    cfg, directory = target_config(model_cfg)
    if isinstance(cfg, HybridConfig):  # a verify call's rows per owner wait for the next call: one block
        block = drafter_config(model_cfg)[0].block_size
        return checkpoint.load_hybrid_target(directory, limits.max_owners, limits.max_seq_len, limits.max_rows, dtype,
                                             pending_rows=block)
    if directory is not None:
        return checkpoint.load_target(directory, limits.max_owners, limits.max_seq_len, dtype)
    # The same preset target whether its drafter is a preset or a checkpoint (e.g. one that
    # `dflash-et distill` trained against this target): the mask row follows the drafter.
    mask = drafter_config(model_cfg)[0].mask_token_id
    return presets.init_target(Target(cfg, limits.max_owners, limits.max_seq_len, dtype), model_cfg.seed, mask)


def load_drafter(model_cfg: ModelConfig, limits: LimitsConfig) -> Drafter:
    dtype = DTYPES[model_cfg.dtype]
    cfg, directory = drafter_config(model_cfg)
    if directory is not None:
        return checkpoint.load_drafter(directory, limits.max_owners, limits.max_seq_len, dtype)
    return presets.init_drafter(Drafter(cfg, limits.max_owners, limits.max_seq_len, dtype), model_cfg.seed)


def check_pair(target: TargetConfig | HybridConfig, drafter: DrafterConfig, limits: LimitsConfig | None = None) -> None:
    """The drafter must read this target's taps, embedding and lm_head; the limits must
    hold one verify block."""
    if drafter.hidden_size != target.hidden_size:
        raise ConfigError(
            f"drafter hidden_size ({drafter.hidden_size}) does not match the target's ({target.hidden_size}): "
            "a DFlash drafter reads the target's embeddings and hidden states; pair it with the target it was "
            "trained for"
        )
    bad = [t for t in drafter.target_layer_ids if not 0 <= t < target.num_layers]
    if bad:
        raise ConfigError(
            f"drafter target_layer_ids {list(drafter.target_layer_ids)} name layers {bad} outside the target's "
            f"{target.num_layers} layers [0, {target.num_layers - 1}]"
        )
    if drafter.num_target_layers is not None and drafter.num_target_layers != target.num_layers:
        raise ConfigError(
            f"drafter num_target_layers ({drafter.num_target_layers}) does not match the target's "
            f"num_hidden_layers ({target.num_layers}): the drafter was trained for another target"
        )
    if drafter.vocab_size is not None and drafter.vocab_size != target.vocab_size:
        raise ConfigError(
            f"drafter vocab_size ({drafter.vocab_size}) does not match the target's ({target.vocab_size})"
        )
    if not 0 <= drafter.mask_token_id < target.vocab_size:
        raise ConfigError(
            f"drafter mask_token_id {drafter.mask_token_id} is outside the target's vocab [0, {target.vocab_size})"
        )
    if limits is not None:
        if drafter.block_size > limits.max_rows:
            raise ConfigError(
                f"limits.max_rows ({limits.max_rows}) must hold at least one verify block of block_size "
                f"{drafter.block_size} rows"
            )
        if drafter.block_size >= limits.max_seq_len:
            raise ConfigError(
                f"limits.max_seq_len ({limits.max_seq_len}) must exceed the drafter's block_size "
                f"({drafter.block_size})"
            )


def load(model_cfg: ModelConfig, limits: LimitsConfig) -> tuple[Target | HybridTarget, Drafter]:
    """Both models; the pair is checked from the configs before any weight is read."""
    check_pair(target_config(model_cfg)[0], drafter_config(model_cfg)[0], limits)
    return load_target(model_cfg, limits), load_drafter(model_cfg, limits)
