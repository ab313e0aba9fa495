"""Method tables: what each program exports, with named inputs, outputs and shapes.

One `MethodSpec` per exported method drives tracing (example inputs and
dynamic shapes), the manifest (names, dtypes, symbolic shapes) and the check.
Shapes are tuples of ints and dim names; `DIMS` names the dynamic dims of
SPEC.md and the config limit that bounds each.
"""

from dataclasses import dataclass, field

import torch
from torch import nn
from torch.export import Dim

from . import heads
from .config import ExportConfig

CONTRACT_VERSION = 2

# The constant methods' names in a program: ExecuTorch's LLM-runner metadata names
# (extension/llm/runner/constants.h: get_vocab_size, get_max_seq_len, get_max_context_len,
# use_kv_cache, enable_dynamic_shape) and its DFlash export's (get_block_size,
# get_mask_token_id, get_n_target_layers); ours follow the same pattern. `ProgramSpec.constants`
# keys are the short names on the left, what the Python code uses.
CONSTANT_METHODS = {
    "contract_version": "get_contract_version",
    "program": "get_program",
    "variant": "get_variant",
    "model_dtype": "get_model_dtype",
    "vocab_size": "get_vocab_size",
    "hidden_size": "get_hidden_size",
    "hidden_width": "get_hidden_width",
    "num_target_layers": "get_n_target_layers",
    "target_layer_ids": "get_target_layer_ids",
    "block_size": "get_block_size",
    "mask_token_id": "get_mask_token_id",
    "max_rows": "get_max_rows",
    "max_owners": "get_max_owners",
    "max_seq_len": "get_max_seq_len",
    "max_context_len": "get_max_context_len",
    "use_kv_cache": "use_kv_cache",
    "enable_dynamic_shape": "enable_dynamic_shape",
}

LOGITS_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DTYPE_NAMES = {v: k for k, v in LOGITS_DTYPES.items()} | {torch.int64: "int64", torch.bool: "bool"}


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: torch.dtype
    shape: tuple  # ints and dim names ("rows", "owners", "owners+1", ...)

    def to_json(self) -> dict:
        return {"name": self.name, "dtype": DTYPE_NAMES[self.dtype], "shape": list(self.shape)}


@dataclass
class MethodSpec:
    name: str
    module: nn.Module
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    head: str | None = None  # the verify head this method is (for the check and the lowering)
    notes: str = ""


@dataclass
class ProgramSpec:
    methods: list[MethodSpec]
    constants: dict  # constant methods: name -> int / str / list of ints (an int64 tensor in the program)
    dims: dict[str, tuple[int, int]] = field(default_factory=dict)  # name -> (min, max)
    # Methods mutate buffers (KV caches) that every method must see: the exporter plans
    # mutable buffers once per program, shared by name, instead of once per method.
    shared_state: bool = False
    # The sizes the methods are traced at (`example_inputs`); None: small ones (_EXAMPLE).
    trace_sizes: dict[str, int] | None = None


def constant_values(spec: ProgramSpec) -> dict:
    """The constant methods as the lowering takes them, under their method names
    (`CONSTANT_METHODS`): a list of ints becomes one int64 tensor (ExecuTorch would make a
    list several outputs; a C++ runtime reads one tensor)."""
    return {name: torch.tensor(v, dtype=torch.int64) if isinstance(v, list) else v
            for name, v in constant_names(spec).items()}


def constant_names(spec: ProgramSpec) -> dict:
    """Method name -> value of every constant method (as the manifest lists them)."""
    return {CONSTANT_METHODS[k]: v for k, v in spec.constants.items()}


# Example sizes for tracing: above 1 (export specialises 0 and 1) and distinct.
_EXAMPLE = {"rows": 5, "owners": 2, "n": 3}


def trace_sizes(cfg: ExportConfig) -> dict[str, int] | None:
    """CUDA programs are traced at their limits: the traced sizes are the hints AOTInductor
    tunes for (its GEMM autotuning times each candidate at them), and a verify step runs at
    max_rows. Traced at 5 rows, the GEMMs were tuned for a 5-row matmul and ran the 1024
    rows of qwen3-smoke's verify with it. Portable programs keep the small sizes (their bytes
    stay as they were)."""
    if cfg.backend != "cuda":
        return None
    return {"rows": cfg.limits.max_rows, "owners": cfg.limits.max_owners, "n": cfg.limits.max_rows}


def _dims(cfg: ExportConfig) -> dict[str, tuple[int, int]]:
    return {
        "rows": (1, cfg.limits.max_rows),
        "owners": (1, cfg.limits.max_owners),
        "n": (1, cfg.limits.max_rows),
    }


def search_bound(cfg: ExportConfig) -> int | None:
    """The heads' `max_rows`: the row bound runs their cut searches in a `scan` (compact
    ExecuTorch CPU programs); None unrolls them (what AOTInductor compiles for CUDA,
    where the searches run unfused only with lowering.fused_verify: false)."""
    return None if cfg.backend == "cuda" else cfg.limits.max_rows


def head_method(name: str, vocab: int, logits_dtype: torch.dtype, bound: int | None) -> MethodSpec:
    """A standalone head of SPEC.md as a method: its inputs and outputs from `heads.HEADS`."""
    head = heads.HEADS[name]

    def tensor(arg: heads.Arg) -> TensorSpec:
        sizes = tuple(vocab if size == "V" else size for size in arg.sizes)
        return TensorSpec(arg.name, logits_dtype if arg.dtype is None else arg.dtype, sizes)

    module = head.module(bound) if issubclass(head.module, heads.SearchBound) else head.module()  # argmax: no search
    return MethodSpec(name, module, [tensor(a) for a in head.inputs], [tensor(a) for a in head.outputs], head=name)


def head_methods(cfg: ExportConfig, vocab: int, logits_dtype: torch.dtype) -> list[MethodSpec]:
    """The standalone heads of SPEC.md for this variant."""
    names = ["dflash_verify_argmax"] if cfg.variant == "greedy" else ["dflash_verify", "sample_rows"]
    return [head_method(n, vocab, logits_dtype, search_bound(cfg)) for n in names]


def heads_program(cfg: ExportConfig) -> ProgramSpec:
    vocab = cfg.heads.vocab_size
    methods = head_methods(cfg, vocab, LOGITS_DTYPES[cfg.head_logits_dtype])
    constants = {
        "contract_version": CONTRACT_VERSION,
        "program": "heads",
        "variant": cfg.variant,
        "vocab_size": vocab,
        "max_rows": cfg.limits.max_rows,
        "max_owners": cfg.limits.max_owners,
        "use_kv_cache": False,
        "enable_dynamic_shape": True,
    }
    return ProgramSpec(methods, constants, _dims(cfg), trace_sizes=trace_sizes(cfg))


def _resolve(size, sizes: dict[str, int]) -> int:
    if isinstance(size, int):
        return size
    name, _, plus = size.partition("+")
    return sizes[name] + int(plus or 0)


def dim_max(size, dims: dict[str, tuple[int, int]]) -> int:
    """The largest value a shape entry (an int or a dim name like "owners+1") may take."""
    return _resolve(size, {name: high for name, (_, high) in dims.items()})


def example_inputs(spec: MethodSpec, sizes: dict[str, int] | None = None) -> tuple[torch.Tensor, ...]:
    """Valid-shaped inputs for tracing at `sizes` (default _EXAMPLE): zeros, except offsets
    that split the rows evenly among the owners."""
    sizes = {**_EXAMPLE, **(sizes or {})}
    out = []
    for t in spec.inputs:
        shape = tuple(_resolve(s, sizes) for s in t.shape)
        if t.name == "offsets":
            owners = shape[0] - 1
            out.append(torch.linspace(0, sizes["rows"], owners + 1).round().to(torch.int64))
        else:
            out.append(torch.zeros(shape, dtype=t.dtype))
    return tuple(out)


def dynamic_shapes(spec: MethodSpec, dims: dict[str, tuple[int, int]]) -> tuple:
    made: dict[str, Dim] = {}

    def dim(name: str):
        base, _, plus = name.partition("+")
        if base not in made:
            low, high = dims[base]
            made[base] = Dim(base, min=low, max=high)
        return made[base] + int(plus) if plus else made[base]

    return tuple(
        {i: dim(s) for i, s in enumerate(t.shape) if isinstance(s, str)} or None for t in spec.inputs
    )
