"""Qwen3.5-family hybrid targets (transformers `qwen3_5` text model) over packed owners with
per-slot state (issue #27), checked against transformers itself; the target of portable DFlash
programs (tests/export/test_hybrid_program.py: the exported program commits transformers' tokens).

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
DeltaNet layer the conv state (the last K - 1 conv inputs) and the recurrent state.
Unlike a KV cache, these cannot be cut back: a verify call advances them over every draft
row, and only the accepted prefix may stay. So a verify call (`defer=True`) reads each
slot's state and leaves it as it was, keeping each row's conv input, `a` and `b` (the
slot's pending rows); `accept(slots, counts)`, in the same method once its head has decided,
keeps `accepted + 1` of them (the pending token and the accepted drafts); the next call on
the slot, whichever it is, first commits them (the same conv and recurrence over those rows,
from the saved state), then runs its own rows. The count never leaves the device. An owner
whose rows start at position 0 starts from zero state (a new sequence, maybe in a slot
another owner used). Costs: docs/CONTRACT.md, "Hybrid targets".

The recurrence (`DeltaRows`) is one `scan` over rows in packed order, its carry every slot's
conv window and state: rows padded to `max_rows` and rows of no valid owner sent to the
scratch slot, so shapes are static and the body is traced once (the ExecuTorch emitter plans
carries at their upper bound). Its cost per row copies the carry: fine for portable programs
of small models. A CUDA export swaps each `DeltaRows` for `dflash::delta_rows`
(kernels/delta_rows.py; lowering/fuse_verify.py), as `lowering.fused_attention` does for the
attention: ExecuTorch's CUDA partitioner cannot take a scan.
"""

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch._higher_order_ops.scan import scan

from ..boundary import mark
from . import layers, llama, packing


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


def _delta_step(cfg: HybridConfig, weight: torch.Tensor, a_log: torch.Tensor, dt_bias: torch.Tensor):
    """One row of one slot, `scan`'s body: (conv windows [S+1, K-1, C], states [S+1, Hv, dk, dv])
    and (slot [1], conv input [C], a [Hv], b [Hv]) -> new carry, core output [Hv, dv] float32."""
    hk, hv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
    dk, dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
    key_dim = hk * dk

    def step(carry, row):
        windows, states = carry
        slot, mixed, a, b = row
        full = torch.cat([windows.index_select(0, slot)[0], mixed.unsqueeze(0)], dim=0)  # [K, C]
        conv = F.silu((full.to(weight.dtype) * weight.t()).sum(dim=0)).to(mixed.dtype)  # [C]
        q, key, v = torch.split(conv, [key_dim, key_dim, cfg.value_dim])
        q = q.reshape(hk, dk).repeat_interleave(hv // hk, dim=0).float()
        key = key.reshape(hk, dk).repeat_interleave(hv // hk, dim=0).float()
        q, key = _l2norm(q) / math.sqrt(dk), _l2norm(key)
        beta = b.sigmoid().float()  # (in the model dtype first, as transformers does)
        g = -a_log.float().exp() * F.softplus(a.float() + dt_bias)
        state = states.index_select(0, slot)[0] * g.exp()[:, None, None]
        delta = (v.reshape(hv, dv).float() - (state * key.unsqueeze(-1)).sum(dim=-2)) * beta.unsqueeze(-1)
        state = state + key.unsqueeze(-1) * delta.unsqueeze(-2)
        out = (state * q.unsqueeze(-1)).sum(dim=-2)
        return (windows.index_copy(0, slot, full[1:].unsqueeze(0)),
                states.index_copy(0, slot, state.unsqueeze(0))), out

    return step


class DeltaRows(nn.Module):
    """The Gated DeltaNet recurrence over rows in packed order, each row advancing its slot:
    (slot [N], conv input [N, C], a [N, Hv], b [N, Hv], conv weight [C, K], A_log [Hv],
    dt_bias [Hv], conv windows [S+1, K-1, C], states [S+1, Hv, dk, dv] float32) -> (windows,
    states after the rows, core outputs [N, Hv, dv] float32); the inputs stay as they were.
    Here one `scan` of `_delta_step`; a CUDA export swaps it for `dflash::delta_rows`
    (kernels/delta_rows.py). While exporting it marks its inputs and results
    (export/boundary.py), as the heads do."""

    def __init__(self, cfg: HybridConfig):
        super().__init__()
        self.cfg = cfg

    def forward(self, slot, mixed, a, b, weight, a_log, dt_bias, windows, states):
        slot, mixed, a, b, weight, a_log, dt_bias, windows, states = mark(
            "delta_rows", "inputs", slot, mixed, a, b, weight, a_log, dt_bias, windows, states)
        step = _delta_step(self.cfg, weight, a_log, dt_bias)
        (windows, states), core = scan(step, (windows.clone(), states.clone()), (slot.unsqueeze(-1), mixed, a, b))
        return mark("delta_rows", "outputs", windows, states, core)


class GatedDeltaNet(nn.Module):
    """The linear-attention layer. Its recurrence (`DeltaRows`: the commit's, the call's own)
    runs over rows in packed order, padded to `max_rows` (static shapes), the scratch slot
    taking padded and invalid rows."""

    def __init__(self, cfg: HybridConfig, slots: int, max_rows: int, pending_rows: int, dtype: torch.dtype):
        super().__init__()
        self.cfg, self.max_rows = cfg, max_rows
        hv, dk, dv = cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim
        self.rows = DeltaRows(cfg)  # (two regions: a fused region is one call of its module)
        self.commit_rows = DeltaRows(cfg)
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
        # a deferred call's rows, per slot: the conv input, a and b of each (the next call replays the committed ones)
        self.register_buffer("pending_qkv", torch.zeros(slots + 1, pending_rows, cfg.conv_dim, dtype=dtype),
                             persistent=False)
        self.register_buffer("pending_ab", torch.zeros(slots + 1, pending_rows, 2, hv, dtype=dtype), persistent=False)
        # how many of them are still to commit: set by a deferred call, cut by accept, spent by the commit,
        # 0 after any other call
        self.register_buffer("pending_count", torch.zeros(slots + 1, dtype=torch.int64), persistent=False)

    def _scan(self, rows, slot, mixed, a, b, carry):
        """`rows` (a `DeltaRows`) over rows [N] in order from `carry` (windows, states) -> (carry
        after them, core outputs [N, Hv, dv])."""
        windows, states, core = rows(slot, mixed, a, b, self.conv1d.weight.squeeze(1), self.A_log, self.dt_bias,
                                     *carry)
        return (windows, states), core

    def reset(self, owner_slot: torch.Tensor, fresh: torch.Tensor) -> None:
        """The slots of owners that start a sequence (`fresh`) back to zero state, nothing pending."""
        slot = torch.where(fresh, owner_slot, self.conv_state.shape[0] - 1)  # others: the scratch slot
        self.conv_state.index_put_((slot,), torch.zeros_like(self.conv_state.index_select(0, slot)))
        self.recurrent_state.index_put_((slot,), torch.zeros_like(self.recurrent_state.index_select(0, slot)))
        self.pending_count.index_put_((slot,), torch.zeros_like(slot))

    def accept(self, owner_slot: torch.Tensor, counts: torch.Tensor) -> None:
        """After a deferred call: each owner's slot keeps the first `counts[o]` of the rows it
        kept (at most those), for the next call to commit."""
        keep = torch.minimum(torch.clamp(counts, min=0), self.pending_count[owner_slot])
        self.pending_count.index_put_((owner_slot,), keep)

    def commit(self, owner_slot: torch.Tensor) -> None:
        """Each owner's slot advances over the rows its last deferred call kept and `accept`
        left (none after any other call); then they are spent."""
        pending = self.pending_qkv.shape[1]
        scratch = self.conv_state.shape[0] - 1
        j = torch.arange(pending, device=owner_slot.device)
        live = j[None, :] < self.pending_count[owner_slot][:, None]  # [O, P]
        slot = torch.where(live, owner_slot[:, None], scratch).reshape(-1)
        src = owner_slot[:, None].expand(-1, pending).reshape(-1)  # each owner's pending rows, in order
        at = j.repeat(owner_slot.shape[0])
        ab = self.pending_ab[src, at]
        carry, _ = self._scan(self.commit_rows, slot, self.pending_qkv[src, at], ab[:, 0], ab[:, 1],
                              (self.conv_state, self.recurrent_state))
        self.conv_state.copy_(carry[0])
        self.recurrent_state.copy_(carry[1])
        self.pending_count.index_put_((owner_slot,), torch.zeros_like(owner_slot))

    def forward(self, x: torch.Tensor, slot: torch.Tensor, row_in_owner: torch.Tensor, owner_slot: torch.Tensor,
                owner_rows: torch.Tensor, defer: bool) -> torch.Tensor:
        """x [R, hidden]; slot [R]: each row's slot (the scratch slot for rows of no valid
        owner); row_in_owner [R]: its index among its owner's rows of this call; owner_slot,
        owner_rows [O]: each owner's slot (or the scratch slot) and rows in this call."""
        cfg = self.cfg
        rows = x.shape[0]
        if rows > self.max_rows:
            raise ValueError(f"{rows} rows in one call: this target takes at most max_rows = {self.max_rows}")
        mixed, z = self.in_proj_qkv(x), self.in_proj_z(x)
        a, b = self.in_proj_a(x), self.in_proj_b(x)
        scratch = self.conv_state.shape[0] - 1
        pad = self.max_rows - rows  # (static scan length: the ExecuTorch emitter plans carries and outputs at it)
        carry, core = self._scan(self.rows, F.pad(slot, (0, pad), value=scratch), F.pad(mixed, (0, 0, 0, pad)),
                                 F.pad(a, (0, 0, 0, pad)), F.pad(b, (0, 0, 0, pad)),
                                 (self.conv_state, self.recurrent_state))
        if defer:
            pending = self.pending_qkv.shape[1]
            keep = torch.where(row_in_owner < pending, slot, scratch)
            at = torch.clamp(row_in_owner, 0, pending - 1)
            self.pending_qkv.index_put_((keep, at), mixed)
            self.pending_ab.index_put_((keep, at), torch.stack([a, b], dim=1))
            self.pending_count.index_put_((owner_slot,), torch.clamp(owner_rows, 0, pending))
        else:
            self.conv_state.copy_(carry[0])
            self.recurrent_state.copy_(carry[1])
            self.pending_count.index_put_((owner_slot,), torch.zeros_like(owner_slot))
        core = core[:rows].to(x.dtype)
        z = z.view(rows, cfg.linear_num_value_heads, cfg.linear_value_head_dim)
        return self.out_proj(self.norm(core, z).reshape(rows, cfg.value_dim))


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

    def forward(self, x: torch.Tensor, cos, sin, place: packing.Placement) -> torch.Tensor:
        cfg = self.cfg
        n, heads, d = x.shape[0], cfg.num_heads, cfg.head_dim
        q_gate = self.q_proj(x).view(n, heads, 2 * d)
        q, gate = q_gate[..., :d], q_gate[..., d:]  # (slices: a chunk is split_copy, which the CUDA backend lacks)
        q = self._rope(self.q_norm(q), cos, sin)
        k = self._rope(self.k_norm(self.k_proj(x).view(n, cfg.num_kv_heads, d)), cos, sin)
        self.k_cache.index_put_((place.write_slot, place.write_position), k)
        self.v_cache.index_put_((place.write_slot, place.write_position),
                                self.v_proj(x).view(n, cfg.num_kv_heads, d))
        cells = torch.arange(self.k_cache.shape[1], device=x.device)
        allowed = (cells[None, :] <= place.position[:, None]).unsqueeze(1)  # [n, 1, T]: its slot's cells up to it
        out = layers.attend(q.unsqueeze(1), self.k_cache[place.read_slot], self.v_cache[place.read_slot],
                            allowed)[:, 0]
        return self.o_proj(out * torch.sigmoid(gate.reshape(n, heads * d)))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: HybridConfig, kind: str, slots: int, max_seq_len: int, max_rows: int,
                 pending_rows: int, dtype: torch.dtype):
        super().__init__()
        self.kind = kind
        if kind == "linear_attention":
            self.linear_attn = GatedDeltaNet(cfg, slots, max_rows, pending_rows, dtype)
        else:
            self.self_attn = GatedAttention(cfg, slots, max_seq_len, dtype)
        self.mlp = layers.MLP(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = CenteredRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = CenteredRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class Backbone(nn.Module):
    """transformers' `model.` prefix: embed_tokens, layers, norm."""

    def __init__(self, cfg: HybridConfig, slots: int, max_seq_len: int, max_rows: int, pending_rows: int,
                 dtype: torch.dtype):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, kind, slots, max_seq_len, max_rows, pending_rows, dtype)
                                    for kind in cfg.layer_types)
        self.norm = CenteredRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class HybridTarget(llama.OutputHead, nn.Module):
    """The hybrid target with `slots` slots of `max_seq_len` positions (+ the scratch slot),
    calls of at most `max_rows` rows, and deferred calls of at most `pending_rows` rows per
    owner (a verify call's block)."""

    def __init__(self, cfg: HybridConfig, slots: int, max_seq_len: int, max_rows: int, pending_rows: int = 16,
                 dtype: torch.dtype = torch.float32):
        super().__init__()
        self.cfg, self.slots, self.max_seq_len = cfg, slots, max_seq_len
        self.model = Backbone(cfg, slots, max_seq_len, max_rows, pending_rows, dtype)
        self.lm_head = None if cfg.tie_embeddings else nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        rope = layers.Rope(theta=cfg.rope_theta)
        cos, sin = rope.table(cfg.rotary_dim, max_seq_len)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        layers.cast_parameters(self, dtype)

    def forward(
        self,
        tokens: torch.Tensor,  # [R] int64
        offsets: torch.Tensor,  # [O+1] int64
        start_position: torch.Tensor,  # [O] int64
        slots: torch.Tensor,  # [O] int64
        taps: tuple[int, ...] = (),
        defer: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # last hidden [R, hidden] (pre-norm), taps [R, len(taps) * hidden]
        """Owner o's rows `[offsets[o], offsets[o+1])`, the first at `start_position[o]`, in
        slot `slots[o]`. First each owner's slot commits what its last deferred call kept and
        `accept` left (an owner starting at position 0 starts from zero state instead); then
        the rows run. `defer`: the linear layers' states stay as they are and this call's
        rows wait for `accept` and the next call (a verify call); else they advance (prefill,
        decode). Taps as `llama.Target`'s: the raw output of each layer in `taps`,
        final-normed for the last layer (the drafter's context, z-lab's convention)."""
        start, count = packing.offsets_to_ranges(offsets)
        place = packing.place_rows(tokens.shape[0], start, count, start_position, slots, self.slots,
                                   self.max_seq_len)
        owner_slot = packing.slot_or_scratch(slots, self.slots)
        fresh = (start_position == 0) & (count > 0)
        row_in_owner = torch.arange(tokens.shape[0], device=tokens.device) - start[place.owner]
        x = self.model.embed_tokens(torch.clamp(tokens, 0, self.cfg.vocab_size - 1))
        cos, sin = self.rope_cos[place.rope_position], self.rope_sin[place.rope_position]
        tapped = {}
        for i, layer in enumerate(self.model.layers):
            h = layer.input_layernorm(x)
            if layer.kind == "linear_attention":
                layer.linear_attn.reset(owner_slot, fresh)
                layer.linear_attn.commit(owner_slot)
                x = x + layer.linear_attn(h, place.write_slot, row_in_owner, owner_slot, count, defer)
            else:
                x = x + layer.self_attn(h, cos, sin, place)
            x = x + layer.mlp(layer.post_attention_layernorm(x))
            if i in taps:
                tapped[i] = llama.tap(x, i, self.cfg.num_layers, self.model.norm)
        return x, torch.cat([tapped[i] for i in taps], dim=-1) if taps else x[:, :0]

    def accept(self, slots: torch.Tensor, counts: torch.Tensor) -> None:  # [O], [O] int64
        """After a deferred (verify) call: owner o's slot keeps the first `counts[o]` rows of
        that call (`accepted + 1`: the pending token and the accepted drafts; clamped to the
        rows it kept) for its next call to commit. Other rows are dropped."""
        owner_slot = packing.slot_or_scratch(slots, self.slots)
        for layer in self.model.layers:
            if layer.kind == "linear_attention":
                layer.linear_attn.accept(owner_slot, counts)
