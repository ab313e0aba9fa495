"""Randomness that behaves: sampled tokens follow the filtered target distribution,
and argmax drafts are accepted with probability p(d) (speculative sampling)."""

import numpy as np
import pytest
import torch
from scipy import stats

from dflash_et.export import heads, rng, sampling

ROW = torch.tensor([2.0, 1.5, 1.5, 0.3, -0.5, 1.0, float("-inf"), 0.0, 2.0, -1.0, 0.7, 1.2])
VOCAB = ROW.shape[0]
DRAWS = 40_000
P_FLOOR = 1e-4  # fixed seeds: deterministic; a correct sampler passes, a biased one does not


def filtered_distribution(row, temperature, top_k, top_p):
    """SPEC.md steps 3-6 with a real sort, normalised: what samples must follow."""
    x = row.float()
    finite = [v for v in range(len(x)) if x[v] > float("-inf")]
    order = sorted(finite, key=lambda v: (-float(x[v]), v))
    if 0 < top_k < len(x):
        order = order[:top_k]
    e = {v: float(torch.exp((x[v] - x.max()) / temperature)) for v in order}
    if top_p < 1:
        s_k, kept, c = sum(e.values()), [], 0.0
        for r, v in enumerate(order):
            if r == 0 or c < top_p * s_k:
                kept.append(v)
            c += e[v]
        order = kept
    p = np.zeros(len(x))
    for v in order:
        p[v] = e[v]
    return p / p.sum()


def draw(temperature, top_k, top_p, seed=1234, bias=None):
    n = DRAWS
    position, seed = torch.arange(n) * 3 + 17, torch.full((n,), seed)
    if bias is None:
        return heads.SampleRows()(ROW.expand(n, VOCAB), position, torch.full((n,), temperature),
                                  torch.full((n,), top_k), torch.full((n,), top_p), seed)
    u = bias(rng.uniform(seed, position, rng.SAMPLE))
    return sampling.sample(ROW.expand(n, VOCAB), torch.full((n,), temperature), torch.full((n,), top_k),
                           torch.full((n,), top_p), u)


def chi_square_p(tokens, p):
    support = p > 0
    counts = np.bincount(tokens.numpy(), minlength=VOCAB)
    assert counts[~support].sum() == 0, f"tokens outside the kept set: {np.nonzero(counts * ~support)}"
    return stats.chisquare(counts[support], p[support] * len(tokens)).pvalue


SETTINGS = [(0.8, 0, 1.0), (1.0, 5, 1.0), (0.7, 0, 0.8), (1.3, 6, 0.9), (2.0, 3, 0.5)]


@pytest.mark.parametrize("temperature,top_k,top_p", SETTINGS)
def test_sampled_tokens_follow_the_filtered_distribution(temperature, top_k, top_p):
    p = filtered_distribution(ROW, temperature, top_k, top_p)
    assert chi_square_p(draw(temperature, top_k, top_p), p) > P_FLOOR


@pytest.mark.parametrize("temperature,top_k,top_p", SETTINGS)
def test_the_same_statistic_rejects_a_biased_sampler(temperature, top_k, top_p):
    # The test above has power: uniforms bent by u -> u^0.9 (a 5% shift near the middle)
    # must fail it, for every setting.
    p = filtered_distribution(ROW, temperature, top_k, top_p)
    assert (p > 0).sum() >= 2
    assert chi_square_p(draw(temperature, top_k, top_p, bias=lambda u: u**0.9), p) < P_FLOOR


def test_argmax_drafts_are_accepted_with_probability_p_of_the_draft():
    temperature = 1.0
    p = filtered_distribution(ROW, temperature, 0, 1.0)
    d = int(np.argmax(p))
    owners, per_call = 30_000, 3_000  # the reference's owner lookup is [owners, rows]: calls of 3k owners
    accepted, next_token = [], []
    for first in range(0, owners, per_call):
        logits = ROW.expand(2 * per_call, VOCAB)
        tokens = torch.tensor([0, d]).repeat(per_call)
        offsets = torch.arange(per_call + 1) * 2
        positions = (first + torch.arange(per_call)) * 5  # every owner's draws its own, as in one call
        a, t = heads.DFlashVerify()(
            logits, tokens, offsets, positions, torch.full((per_call,), temperature),
            torch.zeros(per_call, dtype=torch.int64), torch.ones(per_call), torch.full((per_call,), 99),
        )
        accepted.append(a)
        next_token.append(t)
    accepted, next_token = torch.cat(accepted), torch.cat(next_token)
    rate = accepted.double().mean().item()
    z = (rate - p[d]) / np.sqrt(p[d] * (1 - p[d]) / owners)
    assert abs(z) < 4.5, f"acceptance {rate:.4f} vs p(d) = {p[d]:.4f}"
    # On rejection the correction follows p without d (the speculative residual).
    rejected = next_token[accepted == 0].numpy()
    residual = p.copy()
    residual[d] = 0
    residual /= residual.sum()
    assert (rejected != d).all()
    support = residual > 0
    counts = np.bincount(rejected, minlength=VOCAB)
    assert stats.chisquare(counts[support], residual[support] * len(rejected)).pvalue > P_FLOOR
