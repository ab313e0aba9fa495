"""Write models as checkpoints (tests only): a target as a Hugging Face checkpoint of its
family; drafters in z-lab's layout come from the package (`export/models/checkpoint_writer.py`,
which `dflash-et distill` uses). The real loader (`export/models/checkpoint.py`) is tested on
these files."""

import json
from pathlib import Path

from dflash_et.export.models.checkpoint import CONFIG, TARGET_TYPES, WEIGHTS
from dflash_et.export.models.checkpoint_writer import decoder_json, dtype_name, save_drafter, write_file
from dflash_et.export.models.llama import Target

__all__ = ["save_drafter", "save_target", "write_file"]


def save_target(model: Target, directory: Path) -> Path:
    """Write `model` as an HF checkpoint of its family (config.json + model.safetensors)."""
    cfg = model.cfg
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    config = {
        "architectures": [TARGET_TYPES[cfg.family]],
        "model_type": cfg.family,
        "vocab_size": cfg.vocab_size,
        **decoder_json(cfg),
        "tie_word_embeddings": cfg.tie_embeddings,
        "attention_bias": cfg.attention_bias,
        "max_position_embeddings": model.max_seq_len,
        "torch_dtype": dtype_name(model),
    }
    if cfg.family == "llama":
        config["mlp_bias"] = cfg.mlp_bias
    (directory / CONFIG).write_text(json.dumps(config, indent=2) + "\n")
    write_file(directory / WEIGHTS, dict(model.named_parameters()), {"format": "pt"})
    return directory
