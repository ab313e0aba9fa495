"""The Qwen3.5 hybrid target (export/models/qwen3_5.py) against transformers' own
`qwen3_5` text model on random checkpoints it makes at test time, and its deferred
verify state: committing the accepted rows gives target-only decoding's state."""

import pytest
import torch
from hf_reference import transformers

from dflash_et.export.models import qwen3_5

pytestmark = pytest.mark.quick  # scripts/test.sh --quick

VOCAB = 101


def hf_model(seed: int, tie: bool = False):
    tf = transformers()
    cfg = tf.Qwen3_5TextConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=8, linear_value_head_dim=8, linear_conv_kernel_dim=4, tie_word_embeddings=tie,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
    )
    torch.manual_seed(seed)
    model = tf.Qwen3_5ForCausalLM(cfg).eval()
    with torch.no_grad():  # transformers starts the norms at 0 / 1 and A_log at fixed values: perturb them all
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model, cfg


def ours(model, cfg, slots: int = 3, max_seq_len: int = 64) -> qwen3_5.HybridTarget:
    mine = qwen3_5.HybridTarget(qwen3_5.HybridConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_layers=cfg.num_hidden_layers, num_heads=cfg.num_attention_heads, num_kv_heads=cfg.num_key_value_heads,
        head_dim=cfg.head_dim, layer_types=tuple(cfg.layer_types), linear_num_key_heads=cfg.linear_num_key_heads,
        linear_num_value_heads=cfg.linear_num_value_heads, linear_key_head_dim=cfg.linear_key_head_dim,
        linear_value_head_dim=cfg.linear_value_head_dim, linear_conv_kernel_dim=cfg.linear_conv_kernel_dim,
        rms_norm_eps=cfg.rms_norm_eps, rope_theta=cfg.rope_parameters["rope_theta"],
        partial_rotary_factor=cfg.rope_parameters["partial_rotary_factor"], tie_embeddings=cfg.tie_word_embeddings,
    ), slots, max_seq_len)
    state = {k: v for k, v in model.state_dict().items() if not (cfg.tie_word_embeddings and k == "lm_head.weight")}
    mine.load_state_dict(state, strict=True)
    return mine


def hf_greedy(model, prompt: list[int], new: int) -> list[int]:
    out = model.generate(torch.tensor([prompt]), max_new_tokens=new, do_sample=False, min_new_tokens=new,
                         pad_token_id=0, eos_token_id=None)
    return out[0, len(prompt):].tolist()


@torch.no_grad()
def decode(mine, prompts: dict[int, list[int]], new: int) -> dict[int, list[int]]:
    """Target-only greedy decoding of every slot's prompt, all slots packed in each call."""
    slots = list(prompts)
    logits = mine(torch.tensor([t for s in slots for t in prompts[s]]), [len(prompts[s]) for s in slots],
                  [0] * len(slots), slots)
    ends = torch.tensor([len(prompts[s]) for s in slots]).cumsum(0) - 1
    tokens = {s: [int(logits[e].argmax())] for s, e in zip(slots, ends)}
    for _ in range(new - 1):
        logits = mine(torch.tensor([tokens[s][-1] for s in slots]), [1] * len(slots),
                      [len(prompts[s]) + len(tokens[s]) - 1 for s in slots], slots)
        for i, s in enumerate(slots):
            tokens[s].append(int(logits[i].argmax()))
    return tokens


@pytest.mark.parametrize("tie", [False, True])
def test_greedy_tokens_equal_transformers_generate(tie):
    model, cfg = hf_model(seed=1, tie=tie)
    assert set(cfg.layer_types) == {"linear_attention", "full_attention"}
    prompts = {0: [5, 17, 3, 99, 42, 8, 1], 2: [7, 7, 60]}  # two owners packed in every call, slot 1 unused
    got = decode(ours(model, cfg), prompts, new=12)
    for slot, prompt in prompts.items():
        assert got[slot] == hf_greedy(model, prompt, 12), slot


@torch.no_grad()
def test_verify_calls_commit_only_the_accepted_rows():
    """Speculative greedy decoding with drafts that are right up to a wrong one: each verify
    call defers its DeltaNet rows and the next commits the accepted ones; the committed
    tokens equal target-only decoding, and a call that kept every row would not."""
    model, cfg = hf_model(seed=2)
    prompt, new, block = [11, 4, 90, 23, 5], 14, 4
    want = decode(ours(model, cfg), {0: prompt}, new)[0]
    mine = ours(model, cfg)
    logits = mine(torch.tensor(prompt), [len(prompt)], [0], [0])
    committed = [int(logits[-1].argmax())]
    accepted_total = 0
    step = 0
    while len(committed) < new:
        right = want[len(committed):len(committed) + block - 1]
        drafts = [(t + 1) % VOCAB if i == step % 3 else t for i, t in enumerate(right)]  # wrong at i = step % 3
        rows = [committed[-1], *drafts]
        logits = mine(torch.tensor(rows), [len(rows)], [len(prompt) + len(committed) - 1], [0], defer=True)
        y = logits.argmax(-1).tolist()
        accepted = 0
        while accepted < len(drafts) and drafts[accepted] == y[accepted]:
            accepted += 1
        mine.commit([0], [accepted + 1])  # the pending token and the accepted drafts
        committed += drafts[:accepted] + [y[accepted]]
        accepted_total += accepted
        step += 1
    assert committed[:new] == want
    assert accepted_total > 0 and step < new  # some steps committed several rows


def test_bad_calls_name_the_value():
    model, cfg = hf_model(seed=3)
    mine = ours(model, cfg, slots=2, max_seq_len=32)
    with pytest.raises(ValueError, match="slot 2 is not in"):
        mine(torch.tensor([1]), [1], [0], [2])
    with pytest.raises(ValueError, match="position 32 is past max_seq_len 32"):
        mine(torch.tensor([1, 2]), [2], [31], [0])
    with pytest.raises(ValueError, match="counts add up to 2 rows, tokens has 3"):
        mine(torch.tensor([1, 2, 3]), [2], [0], [0])
    with pytest.raises(ValueError, match="at most 16 rows can wait"):
        mine(torch.tensor([1] * 17), [17], [0], [0], defer=True)


def _save(model, directory, extra: dict | None = None):
    model.save_pretrained(directory)
    if extra:
        import safetensors.torch as st
        st.save_file({k: v.contiguous() for k, v in extra.items()}, str(directory / "extra.safetensors"))
    return directory


def test_checkpoints_transformers_writes_load_and_decode_alike(tmp_path):
    """The text model's checkpoint, and the multimodal wrapper's (weights under
    model.language_model., a vision tower and an mtp head beside them, left out)."""
    from dflash_et.export.models import checkpoint

    tf = transformers()
    model, cfg = hf_model(seed=4)
    text = _save(model, tmp_path / "text", extra={"mtp.fc.weight": torch.zeros(2, 2)})
    prompt = [3, 14, 15, 92, 65]
    want = hf_greedy(model, prompt, 8)
    loaded = checkpoint.load_hybrid_target(text, slots=2, max_seq_len=32, dtype=torch.float32)
    assert decode(loaded, {1: prompt}, 8)[1] == want

    wrapper = tf.Qwen3_5ForConditionalGeneration(tf.Qwen3_5Config(
        text_config=cfg.to_dict(),
        vision_config=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
                           patch_size=4, temporal_patch_size=2, spatial_merge_size=2, num_position_embeddings=16),
    )).eval()
    wrapper.model.language_model.load_state_dict(model.model.state_dict())
    wrapper.lm_head.load_state_dict(model.lm_head.state_dict())
    multimodal = _save(wrapper, tmp_path / "multimodal")
    loaded = checkpoint.load_hybrid_target(multimodal, slots=2, max_seq_len=32, dtype=torch.float32)
    assert decode(loaded, {0: prompt}, 8)[0] == want


def test_configs_name_what_transformers_would_fill_in(tmp_path):
    import json

    from dflash_et.export.models import checkpoint

    model, _ = hf_model(seed=5)
    directory = _save(model, tmp_path / "m")
    data = json.loads((directory / "config.json").read_text())
    for key in ("head_dim", "num_key_value_heads"):
        broken = {k: v for k, v in data.items() if k != key}
        (directory / "config.json").write_text(json.dumps(broken))
        with pytest.raises(checkpoint.CheckpointError, match=f"has no {key}: transformers' Qwen3_5TextConfig"):
            checkpoint.hybrid_config(directory)
    (directory / "config.json").write_text(json.dumps(data))
    with pytest.raises(checkpoint.CheckpointError, match="Qwen3.5 hybrid targets load only as an eager reference"):
        checkpoint.target_config(directory)  # a program's target: not yet
