"""dflash_verify's certain misses and moot rows (`kernels/verify.py`, steps 1 and 2).

A top-p-alone row whose token certainly is not its draft (`sampling_rule.certain_miss`, told
from the row's first pass: V_MISS) ends its owner's accepted count there or before; the owner's
later rows are moot (MOOT_ROW) and nothing decides them. The tokens must stay the reference's,
and a row told "miss" must miss in the reference: checked row by row against the reference's
own token at every row, on drafts that are argmaxes (mostly told), the target's own tokens
(never to be told) and random tokens, on several row kinds (CPU: TRITON_INTERPRET=1).
"""

import pytest
import torch
from conftest import DEVICE
from kernel_parity import check_verify

from dflash_et import kernels  # noqa: F401  (registers torch.ops.dflash)
from dflash_et.export import cases, heads
from dflash_et.kernels import launch
from dflash_et.kernels import scratch as record
from dflash_et.kernels import verify as verify_kernel

OWNERS, ROWS = 8, 6


def _case(g, kind, vocab, temperature, top_p, drafts):
    """OWNERS owners of ROWS rows of `kind`, every owner top-p alone at (temperature, top_p);
    drafts: 'argmax' (each row's argmax), 'own' (the target's own tokens for a random prefix
    of most owners: accepted), 'random'."""
    x = cases.kind_logits(g, kind, OWNERS * ROWS, vocab, torch.float32)
    params = {
        "start_position": torch.randint(0, 1 << 40, (OWNERS,), generator=g),
        "temperature": torch.full((OWNERS,), temperature),
        "top_k": torch.zeros(OWNERS, dtype=torch.int64),
        "top_p": torch.full((OWNERS,), top_p),
        "seed": torch.randint(-(1 << 62), 1 << 62, (OWNERS,), generator=g),
    }
    offsets = torch.arange(OWNERS + 1, dtype=torch.int64) * ROWS
    tokens = torch.randint(0, vocab, (OWNERS * ROWS,), generator=g)
    if drafts == "argmax":
        tokens[1:] = x.nan_to_num(nan=float("-inf")).argmax(-1)[:-1]
    elif drafts == "own":
        cases.plant_target_tokens(g, x, tokens, offsets, params, vocab)
    return {"logits": x, "tokens": tokens, "offsets": offsets, **params}


def _own_tokens(inp) -> torch.Tensor:
    """The reference's token at every row (its owner's parameters, its position)."""
    owner = torch.arange(OWNERS).repeat_interleave(ROWS)
    j = torch.arange(OWNERS * ROWS) % ROWS
    return heads.SampleRows()(inp["logits"], inp["start_position"][owner] + j + 1, inp["temperature"][owner],
                              inp["top_k"][owner], inp["top_p"][owner], inp["seed"][owner])


def _confident(x: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """Rows whose argmax alone reaches the nucleus (p S <= 1, S in float64 as SPEC.md's): the first
    launch decides them (their token the argmax) and tells a miss like a certain one."""
    x = x.float().nan_to_num(nan=float("-inf"), posinf=torch.finfo(torch.float32).max, neginf=float("-inf"))
    top = x.max(-1, keepdim=True).values
    mass = torch.exp((x - top) / temperature).double().nan_to_num(nan=0.0).sum(-1)
    return (top.squeeze(-1) > float("-inf")) & (top_p * mass <= 1.0)


# told: how many owners' first rows must be told "miss" ('most': wide rows, unlikely drafts; 'none': top-p 1e-7
# keeps the argmax alone, so an argmax draft is always accepted; None: no claim). (top-p 0 rows are greedy:
# `sampling_rule.decided_temperature`, never told.)
@pytest.mark.parametrize("kind,temperature,top_p,drafts,told", [
    ("flat", 1.0, 0.9, "argmax", "most"), ("power-law", 0.7, 0.5, "own", None), ("ties", 1.5, 0.99, "random", "most"),
    ("nan/-inf", 1.0, 0.95, "argmax", None), ("flat", 1.0, 1e-7, "argmax", "none"), ("peaked", 1.3, 0.95, "own", None)])
def test_certain_misses_are_misses_and_moot_the_later_rows(kind, temperature, top_p, drafts, told):
    g = torch.Generator().manual_seed(5)
    inp = _case(g, kind, 96, temperature, top_p, drafts)
    scratch = launch.scratch_for(inp["logits"])
    dev = {k: v.to(DEVICE) for k, v in inp.items()}
    check_verify(dev, verify_kernel.launch(*[dev[k] for k in cases.VERIFY_INPUTS], scratch=scratch))
    miss = scratch.verify_words()[:, record.V_MISS.value].view(OWNERS, ROWS)
    mark = scratch.results()[:, record.R_TOKEN.value].view(OWNERS, ROWS)
    own = _own_tokens(inp).view(OWNERS, ROWS)
    draft = torch.cat([inp["tokens"][1:], torch.tensor([-1])]).view(OWNERS, ROWS)
    draft[:, -1] = -1  # (the last row of an owner has no draft: always a miss)
    assert bool(((miss == 0) | (miss == 1)).all()) and bool((miss[:, -1] == 1).all()), miss.tolist()
    # told "miss": the reference's token is not the draft, at every row (moot ones included)
    assert not bool(((miss == 1) & (own == draft)).any()), (miss.tolist(), own.tolist(), draft.tolist())
    # moot: exactly the rows after an owner's first told row, but for the confident ones, decided at once
    first = miss.float().argmax(1)
    after = torch.arange(ROWS).unsqueeze(0) > first.unsqueeze(1)
    confident = _confident(inp["logits"], temperature, top_p).view(OWNERS, ROWS)
    assert bool(((mark == record.MOOT_ROW.value) == (after & ~confident)).all()), (mark.tolist(), miss.tolist())
    assert bool((mark[confident] >= -1).all()), mark.tolist()
    if told == "most":  # (the optimization is in use)
        assert int(miss[:, 0].sum()) >= OWNERS // 2, miss.tolist()
    elif told == "none":
        assert int(miss[:, :-1].sum()) == 0, miss.tolist()


def test_an_accepted_draft_is_never_told():
    """Drafts that are the target's own tokens on every row (all accepted): no row is told,
    nothing is moot, and every owner accepts all its drafts."""
    g = torch.Generator().manual_seed(9)
    inp = _case(g, "flat", 96, 1.0, 0.9, "random")
    own = _own_tokens(inp)
    inp["tokens"][1:] = own[:-1]
    scratch = launch.scratch_for(inp["logits"])
    got = verify_kernel.launch(*[inp[k].to(DEVICE) for k in cases.VERIFY_INPUTS], scratch=scratch)
    check_verify({k: v.to(DEVICE) for k, v in inp.items()}, got)
    assert got[0].tolist() == [ROWS - 1] * OWNERS
    assert int(scratch.verify_words()[:, record.V_MISS.value].view(OWNERS, ROWS)[:, :-1].sum()) == 0
    assert not bool((scratch.results()[:, record.R_TOKEN.value] == record.MOOT_ROW.value).any())
