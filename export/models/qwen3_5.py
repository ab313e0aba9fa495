"""Qwen3.5-family hybrid targets (transformers `qwen3_5` text model) over packed owners with
per-slot state: the eager reference of issue #27 (not yet a program: no method builds it).

Architecture (transformers 5.18 `modeling_qwen3_5`, parameter names as there):
- decoder layers of two kinds, `layer_types`: `linear_attention` (Gated DeltaNet) and
  `full_attention` (gated softmax attention, every 4th layer by default);
- RMSNorms are zero-centred, `x * (1 + w)` in float32; the DeltaNet output norm is a
  plain `w` norm times `silu(z)`;
- full attention: `q_proj` yields a query and a gate per head, q/k RMSNorm per head,
  RoPE on the first `head_dim * partial_rotary_factor` dims only, the output times
  `sigmoid(gate)` before `o_proj`;
- Gated DeltaNet: a causal depthwise conv (kernel K, silu) over `in_proj_qkv`'s output,
  q/k L2-normalised, `beta = sigmoid(b)`, `g = -exp(A_log) * softplus(a + dt_bias)`, and
  per value head the state `S [dk, dv]` (float32): `S *= exp(g)`, `S += k (x) beta (v - S^T k)`,
  output `S^T q / sqrt(dk)`.

State per slot: the full-attention layers' K/V caches (as the Llama target's: a row sees its
slot's cells up to its position, so cells past the committed prefix are never read); per
DeltaNet layer the conv state (the last K - 1 inputs of the conv) and the recurrent state.
Unlike a KV cache, these cannot be cut back: a verify call advances them over every draft
row, and only the accepted prefix may stay. Here a call that verifies (`defer=True`) reads
the slot's state but leaves it as it was, and keeps each row's conv input, `a` and `b`
(`pending_*`); the next call first commits the accepted rows (`commit`: the same conv and
recurrence over the first `accepted + 1` pending rows, from the saved state). Cost per
DeltaNet layer and slot: pending rows x (conv_dim + 2 x value heads) values of memory; per
step, the recurrence of the committed rows once more (dk x dv x value heads x ~6 FLOPs a row,
small against the projections). Per-row state checkpoints would instead keep rows x value
heads x dk x dv float32 values per slot and layer (2 MiB a row at Qwen3.5-9B's 32 x 128 x 128).
"""

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from . import layers


@dataclass(frozen=True)
class HybridConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    layer_types: tuple[str, ...]
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    linear_conv_kernel_dim: int = 4
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10_000_000.0
    partial_rotary_factor: float = 0.25
    tie_embeddings: bool = False
    attention_bias: bool = False

    def __post_init__(self):
        layers.check_decoder_shape("target", self, ("vocab_size", "hidden_size", "intermediate_size", "num_layers",
                                                     "num_heads", "num_kv_heads", "head_dim"))
        if len(self.layer_types) != self.num_layers:
            raise ValueError(f"target layer_types has {len(self.layer_types)} entries for {self.num_layers} layers")
        unknown = set(self.layer_types) - {"linear_attention", "full_attention"}
        if unknown:
            raise ValueError(f"target layer_types: {sorted(unknown)} are not linear_attention / full_attention")
        if self.linear_num_value_heads % self.linear_num_key_heads:
            raise ValueError(f"linear_num_value_heads ({self.linear_num_value_heads}) must be a multiple of "
                             f"linear_num_key_heads ({self.linear_num_key_heads})")
        if self.rotary_dim % 2 or not 0 < self.rotary_dim <= self.head_dim:
            raise ValueError(f"head_dim {self.head_dim} x partial_rotary_factor {self.partial_rotary_factor} must be "
                             f"an even number of dims in (0, head_dim], got {self.rotary_dim}")

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def conv_dim(self) -> int:
        return 2 * self.linear_num_key_heads * self.linear_key_head_dim + self.value_dim

    @property
    def value_dim(self) -> int:
        return self.linear_num_value_heads * self.linear_value_head_dim


class CenteredRMSNorm(nn.Module):
    """`norm(x) * (1 + w)` in float32 (the weight starts at zero)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (h * (1.0 + self.weight.float())).type_as(x)


class GatedRMSNorm(nn.Module):
    """The DeltaNet output norm: `w * norm(x)` (cast back first), times `silu(gate)` in float32."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        h = self.weight * h.to(x.dtype)
        return (h * F.silu(gate.float())).to(x.dtype)


def _l2norm(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + 1e-6)


class GatedDeltaNet(nn.Module):
    def __init__(self, cfg: HybridConfig, slots: int, pending_rows: int, dtype: torch.dtype):
        super().__init__()
        self.cfg = cfg
        hv, dk, dv = cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim
        self.key_dim = cfg.linear_num_key_heads * dk
        self.conv1d = nn.Conv1d(cfg.conv_dim, cfg.conv_dim, cfg.linear_conv_kernel_dim, bias=False,
                                groups=cfg.conv_dim, padding=cfg.linear_conv_kernel_dim - 1)
        self.dt_bias = nn.Parameter(torch.ones(hv))
        self.A_log = nn.Parameter(torch.zeros(hv))
        self.norm = GatedRMSNorm(dv, cfg.rms_norm_eps)
        self.out_proj = nn.Linear(cfg.value_dim, cfg.hidden_size, bias=False)
        self.in_proj_qkv = nn.Linear(cfg.hidden_size, cfg.conv_dim, bias=False)
        self.in_proj_z = nn.Linear(cfg.hidden_size, cfg.value_dim, bias=False)
        self.in_proj_b = nn.Linear(cfg.hidden_size, hv, bias=False)
        self.in_proj_a = nn.Linear(cfg.hidden_size, hv, bias=False)
        k = cfg.linear_conv_kernel_dim
        self.register_buffer("conv_state", torch.zeros(slots + 1, k - 1, cfg.conv_dim, dtype=dtype), persistent=False)
        self.register_buffer("recurrent_state", torch.zeros(slots + 1, hv, dk, dv), persistent=False)
        # a deferred call's rows, per slot: the conv input, a and b of each (`commit` replays them)
        self.register_buffer("pending_qkv", torch.zeros(slots + 1, pending_rows, cfg.conv_dim, dtype=dtype),
                             persistent=False)
        self.register_buffer("pending_ab", torch.zeros(slots + 1, pending_rows, 2, hv, dtype=dtype), persistent=False)

    def _run(self, slot: int, mixed: torch.Tensor, a: torch.Tensor, b: torch.Tensor):
        """The conv and the recurrence over one slot's rows in order, from its saved state:
        (core output [n, Hv, dv] in the model dtype, conv state after, recurrent state after)."""
        cfg = self.cfg
        n, k = mixed.shape[0], cfg.linear_conv_kernel_dim
        window = torch.cat([self.conv_state[slot], mixed], dim=0)  # [k - 1 + n, conv_dim]
        weight = self.conv1d.weight.squeeze(1)  # [conv_dim, k]
        conv = F.conv1d(window.t().unsqueeze(0).to(weight.dtype), weight.unsqueeze(1), groups=cfg.conv_dim)
        conv = F.silu(conv[0].t()).to(mixed.dtype)  # [n, conv_dim]
        hk, hv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
        dk, dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
        q, key, v = torch.split(conv, [self.key_dim, self.key_dim, cfg.value_dim], dim=-1)
        q = q.reshape(n, hk, dk).repeat_interleave(hv // hk, dim=1).float()
        key = key.reshape(n, hk, dk).repeat_interleave(hv // hk, dim=1).float()
        v = v.reshape(n, hv, dv).float()
        beta = b.sigmoid().float()  # (in the model dtype first, as transformers does)
        g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias)
        q, key = _l2norm(q) / math.sqrt(dk), _l2norm(key)
        state = self.recurrent_state[slot].clone()
        out = torch.empty(n, hv, dv)
        for t in range(n):
            state = state * g[t].exp()[:, None, None]
            delta = (v[t] - (state * key[t].unsqueeze(-1)).sum(dim=-2)) * beta[t].unsqueeze(-1)
            state = state + key[t].unsqueeze(-1) * delta.unsqueeze(-2)
            out[t] = (state * q[t].unsqueeze(-1)).sum(dim=-2)
        return out.to(mixed.dtype), window[-(k - 1):], state

    def forward(self, x: torch.Tensor, runs: list[tuple[int, int, int]], defer: bool) -> torch.Tensor:
        """x [R, hidden]; runs: (slot, first row, rows) per owner, in one call's packing."""
        cfg = self.cfg
        mixed, z = self.in_proj_qkv(x), self.in_proj_z(x)
        a, b = self.in_proj_a(x), self.in_proj_b(x)
        core = torch.zeros(x.shape[0], cfg.linear_num_value_heads, cfg.linear_value_head_dim, dtype=x.dtype)
        for slot, first, n in runs:
            rows = slice(first, first + n)
            core[rows], conv_state, state = self._run(slot, mixed[rows], a[rows], b[rows])
            if defer:
                if n > self.pending_qkv.shape[1]:
                    raise ValueError(f"a deferred call of {n} rows for slot {slot}: at most "
                                     f"{self.pending_qkv.shape[1]} rows can wait for their commit")
                self.pending_qkv[slot, :n] = mixed[rows]
                self.pending_ab[slot, :n] = torch.stack([a[rows], b[rows]], dim=1)
            else:
                self.conv_state[slot] = conv_state
                self.recurrent_state[slot] = state
        z = z.view(-1, cfg.linear_num_value_heads, cfg.linear_value_head_dim)
        return self.out_proj(self.norm(core, z).reshape(x.shape[0], cfg.value_dim))

    def commit(self, slot: int, rows: int) -> None:
        """Advance the slot's state over the first `rows` rows its last deferred call kept."""
        if rows > 0:
            ab = self.pending_ab[slot, :rows]
            _, self.conv_state[slot], self.recurrent_state[slot] = self._run(
                slot, self.pending_qkv[slot, :rows], ab[:, 0], ab[:, 1])


class GatedAttention(nn.Module):
    def __init__(self, cfg: HybridConfig, slots: int, max_seq_len: int, dtype: torch.dtype):
        super().__init__()
        self.cfg = cfg
        heads, kv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        bias = cfg.attention_bias
        self.q_proj = nn.Linear(cfg.hidden_size, heads * d * 2, bias=bias)
        self.k_proj = nn.Linear(cfg.hidden_size, kv * d, bias=bias)
        self.v_proj = nn.Linear(cfg.hidden_size, kv * d, bias=bias)
        self.o_proj = nn.Linear(heads * d, cfg.hidden_size, bias=bias)
        self.q_norm = CenteredRMSNorm(d, cfg.rms_norm_eps)
        self.k_norm = CenteredRMSNorm(d, cfg.rms_norm_eps)
        cache = (slots + 1, max_seq_len, kv, d)
        self.register_buffer("k_cache", torch.zeros(cache, dtype=dtype), persistent=False)
        self.register_buffer("v_cache", torch.zeros(cache, dtype=dtype), persistent=False)

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        r = self.cfg.rotary_dim
        return torch.cat([layers.apply_rope(x[..., :r], cos, sin), x[..., r:]], dim=-1)

    def forward(self, x: torch.Tensor, cos, sin, slot: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        cfg = self.cfg
        n, heads, d = x.shape[0], cfg.num_heads, cfg.head_dim
        q, gate = torch.chunk(self.q_proj(x).view(n, heads, 2 * d), 2, dim=-1)
        q = self._rope(self.q_norm(q), cos, sin)
        k = self._rope(self.k_norm(self.k_proj(x).view(n, cfg.num_kv_heads, d)), cos, sin)
        self.k_cache.index_put_((slot, position), k)
        self.v_cache.index_put_((slot, position), self.v_proj(x).view(n, cfg.num_kv_heads, d))
        cells = torch.arange(self.k_cache.shape[1])
        allowed = (cells[None, :] <= position[:, None]).unsqueeze(1)  # [n, 1, T]: its slot's cells up to it
        out = layers.attend(q.unsqueeze(1), self.k_cache[slot], self.v_cache[slot], allowed)[:, 0]
        return self.o_proj(out * torch.sigmoid(gate.reshape(n, heads * d)))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: HybridConfig, kind: str, slots: int, max_seq_len: int, pending_rows: int,
                 dtype: torch.dtype):
        super().__init__()
        self.kind = kind
        if kind == "linear_attention":
            self.linear_attn = GatedDeltaNet(cfg, slots, pending_rows, dtype)
        else:
            self.self_attn = GatedAttention(cfg, slots, max_seq_len, dtype)
        self.mlp = layers.MLP(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = CenteredRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = CenteredRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class Backbone(nn.Module):
    """transformers' `model.` prefix: embed_tokens, layers, norm."""

    def __init__(self, cfg: HybridConfig, slots: int, max_seq_len: int, pending_rows: int, dtype: torch.dtype):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, kind, slots, max_seq_len, pending_rows, dtype)
                                    for kind in cfg.layer_types)
        self.norm = CenteredRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class HybridTarget(nn.Module):
    """The hybrid target with `slots` slots of `max_seq_len` positions (+ one scratch slot);
    a deferred call may keep up to `pending_rows` rows per owner for its commit."""

    def __init__(self, cfg: HybridConfig, slots: int, max_seq_len: int, pending_rows: int = 16,
                 dtype: torch.dtype = torch.float32):
        super().__init__()
        self.cfg, self.slots, self.max_seq_len = cfg, slots, max_seq_len
        self.model = Backbone(cfg, slots, max_seq_len, pending_rows, dtype)
        self.lm_head = None if cfg.tie_embeddings else nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        rope = layers.Rope(theta=cfg.rope_theta)
        cos, sin = rope.table(cfg.rotary_dim, max_seq_len)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        layers.cast_parameters(self, dtype)

    def commit(self, slots: list[int], rows: list[int]) -> None:
        """Each slot's state advances over the first `rows` rows of its last deferred call."""
        for layer in self.model.layers:
            if layer.kind == "linear_attention":
                for slot, n in zip(slots, rows):
                    layer.linear_attn.commit(slot, n)

    def forward(self, tokens: torch.Tensor, counts: list[int], start_position: list[int], slots: list[int],
                defer: bool = False) -> torch.Tensor:  # logits [R, V]
        """Owner o's `counts[o]` rows follow each other in `tokens`, the first at
        `start_position[o]`, in slot `slots[o]`. `defer`: the DeltaNet states stay as they
        were and the rows wait for `commit` (a verify call); else they advance (prefill, decode)."""
        runs, first = [], 0
        for slot, n in zip(slots, counts):
            if not 0 <= slot < self.slots:
                raise ValueError(f"slot {slot} is not in [0, {self.slots})")
            runs.append((slot, first, n))
            first += n
        if first != tokens.shape[0]:
            raise ValueError(f"counts add up to {first} rows, tokens has {tokens.shape[0]}")
        slot = torch.tensor([s for s, _, n in runs for _ in range(n)], dtype=torch.int64)
        position = torch.tensor([p + j for p, (_, _, n) in zip(start_position, runs) for j in range(n)],
                                dtype=torch.int64)
        if tokens.shape[0] and int(position.max()) >= self.max_seq_len:
            raise ValueError(f"position {int(position.max())} is past max_seq_len {self.max_seq_len}")
        x = self.model.embed_tokens(tokens)
        cos, sin = self.rope_cos[position], self.rope_sin[position]
        for layer in self.model.layers:
            h = layer.input_layernorm(x)
            if layer.kind == "linear_attention":
                x = x + layer.linear_attn(h, runs, defer)
            else:
                x = x + layer.self_attn(h, cos, sin, slot, position)
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        weight = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return F.linear(self.model.norm(x), weight)
