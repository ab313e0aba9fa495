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


def _peaked(g, rows, vocab):  # an LLM-like row: a Gaussian body and a few dozen strongly preferred tokens
    d = g.device
    x = torch.randn(rows, vocab, generator=g, device=d) * 2.0
    hot = min(24, vocab)
    boost = 6.0 + 8.0 * torch.rand(rows, hot, generator=g, device=d)
    x.scatter_add_(1, torch.randint(0, vocab, (rows, hot), generator=g, device=d), boost)
    return x


def _power_law(g, rows, vocab):  # log-probability falling with log rank (Zipf, exponent 0.8-1.2)
    d = g.device
    exponent = 0.8 + 0.4 * torch.rand(rows, 1, generator=g, device=d)
    ranked = -exponent * torch.log(torch.arange(1, vocab + 1, dtype=torch.float32, device=d))[None, :]
    order = torch.argsort(torch.rand(rows, vocab, generator=g, device=d), dim=1)
    return torch.gather(ranked.expand(rows, vocab), 1, order)


def _nonfinite(g, rows, vocab):  # peaked rows with NaN and -inf spread over a tenth of the tokens each
    x = _peaked(g, rows, vocab)
    u = torch.rand(rows, vocab, generator=g, device=g.device)
    x[u < 0.1] = float("nan")
    x[(u >= 0.1) & (u < 0.2)] = float("-inf")
    return x


# Kinds of rows the heads must decide at the same speed and by the same rule (issue #25):
# name -> (g, rows, vocab) -> [rows, V] float32 on g's device.
ROW_KINDS = {
    "peaked": _peaked,
    "power-law": _power_law,
    "flat": lambda g, rows, vocab: torch.randn(rows, vocab, generator=g, device=g.device),
    "equal": lambda g, rows, vocab: torch.zeros(rows, vocab, device=g.device),
    "ties": lambda g, rows, vocab: (torch.randn(rows, vocab, generator=g, device=g.device) * 2.0).round(),  # ~15
    "nan/-inf": _nonfinite,
}


def kind_logits(g: torch.Generator, kind: str, rows: int, vocab: int, dtype: torch.dtype) -> torch.Tensor:
    """[rows, V] rows of one of ROW_KINDS, in `dtype`, on `g`'s device."""
    if kind not in ROW_KINDS:
        raise ValueError(f"row kind {kind!r} is not one of {list(ROW_KINDS)}")
    return ROW_KINDS[kind](g, rows, vocab).to(dtype)


def kind_modes(vocab: int) -> dict[str, tuple[float, int, float]]:
    """The sampling modes each row kind is decided under (issue #25): name -> (temperature,
    top_k, top_p)."""
    return {
        "greedy": (0.0, 0, 1.0),
        **{f"temperature {t}": (t, 0, 1.0) for t in (0.7, 1.0, 1.5)},
        **{f"top-p {p}": (1.0, 0, p) for p in (0.9, 0.95, 0.99)},
        **{f"top-k {k}": (1.0, min(k, vocab), 1.0) for k in (1, 50, 1000)},
        "top-k V": (1.0, vocab, 1.0),
        "top-k 40 + top-p 0.9": (1.0, min(40, vocab), 0.9),
        "top-k 1000 + top-p 0.95": (1.0, min(1000, vocab), 0.95),
    }


def kinds_case(g: torch.Generator, vocab: int, dtype: torch.dtype, pairs: list[tuple[str, str]],
               rows_per_owner: int) -> dict:
    """Inputs of dflash_verify: one owner of `rows_per_owner` rows of each (row kind, mode)
    pair, its drafts the target's own tokens for a random prefix (`plant_target_tokens`)."""
    modes = kind_modes(vocab)
    owners = len(pairs)
    x = torch.cat([kind_logits(g, kind, rows_per_owner, vocab, dtype) for kind, _ in pairs])
    params = {
        "start_position": torch.randint(0, 1 << 40, (owners,), generator=g),
        "temperature": torch.tensor([modes[m][0] for _, m in pairs], dtype=torch.float32),
        "top_k": torch.tensor([modes[m][1] for _, m in pairs], dtype=torch.int64),
        "top_p": torch.tensor([modes[m][2] for _, m in pairs], dtype=torch.float32),
        "seed": torch.randint(-(1 << 62), 1 << 62, (owners,), generator=g),
    }
    offsets = torch.arange(owners + 1, dtype=torch.int64) * rows_per_owner
    tokens = torch.randint(0, vocab, (owners * rows_per_owner,), generator=g)
    plant_target_tokens(g, x, tokens, offsets, params, vocab)
    return {"logits": x, "tokens": tokens, "offsets": offsets, **params}


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
