"""Local Hugging Face-style checkpoints: `config.json` + `*.safetensors`, read.

Targets: `model_type` qwen3 (`Qwen3ForCausalLM`) or llama (`LlamaForCausalLM`),
HF tensor names (`model.embed_tokens.weight`, `model.layers.N.self_attn.q_proj
.weight`, ..., `lm_head.weight` unless `tie_word_embeddings`). Drafters: z-lab
DFlash (`DFlashDraftModel`): unprefixed names (`fc.weight`, `hidden_norm.weight`,
`layers.N...`, `norm.weight`; a `model.` prefix is accepted), no embedding and
no lm_head; `block_size`, `target_layer_ids` and `mask_token_id` from the
config, top level or inside `dflash_config` (which wins, as in z-lab and sglang).

Every tensor the model needs must be present with its exact shape, and every
tensor present must be needed (HF's non-persistent `rotary_emb.inv_freq` is the
only thing skipped); errors name the tensor and the file. Float tensors are
cast to the model dtype.

safetensors is read here directly (8-byte little-endian header
length, JSON header `{name: {dtype, shape, data_offsets}}`, raw little-endian
data), memory-mapped, so loading needs no extra dependency and a bad file gets
an error that names it.
"""

import json
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import torch

from ..config import ConfigError
from . import layers
from .dflash import SLIDING, Drafter, DrafterConfig
from .llama import Target, TargetConfig
from .qwen3_5 import HybridConfig, HybridTarget

CONFIG = "config.json"
INDEX = "model.safetensors.index.json"
WEIGHTS = "model.safetensors"

ST_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool,
}
ST_NAMES = {v: k for k, v in ST_DTYPES.items()}
FLOAT_DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16)

TARGET_TYPES = {"qwen3": "Qwen3ForCausalLM", "llama": "LlamaForCausalLM"}
HYBRID_TYPES = ("qwen3_5", "qwen3_5_text")  # the multimodal wrapper (text_config inside) and the text model
DRAFTER_ARCHITECTURE = "DFlashDraftModel"
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)  # non-persistent in HF; old checkpoints carry it


class CheckpointError(ConfigError):
    """A checkpoint that cannot be loaded; the message names the file, the tensor or the key."""


# ----------------------------------------------------------------------------- safetensors


@dataclass(frozen=True)
class TensorEntry:
    file: Path
    dtype: torch.dtype
    shape: tuple[int, ...]
    begin: int  # absolute byte offsets in the file
    end: int


def read_header(path: Path) -> dict[str, TensorEntry]:
    """The tensors a .safetensors file holds, checked against its size."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise CheckpointError(f"{path} is not a safetensors file (shorter than its 8-byte header length)")
        (length,) = struct.unpack("<Q", head)
        if length > size - 8:
            raise CheckpointError(f"{path} is truncated or not a safetensors file (header of {length} bytes)")
        try:
            header = json.loads(f.read(length))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise CheckpointError(f"{path} has an unreadable safetensors header ({e})") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path} has an unreadable safetensors header (not a JSON object)")
    data_start = 8 + length
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype_name, shape, (begin, end) = meta["dtype"], tuple(meta["shape"]), meta["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise CheckpointError(f"{path}: tensor {name} has a malformed header entry {meta!r}") from None
        if dtype_name not in ST_DTYPES:
            raise CheckpointError(
                f"{path}: tensor {name} has dtype {dtype_name}, which this loader does not read "
                f"(supported: {', '.join(ST_DTYPES)})"
            )
        dtype = ST_DTYPES[dtype_name]
        numel = 1
        for d in shape:
            numel *= d
        nbytes = numel * torch.empty((), dtype=dtype).element_size()
        if not 0 <= begin <= end or end - begin != nbytes or data_start + end > size:
            raise CheckpointError(
                f"{path}: tensor {name} ({dtype_name} {list(shape)}) has data offsets [{begin}, {end}] that do "
                f"not fit its {nbytes} bytes or the file; the file is truncated or corrupt"
            )
        out[name] = TensorEntry(path, dtype, shape, data_start + begin, data_start + end)
    return out


def read_tensor(entry: TensorEntry, mapped: mmap.mmap) -> torch.Tensor:
    if entry.end == entry.begin:
        return torch.empty(entry.shape, dtype=entry.dtype)
    raw = torch.frombuffer(mapped, dtype=torch.uint8, count=entry.end - entry.begin, offset=entry.begin)
    return raw.clone().view(entry.dtype).reshape(entry.shape)  # clone: aligned, owns its memory


def read_file(path: Path) -> dict[str, torch.Tensor]:
    entries = read_header(path)
    with open(path, "rb") as f:
        if not entries:
            return {}
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        try:
            return {name: read_tensor(e, mapped) for name, e in entries.items()}
        finally:
            mapped.close()


# ----------------------------------------------------------------------------- directories


def _read_config(directory: Path) -> dict:
    path = directory / CONFIG
    if not path.exists():
        raise CheckpointError(
            f"{directory} has no {CONFIG}; a checkpoint directory holds config.json and *.safetensors"
        )
    try:
        data = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path} is not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path} must hold a JSON object")
    return data


def tensor_index(directory: Path) -> dict[str, TensorEntry]:
    """Every tensor of the checkpoint -> where it is (all shards, or those the index names)."""
    index = directory / INDEX
    if index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as e:
            raise CheckpointError(f"{index} is not a safetensors index with a weight_map ({e})") from None
        files = sorted({directory / f for f in weight_map.values()})
        for f in files:
            if not f.exists():
                raise CheckpointError(f"{index} names {f.name}, which is missing from {directory}")
    else:
        files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{directory} has no *.safetensors files")
    out: dict[str, TensorEntry] = {}
    for f in files:
        for name, entry in read_header(f).items():
            if name in out:
                raise CheckpointError(f"tensor {name} is in both {out[name].file} and {f}; keep one copy")
            out[name] = entry
    return out


def _load_state(
    directory: Path,
    expected: dict[str, torch.Size],
    rename,  # checkpoint name -> model name
    dtype: torch.dtype,
    what: str,
    skip: tuple[str, ...] = (),  # prefixes of checkpoint names that are not the model's (not read)
) -> dict[str, torch.Tensor]:
    """Check names and shapes against the model's, then read and cast every tensor."""
    found: dict[str, TensorEntry] = {}
    for name, entry in tensor_index(directory).items():
        if name.endswith(IGNORED_SUFFIXES) or name.startswith(skip):
            continue
        key = rename(name)
        if key not in expected:
            raise CheckpointError(
                f"unexpected tensor {name} in {entry.file}: the {what} described by {directory / CONFIG} has no "
                f"such weight (wrong model_type, num_hidden_layers or tie_word_embeddings in config.json?)"
            )
        found[key] = entry
    files = ", ".join(sorted({e.file.name for e in found.values()})) or "its *.safetensors files"
    for key, shape in expected.items():
        if key not in found:
            raise CheckpointError(f"tensor {key} is missing from {directory} ({files}); the {what} needs it")
        entry = found[key]
        if entry.shape != tuple(shape):
            raise CheckpointError(
                f"tensor {key} in {entry.file} has shape {list(entry.shape)}, expected {list(shape)} "
                f"from {directory / CONFIG}"
            )
        if entry.dtype not in FLOAT_DTYPES:
            raise CheckpointError(
                f"tensor {key} in {entry.file} has dtype {ST_NAMES[entry.dtype]}; weights must be floats"
            )
    state = {}
    for file in sorted({e.file for e in found.values()}):
        with open(file, "rb") as f:
            mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
            try:
                for key, entry in found.items():
                    if entry.file == file:
                        state[key] = read_tensor(entry, mapped).to(dtype)
            finally:
                mapped.close()
    return state


# ----------------------------------------------------------------------------- config.json


_KIND_NAMES = {
    int: "an integer", bool: "true or false", dict: "a JSON object", list: "a list", (int, float): "a number",
}


class _Keys:
    """config.json reader whose errors name the file and the key."""

    def __init__(self, data: dict, path: Path):
        self.data, self.path = data, path

    def get(self, key, default=None, kind=None, within: dict | None = None):
        source = self.data if within is None else within
        value = source.get(key, default)
        if kind is not None and value is not None:
            ok = isinstance(value, kind) and not (kind in (int, (int, float)) and isinstance(value, bool))
            if not ok:
                raise CheckpointError(f"{self.path}: {key} must be {_KIND_NAMES[kind]}, got {value!r}")
        return value

    def need(self, key, kind=int, within: dict | None = None):
        value = self.get(key, kind=kind, within=within)
        if value is None:
            raise CheckpointError(f"{self.path} has no {key}; it is required")
        return value


def _rope(keys: _Keys, default_theta: float) -> layers.Rope:
    params = keys.get("rope_parameters", kind=dict) or {}
    theta = float(params.get("rope_theta", keys.get("rope_theta", default_theta, kind=(int, float))))
    scaling = keys.get("rope_scaling", kind=dict) or ({k: v for k, v in params.items() if k != "rope_theta"} or None)
    kind = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    if kind == "default":
        return layers.Rope(theta=theta)
    if kind == "llama3":
        try:
            return layers.Rope(
                theta=theta, kind="llama3", factor=float(scaling["factor"]),
                low_freq_factor=float(scaling["low_freq_factor"]),
                high_freq_factor=float(scaling["high_freq_factor"]),
                original_max_position=int(scaling["original_max_position_embeddings"]),
            )
        except KeyError as e:
            raise CheckpointError(f"{keys.path}: rope_scaling of type llama3 needs {e.args[0]}") from None
    raise CheckpointError(
        f"{keys.path}: rope type {kind!r} is not supported (supported: default, llama3)"
    )


def _check_qwen3_explicit(keys: _Keys) -> None:
    """transformers' Qwen3Config fills a missing head_dim, num_key_value_heads or rope_theta
    with class defaults (not derived from the other keys, and not the same in every
    release), where our reading would derive or assume another value. Such a config.json is
    refused, naming the key, rather than loaded as a different model than transformers'."""
    rope_theta = "rope_theta" in keys.data or "rope_theta" in (keys.get("rope_parameters", kind=dict) or {})
    for key, present in (("head_dim", "head_dim" in keys.data),
                         ("num_key_value_heads", "num_key_value_heads" in keys.data),
                         ("rope_theta", rope_theta)):
        if not present:
            raise CheckpointError(
                f"{keys.path} has no {key}: transformers' Qwen3Config would take its own class default "
                f"for it, not a value derived from the other keys; write {key} into the config.json"
            )


def _check_silu(keys: _Keys, what: str) -> None:
    act = keys.get("hidden_act", "silu")
    if act != "silu":
        raise CheckpointError(f"{keys.path}: hidden_act {act!r} is not supported for the {what}; only silu (SwiGLU)")


def _check_plain(keys: _Keys, what: str) -> None:
    _check_silu(keys, what)
    kinds = set(keys.get("layer_types", None, kind=list) or [])
    if kinds - {"full_attention"} or keys.get("use_sliding_window", False):
        raise CheckpointError(
            f"{keys.path}: sliding-window layers ({sorted(kinds - {'full_attention'}) or 'use_sliding_window'}) "
            f"are not supported for the {what}; only full attention"
        )


def target_config(directory: Path) -> TargetConfig:
    path = directory / CONFIG
    data = _read_config(directory)
    keys = _Keys(data, path)
    model_type = data.get("model_type")
    archs = data.get("architectures") or []
    if model_type not in TARGET_TYPES:
        supported = ", ".join(f"{t} ({a})" for t, a in TARGET_TYPES.items())
        hint = "; this is a DFlash drafter: use it as model.drafter" if DRAFTER_ARCHITECTURE in archs else ""
        if model_type in HYBRID_TYPES:
            hint = "; it is a Qwen3.5 hybrid target: read it with hybrid_config / load_hybrid_target"
        raise CheckpointError(
            f"{path}: model_type {model_type!r} (architectures {archs}) is not a supported target; "
            f"supported: {supported}{hint}"
        )
    if DRAFTER_ARCHITECTURE in archs:
        raise CheckpointError(f"{path} describes a DFlash drafter ({DRAFTER_ARCHITECTURE}); use it as model.drafter")
    _check_plain(keys, "target")
    if model_type == "qwen3":
        _check_qwen3_explicit(keys)
    heads = keys.need("num_attention_heads")
    hidden = keys.need("hidden_size")
    try:
        return TargetConfig(
            family=model_type,
            vocab_size=keys.need("vocab_size"),
            hidden_size=hidden,
            intermediate_size=keys.need("intermediate_size"),
            num_layers=keys.need("num_hidden_layers"),
            num_heads=heads,
            num_kv_heads=keys.get("num_key_value_heads", heads, kind=int),
            head_dim=keys.get("head_dim", None, kind=int) or hidden // heads,
            rms_norm_eps=float(keys.get("rms_norm_eps", 1e-6, kind=(int, float))),
            rope=_rope(keys, 10_000.0),
            tie_embeddings=bool(keys.get("tie_word_embeddings", False, kind=bool)),
            attention_bias=bool(keys.get("attention_bias", False, kind=bool)),
            mlp_bias=bool(keys.get("mlp_bias", False, kind=bool)),
        )
    except ValueError as e:
        if isinstance(e, CheckpointError):
            raise
        raise CheckpointError(f"{path}: {e}") from None


def build_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """z-lab's default taps when a drafter config names none (`dflash/model.py`)."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    span = end - start
    return [int(round(start + (i * span) / (num_draft_layers - 1))) for i in range(num_draft_layers)]


def _drafter_attention(keys: _Keys, dflash: dict, num_layers: int) -> dict:
    """layer_types, sliding_window and is_causal as z-lab's drafter reads them from
    transformers' Qwen3Config: the window counts only with use_sliding_window (else
    Qwen3Config sets it to None), missing layer_types are derived (sliding from
    max_window_layers on, when windowed), and is_causal is read where vLLM reads it
    (top level, then dflash_config.is_causal, then dflash_config.causal)."""
    window = keys.get("sliding_window", None, kind=int) if keys.get("use_sliding_window", False, kind=bool) else None
    types = keys.get("layer_types", None, kind=list)
    if types is None:
        first = keys.get("max_window_layers", 28, kind=int)
        types = [SLIDING if window is not None and i >= first else "full_attention" for i in range(num_layers)]
    causal = keys.get("is_causal", None, kind=bool)
    for key in ("is_causal", "causal"):
        if causal is None:
            causal = keys.get(key, None, kind=bool, within=dflash)
    if not isinstance(types, list) or not all(isinstance(t, str) for t in types):
        raise CheckpointError(f"{keys.path}: layer_types must be a list of strings, got {types!r}")
    plain = len(types) == num_layers and set(types) == {"full_attention"}  # = no layer_types
    return {"layer_types": None if plain else tuple(types),
            "sliding_window": window if SLIDING in types else None, "is_causal": causal}


def drafter_config(directory: Path) -> DrafterConfig:
    path = directory / CONFIG
    data = _read_config(directory)
    keys = _Keys(data, path)
    archs = data.get("architectures") or []
    dflash = keys.get("dflash_config", {}, kind=dict)
    if DRAFTER_ARCHITECTURE not in archs and not dflash and "block_size" not in data:
        raise CheckpointError(
            f"{path}: architectures {archs} (model_type {data.get('model_type')!r}) is not a DFlash drafter; "
            f"expected {DRAFTER_ARCHITECTURE} with block_size and dflash_config (target_layer_ids, mask_token_id)"
        )
    _check_silu(keys, "drafter")
    _check_qwen3_explicit(keys)  # z-lab's drafters are Qwen3Config models
    neutral_values = (("input_embedding_scale", 1.0), ("output_multiplier", 1.0), ("final_logit_softcapping", None))
    for key, neutral in neutral_values:
        value = dflash.get(key, data.get(key, neutral))
        if value != neutral:
            raise CheckpointError(f"{path}: {key} = {value!r} is not supported (only {neutral!r})")
    if keys.get("attention_bias", False, kind=bool):
        raise CheckpointError(f"{path}: attention_bias is not supported for DFlash drafters")
    heads = keys.need("num_attention_heads")
    hidden = keys.need("hidden_size")
    layers_n = keys.need("num_hidden_layers")
    num_target_layers = keys.get("num_target_layers", None, kind=int)
    taps = dflash.get("target_layer_ids", data.get("target_layer_ids"))
    if taps is None:
        if num_target_layers is None:
            raise CheckpointError(
                f"{path} has no dflash_config.target_layer_ids (and no num_target_layers to derive them)"
            )
        taps = build_target_layer_ids(num_target_layers, layers_n)
    if not isinstance(taps, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in taps):
        raise CheckpointError(f"{path}: target_layer_ids must be a list of integers, got {taps!r}")
    mask = dflash.get("mask_token_id", data.get("mask_token_id"))
    if not isinstance(mask, int) or isinstance(mask, bool):
        raise CheckpointError(f"{path} has no integer dflash_config.mask_token_id (got {mask!r}); it is required")
    block = dflash.get("block_size", data.get("block_size"))
    if block is None:
        raise CheckpointError(f"{path} has no block_size (nor dflash_config.block_size); it is required: the "
                              "drafter was trained for one block size")
    if not isinstance(block, int) or isinstance(block, bool):
        raise CheckpointError(f"{path}: block_size must be an integer, got {block!r}")
    try:
        return DrafterConfig(
            hidden_size=hidden,
            intermediate_size=keys.need("intermediate_size"),
            num_layers=layers_n,
            num_heads=heads,
            num_kv_heads=keys.get("num_key_value_heads", heads, kind=int),
            head_dim=keys.get("head_dim", None, kind=int) or hidden // heads,
            block_size=block,
            target_layer_ids=tuple(taps),
            mask_token_id=mask,
            rms_norm_eps=float(keys.get("rms_norm_eps", 1e-6, kind=(int, float))),
            rope=_rope(keys, 1_000_000.0),
            vocab_size=keys.get("vocab_size", None, kind=int),
            num_target_layers=num_target_layers,
            **_drafter_attention(keys, dflash, layers_n),
        )
    except ValueError as e:
        if isinstance(e, CheckpointError):
            raise
        raise CheckpointError(f"{path}: {e}") from None


def is_hybrid(directory: Path) -> bool:
    """Whether the checkpoint's config.json describes a Qwen3.5 hybrid target."""
    return _read_config(Path(directory)).get("model_type") in HYBRID_TYPES


def hybrid_config(directory: Path) -> tuple[HybridConfig, bool]:
    """A Qwen3.5 text config (`qwen3_5_text`, or the multimodal `qwen3_5` wrapper's
    `text_config`) -> (config, whether the weights sit under the wrapper's
    `model.language_model.` prefix). Keys that transformers' Qwen3_5TextConfig fills with
    class defaults unrelated to the other keys (head_dim, num_key_value_heads, rope_theta,
    the linear-attention head counts and dims) must be written out; the ones it derives
    (layer_types from full_attention_interval, partial_rotary_factor 0.25, the conv kernel 4)
    are derived the same way here."""
    path = directory / CONFIG
    data = _read_config(directory)
    model_type = data.get("model_type")
    if model_type not in HYBRID_TYPES:
        raise CheckpointError(
            f"{path}: model_type {model_type!r} is not a Qwen3.5 hybrid target ({', '.join(HYBRID_TYPES)})")
    wrapped = model_type == "qwen3_5"
    text = _Keys(data, path).need("text_config", kind=dict) if wrapped else data
    keys = _Keys(text, path)
    _check_silu(keys, "target")
    params = keys.get("rope_parameters", kind=dict) or {}
    for key, present in (("head_dim", "head_dim" in text), ("num_key_value_heads", "num_key_value_heads" in text),
                         ("rope_theta", "rope_theta" in params or "rope_theta" in text)):
        if not present:
            raise CheckpointError(f"{path} has no {key}{' in text_config' if wrapped else ''}: transformers' "
                                  f"Qwen3_5TextConfig would take its own class default; write it into the config.json")
    if params.get("rope_type", "default") != "default":
        raise CheckpointError(f"{path}: rope type {params['rope_type']!r} is not supported (supported: default)")
    layers_n = keys.need("num_hidden_layers")
    interval = keys.get("full_attention_interval", 4, kind=int)
    types = keys.get("layer_types", None, kind=list) or [
        "linear_attention" if (i + 1) % interval else "full_attention" for i in range(layers_n)]
    tie = keys.get("tie_word_embeddings", data.get("tie_word_embeddings", False), kind=bool)
    try:
        cfg = HybridConfig(
            vocab_size=keys.need("vocab_size"), hidden_size=keys.need("hidden_size"),
            intermediate_size=keys.need("intermediate_size"), num_layers=layers_n,
            num_heads=keys.need("num_attention_heads"), num_kv_heads=keys.need("num_key_value_heads"),
            head_dim=keys.need("head_dim"), layer_types=tuple(types),
            linear_num_key_heads=keys.need("linear_num_key_heads"),
            linear_num_value_heads=keys.need("linear_num_value_heads"),
            linear_key_head_dim=keys.need("linear_key_head_dim"),
            linear_value_head_dim=keys.need("linear_value_head_dim"),
            linear_conv_kernel_dim=keys.get("linear_conv_kernel_dim", 4, kind=int),
            rms_norm_eps=float(keys.get("rms_norm_eps", 1e-6, kind=(int, float))),
            rope_theta=float(params.get("rope_theta", text.get("rope_theta"))),
            partial_rotary_factor=float(params.get("partial_rotary_factor", text.get("partial_rotary_factor", 0.25))),
            tie_embeddings=bool(tie), attention_bias=bool(keys.get("attention_bias", False, kind=bool)),
        )
    except ValueError as e:
        if isinstance(e, CheckpointError):
            raise
        raise CheckpointError(f"{path}: {e}") from None
    return cfg, wrapped


def load_hybrid_target(directory: Path, slots: int, max_seq_len: int, max_rows: int, dtype: torch.dtype,
                       pending_rows: int = 16) -> HybridTarget:
    """A Qwen3.5 text model from a transformers checkpoint (the text model's, or the
    multimodal model's: its vision tower `model.visual.*` and its multi-token-prediction
    head `mtp.*` are left out)."""
    directory = Path(directory)
    cfg, wrapped = hybrid_config(directory)
    model = HybridTarget(cfg, slots, max_seq_len, max_rows, pending_rows, dtype)
    rename = (lambda n: n.replace("model.language_model.", "model.", 1)) if wrapped else (lambda n: n)
    state = _load_state(directory, _expected(model), rename, dtype, "Qwen3.5 target",
                        skip=("model.visual.", "mtp.") if wrapped else ("mtp.",))
    model.load_state_dict(state, strict=True)
    return model


# ----------------------------------------------------------------------------- models


def _expected(model: torch.nn.Module) -> dict[str, torch.Size]:
    return {name: p.shape for name, p in model.named_parameters()}


def load_target(directory: Path, slots: int, max_seq_len: int, dtype: torch.dtype) -> Target:
    directory = Path(directory)
    model = Target(target_config(directory), slots, max_seq_len, dtype)
    state = _load_state(directory, _expected(model), lambda n: n, dtype, "target")
    model.load_state_dict(state, strict=True)
    return model


def load_drafter(directory: Path, slots: int, max_seq_len: int, dtype: torch.dtype) -> Drafter:
    directory = Path(directory)
    model = Drafter(drafter_config(directory), slots, max_seq_len, dtype)
    state = _load_state(directory, _expected(model), lambda n: n.removeprefix("model."), dtype, "DFlash drafter")
    model.load_state_dict(state, strict=True)
    return model
