"""The DFlash drafter (z-lab `DFlashDraftModel`), batched over owners with a per-slot
context cache.

z-lab architecture (`dflash/model.py`):
- context features: `hidden_norm(fc(taps))`, `fc: Linear(len(taps) * H -> H, no bias)`;
  the same features enter every layer, each projects them with its own
  k_proj / v_proj (+ k_norm, + RoPE at the context row's absolute position);
- block stream: the target's embedding of `[pending, mask x (block_size - 1)]`
  at positions `P .. P + block_size - 1` (P = the pending token's position);
- each layer: pre-norm attention whose queries come from the block and whose
  keys/values are `[context K/V of positions < P, block K/V]`, then a pre-norm
  SwiGLU MLP; final RMSNorm. A full-attention layer sees all of them (no mask
  inside the block: non-causal). A sliding-window layer (`layer_types`
  "sliding_attention", window W) sees only keys within W of the query's absolute
  position, and is causal unless the config says `is_causal: false`: the
  semantics of z-lab's `dflash/model.py` at 07ebd93 (and vLLM's): a query at q sees
  key k iff q - k < W, and k <= q when causal (else also k - q < W). An explicit
  `is_causal` applies to every layer. (z-lab's older revision, 7d2ea1e, ran every
  layer non-causal, the window through flash-attention as |q - k| < W.)
- logits through the *target's* lm_head; block position i predicts the token at
  position P + i, so positions 1 .. block_size - 1 give the drafts (argmax).

The context cache holds, per layer and slot, the post-k_norm post-RoPE K and
the V of every committed position (z-lab's `past_key_values_draft` after
`crop(start)`). A block writes its own K/V at cells P .. P + L - 1 before it
attends, so every query sees one interval of cells (`Drafter.seen`), which
`dflash::cached_attention` reads without a mask; the caches have L - 1 cells
past max_seq_len for a block that runs off the slot's end. Entries at cells
>= P + L are never read, and those in [P, P + L) are rewritten by the next
block or by committed context, so rows written past the committed prefix, or
left over from an earlier owner of the slot, are harmless until overwritten.
"""

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from . import layers, packing


SLIDING = "sliding_attention"
LAYER_TYPES = ("full_attention", SLIDING)


@dataclass(frozen=True)
class DrafterConfig:
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    target_layer_ids: tuple[int, ...]
    mask_token_id: int
    rms_norm_eps: float = 1e-6
    rope: layers.Rope = field(default_factory=layers.Rope)
    vocab_size: int | None = None  # when the checkpoint says: must equal the target's
    num_target_layers: int | None = None  # likewise
    layer_types: tuple[str, ...] | None = None  # "full_attention" / "sliding_attention"; None: all full
    sliding_window: int | None = None  # W of the sliding layers (None: they are not windowed)
    is_causal: bool | None = None  # None: sliding layers causal, full layers not (z-lab's default)

    def __post_init__(self):
        layers.check_decoder_shape(
            "drafter", self, ("hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads", "head_dim"))
        if not 2 <= self.block_size <= 64:
            raise ValueError(f"drafter block_size must be in [2, 64], got {self.block_size}")
        if not self.target_layer_ids:
            raise ValueError("drafter target_layer_ids must name at least one target layer")
        if len(set(self.target_layer_ids)) != len(self.target_layer_ids):
            raise ValueError(f"drafter target_layer_ids must be distinct, got {list(self.target_layer_ids)}")
        if self.layer_types is not None:
            if len(self.layer_types) != self.num_layers:
                raise ValueError(f"drafter layer_types has {len(self.layer_types)} entries for "
                                 f"{self.num_layers} layers")
            unknown = sorted(set(self.layer_types) - set(LAYER_TYPES))
            if unknown:
                raise ValueError(f"drafter layer_types {unknown} are not supported (supported: {', '.join(LAYER_TYPES)})")
        if self.sliding_window is not None and not (isinstance(self.sliding_window, int) and self.sliding_window >= 1):
            raise ValueError(f"drafter sliding_window must be a positive integer or absent, got {self.sliding_window!r}")

    def attention(self, layer: int) -> tuple[bool, int | None]:
        """(causal, window or None) of the layer's attention."""
        sliding = self.layer_types is not None and self.layer_types[layer] == SLIDING
        causal = sliding if self.is_causal is None else self.is_causal
        return causal, self.sliding_window if sliding else None

    @property
    def context_width(self) -> int:
        """Width of one packed hidden row: the concatenated taps."""
        return len(self.target_layer_ids) * self.hidden_size


class DrafterLayer(nn.Module):
    def __init__(self, cfg: DrafterConfig, slots: int, max_seq_len: int, dtype: torch.dtype):
        super().__init__()
        self.input_layernorm = layers.RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = layers.Attention(  # cells past max_seq_len: a block that runs off the slot's end
            cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.rms_norm_eps,
            True, False, slots, max_seq_len + cfg.block_size - 1, dtype,
        )
        self.post_attention_layernorm = layers.RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = layers.MLP(cfg.hidden_size, cfg.intermediate_size)
        # no parameters: z-lab's names are unchanged; a block's rows gather their slot once
        self.cached_attention = layers.CachedAttention(group=cfg.block_size)

    def forward(
        self,
        x: torch.Tensor,  # [O, L, hidden]: the block stream
        cos: torch.Tensor,  # [O * L, D]
        sin: torch.Tensor,  # [O * L, D]
        slot: torch.Tensor,  # [O * L] int64: each block row's slot (its owner's, or the scratch slot)
        cell: torch.Tensor,  # [O * L] int64: the cell its K/V go to (its position)
        seen: tuple[torch.Tensor, torch.Tensor],  # ([O * L], [O * L]) int64: the cells [lo, hi) it sees
    ) -> torch.Tensor:  # [O, L, hidden]
        attn = self.self_attn
        owners, length, hidden = x.shape
        h = self.input_layernorm(x).reshape(owners * length, hidden)
        q = attn.query(h, cos, sin)
        k, v = attn.key_value(h, cos, sin)
        attn.store(slot, cell, k, v)  # the block's keys sit after the context: one interval per query
        out = self.cached_attention(q, attn.k_cache, attn.v_cache, slot, *seen)
        x = x + attn.o_proj(out).view(owners, length, hidden)
        return x + self.mlp(self.post_attention_layernorm(x))


class Drafter(nn.Module):
    """DFlash drafter with `slots` context slots of `max_seq_len` positions (+ scratch).
    Unprefixed parameter names as in z-lab checkpoints (`fc.weight`, `layers.0...`)."""

    def __init__(self, cfg: DrafterConfig, slots: int, max_seq_len: int, dtype: torch.dtype = torch.float32):
        super().__init__()
        self.cfg, self.slots, self.max_seq_len = cfg, slots, max_seq_len
        self.fc = nn.Linear(cfg.context_width, cfg.hidden_size, bias=False)
        self.hidden_norm = layers.RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.layers = nn.ModuleList(DrafterLayer(cfg, slots, max_seq_len, dtype) for _ in range(cfg.num_layers))
        self.norm = layers.RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        cos, sin = cfg.rope.table(cfg.head_dim, max_seq_len)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        layers.cast_parameters(self, dtype)

    def store_context(
        self,
        hidden: torch.Tensor,  # [R, len(taps) * hidden]: target hidden taps
        place: packing.Placement,
    ) -> None:
        """Write every layer's context K/V of the placed rows into their slots."""
        ctx = self.hidden_norm(self.fc(hidden))
        cos, sin = self.rope_cos[place.rope_position], self.rope_sin[place.rope_position]
        for layer in self.layers:
            k, v = layer.self_attn.key_value(ctx, cos, sin)
            layer.self_attn.store(place.write_slot, place.write_position, k, v)

    def block(
        self,
        noise: torch.Tensor,  # [O, L, hidden]: target embeddings of [pending, mask, ...]
        start_position: torch.Tensor,  # [O] int64: position of the pending token
        slots: torch.Tensor,  # [O] int64
    ) -> torch.Tensor:  # [O, L, hidden]: final-normed block states
        owners, length, _ = noise.shape
        steps = torch.arange(length, dtype=torch.int64, device=noise.device)
        positions = torch.clamp(start_position[:, None] + steps[None, :], 0, self.max_seq_len - 1).reshape(-1)
        cos, sin = self.rope_cos[positions], self.rope_sin[positions]
        # an owner with a bad slot or P outside [0, max_seq_len) drafts from the scratch slot
        valid = (start_position >= 0) & (start_position < self.max_seq_len)
        slot = torch.where(valid, packing.slot_or_scratch(slots, self.slots), self.slots)
        start = torch.clamp(start_position, 0, self.max_seq_len - 1)
        cell = (start[:, None] + steps[None, :]).reshape(-1)  # < max_seq_len + L - 1: the caches' size
        row_slot = slot[:, None].expand(owners, length).reshape(-1)
        seen = {}  # (causal, window) -> (lo, hi)
        x = noise
        for i, layer in enumerate(self.layers):
            kind = self.cfg.attention(i)
            if kind not in seen:
                seen[kind] = self.seen(start, length, *kind)
            x = layer(x, cos, sin, row_slot, cell, seen[kind])
        return self.norm(x)

    @staticmethod
    def seen(start: torch.Tensor, length: int, causal: bool, window: int | None) -> tuple[torch.Tensor, torch.Tensor]:
        """([O * L], [O * L]): the cells [lo, hi) each block query sees. Query i is at
        position q = P + i, context cell c at position c (< P: committed), block key j at
        cell P + j. Every layer kind sees one interval: full, all of [0, P + L); causal,
        [0, q + 1); a window W keeps keys k with q - k < W (lo = q - W + 1) and, when not
        causal, k - q < W (hi = q + W)."""
        steps = torch.arange(length, dtype=torch.int64, device=start.device)
        query = (start[:, None] + steps[None, :]).reshape(-1)
        end = (start[:, None] + length).expand(-1, length).reshape(-1)
        hi = query + 1 if causal else end
        lo = torch.zeros_like(query)
        if window is not None:
            lo = torch.clamp(query - window + 1, min=0)
            if not causal:
                hi = torch.minimum(hi, query + window)
        return lo, hi


def draft_tokens(
    states: torch.Tensor,  # [O, L, hidden]: Drafter.block output
    output_weight: torch.Tensor,  # [V, hidden]: the target's lm_head
    greedy: layers.GreedyRows,  # the argmax (a submodule of the caller: a CUDA export fuses it)
) -> torch.Tensor:  # [O, L - 1] int64: argmax drafts for block positions 1 .. L-1
    owners, length, hidden = states.shape
    logits = F.linear(states[:, 1:].reshape(owners * (length - 1), hidden), output_weight)
    return greedy(logits).view(owners, length - 1)
