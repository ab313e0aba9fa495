"""Write a drafter as a z-lab DFlash checkpoint (`config.json` + `model.safetensors`), the
layout `checkpoint.py` reads: what `dflash-et distill` produces, and the tests' checkpoints;
and a Qwen3.5 hybrid target as transformers writes one (tests on machines without
transformers: the GPU machine)."""

import json
import struct
from pathlib import Path

import torch

from . import layers
from .checkpoint import CONFIG, DRAFTER_ARCHITECTURE, ST_NAMES, WEIGHTS
from .dflash import Drafter
from .qwen3_5 import HybridTarget


def write_file(path: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> None:
    """Write `tensors` as one safetensors file (names sorted, header padded to 8 bytes)."""
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous().cpu()
        if t.dtype not in ST_NAMES:
            raise ValueError(f"cannot write tensor {name} of dtype {t.dtype} to safetensors")
        data = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {
            "dtype": ST_NAMES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(data)],
        }
        blobs.append(data)
        offset += len(data)
    if metadata:
        header["__metadata__"] = metadata
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for data in blobs:
            f.write(data)


def _rope_json(rope: layers.Rope) -> dict:
    scaling = None
    if rope.kind == "llama3":
        scaling = {
            "rope_type": "llama3", "factor": rope.factor, "low_freq_factor": rope.low_freq_factor,
            "high_freq_factor": rope.high_freq_factor, "original_max_position_embeddings": rope.original_max_position,
        }
    return {"rope_theta": rope.theta, "rope_scaling": scaling}


def dtype_name(model: torch.nn.Module) -> str:
    return str(next(model.parameters()).dtype).removeprefix("torch.")


def _shape_json(cfg) -> dict:
    """The decoder's sizes (Hugging Face names): every target's and drafter's config."""
    return {
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "rms_norm_eps": cfg.rms_norm_eps,
    }


def decoder_json(cfg) -> dict:
    """The config.json keys a target and a drafter share (Hugging Face names)."""
    return {**_shape_json(cfg), **_rope_json(cfg.rope), "hidden_act": "silu"}


def save_drafter(model: Drafter, directory: Path) -> Path:
    """Write `model` in z-lab's DFlash layout (config.json + unprefixed model.safetensors)."""
    cfg = model.cfg
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    config = {
        "architectures": [DRAFTER_ARCHITECTURE],
        "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
        "model_type": "qwen3",
        "block_size": cfg.block_size,
        "dflash_config": {"mask_token_id": cfg.mask_token_id, "target_layer_ids": list(cfg.target_layer_ids)},
        **decoder_json(cfg),
        "attention_bias": False,
        "layer_types": list(cfg.layer_types or ["full_attention"] * cfg.num_layers),
        **({"use_sliding_window": True, "sliding_window": cfg.sliding_window} if cfg.sliding_window else {}),
        **({"is_causal": cfg.is_causal} if cfg.is_causal is not None else {}),
        "tie_word_embeddings": True,
        "torch_dtype": dtype_name(model),
    }
    if cfg.vocab_size is not None:
        config["vocab_size"] = cfg.vocab_size
    if cfg.num_target_layers is not None:
        config["num_target_layers"] = cfg.num_target_layers
    (directory / CONFIG).write_text(json.dumps(config, indent=2) + "\n")
    write_file(directory / WEIGHTS, dict(model.named_parameters()), {"format": "pt"})
    return directory


def save_hybrid_target(model: HybridTarget, directory: Path) -> Path:
    """Write `model` as transformers writes a Qwen3.5 text model (`qwen3_5_text`: config.json
    with every key `checkpoint.hybrid_config` needs, the weights under their transformers
    names, which are the model's)."""
    cfg = model.cfg
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    config = {
        "architectures": ["Qwen3_5ForCausalLM"],
        "model_type": "qwen3_5_text",
        "vocab_size": cfg.vocab_size,
        **_shape_json(cfg),
        "layer_types": list(cfg.layer_types),
        "linear_num_key_heads": cfg.linear_num_key_heads,
        "linear_num_value_heads": cfg.linear_num_value_heads,
        "linear_key_head_dim": cfg.linear_key_head_dim,
        "linear_value_head_dim": cfg.linear_value_head_dim,
        "linear_conv_kernel_dim": cfg.linear_conv_kernel_dim,
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta,
                            "partial_rotary_factor": cfg.partial_rotary_factor},
        "attention_bias": cfg.attention_bias,
        "hidden_act": "silu",
        "tie_word_embeddings": cfg.tie_embeddings,
        "torch_dtype": dtype_name(model),
    }
    (directory / CONFIG).write_text(json.dumps(config, indent=2) + "\n")
    write_file(directory / WEIGHTS, dict(model.named_parameters()), {"format": "pt"})
    return directory
