"""Small random targets and drafters for the model, checkpoint and program tests
(deterministic from their seeds; `slots` KV slots of `T` positions)."""

from dflash_et.export.models import Drafter, DrafterConfig, Target, TargetConfig, layers, presets

SLOTS, T = 3, 48


def small_target(family="qwen3", tie=False, bias=False, rope=None, seed=0) -> Target:
    cfg = TargetConfig(
        family=family, vocab_size=61, hidden_size=32, intermediate_size=48, num_layers=3, num_heads=4,
        num_kv_heads=2, head_dim=8, rms_norm_eps=1e-5, rope=rope or layers.Rope(theta=500.0),
        tie_embeddings=tie, attention_bias=bias, mlp_bias=bias,
    )
    return presets.init_target(Target(cfg, SLOTS, T), seed)


def small_drafter(block_size=4, taps=(0, 2), seed=1, **attention) -> Drafter:
    """`attention`: layer_types / sliding_window / is_causal of DrafterConfig."""
    cfg = DrafterConfig(
        hidden_size=32, intermediate_size=40, num_layers=2, num_heads=4, num_kv_heads=1, head_dim=8,
        block_size=block_size, target_layer_ids=taps, mask_token_id=60, rope=layers.Rope(theta=700.0),
        **attention,
    )
    return presets.init_drafter(Drafter(cfg, SLOTS, T), seed)
