"""A DFlash drafter distilled on its target's own greedy text, so that drafts get accepted.

A random drafter almost never guesses the target's next token, so a loop over it commits
one token per step and never shows (or exercises) the multi-row commits of
`target_verify` / `draft_forward`. `distill` trains the drafter on the target's greedy
continuations of given prompts; `dflash-et distill` writes the result as a z-lab
checkpoint, which any config can name as its `model.drafter`.

What it learns on the embedded random `tiny` target: the continuations it was trained on,
drafted almost perfectly, and little else; on new prompts its drafts are hardly better
than a random drafter's (benchmarks/HISTORY.md, "A distilled drafter"). A random target's
text has no structure a small drafter can pick up in minutes; a real LLM's has. So the
prompts to distil on are the prompts the loop will run.

The recipe, deterministic from `Recipe.seed`:
1. the target decodes `new_tokens` greedily (SPEC.md's argmax) after each prompt, which
   also gives its hidden taps of every position;
2. each optimiser step: every text's taps go into its drafter slot through
   `Drafter.store_context` (what `draft_prefill` / `draft_forward` do), and `anchors`
   block positions P per text run through `Drafter.block` with the block
   `[token at P, mask, ...]`; the loss is the cross-entropy of the block's logits (the
   target's frozen lm_head) against the tokens at P + 1 .. P + block_size - 1;
3. Adam on the drafter's own weights only (the embedding and lm_head are the target's).

Training runs the production drafter modules, not a copy, so what is learned is what the
exported `draft_forward` computes. It runs in float64 on the CPU.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .. import sampling
from ..config import ConfigError
from . import packing
from .dflash import Drafter
from .llama import Target


@dataclass(frozen=True)
class Recipe:
    steps: int = 300
    new_tokens: int = 64
    anchors: int = 16  # block positions per text and step
    lr: float = 3e-3
    seed: int = 0

    def __post_init__(self):
        for name in ("steps", "new_tokens", "anchors"):
            if getattr(self, name) < 1:
                raise ConfigError(f"distill recipe: {name} must be at least 1, not {getattr(self, name)}")
        if not self.lr > 0:
            raise ConfigError(f"distill recipe: lr must be positive, not {self.lr}")


def greedy_text(target: Target, prompts: list[list[int]], new_tokens: int,
                taps: tuple[int, ...]) -> tuple[list[list[int]], list[torch.Tensor]]:
    """Each prompt and its greedy continuation of `new_tokens` tokens (one KV slot each:
    `target` has at least len(prompts) slots of the longest text's positions), and the taps
    of every position but the last, [len(text) - 1, F] per text."""
    count = len(prompts)
    slots = torch.arange(count, dtype=torch.int64)
    lengths = torch.tensor([len(p) for p in prompts], dtype=torch.int64)
    rows = torch.tensor([t for p in prompts for t in p], dtype=torch.int64)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(lengths, 0)])
    position = torch.zeros(count, dtype=torch.int64)
    texts, tapped = [list(p) for p in prompts], [[] for _ in prompts]
    for _ in range(new_tokens):
        h, hidden = target(rows, offsets, position, slots, taps)
        last = offsets[1:] - 1
        token = sampling.greedy(sampling.sanitize(target.logits(h[last])))
        for i in range(count):
            tapped[i].append(hidden[offsets[i]:offsets[i + 1]])
            texts[i].append(int(token[i]))
        position = position + offsets[1:] - offsets[:-1]
        rows, offsets = token, torch.arange(count + 1, dtype=torch.int64)
    return texts, [torch.cat(t) for t in tapped]


def distill(target: Target, drafter: Drafter, prompts: list[list[int]], recipe: Recipe = Recipe(),
            say=lambda text: None) -> dict[str, torch.Tensor]:
    """Trained weights for `drafter` (a state dict in its dtype) from the target's greedy
    continuations of `prompts`; neither model changes. Says the loss and how often the
    whole block of drafts is right, every 50 steps."""
    cfg, block = drafter.cfg, drafter.cfg.block_size
    if not prompts or any(not p for p in prompts):
        raise ConfigError("distill: give at least one prompt, each of at least one token")
    bad = sorted({t for p in prompts for t in p if not 0 <= t < target.cfg.vocab_size})
    if bad:
        raise ConfigError(f"distill: prompt tokens {bad[:5]} are outside the target's vocab [0, {target.cfg.vocab_size})")
    if recipe.new_tokens < block:
        raise ConfigError(f"distill recipe: new_tokens ({recipe.new_tokens}) must be at least block_size ({block})")
    taps = tuple(cfg.target_layer_ids)
    length = max(len(p) for p in prompts) + recipe.new_tokens
    count = len(prompts)

    teacher = Target(target.cfg, count, length, torch.float64)
    teacher.load_state_dict(_float64(target.state_dict()))
    student = Drafter(cfg, count, length, torch.float64)
    student.load_state_dict(_float64(drafter.state_dict()))
    student.requires_grad_(True)  # (the models are built frozen, for export)
    with torch.no_grad():
        texts, hidden = greedy_text(teacher.eval(), prompts, recipe.new_tokens, taps)
    embed, output = teacher.model.embed_tokens, teacher.output_weight.detach()

    # Every text's taps into its slot (positions 0 ..), once per step.
    slots = torch.arange(count, dtype=torch.int64)
    sizes = torch.tensor([h.shape[0] for h in hidden], dtype=torch.int64)
    starts = torch.cumsum(sizes, 0) - sizes
    hidden = torch.cat(hidden)
    place = packing.place_rows(hidden.shape[0], starts, sizes, torch.zeros_like(slots), slots, count, length)
    # Anchors P: a block whose pending token is generated and whose drafts all exist.
    padded = torch.tensor([t + [0] * (length - len(t)) for t in texts], dtype=torch.int64)
    low = torch.tensor([len(p) for p in prompts], dtype=torch.int64)
    span = torch.tensor([len(t) for t in texts], dtype=torch.int64) - block + 1 - low
    owner = slots.repeat_interleave(recipe.anchors)
    steps = torch.arange(block, dtype=torch.int64)
    caches = [(m, name) for m in student.modules() for name in ("k_cache", "v_cache") if hasattr(m, name)]
    g = torch.Generator().manual_seed(recipe.seed)
    optimiser = torch.optim.Adam(student.parameters(), lr=recipe.lr)
    for step in range(1, recipe.steps + 1):
        for module, name in caches:  # a fresh context cache: no graph reaches across steps
            setattr(module, name, torch.zeros_like(getattr(module, name)))
        student.store_context(hidden, place)
        start = low[owner] + (torch.rand(owner.shape[0], generator=g, dtype=torch.float64) * span[owner]).long()
        seq = padded[owner[:, None], start[:, None] + steps[None, :]]  # [O, block]: token at P, then the targets
        masks = torch.full_like(seq[:, 1:], cfg.mask_token_id)
        states = student.block(embed(torch.cat([seq[:, :1], masks], dim=1)).detach(), start, owner)
        logits = F.linear(states[:, 1:], output)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), seq[:, 1:].reshape(-1))
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        if step % 50 == 0 or step == recipe.steps:
            right = (logits.argmax(-1) == seq[:, 1:]).all(dim=1).double().mean().item()
            say(f"distill step {step}/{recipe.steps}: loss {loss.item():.3f}, every draft of the block right "
                f"in {right:.0%} of blocks")
    dtype = next(drafter.parameters()).dtype
    return {k: v.detach().to(dtype) for k, v in student.state_dict().items()}


def _float64(state: dict) -> dict:
    return {k: v.to(torch.float64) if v.is_floating_point() else v for k, v in state.items()}
