"""transformers as a test reference (a test dependency, scripts/env.sh; no hub access), and
our targets' side of the comparison: packed calls and greedy decoding (`call`, `decode`).

`python -m pytest` puts the repo root on sys.path, and the root holds a `kernels/` folder
(ours, imported as dflash_et.kernels): transformers asks `import kernels` whether the hub
`kernels` package is installed and would import ours. So transformers is imported with the
root off the path, once."""

import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def transformers():
    if "transformers.activations" not in sys.modules:  # (the module whose import probes for `kernels`)
        saved = sys.path[:]
        sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT]
        try:
            import transformers.activations  # noqa: F401
        finally:
            sys.path[:] = saved
    return sys.modules["transformers"]


def qwen3_5_model(seed: int, vocab: int, tie: bool = False, layers: int = 4):
    """A random transformers Qwen3.5 text model (Gated DeltaNet and gated attention layers:
    every 4th full attention, or alternating for other depths) -> (model, config)."""
    tf = transformers()
    cfg = tf.Qwen3_5TextConfig(
        vocab_size=vocab, hidden_size=64, intermediate_size=96, num_hidden_layers=layers, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=8, linear_value_head_dim=8, linear_conv_kernel_dim=4, tie_word_embeddings=tie,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
        **({} if layers == 4 else {"layer_types": ["linear_attention", "full_attention"] * (layers // 2)}),
    )
    torch.manual_seed(seed)
    model = tf.Qwen3_5ForCausalLM(cfg).eval()
    with torch.no_grad():  # transformers starts the norms at 0 / 1 and A_log at fixed values: perturb them all
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model, cfg


def greedy(model, prompt: list[int], new: int) -> list[int]:
    """transformers' `generate(do_sample=False)`: exactly `new` tokens after `prompt`."""
    out = model.generate(torch.tensor([prompt]), max_new_tokens=new, do_sample=False, min_new_tokens=new,
                         pad_token_id=0, eos_token_id=None)
    return out[0, len(prompt):].tolist()


def call(target, rows: dict[int, list[int]], start: dict[int, int], defer: bool = False) -> torch.Tensor:
    """One packed call of one of our targets (llama.Target or qwen3_5.HybridTarget): each slot's
    rows, from its start position -> logits [R, V]. (One tap: the Llama target needs one.)"""
    slots = list(rows)
    offsets = torch.tensor([0, *[len(rows[s]) for s in slots]]).cumsum(0)
    h, _ = target(torch.tensor([t for s in slots for t in rows[s]]), offsets, torch.tensor([start[s] for s in slots]),
                  torch.tensor(slots), (0,), defer=defer)
    return target.logits(h)


@torch.no_grad()
def decode(target, prompts: dict[int, list[int]], new: int) -> dict[int, list[int]]:
    """Target-only greedy decoding of every slot's prompt, all slots packed in each call."""
    logits = call(target, prompts, {s: 0 for s in prompts})
    ends = torch.tensor([len(p) for p in prompts.values()]).cumsum(0) - 1
    tokens = {s: [int(logits[e].argmax())] for s, e in zip(prompts, ends)}
    for _ in range(new - 1):
        logits = call(target, {s: [tokens[s][-1]] for s in prompts},
                      {s: len(prompts[s]) + len(tokens[s]) - 1 for s in prompts})
        for i, s in enumerate(prompts):
            tokens[s].append(int(logits[i].argmax()))
    return tokens
