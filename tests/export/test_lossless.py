"""The lossless property of SPEC.md: speculative decoding with any drafts commits exactly
the tokens of target-only `sample_rows` decoding with the same seeds."""

import hashlib

import pytest
import torch

from dflash_et.export import heads

pytestmark = pytest.mark.quick  # scripts/test.sh --quick

VOCAB = 30


def target_logits(prefix: list[int]) -> torch.Tensor:  # [V]: a fixed function of the prefix
    h = int.from_bytes(hashlib.sha256(repr(prefix).encode()).digest()[:8], "little")
    g = torch.Generator().manual_seed(h)
    return torch.randn(VOCAB, generator=g) * 2.5


OWNERS = [  # (temperature, top_k, top_p, seed)
    (0.0, 0, 1.0, 1), (1.0, 0, 1.0, 2), (0.8, 5, 1.0, 3), (1.2, 0, 0.85, 4), (0.6, 8, 0.7, -5),
]


def target_only(prompt, params, steps):
    seq = list(prompt)
    t, k, p, s = params
    for _ in range(steps):
        y = heads.SampleRows()(target_logits(seq)[None], torch.tensor([len(seq)]), torch.tensor([t]),
                               torch.tensor([k]), torch.tensor([p]), torch.tensor([s]))
        seq.append(int(y))
    return seq


def speculative(prompts, drafter, total):
    seqs = [list(p) for p in prompts]
    g = torch.Generator().manual_seed(0)
    while min(len(s) - len(p) for s, p in zip(seqs, prompts)) < total:
        logits, tokens, offsets = [], [], [0]
        for o, seq in enumerate(seqs):
            if len(seq) - len(prompts[o]) >= total:  # done: an empty owner from now on
                offsets.append(offsets[-1])
                continue
            drafts = drafter(seq, int(torch.randint(0, 6, (1,), generator=g)), g)
            block = [seq[-1]] + drafts  # pending token, then drafts
            for j in range(len(block)):
                logits.append(target_logits(seq + drafts[:j]))
            tokens += block
            offsets.append(offsets[-1] + len(block))
        params = list(zip(*OWNERS))
        accepted, next_token = heads.DFlashVerify()(
            torch.stack(logits), torch.tensor(tokens), torch.tensor(offsets),
            torch.tensor([len(s) - 1 for s in seqs]), torch.tensor(params[0]), torch.tensor(params[1]),
            torch.tensor(params[2]), torch.tensor(params[3]),
        )
        for o, seq in enumerate(seqs):
            a = offsets[o]
            if offsets[o + 1] == a:
                assert (int(accepted[o]), int(next_token[o])) == (0, -1)
                continue
            seq += tokens[a + 1:a + 1 + int(accepted[o])] + [int(next_token[o])]
    return seqs


def test_any_drafter_commits_the_target_only_tokens():
    prompts = [[1, 2, 3], [4], [5, 6], [7, 8, 9, 10], [11]]
    total = 24
    want = [target_only(p, params, total + 6) for p, params in zip(prompts, OWNERS)]

    def random_drafter(seq, n, g):
        return torch.randint(0, VOCAB, (n,), generator=g).tolist()

    def oracle_drafter(seq, n, g):  # mostly right, sometimes wrong: long acceptances and misses
        o = next(i for i, w in enumerate(want) if w[: len(seq)] == seq)  # a wrong commit stops here
        out = want[o][len(seq):len(seq) + n]
        if out and torch.rand(1, generator=g) < 0.3:
            out[int(torch.randint(0, len(out), (1,), generator=g))] = int(torch.randint(0, VOCAB, (1,), generator=g))
        return out

    for drafter in (random_drafter, oracle_drafter):
        got = speculative(prompts, drafter, total)
        for o, (g_seq, w_seq) in enumerate(zip(got, want)):
            assert g_seq == w_seq[: len(g_seq)], f"owner {o} diverged with {drafter.__name__}"
