"""The target: a Llama / Qwen3-family decoder over packed rows of several owners.

Architecture (HF `modeling_llama` / `modeling_qwen3`): token embedding; per layer
pre-norm attention (RoPE, GQA, Qwen3's per-head q/k RMSNorm before RoPE) and
pre-norm SwiGLU MLP, each added to the residual; final RMSNorm; lm_head (tied to
the embedding or not). Parameter names are HF's (`model.layers.N.self_attn.q_proj
.weight`, ...), so a checkpoint's state dict loads as it is.

Packed step: rows `[offsets[o], offsets[o+1])` belong to owner `o`, the first at
position `start_position[o]`, in KV slot `slots[o]`. Each layer first writes
every row's K/V at (its slot, its position), then each row attends to its
slot's positions `<= its own` (`layers.CachedAttention`). So rows of one owner in
one step see each other causally, and cache entries past a row's position (stale
drafts of an earlier step, or an earlier owner of a reused slot) are never read.
Each row gathers its slot's whole cache (`[R, T, KV, D]`): simple, vectorised over
owners and batch-invariant (a row's result does not depend on the other rows),
sized for the portable reference program; a CUDA export with
`lowering.fused_attention` swaps in `dflash::cached_attention`, which reads only the
cells each row sees.

Hidden taps (z-lab DFlash convention, `extract_context_feature`): the drafter's
context is `hidden_states[layer_id + 1]` of HF's `output_hidden_states`, i.e.
the raw output of 0-based decoder layer `layer_id`, concatenated in
`target_layer_ids` order. HF replaces the last entry of that tuple with the
final-normed state, so a tap of the last layer is normed here too.
"""

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from . import layers, packing

FAMILIES = ("qwen3", "llama")


@dataclass(frozen=True)
class TargetConfig:
    family: str  # "qwen3" (q/k norm) or "llama": decides the checkpoint's config.json
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope: layers.Rope = field(default_factory=layers.Rope)
    tie_embeddings: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False

    @property
    def qk_norm(self) -> bool:
        """Qwen3 normalises each head's q and k before RoPE; Llama does not."""
        return self.family == "qwen3"

    def __post_init__(self):
        if self.family not in FAMILIES:
            raise ValueError(f"target family must be one of {', '.join(FAMILIES)}, got {self.family!r}")
        layers.check_decoder_shape("target", self, ("vocab_size", "hidden_size", "intermediate_size", "num_layers",
                                                     "num_heads", "num_kv_heads", "head_dim"))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: TargetConfig, slots: int, max_seq_len: int, dtype: torch.dtype):
        super().__init__()
        self.input_layernorm = layers.RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = layers.Attention(
            cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.rms_norm_eps,
            cfg.qk_norm, cfg.attention_bias, slots, max_seq_len, dtype,
        )
        self.post_attention_layernorm = layers.RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = layers.MLP(cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias)
        self.cached_attention = layers.CachedAttention()  # no parameters: HF's names are unchanged

    def forward(
        self,
        x: torch.Tensor,  # [R, hidden]
        cos: torch.Tensor,  # [R, D]
        sin: torch.Tensor,  # [R, D]
        place: packing.Placement,
        seen: tuple[torch.Tensor, torch.Tensor],  # ([R], [R]) int64: the cells [lo, hi) each row sees
    ) -> torch.Tensor:  # [R, hidden]
        attn = self.self_attn
        h = self.input_layernorm(x)
        q = attn.query(h, cos, sin)
        k, v = attn.key_value(h, cos, sin)
        attn.store(place.write_slot, place.write_position, k, v)
        out = self.cached_attention(q, attn.k_cache, attn.v_cache, place.read_slot, *seen)
        x = x + attn.o_proj(out)
        return x + self.mlp(self.post_attention_layernorm(x))


class Backbone(nn.Module):
    """HF's `model.` prefix: embed_tokens, layers, norm."""

    def __init__(self, cfg: TargetConfig, slots: int, max_seq_len: int, dtype: torch.dtype):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, slots, max_seq_len, dtype) for _ in range(cfg.num_layers))
        self.norm = layers.RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


def tap(x: torch.Tensor, layer: int, num_layers: int, norm: nn.Module) -> torch.Tensor:
    """Decoder layer `layer`'s output as the drafter's context takes it (HF's
    `hidden_states[layer + 1]`): raw, except the last layer's, which HF replaces with the
    final-normed state."""
    return norm(x) if layer == num_layers - 1 else x


def output_weight(embed_tokens: nn.Embedding, lm_head: nn.Linear | None) -> torch.Tensor:  # [V, hidden]
    """The lm_head's weight, or the embedding's when they are tied (lm_head None)."""
    return embed_tokens.weight if lm_head is None else lm_head.weight


class OutputHead:
    """The logits of a target with `model.embed_tokens`, `model.norm` and `lm_head` (None when
    tied): shared by this target and the Qwen3.5 hybrid."""

    @property
    def output_weight(self) -> torch.Tensor:  # [V, hidden]
        return output_weight(self.model.embed_tokens, self.lm_head)

    def logits(self, h: torch.Tensor) -> torch.Tensor:  # [N, hidden] pre-norm -> [N, V]
        return F.linear(self.model.norm(h), self.output_weight)


class Target(OutputHead, nn.Module):
    """The target LLM with `slots` KV slots of `max_seq_len` positions (+ one scratch slot)."""

    def __init__(self, cfg: TargetConfig, slots: int, max_seq_len: int, dtype: torch.dtype = torch.float32):
        super().__init__()
        self.cfg, self.slots, self.max_seq_len = cfg, slots, max_seq_len
        self.model = Backbone(cfg, slots, max_seq_len, dtype)
        self.lm_head = None if cfg.tie_embeddings else nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        cos, sin = cfg.rope.table(cfg.head_dim, max_seq_len)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        layers.cast_parameters(self, dtype)  # the RoPE table stays float32

    def forward(
        self,
        tokens: torch.Tensor,  # [R] int64
        offsets: torch.Tensor,  # [O+1] int64
        start_position: torch.Tensor,  # [O] int64
        slots: torch.Tensor,  # [O] int64
        taps: tuple[int, ...],
        defer: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # last hidden [R, hidden] (pre-norm), taps [R, len(taps) * hidden]
        """`defer` (a verify call) changes nothing here: a KV cell past the committed prefix is
        never read, and the next call overwrites it (a hybrid target's state needs it)."""
        start, count = packing.offsets_to_ranges(offsets)
        place = packing.place_rows(
            tokens.shape[0], start, count, start_position, slots, self.slots, self.max_seq_len
        )
        x = self.model.embed_tokens(torch.clamp(tokens, 0, self.cfg.vocab_size - 1))
        cos, sin = self.rope_cos[place.rope_position], self.rope_sin[place.rope_position]
        seen = (torch.zeros_like(place.position), place.position + 1)  # cells <= the row's position
        tapped = {}
        for i, layer in enumerate(self.model.layers):
            x = layer(x, cos, sin, place, seen)
            if i in taps:
                tapped[i] = tap(x, i, self.cfg.num_layers, self.model.norm)
        return x, torch.cat([tapped[i] for i in taps], dim=-1)

    def accept(self, slots: torch.Tensor, counts: torch.Tensor) -> None:
        """Nothing to keep after a verify call (see `forward`'s `defer`)."""
