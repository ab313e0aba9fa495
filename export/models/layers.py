"""Building blocks shared by the target and the drafter (Qwen3 / Llama conventions of HF).

- RMSNorm: `weight * (x * rsqrt(mean(x^2) + eps))`, computed in float32 and cast
  back before the weight (no `1 + weight`).
- RoPE: NeoX-style `rotate_half` over the full head dim; `inv_freq = 1 /
  theta^(2i/D)` (Llama-3.1 `rope_type: llama3` rescales it). cos/sin for every
  position below `max_seq_len` are a constant table: a gather, not a `cos` op, so
  eager and exported programs see the same values bit for bit.
- Attention: `softmax(q k^T / sqrt(D) + mask) v` through
  `scaled_dot_product_attention` with a bool mask, in the model dtype, with
  equal head counts for q, k and v (GQA folds each KV head's query heads into
  rows): one plain SDPA node that a backend can swap for its fused kernel.
- Scratch slot: every KV cache has `slots + 1` slots; the last one takes the
  writes of rows that belong to no valid (owner, slot, position), so a bad input
  never writes outside the cache and never touches another owner's slot.
"""

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .. import sampling
from ..boundary import mark


@dataclass(frozen=True)
class Rope:
    """RoPE parameters: `kind` "default" or "llama3" (with its four scaling numbers)."""

    theta: float = 1_000_000.0
    kind: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192

    def __post_init__(self):
        if self.kind not in ("default", "llama3"):
            raise ValueError(f"rope kind must be default or llama3, got {self.kind!r}")
        if self.theta <= 0:
            raise ValueError(f"rope_theta must be > 0, got {self.theta}")

    def inv_freq(self, head_dim: int) -> torch.Tensor:  # [D/2] float32
        inv = 1.0 / (self.theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
        if self.kind == "default":
            return inv
        # transformers `_compute_llama3_parameters`
        low_wavelen = self.original_max_position / self.low_freq_factor
        high_wavelen = self.original_max_position / self.high_freq_factor
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > low_wavelen, inv / self.factor, inv)
        smooth = (self.original_max_position / wavelen - self.low_freq_factor) / (
            self.high_freq_factor - self.low_freq_factor
        )
        smoothed = (1 - smooth) * scaled / self.factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        return torch.where(medium, smoothed, scaled)

    def table(self, head_dim: int, max_seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [max_seq_len, D] float32, computed as HF does (float32 outer product)."""
        positions = torch.arange(max_seq_len, dtype=torch.int64).float()
        freqs = positions[:, None] * self.inv_freq(head_dim)[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos(), emb.sin()


def check_decoder_shape(who: str, cfg, sizes: tuple[str, ...]) -> None:
    """The size fields of a target or drafter config: positive, heads grouping, RoPE halves."""
    for name in sizes:
        if getattr(cfg, name) < 1:
            raise ValueError(f"{who} {name} must be >= 1, got {getattr(cfg, name)}")
    if cfg.num_heads % cfg.num_kv_heads:
        raise ValueError(
            f"{who} num_attention_heads ({cfg.num_heads}) must be a multiple of "
            f"num_key_value_heads ({cfg.num_kv_heads})"
        )
    if cfg.head_dim % 2:
        raise ValueError(f"{who} head_dim must be even for RoPE, got {cfg.head_dim}")


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., dim]
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


class MLP(nn.Module):
    """SwiGLU: `down(silu(gate(x)) * up(x))`."""

    def __init__(self, hidden: int, intermediate: int, bias: bool = False):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=bias)
        self.up_proj = nn.Linear(hidden, intermediate, bias=bias)
        self.down_proj = nn.Linear(intermediate, hidden, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [N, hidden]
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(
    x: torch.Tensor,  # [N, heads, D]
    cos: torch.Tensor,  # [N, D] float32
    sin: torch.Tensor,  # [N, D] float32
) -> torch.Tensor:  # [N, heads, D]
    cos = cos.to(x.dtype).unsqueeze(1)
    sin = sin.to(x.dtype).unsqueeze(1)
    return x * cos + rotate_half(x) * sin


class Attention(nn.Module):
    """Projections (+ Qwen3 q/k norm) and a per-slot KV cache `[slots + 1, T, KV, D]`."""

    def __init__(
        self, hidden: int, heads: int, kv_heads: int, head_dim: int, eps: float, qk_norm: bool,
        bias: bool, slots: int, max_seq_len: int, dtype: torch.dtype,
    ):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.q_proj = nn.Linear(hidden, heads * head_dim, bias=bias)
        self.k_proj = nn.Linear(hidden, kv_heads * head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden, kv_heads * head_dim, bias=bias)
        self.o_proj = nn.Linear(heads * head_dim, hidden, bias=bias)
        if qk_norm:
            self.q_norm = RMSNorm(head_dim, eps)
            self.k_norm = RMSNorm(head_dim, eps)
        else:
            self.q_norm = self.k_norm = None
        cache = (slots + 1, max_seq_len, kv_heads, head_dim)  # + the scratch slot
        self.register_buffer("k_cache", torch.zeros(cache, dtype=dtype), persistent=False)
        self.register_buffer("v_cache", torch.zeros(cache, dtype=dtype), persistent=False)

    def query(self, x, cos, sin):  # x [N, hidden], cos/sin [N, D] -> [N, H, D]
        q = self.q_proj(x).view(x.shape[0], self.heads, self.head_dim)
        if self.q_norm is not None:
            q = self.q_norm(q)
        return apply_rope(q, cos, sin)

    def key_value(self, x, cos, sin):  # x [N, hidden] -> k, v [N, KV, D] (k normed, rotated)
        k = self.k_proj(x).view(x.shape[0], self.kv_heads, self.head_dim)
        v = self.v_proj(x).view(x.shape[0], self.kv_heads, self.head_dim)
        if self.k_norm is not None:
            k = self.k_norm(k)
        return apply_rope(k, cos, sin), v

    def store(
        self,
        slot: torch.Tensor,  # [N] int64 in [0, slots] (slots = scratch)
        position: torch.Tensor,  # [N] int64 in [0, T)
        k: torch.Tensor,  # [N, KV, D]
        v: torch.Tensor,  # [N, KV, D]
    ) -> None:
        self.k_cache.index_put_((slot, position), k)
        self.v_cache.index_put_((slot, position), v)


def attend(
    q: torch.Tensor,  # [B, L, H, D]
    k: torch.Tensor,  # [B, S, KV, D]
    v: torch.Tensor,  # [B, S, KV, D]
    allowed: torch.Tensor,  # [B, L, S] bool
) -> torch.Tensor:  # [B, L, H * D]
    """Masked multi-head attention, GQA without repeating K/V: query head h reads KV head
    h // G (HF `repeat_kv` order), so the G query heads of a KV head become G x L rows of
    one SDPA head. Same dot products and softmax rows as repeating K/V, G times less memory."""
    b, length, heads, dim = q.shape
    kv = k.shape[2]
    groups = heads // kv
    q = _flat(q.view(b, length, kv, groups, dim).permute(0, 2, 3, 1, 4), (b, kv, groups * length, dim))
    mask = allowed.unsqueeze(1).expand(b, groups, length, allowed.shape[-1]).reshape(b, 1, groups * length, -1)
    out = F.scaled_dot_product_attention(q, k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask)
    out = _flat(out, (b, kv, groups, length, dim)).permute(0, 3, 1, 2, 4)  # [B, L, KV, G, D]
    return _flat(out, (b, length, heads * dim))


class CachedAttention(nn.Module):
    """Each row's attention over cells [lo, hi) of its own slot of a layer's KV cache; a row
    with an empty interval gets zeros. Here (eager, CPU programs) every group of `group`
    consecutive rows gathers its slot's whole cache once and masks it: the target's rows
    are groups of one (any slot each), the drafter's a block of one owner's rows (`group`
    = block_size, one slot per group). A CUDA export with `lowering.fused_attention` swaps
    this module for `dflash::cached_attention`, which reads only the intervals
    (lowering/fuse_verify.py). While exporting it marks its inputs and its result
    (export/boundary.py), as the heads do."""

    def __init__(self, group: int = 1):
        super().__init__()
        self.group = group

    def forward(
        self,
        q: torch.Tensor,  # [R, H, D]
        k_cache: torch.Tensor,  # [S, T, KV, D]
        v_cache: torch.Tensor,  # [S, T, KV, D]
        slot: torch.Tensor,  # [R] int64 (one slot per group of rows)
        lo: torch.Tensor,  # [R] int64
        hi: torch.Tensor,  # [R] int64
    ) -> torch.Tensor:  # [R, H * D]
        q, k_cache, v_cache, slot, lo, hi = mark("cached_attention", "inputs", q, k_cache, v_cache, slot, lo, hi)
        rows, heads, dim = q.shape
        g = self.group
        cells = torch.arange(k_cache.shape[1], dtype=torch.int64, device=q.device)
        allowed = (cells[None, :] >= lo[:, None]) & (cells[None, :] < hi[:, None])  # [R, T]
        first = slot.view(rows // g, g)[:, 0]  # the slot of each group
        out = attend(q.view(rows // g, g, heads, dim), k_cache[first], v_cache[first],
                     allowed.view(rows // g, g, -1)).view(rows, heads * dim)
        (out,) = mark("cached_attention", "outputs", torch.where(allowed.any(dim=-1, keepdim=True), out, 0.0))
        return out


class GreedyRows(nn.Module):
    """Each row's greedy token: `sampling.greedy` of the sanitized row (the lowest index of
    the maximum, NaN as -inf, +inf as FLT_MAX; -1 for a row with no finite logit). The
    drafter's drafts are this over rows x vocab logits. A CUDA export with
    `lowering.fused_verify` swaps this module for `dflash::greedy_rows`, one pass over each
    row (lowering/fuse_verify.py); here, and in CPU programs, the plain reduction. While
    exporting it marks its input and its result (export/boundary.py), as the heads do."""

    def forward(self, logits: torch.Tensor) -> torch.Tensor:  # [N, V] -> [N] int64
        (logits,) = mark("greedy_rows", "inputs", logits)
        (token,) = mark("greedy_rows", "outputs", sampling.greedy(sampling.sanitize(logits)))
        return token


def _flat(x: torch.Tensor, shape: tuple) -> torch.Tensor:
    """`x.reshape(shape)` through an explicit contiguous copy. A traced reshape becomes a
    view or a copy by the strides seen at export time, and SDPA's output strides there
    (its fused kernel's) differ from those of its decomposition in the edge lowering."""
    return x.clone(memory_format=torch.contiguous_format).view(shape)


def init_normal(module: nn.Module, g: torch.Generator, gain: float, norm_jitter: float = 0.1) -> None:
    """Deterministic random init: matrices N(0, gain^2 / fan_in); norm weights 1 + jitter
    (not all ones, so a checkpoint that swaps two norms cannot load unnoticed); biases small."""
    for name, p in sorted(module.named_parameters()):
        with torch.no_grad():
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=g) * gain / math.sqrt(p.shape[1]))
            elif name.endswith("norm.weight"):
                p.copy_(1.0 + norm_jitter * torch.randn(p.shape, generator=g))
            else:  # biases
                p.copy_(0.02 * torch.randn(p.shape, generator=g))


def cast_parameters(module: nn.Module, dtype: torch.dtype) -> None:
    """Parameters to `dtype`, frozen; buffers (caches are made in the model dtype, RoPE
    tables stay float32) are left alone. Frozen because export would otherwise trace the
    heads' `scan` for autograd (its closure reads values computed from the weights)."""
    for p in module.parameters():
        p.data = p.data.to(dtype)
        p.requires_grad_(False)
