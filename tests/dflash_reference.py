"""A straightforward per-owner reference of the target and the DFlash drafter, in float64.

One owner at a time, no caches, no packing, no slots: the target is a causal LM
over the owner's whole sequence (HF `modeling_qwen3` / `modeling_llama` math),
the drafter is z-lab's `DFlashDraftModel.forward` over all context features of
positions < P plus the block at P .. P + block_size - 1 (no mask, or for sliding-window
and causal layers the mask of z-lab's dflash/model.py at 07ebd93, `zlab_visible`). Weights are
read from the models' state dicts by their HF / z-lab names, so this also
checks that the modules use each tensor where the checkpoint convention says.
"""

import math

import torch


def _w(state, name):
    return state[name].double()


def rms(x, weight, eps):
    return weight * (x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps))


def rope(x, positions, inv_freq):  # x [n, heads, D]
    angle = positions.double()[:, None] * inv_freq.double()[None, :]
    emb = torch.cat([angle, angle], dim=-1)
    cos, sin = emb.cos()[:, None, :], emb.sin()[:, None, :]
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def _linear(state, name, x, bias=False):
    y = x @ _w(state, f"{name}.weight").T
    if bias and f"{name}.bias" in state:
        y = y + _w(state, f"{name}.bias")
    return y


def attention(q, k, v, allowed):  # q [n, H, D], k/v [m, KV, D], allowed [n, m]
    heads, kv = q.shape[1], k.shape[1]
    k = k.repeat_interleave(heads // kv, dim=1)
    v = v.repeat_interleave(heads // kv, dim=1)
    scores = torch.einsum("nhd,mhd->hnm", q, k) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~allowed[None], float("-inf"))
    return torch.einsum("hnm,mhd->nhd", scores.softmax(-1), v).reshape(q.shape[0], -1)


def mlp(state, prefix, x, bias=False):
    gate = _linear(state, f"{prefix}.gate_proj", x, bias)
    up = _linear(state, f"{prefix}.up_proj", x, bias)
    return _linear(state, f"{prefix}.down_proj", torch.nn.functional.silu(gate) * up, bias)


def target_forward(model, tokens: list[int]):
    """-> logits [n, V], layer outputs [L] x [n, H] (HF hidden_states[1:], last one normed)."""
    cfg, state = model.cfg, {k: v for k, v in model.state_dict().items()}
    n = len(tokens)
    positions = torch.arange(n)
    inv_freq = cfg.rope.inv_freq(cfg.head_dim)
    x = _w(state, "model.embed_tokens.weight")[torch.tensor(tokens)]
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    outputs = []
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}"
        h = rms(x, _w(state, f"{p}.input_layernorm.weight"), cfg.rms_norm_eps)
        q = _linear(state, f"{p}.self_attn.q_proj", h, cfg.attention_bias).view(n, cfg.num_heads, cfg.head_dim)
        k = _linear(state, f"{p}.self_attn.k_proj", h, cfg.attention_bias).view(n, cfg.num_kv_heads, cfg.head_dim)
        v = _linear(state, f"{p}.self_attn.v_proj", h, cfg.attention_bias).view(n, cfg.num_kv_heads, cfg.head_dim)
        if cfg.family == "qwen3":
            q = rms(q, _w(state, f"{p}.self_attn.q_norm.weight"), cfg.rms_norm_eps)
            k = rms(k, _w(state, f"{p}.self_attn.k_norm.weight"), cfg.rms_norm_eps)
        q, k = rope(q, positions, inv_freq), rope(k, positions, inv_freq)
        x = x + _linear(state, f"{p}.self_attn.o_proj", attention(q, k, v, causal), cfg.attention_bias)
        x = x + mlp(state, f"{p}.mlp", rms(x, _w(state, f"{p}.post_attention_layernorm.weight"), cfg.rms_norm_eps),
                    cfg.mlp_bias)
        outputs.append(x)
    final = rms(x, _w(state, "model.norm.weight"), cfg.rms_norm_eps)
    outputs[-1] = final
    head = "model.embed_tokens.weight" if cfg.tie_embeddings else "lm_head.weight"
    return final @ _w(state, head).T, outputs


def taps(outputs, layer_ids) -> torch.Tensor:  # [n, len(taps) * H] (z-lab extract_context_feature)
    return torch.cat([outputs[i] for i in layer_ids], dim=-1)


def zlab_visible(cfg, layer: int, q_pos, kv_pos) -> torch.Tensor:  # [q, kv] bool
    """z-lab 07ebd93: `is_causal` unset makes sliding layers causal; the window counts from
    the query's absolute position."""
    layer_type = cfg.layer_types[layer] if cfg.layer_types is not None else "full_attention"
    causal = layer_type == "sliding_attention" if cfg.is_causal is None else bool(cfg.is_causal)
    window = cfg.sliding_window if layer_type == "sliding_attention" else None
    query, key = q_pos[:, None], kv_pos[None, :]
    visible = torch.ones(len(q_pos), len(kv_pos), dtype=torch.bool)
    if causal:
        visible &= key <= query
    if window is not None:
        visible &= query - key < window
        if not causal:
            visible &= key - query < window
    return visible


def drafter_logits(drafter, target, context: torch.Tensor, pending: int, start: int) -> torch.Tensor:
    """z-lab DFlash forward: context features of positions 0..start-1 ([start, F]), the block
    [pending, mask...] at start..start+bs-1 -> logits [bs - 1, V] for positions start+1.."""
    cfg, state = drafter.cfg, drafter.state_dict()
    tstate, tcfg = target.state_dict(), target.cfg
    bs = cfg.block_size
    inv_freq = cfg.rope.inv_freq(cfg.head_dim)
    ctx = rms(_linear(state, "fc", context.double()), _w(state, "hidden_norm.weight"), cfg.rms_norm_eps)
    block = torch.tensor([pending] + [cfg.mask_token_id] * (bs - 1))
    x = _w(tstate, "model.embed_tokens.weight")[block]
    q_pos = torch.arange(start, start + bs)
    kv_pos = torch.arange(0, start + bs)
    for i in range(cfg.num_layers):
        p = f"layers.{i}"
        h = rms(x, _w(state, f"{p}.input_layernorm.weight"), cfg.rms_norm_eps)
        both = torch.cat([ctx, h], dim=0)
        q = _linear(state, f"{p}.self_attn.q_proj", h).view(bs, cfg.num_heads, cfg.head_dim)
        k = _linear(state, f"{p}.self_attn.k_proj", both).view(-1, cfg.num_kv_heads, cfg.head_dim)
        v = _linear(state, f"{p}.self_attn.v_proj", both).view(-1, cfg.num_kv_heads, cfg.head_dim)
        q = rms(q, _w(state, f"{p}.self_attn.q_norm.weight"), cfg.rms_norm_eps)
        k = rms(k, _w(state, f"{p}.self_attn.k_norm.weight"), cfg.rms_norm_eps)
        q, k = rope(q, q_pos, inv_freq), rope(k, kv_pos, inv_freq)
        x = x + _linear(state, f"{p}.self_attn.o_proj", attention(q, k, v, zlab_visible(cfg, i, q_pos, kv_pos)))
        x = x + mlp(state, f"{p}.mlp", rms(x, _w(state, f"{p}.post_attention_layernorm.weight"), cfg.rms_norm_eps))
    out = rms(x, _w(state, "norm.weight"), cfg.rms_norm_eps)
    head = "model.embed_tokens.weight" if tcfg.tie_embeddings else "lm_head.weight"
    return out[1:] @ _w(tstate, head).T
