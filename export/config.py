"""Export configs: frozen dataclasses loaded from YAML.

Every key is checked: unknown keys fail with the list of valid ones, wrong types
and out-of-range values fail with the key, the value and what is allowed. A
config names a *program* (the standalone verify heads, or a DFlash target +
drafter program), a *backend* and a *variant*:

    variant: greedy    -> dflash_verify_argmax (no sampling inputs, no randomness)
    variant: sampling  -> dflash_verify and sample_rows
"""

import dataclasses
import hashlib
import json
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path

import yaml

PROGRAMS = ("heads", "dflash")
BACKENDS = ("portable", "cuda")
VARIANTS = ("greedy", "sampling")
LOGITS_DTYPES = ("float32", "bfloat16", "float16")
MODEL_DTYPES = ("float32", "bfloat16")
AUTOTUNE = ("none", "gemm", "full")

MAX_VOCAB = 1 << 20
MAX_ROWS = 1 << 16
MAX_OWNERS = 4096
MAX_SEQ_LEN = 1 << 20

BUILTIN_DIR = Path(__file__).resolve().parent.parent / "configs"


class ConfigError(ValueError):
    """A user error in a config: the message names the key, the value and the fix."""


def _check_choice(key: str, value, choices) -> None:
    if value not in choices:
        raise ConfigError(f"{key} must be one of {', '.join(map(str, choices))}; got {value!r}")


def _check_range(key: str, value: int, low: int, high: int) -> None:
    if not low <= value <= high:
        raise ConfigError(f"{key} must be in [{low}, {high}], got {value}")


@dataclass(frozen=True)
class HeadsConfig:
    """The standalone heads program."""

    vocab_size: int

    def __post_init__(self):
        _check_range("heads.vocab_size", self.vocab_size, 1, MAX_VOCAB)


@dataclass(frozen=True)
class ModelConfig:
    """The target and drafter of a DFlash program: a preset name or a checkpoint directory."""

    target: str
    drafter: str
    dtype: str = "float32"
    seed: int = 0  # initialisation seed of the presets (checkpoints ignore it)

    def __post_init__(self):
        _check_choice("model.dtype", self.dtype, MODEL_DTYPES)
        if not self.target:
            raise ConfigError("model.target must name a preset or a checkpoint directory")
        if not self.drafter:
            raise ConfigError("model.drafter must name a preset or a checkpoint directory")


@dataclass(frozen=True)
class LimitsConfig:
    """Upper bounds of the dynamic shapes (and of the KV slots of a DFlash program)."""

    max_rows: int = 256  # R: packed rows per step (sample_rows: N)
    max_owners: int = 64  # O: owners per step
    max_seq_len: int = 512  # DFlash programs: positions per KV slot

    def __post_init__(self):
        _check_range("limits.max_rows", self.max_rows, 1, MAX_ROWS)
        _check_range("limits.max_owners", self.max_owners, 1, MAX_OWNERS)
        _check_range("limits.max_seq_len", self.max_seq_len, 2, MAX_SEQ_LEN)


@dataclass(frozen=True)
class LoweringConfig:
    """CUDA only. `fused_verify`: swap each verify head, and the drafts' argmax
    (`dflash::greedy_rows`), for its fused Triton op before AOTInductor. `autotune`: what
    AOTInductor benchmarks while compiling; `none` times
    nothing (each GEMM takes the first Triton template config, inductor's deterministic
    mode: the fastest export, for check-sized models), `gemm` times the Triton GEMM
    templates only (every other kernel takes inductor's heuristic launch config), `full` is
    ExecuTorch's default (`max_autotune`: every pointwise and reduction kernel's launch
    configs are benchmarked too, a slower export). `fused_attention`: swap the target's
    and the drafter's attention (every row gathers its whole KV slot) for
    `dflash::cached_attention`, which reads only the cells each row sees (issue #26; off
    unless a config sets it, as the qwen3-smoke CUDA configs do). `zero_constants`: leave
    every all-zero constant (the KV and context caches) out of the `.ptd`, to be allocated
    and zeroed when the runtime loads the method (lowering/zero_constants.py; long contexts:
    the caches are most of the blob). Only a runtime with the runner's zero-constants patch
    loads such a program; any other refuses it at load."""

    fused_verify: bool = True
    autotune: str = "gemm"
    fused_attention: bool = False
    zero_constants: bool = False

    def __post_init__(self):
        _check_choice("lowering.autotune", self.autotune, AUTOTUNE)


@dataclass(frozen=True)
class ExportConfig:
    program: str
    backend: str = "portable"
    variant: str = "sampling"
    logits_dtype: str | None = None  # heads: float32 by default; dflash: the model's dtype
    heads: HeadsConfig | None = None
    model: ModelConfig | None = None
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    lowering: LoweringConfig = field(default_factory=LoweringConfig)

    def __post_init__(self):
        _check_choice("program", self.program, PROGRAMS)
        _check_choice("backend", self.backend, BACKENDS)
        _check_choice("variant", self.variant, VARIANTS)
        if self.logits_dtype is not None:
            _check_choice("logits_dtype", self.logits_dtype, LOGITS_DTYPES)
        if self.program == "heads":
            if self.heads is None:
                raise ConfigError("program: heads needs a heads: section (heads.vocab_size)")
            if self.model is not None:
                raise ConfigError("program: heads takes no model: section; use program: dflash")
        else:
            if self.model is None:
                raise ConfigError("program: dflash needs a model: section (model.target, model.drafter)")
            if self.heads is not None:
                raise ConfigError(
                    "program: dflash takes no heads: section; the vocab size comes from the model"
                )
            if self.logits_dtype not in (None, self.model.dtype):
                raise ConfigError(
                    f"logits_dtype ({self.logits_dtype}) must match model.dtype ({self.model.dtype}) in a "
                    "dflash program: the heads read the target's logits as they are"
                )
        if self.limits.max_owners > self.limits.max_rows:
            raise ConfigError(
                f"limits.max_owners ({self.limits.max_owners}) must not exceed limits.max_rows "
                f"({self.limits.max_rows}): every owner holds at least one row"
            )

    @property
    def head_logits_dtype(self) -> str:
        """The dtype the verify heads read: logits_dtype, else the model's, else float32."""
        if self.logits_dtype is not None:
            return self.logits_dtype
        return self.model.dtype if self.model is not None else "float32"

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    def digest(self) -> str:
        """sha256 of the resolved config: what makes two exports the same export."""
        canonical = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()


def _type_name(tp) -> str:
    return {int: "an integer", bool: "true or false", str: "a string", float: "a number"}.get(
        tp, getattr(tp, "__name__", str(tp))
    )


def _build(cls, data, where: str):
    if not isinstance(data, dict):
        raise ConfigError(f"{where or 'the config'} must be a mapping of keys, got {data!r}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        prefix = f"{where}." if where else ""
        raise ConfigError(
            f"unknown key {prefix}{unknown[0]}; valid keys{' of ' + where if where else ''}: "
            f"{', '.join(fields)}"
        )
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for name, value in data.items():
        key = f"{where}.{name}" if where else name
        kwargs[name] = _convert(hints[name], value, key)
    missing = [
        n for n, f in fields.items()
        if n not in kwargs and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise ConfigError(f"missing key {where + '.' if where else ''}{missing[0]}")
    return cls(**kwargs)


def _convert(tp, value, key: str):
    if typing.get_origin(tp) in (typing.Union, types.UnionType):  # X | None
        inner = [a for a in typing.get_args(tp) if a is not type(None)][0]
        return None if value is None else _convert(inner, value, key)
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, key)
    # bool is an int in Python: keep them apart so `max_rows: true` is an error.
    ok = isinstance(value, tp) and not (tp is int and isinstance(value, bool))
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        value, ok = float(value), True
    if not ok:
        raise ConfigError(f"{key} must be {_type_name(tp)}, got {value!r}")
    return value


def from_dict(data: dict) -> ExportConfig:
    return _build(ExportConfig, data, "")


def builtin_names() -> list[str]:
    """The built-in configs: the YAML files of configs/."""
    return sorted(p.stem for p in BUILTIN_DIR.glob("*.yaml"))


def resolve_path(name_or_path: str) -> Path:
    """A config file path, or the name of a built-in config (`heads-sampling`)."""
    path = Path(name_or_path)
    if path.exists():
        return path
    builtin = BUILTIN_DIR / f"{name_or_path.removesuffix('.yaml')}.yaml"
    if "/" not in name_or_path and builtin.exists():
        return builtin
    names = ", ".join(builtin_names())
    raise ConfigError(f"config file {name_or_path} does not exist (built-in configs: {names})")


def load(name_or_path: str) -> ExportConfig:
    path = resolve_path(name_or_path)
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise ConfigError(f"{path} is not valid YAML: {e}") from None
    try:
        return from_dict(data if data is not None else {})
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None
