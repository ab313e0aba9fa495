"""Embedded models: `tiny` (target) and `tiny-dflash` (drafter), random but deterministic.

Small enough for CI (an export of every method takes about a minute on two
cores), shaped like the real thing: Qwen3-style q/k norm, GQA (4 query heads,
2 KV heads), tied embeddings; a DFlash drafter tapping target layers 1 and 2
with block size 4 and the last vocab id as its mask token. Weights come from
`model.seed` (the drafter from its own stream), so the same config always gives
the same `.pte`.

`qwen3-smoke` / `qwen3-smoke-dflash` have Qwen3-1.7B's shapes (V = 151936, hidden
2048) with 4 target layers and 1 drafter layer: a realistic-size smoke test of the
CUDA export (configs/qwen3-smoke-sampling-cuda.yaml), not for CI.
"""

import torch

from . import layers
from .dflash import Drafter, DrafterConfig
from .llama import Target, TargetConfig

TARGETS = {
    "tiny": TargetConfig(
        family="qwen3", vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=4,
        num_heads=4, num_kv_heads=2, head_dim=16, rms_norm_eps=1e-6, rope=layers.Rope(theta=10_000.0),
        tie_embeddings=True,
    ),
    # Qwen3-1.7B's shapes with 4 of its 28 layers: a realistic-size smoke test of the CUDA
    # export (vocab, hidden and attention as in the real model), random weights.
    "qwen3-smoke": TargetConfig(
        family="qwen3", vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_layers=4,
        num_heads=16, num_kv_heads=8, head_dim=128, rms_norm_eps=1e-6, rope=layers.Rope(theta=1_000_000.0),
        tie_embeddings=True,
    ),
}

DRAFTERS = {
    "tiny-dflash": DrafterConfig(
        hidden_size=64, intermediate_size=128, num_layers=1, num_heads=4, num_kv_heads=2, head_dim=16,
        block_size=4, target_layer_ids=(1, 2), mask_token_id=255, rms_norm_eps=1e-6,
        rope=layers.Rope(theta=10_000.0), vocab_size=256, num_target_layers=4,
    ),
    # A DFlash drafter of the smoke target's width: block 16, one layer, tapping layers 1 and 2.
    "qwen3-smoke-dflash": DrafterConfig(
        hidden_size=2048, intermediate_size=6144, num_layers=1, num_heads=16, num_kv_heads=8, head_dim=128,
        block_size=16, target_layer_ids=(1, 2), mask_token_id=151669, rms_norm_eps=1e-6,
        rope=layers.Rope(theta=1_000_000.0), vocab_size=151936, num_target_layers=4,
    ),
}

# Init scales, chosen so that random weights decode like a language model, not a
# copy machine: with the tied lm_head the embedding std sets the logits' spread
# (about 1.6, so temperature, top-k and top-p all matter), and linear weights of
# gain 2 let the layers, not the token's own embedding, dominate the residual
# stream (with gain 1 decoding falls into repeating one token, which would make
# the token-for-token tests weak).
EMBED_STD = 0.2
WEIGHT_GAIN = 2.0
_DRAFTER_STREAM = 1_000_003  # the drafter's generator seed offset from model.seed


def init_target(model: Target, seed: int, mask_token_id: int | None = None) -> Target:
    """Random weights from `seed`. The mask token's embedding row is 10x smaller, like an
    added special token the target never emits: its tied logit stays near 0, so the
    drafter's mask positions do not just echo the mask token back."""
    g = torch.Generator().manual_seed(seed)
    layers.init_normal(model, g, gain=WEIGHT_GAIN)
    embed = model.model.embed_tokens.weight
    with torch.no_grad():
        embed.copy_(torch.randn(embed.shape, generator=g) * EMBED_STD)
        if mask_token_id is not None:
            embed[mask_token_id] *= 0.1
    return model


def init_drafter(model: Drafter, seed: int) -> Drafter:
    layers.init_normal(model, torch.Generator().manual_seed(seed + _DRAFTER_STREAM), gain=WEIGHT_GAIN)
    return model
