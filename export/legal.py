"""Which decisions SPEC.md lets two implementations take differently.

SPEC.md allows token ids to differ only where a top-p prefix C(r-1) lies within
1e-6 * S_k of top_p * S_k, or an inverse-CDF prefix within 1e-6 * S of t (an
ulp of float32 `exp` moves sums by about that much). This module flags those
rows, so parity checks can tell a legal difference from a bug. Eager only (it
sorts); it is a judge, never exported.
"""

import torch

from . import owners, rng, sampling

BAND = 1e-6


def close_rows(
    logits: torch.Tensor,  # [N, V]
    temperature: torch.Tensor,  # [N] float32
    top_k: torch.Tensor,  # [N] int64
    top_p: torch.Tensor,  # [N] float32
    u: torch.Tensor,  # [N] float32
) -> torch.Tensor:  # [N] bool: the row's decision is inside a legal band
    x = sampling.sanitize(logits)
    n, vocab = x.shape
    sampling_row = (temperature > 0) & (x > float("-inf")).any(dim=-1)
    values, order = torch.sort(x, dim=-1, descending=True, stable=True)  # ties by index
    rank = torch.arange(vocab, device=x.device).expand(n, vocab)
    k = torch.where((top_k > 0) & (top_k < vocab), top_k, vocab).unsqueeze(-1)
    kept_sorted = (values > float("-inf")) & (rank < k)
    x_max = torch.where(values[:, :1] > float("-inf"), values[:, :1], 0.0)
    temp = torch.where(temperature > 0, temperature, 1.0).unsqueeze(-1)
    e_sorted = torch.where(kept_sorted, torch.exp((values - x_max) / temp), 0.0).double()
    s_k = e_sorted.sum(dim=-1, keepdim=True)
    use_p = (top_p < 1).unsqueeze(-1)
    target = top_p.double().unsqueeze(-1) * s_k
    before = torch.cumsum(e_sorted, dim=-1) - e_sorted
    band_p = use_p & kept_sorted & (rank > 0) & ((before - target).abs() <= BAND * s_k)
    kept_p = kept_sorted & ((before < target) | (rank == 0))
    kept_sorted = torch.where(use_p, kept_p, kept_sorted)

    kept = torch.zeros_like(kept_sorted).scatter(1, order, kept_sorted)
    e = torch.zeros_like(e_sorted).scatter(1, order, e_sorted)
    e = torch.where(kept, e, 0.0)
    prefix = torch.cumsum(e, dim=-1)
    total = prefix[:, -1:]
    t = u.double().unsqueeze(-1) * total
    band_cdf = kept & ((prefix - t).abs() <= BAND * total)
    return sampling_row & (band_p.any(dim=-1) | band_cdf.any(dim=-1))


def close_owners(
    logits, tokens, offsets, start_position, temperature, top_k, top_p, seed
) -> torch.Tensor:  # [O] bool: some decision of the owner is inside a legal band
    pairs = owners.pack_pairs(offsets, logits.shape[0])
    o = pairs.owner
    u = rng.uniform(seed[o], start_position[o] + pairs.j + 1, rng.SAMPLE)
    close = close_rows(logits[pairs.row], temperature[o], top_k[o], top_p[o], u) & pairs.used
    owner_ids = torch.arange(offsets.shape[0] - 1, device=offsets.device)
    mine = pairs.owner.unsqueeze(0) == owner_ids.unsqueeze(1)
    return (mine & close.unsqueeze(0)).any(dim=1)
