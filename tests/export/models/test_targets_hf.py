"""The Qwen3 and Llama targets (export/models/llama.py) against transformers itself, the pattern
of issue #27's hybrid tests: random checkpoints transformers writes at test time (Qwen3 with
its q/k norms and an explicit head_dim; Llama with llama3 RoPE scaling and biases; tied and
untied embeddings; GQA), read by `checkpoint.load_target`; greedy tokens of two slots decoded
packed in each call equal transformers' own `generate(do_sample=False)`."""

import pytest
import torch

import hf_reference
from hf_reference import transformers

from dflash_et.export.models import checkpoint

VOCAB = 97


def _model(family: str, tie: bool):
    tf = transformers()
    shape = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, tie_word_embeddings=tie)
    if family == "qwen3":
        cfg = tf.Qwen3Config(**shape, head_dim=16, rope_parameters={"rope_type": "default", "rope_theta": 10_000.0})
        model = tf.Qwen3ForCausalLM(cfg)
    else:
        cfg = tf.LlamaConfig(**shape, head_dim=16, attention_bias=True, mlp_bias=True, rope_parameters={
            "rope_type": "llama3", "rope_theta": 500_000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 16})
        model = tf.LlamaForCausalLM(cfg)
    torch.manual_seed(7)
    with torch.no_grad():  # (norms start at one, biases at zero: perturb every weight)
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model.eval()


@pytest.mark.parametrize("family", ["qwen3", "llama"])
@pytest.mark.parametrize("tie", [False, True])
def test_greedy_tokens_equal_transformers_generate(tmp_path, family, tie):
    model = _model(family, tie)
    model.save_pretrained(tmp_path)
    target = checkpoint.load_target(tmp_path, slots=2, max_seq_len=48, dtype=torch.float32)
    assert target.cfg.family == family and target.cfg.tie_embeddings == tie
    prompts = {0: [5, 17, 42, 8, 91, 3], 1: [60, 2]}
    got = hf_reference.decode(target, prompts, 12)
    for slot, prompt in prompts.items():
        assert got[slot] == hf_reference.greedy(model, prompt, 12), (family, tie, slot)
