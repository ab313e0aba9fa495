"""Seeded random inputs for the heads: the cases `check` and the tests run.

Each case mixes what a runtime can send: greedy and sampling owners, every
top-k / top-p corner of SPEC.md, empty owners, invalid ranges, NaN / -inf /
tied rows, out-of-range drafts, and drafts that equal the target's own tokens
(so acceptance runs long, not only at 0).
"""

import torch

from . import heads

TEMPERATURES = [0.0, 0.0, 0.7, 1.0, 1.3, 1e-3, -1.0, float("nan")]
TOP_PS = [1.0, 1.0, 0.9, 0.5, 0.0, 1e-7, float("nan"), 2.0]
# The ops' inputs in SPEC.md's order (the keys of `verify_case` / `sample_case`);
# dflash_verify_argmax takes the first three of VERIFY_INPUTS.
VERIFY_INPUTS = heads.HEADS["dflash_verify"].input_names
SAMPLE_INPUTS = heads.HEADS["sample_rows"].input_names


def _top_ks(vocab: int) -> list[int]:
    return [0, 0, 1, 5, 40, vocab - 1, vocab, vocab + 3, -1]


def _pick(g: torch.Generator, values: list, n: int, dtype) -> torch.Tensor:
    idx = torch.randint(0, len(values), (n,), generator=g)
    return torch.tensor([values[i] for i in idx.tolist()], dtype=dtype)


def logits(g: torch.Generator, rows: int, vocab: int, dtype: torch.dtype) -> torch.Tensor:
    """[rows, V]: Gaussian logits at random scales, with some degenerate rows."""
    scale = torch.tensor([0.5, 2.0, 6.0])[torch.randint(0, 3, (rows, 1), generator=g)]
    x = torch.randn(rows, vocab, generator=g) * scale
    kind = torch.randint(0, 12, (rows,), generator=g)
    x[kind == 0] = x[kind == 0].round()  # many ties
    x[kind == 1] = float("nan")
    x[kind == 2] = float("-inf")
    x[kind == 3, :: 2] = float("nan")
    x[kind == 4, 0] = float("inf")
    return x.to(dtype)


def owner_params(g: torch.Generator, owners: int, vocab: int, greedy_only: bool = False) -> dict:
    temperature = _pick(g, TEMPERATURES, owners, torch.float32)
    if greedy_only:
        temperature = torch.zeros(owners)
    return {
        "start_position": torch.randint(0, 1 << 40, (owners,), generator=g),
        "temperature": temperature,
        "top_k": _pick(g, _top_ks(vocab), owners, torch.int64),
        "top_p": _pick(g, TOP_PS, owners, torch.float32),
        "seed": torch.randint(-(1 << 62), 1 << 62, (owners,), generator=g),
    }


def verify_case(
    g: torch.Generator, vocab: int, max_rows: int, max_owners: int, dtype: torch.dtype,
    greedy_only: bool = False,
) -> dict:
    """Inputs of dflash_verify (or, with greedy_only, dflash_verify_argmax plus zero params)."""
    num_owners = int(torch.randint(1, min(max_owners, 8) + 1, (1,), generator=g))
    n = torch.randint(0, 7, (num_owners,), generator=g)
    n[torch.rand(num_owners, generator=g) < 0.15] = 0  # padding owners
    while int(n.sum()) > max_rows:
        n[int(torch.argmax(n))] -= 1
    num_rows = min(max(int(n.sum()) + int(torch.randint(0, 3, (1,), generator=g)), 1), max_rows)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(n, 0)])
    if torch.rand(1, generator=g) < 0.2:  # invalid ranges: negative, past R, decreasing
        o = int(torch.randint(0, num_owners + 1, (1,), generator=g))
        offsets[o] = int(torch.randint(-2, num_rows + 3, (1,), generator=g))
    params = owner_params(g, num_owners, vocab, greedy_only)
    x = logits(g, num_rows, vocab, dtype)
    tokens = torch.randint(-2, vocab + 2, (num_rows,), generator=g)
    plant_target_tokens(g, x, tokens, offsets, params, vocab)
    return {"logits": x, "tokens": tokens, "offsets": offsets, **params}


def plant_target_tokens(g, x, tokens, offsets, params, vocab) -> None:
    """Make a random prefix of some owners' drafts equal the target's own tokens. The
    choices come from `g` (a CPU generator); the reference runs where `x` lives (the GPU
    parity suite plants on the GPU: on the CPU the largest case takes minutes)."""
    num_rows = x.shape[0]
    for o in range(offsets.shape[0] - 1):
        a, b = int(offsets[o]), int(offsets[o + 1])
        if not (0 <= a < b <= num_rows) or torch.rand(1, generator=g) < 0.3:
            continue
        keep = int(torch.randint(0, b - a, (1,), generator=g))
        position = params["start_position"][o] + torch.arange(1, keep + 1, device=x.device)
        own = heads.SampleRows()(
            x[a:a + keep], position, params["temperature"][o].expand(keep),
            params["top_k"][o].expand(keep), params["top_p"][o].expand(keep), params["seed"][o].expand(keep),
        )
        tokens[a + 1:a + 1 + keep] = own


def sample_case(g: torch.Generator, vocab: int, max_rows: int, dtype: torch.dtype) -> dict:
    n = int(torch.randint(1, min(max_rows, 24) + 1, (1,), generator=g))
    params = owner_params(g, n, vocab)
    return {
        "logits": logits(g, n, vocab, dtype),
        "position": params["start_position"],
        "temperature": params["temperature"],
        "top_k": params["top_k"],
        "top_p": params["top_p"],
        "seed": params["seed"],
    }
