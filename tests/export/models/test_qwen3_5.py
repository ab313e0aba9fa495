"""The Qwen3.5 hybrid target (export/models/qwen3_5.py) against transformers' own
`qwen3_5` text model on random checkpoints it makes at test time, and its deferred
verify state: committing the accepted rows gives target-only decoding's state; a new owner in
a used slot starts from zero state."""

import pytest
import torch

import hf_reference
from hf_reference import transformers

from dflash_et.export.models import qwen3_5

VOCAB = 101


def hf_model(seed: int, tie: bool = False, layers: int = 4):
    return hf_reference.qwen3_5_model(seed, VOCAB, tie, layers)


def ours(model, cfg, slots: int = 3, max_seq_len: int = 64, max_rows: int = 16) -> qwen3_5.HybridTarget:
    mine = qwen3_5.HybridTarget(qwen3_5.HybridConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_layers=cfg.num_hidden_layers, num_heads=cfg.num_attention_heads, num_kv_heads=cfg.num_key_value_heads,
        head_dim=cfg.head_dim, layer_types=tuple(cfg.layer_types), linear_num_key_heads=cfg.linear_num_key_heads,
        linear_num_value_heads=cfg.linear_num_value_heads, linear_key_head_dim=cfg.linear_key_head_dim,
        linear_value_head_dim=cfg.linear_value_head_dim, linear_conv_kernel_dim=cfg.linear_conv_kernel_dim,
        rms_norm_eps=cfg.rms_norm_eps, rope_theta=cfg.rope_parameters["rope_theta"],
        partial_rotary_factor=cfg.rope_parameters["partial_rotary_factor"], tie_embeddings=cfg.tie_word_embeddings,
    ), slots, max_seq_len, max_rows, pending_rows=4)
    state = {k: v for k, v in model.state_dict().items() if not (cfg.tie_word_embeddings and k == "lm_head.weight")}
    mine.load_state_dict(state, strict=True)
    return mine


hf_greedy = hf_reference.greedy


call, decode = hf_reference.call, hf_reference.decode


def accept(mine, counts: dict[int, int]) -> None:
    """After a deferred call: each slot keeps `counts[slot]` of its rows for the next call."""
    mine.accept(torch.tensor(list(counts)), torch.tensor(list(counts.values())))


@pytest.mark.quick  # scripts/test.sh --quick
@pytest.mark.parametrize("tie", [False, True])
def test_greedy_tokens_equal_transformers_generate(tie):
    model, cfg = hf_model(seed=1, tie=tie)
    assert set(cfg.layer_types) == {"linear_attention", "full_attention"}
    prompts = {0: [5, 17, 3, 99, 42, 8, 1], 2: [7, 7, 60]}  # two owners packed in every call, slot 1 unused
    got = decode(ours(model, cfg), prompts, new=12)
    for slot, prompt in prompts.items():
        assert got[slot] == hf_greedy(model, prompt, 12), slot


@pytest.mark.quick
@torch.no_grad()
def test_verify_calls_commit_only_the_accepted_rows():
    """Speculative greedy decoding with drafts that are right up to a wrong one: each verify
    call defers its DeltaNet rows, `accept` keeps the accepted ones and the next call commits
    them; the committed tokens equal target-only decoding, and keeping every row would not."""
    model, cfg = hf_model(seed=2)
    prompt, new, block = [11, 4, 90, 23, 5], 14, 4
    want = decode(ours(model, cfg), {0: prompt}, new)[0]
    mine = ours(model, cfg)
    logits = call(mine, {0: prompt}, {0: 0})
    committed = [int(logits[-1].argmax())]
    accepted_total, step = 0, 0
    while len(committed) < new:
        right = want[len(committed):len(committed) + block - 1]
        drafts = [(t + 1) % VOCAB if i == step % 3 else t for i, t in enumerate(right)]  # wrong at i = step % 3
        rows = [committed[-1], *drafts]
        # this call first commits the last one's accepted rows, then defers its own
        logits = call(mine, {0: rows}, {0: len(prompt) + len(committed) - 1}, defer=True)
        y = logits.argmax(-1).tolist()
        accepted = 0
        while accepted < len(drafts) and drafts[accepted] == y[accepted]:
            accepted += 1
        accept(mine, {0: accepted + 1})  # the pending token and the accepted drafts
        committed += drafts[:accepted] + [y[accepted]]
        accepted_total += accepted
        step += 1
    assert committed[:new] == want
    assert accepted_total > 0 and step < new  # some steps committed several rows


@pytest.mark.quick
@torch.no_grad()
def test_a_commit_takes_only_the_kept_rows_and_only_once():
    """`accept` keeps at most the rows the slot's last deferred call kept; after a prefill it
    keeps none; the next call commits them once, and a stale `accept` after that keeps none."""
    model, cfg = hf_model(seed=8)

    def run(steps):  # calls (rows, start, defer) and accepts (an int) -> the last call's logits
        mine = ours(model, cfg)
        for step in steps:
            if isinstance(step, int):
                accept(mine, {0: step})
            else:
                logits = call(mine, {0: step[0]}, {0: step[1]}, defer=step[2])
        return logits

    prefill, verify = ([5, 6, 7], 0, False), ([8, 9, 10], 3, True)
    after = [11, 12]
    # clamped: 7 of 3 kept rows keeps the 3
    assert torch.equal(run([prefill, verify, 7, (after, 6, False)]), run([prefill, verify, 3, (after, 6, False)]))
    # nothing pending after a prefill
    assert torch.equal(run([prefill, 4, ([8], 3, False)]), run([prefill, ([8], 3, False)]))
    # spent once: a stale accept after the commit keeps nothing
    twice = [prefill, verify, 2, ([11], 5, False), 2, ([12], 6, False)]
    once = [prefill, verify, 2, ([11], 5, False), ([12], 6, False)]
    assert torch.equal(run(twice), run(once))
    # (the rows kept do change the state: the equalities above are not vacuous)
    assert not torch.equal(run([prefill, verify, 2, (after, 5, False)]), run([prefill, verify, 1, (after, 5, False)]))


@pytest.mark.quick
@torch.no_grad()
def test_a_new_owner_in_a_used_slot_starts_from_zero_state():
    """A sequence that starts at position 0 in a slot another owner used, even one that left
    with rows pending, decodes as in a new target."""
    model, cfg = hf_model(seed=10)
    prompt = [9, 8, 7, 6]
    fresh = decode(ours(model, cfg), {1: prompt}, 6)[1]
    mine = ours(model, cfg)
    call(mine, {1: [1, 2, 3, 4, 5]}, {1: 0})
    call(mine, {1: [6, 7, 8]}, {1: 5}, defer=True)
    accept(mine, {1: 2})  # the old owner leaves here, two rows pending
    assert decode(mine, {1: prompt}, 6)[1] == fresh


@pytest.mark.quick
@torch.no_grad()
def test_an_owner_with_a_bad_slot_leaves_the_others_alone():
    """Rows of an owner whose slot is out of range go to the scratch slot: the valid owner
    packed beside it decodes as it does alone."""
    model, cfg = hf_model(seed=3)
    alone = decode(ours(model, cfg), {1: [4, 8, 15]}, 6)[1]
    mine = ours(model, cfg)
    logits = call(mine, {9: [16, 23, 42, 7], 1: [4, 8, 15]}, {9: 0, 1: 0})  # slot 9 of 3: scratch
    token = int(logits[-1].argmax())
    got = [token]
    for i in range(5):
        logits = call(mine, {9: [1, 2], 1: [token]}, {9: 4 + 2 * i, 1: 3 + i}, defer=i % 2 == 1)
        accept(mine, {9: 2, 1: 1})
        token = int(logits[-1].argmax())
        got.append(token)
    assert got == alone


def _save(model, directory, extra: dict | None = None):
    model.save_pretrained(directory)
    if extra:
        import safetensors.torch as st
        st.save_file({k: v.contiguous() for k, v in extra.items()}, str(directory / "extra.safetensors"))
    return directory


@pytest.mark.quick
def test_checkpoints_transformers_writes_load_and_decode_alike(tmp_path):
    """The text model's checkpoint, and the multimodal wrapper's (weights under
    model.language_model., a vision tower and an mtp head beside them, left out)."""
    from dflash_et.export.models import checkpoint

    tf = transformers()
    model, cfg = hf_model(seed=4)
    text = _save(model, tmp_path / "text", extra={"mtp.fc.weight": torch.zeros(2, 2)})
    prompt = [3, 14, 15, 92, 65]
    want = hf_greedy(model, prompt, 8)
    loaded = checkpoint.load_hybrid_target(text, slots=2, max_seq_len=32, max_rows=16, dtype=torch.float32)
    assert decode(loaded, {1: prompt}, 8)[1] == want

    wrapper = tf.Qwen3_5ForConditionalGeneration(tf.Qwen3_5Config(
        text_config=cfg.to_dict(),
        vision_config=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
                           patch_size=4, temporal_patch_size=2, spatial_merge_size=2, num_position_embeddings=16),
    )).eval()
    wrapper.model.language_model.load_state_dict(model.model.state_dict())
    wrapper.lm_head.load_state_dict(model.lm_head.state_dict())
    multimodal = _save(wrapper, tmp_path / "multimodal")
    loaded = checkpoint.load_hybrid_target(multimodal, slots=2, max_seq_len=32, max_rows=16, dtype=torch.float32)
    assert decode(loaded, {0: prompt}, 8)[0] == want


@pytest.mark.parametrize("tie", [False, True])
def test_checkpoints_we_write_are_the_ones_transformers_reads(tmp_path, tie):
    """checkpoint_writer.save_hybrid_target (the GPU tests' hybrid checkpoints: that machine has
    no transformers): transformers loads what it writes into the model it came from (every
    weight, the layer kinds, the same greedy tokens), and our loader reads it back."""
    from dflash_et.export.models import checkpoint, checkpoint_writer

    tf = transformers()
    model, cfg = hf_model(seed=6, tie=tie)
    loaded = checkpoint.load_hybrid_target(_save(model, tmp_path / "hf"), slots=2, max_seq_len=32, max_rows=16,
                                           dtype=torch.float32)
    written = checkpoint_writer.save_hybrid_target(loaded, tmp_path / "ours")
    again = tf.Qwen3_5ForCausalLM.from_pretrained(written).eval()
    assert again.config.layer_types == cfg.layer_types and again.config.tie_word_embeddings == tie
    want, got = model.state_dict(), again.state_dict()
    assert sorted(got) == sorted(want)
    assert all(torch.equal(got[k], want[k]) for k in want)
    prompt = [7, 1, 88, 42]
    assert hf_greedy(again, prompt, 6) == hf_greedy(model, prompt, 6)
    back = checkpoint.load_hybrid_target(written, slots=2, max_seq_len=32, max_rows=16, dtype=torch.float32)
    assert all(torch.equal(a, b) for a, b in zip(back.parameters(), loaded.parameters()))


@pytest.mark.quick
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
    with pytest.raises(checkpoint.CheckpointError, match="a Qwen3.5 hybrid target: read it with hybrid_config"):
        checkpoint.target_config(directory)  # the Llama-family reader names the right one


@pytest.mark.quick
@torch.no_grad()
def test_taps_are_transformers_hidden_states():
    """The drafter's context taps: layer i's raw output (transformers' hidden_states[i + 1]),
    the last layer's after the final norm (as transformers replaces it)."""
    model, cfg = hf_model(seed=7)
    mine = ours(model, cfg)
    prompt = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    want = model(prompt, output_hidden_states=True).hidden_states
    n = prompt.shape[1]
    _, taps = mine(prompt[0], torch.tensor([0, n]), torch.tensor([0]), torch.tensor([0]), taps=(0, 2, 3))
    for k, layer in enumerate((0, 2, 3)):
        got = taps[:, k * cfg.hidden_size:(k + 1) * cfg.hidden_size]
        assert torch.allclose(got, want[layer + 1][0], rtol=1e-4, atol=1e-5), layer



@pytest.mark.quick
def test_a_call_past_max_rows_is_refused_by_name():
    model, cfg = hf_model(seed=9)
    with pytest.raises(ValueError, match="17 rows in one call: this target takes at most max_rows = 16"):
        call(ours(model, cfg, max_rows=16), {0: list(range(17))}, {0: 0})
