"""dflash_verify / dflash_verify_argmax / sample_rows over packed owners."""

import spec_oracle
import pytest
import torch

from dflash_et.export import cases, heads, legal

pytestmark = pytest.mark.quick  # scripts/test.sh --quick

VOCAB = 50


def _oracle_verify(inp):
    return spec_oracle.verify(
        inp["logits"].float().numpy(), inp["tokens"].tolist(), inp["offsets"].tolist(),
        inp["start_position"].tolist(), inp["temperature"].tolist(), inp["top_k"].tolist(),
        inp["top_p"].tolist(), inp["seed"].tolist(),
    )


def _verify(inp, module=None):
    module = module or heads.DFlashVerify()
    return module(inp["logits"], inp["tokens"], inp["offsets"], inp["start_position"],
                  inp["temperature"], inp["top_k"], inp["top_p"], inp["seed"])


def test_verify_matches_oracle_on_random_cases():
    g = torch.Generator().manual_seed(21)
    legal_owners = 0
    for _ in range(150):
        inp = cases.verify_case(g, VOCAB, max_rows=40, max_owners=8, dtype=torch.float32)
        accepted, next_token = _verify(inp)
        want_acc, want_next, close = _oracle_verify(inp)
        flagged = legal.close_owners(*_verify_args(inp))
        for o, is_close in enumerate(close):
            assert bool(flagged[o]) == is_close
            if is_close:
                legal_owners += 1
                continue
            assert (int(accepted[o]), int(next_token[o])) == (want_acc[o], want_next[o]), (o, inp["offsets"])
    assert legal_owners < 20


def _verify_args(inp):
    return [inp[k] for k in cases.VERIFY_INPUTS]


def test_acceptance_runs_long_when_drafts_are_the_targets_tokens():
    g = torch.Generator().manual_seed(22)
    rows, vocab = 6, 40
    x = torch.randn(rows, vocab, generator=g)
    position = 100 + torch.arange(1, rows + 1)
    own = heads.SampleRows()(x, position, torch.full((rows,), 0.9), torch.zeros(rows, dtype=torch.int64),
                             torch.ones(rows), torch.full((rows,), 5))
    tokens = torch.cat([torch.tensor([3]), own[:-1]])
    acc, nxt = heads.DFlashVerify()(x, tokens, torch.tensor([0, rows]), torch.tensor([100]),
                                    torch.tensor([0.9]), torch.tensor([0]), torch.tensor([1.0]), torch.tensor([5]))
    assert (int(acc), int(nxt)) == (rows - 1, int(own[-1]))  # every draft kept, then the bonus
    tokens[3] = (tokens[3] + 1) % vocab  # break draft 3
    acc, nxt = heads.DFlashVerify()(x, tokens, torch.tensor([0, rows]), torch.tensor([100]),
                                    torch.tensor([0.9]), torch.tensor([0]), torch.tensor([1.0]), torch.tensor([5]))
    assert (int(acc), int(nxt)) == (2, int(own[2]))  # the correction at the first miss


def test_argmax_head_equals_verify_with_greedy_owners():
    g = torch.Generator().manual_seed(23)
    for _ in range(60):
        inp = cases.verify_case(g, VOCAB, 40, 8, torch.float32, greedy_only=True)
        a1, n1 = heads.DFlashVerifyArgmax()(inp["logits"], inp["tokens"], inp["offsets"])
        a2, n2 = _verify(inp)
        assert torch.equal(a1, a2) and torch.equal(n1, n2)


def test_bad_and_padded_owners():
    x = torch.randn(6, VOCAB)
    tokens = torch.zeros(6, dtype=torch.int64)
    head = heads.DFlashVerifyArgmax()
    # empty owner, valid owner, b < a, b > R, a < 0
    for offsets, bad in (([0, 0, 3], [0]), ([0, 4, 2], [1]), ([0, 3, 9], [1]), ([-1, 3, 6], [0])):
        acc, nxt = head(x, tokens, torch.tensor(offsets))
        for o in bad:
            assert (int(acc[o]), int(nxt[o])) == (0, -1)
    # a draft outside [0, V) never matches, even where the target gives -1 (all-NaN row)
    x[0] = float("nan")
    acc, nxt = head(x, torch.tensor([0, -1, 0, 0, 0, 0]), torch.tensor([0, 2]))
    assert (int(acc[0]), int(nxt[0])) == (0, -1)


def test_overlapping_owners_follow_the_admission_rule():
    x = torch.randn(6, VOCAB)
    tokens = torch.cat([torch.tensor([0]), x.argmax(-1)[:-1]])
    head = heads.DFlashVerifyArgmax()
    # [0, 5, 2, 6]: owner 1 is invalid (b < a); owners 0 and 2 overlap on rows 2..4, and
    # 5 + 4 valid rows exceed R = 6, so owner 2 is not admitted (see owners.py).
    acc, nxt = head(x, tokens, torch.tensor([0, 5, 2, 6]))
    assert acc.tolist() == [4, 0, 0] and nxt.tolist()[1:] == [-1, -1]
    # [0, 3, 1, 3]: 3 + 2 valid rows fit in R = 6, so the overlapping owner 2 is decided.
    for offsets in ([0, 5, 2, 6], [0, 3, 1, 3], [2, 6, 0, 3]):
        acc, nxt = head(x, tokens, torch.tensor(offsets))
        want_acc, want_next, _ = spec_oracle.verify_argmax(x.numpy(), tokens.tolist(), offsets)
        assert (acc.tolist(), nxt.tolist()) == (want_acc, want_next)


def _pack(owner_rows, order, pads):
    """Pack per-owner (logits, tokens, params) in `order`, with empty owners at `pads`."""
    logits, tokens, offsets, params = [], [], [0], {k: [] for k in ("start_position", "temperature", "top_k", "top_p", "seed")}
    slots = []
    for o in order:
        while pads and pads[0] == len(slots):
            pads.pop(0)
            slots.append(None)
            offsets.append(offsets[-1])
            for k, v in params.items():
                v.append(0 if k in ("start_position", "top_k", "seed") else 1.0)
        slots.append(o)
        x, t, p = owner_rows[o]
        logits.append(x), tokens.append(t), offsets.append(offsets[-1] + x.shape[0])
        for k, v in params.items():
            v.append(p[k])
    return {
        "logits": torch.cat(logits), "tokens": torch.cat(tokens), "offsets": torch.tensor(offsets),
        "start_position": torch.tensor(params["start_position"]), "temperature": torch.tensor(params["temperature"]),
        "top_k": torch.tensor(params["top_k"]), "top_p": torch.tensor(params["top_p"]), "seed": torch.tensor(params["seed"]),
    }, slots


def test_owner_outputs_do_not_depend_on_other_owners():
    g = torch.Generator().manual_seed(24)
    owner_rows = []
    for o in range(6):
        n = int(torch.randint(1, 6, (1,), generator=g))
        x = torch.randn(n, VOCAB, generator=g) * 3
        t = torch.randint(0, VOCAB, (n,), generator=g)
        t[1:] = torch.where(torch.rand(n - 1, generator=g) < 0.7, x.argmax(-1)[:-1], t[1:])
        p = {"start_position": int(torch.randint(0, 1000, (1,), generator=g)), "temperature": [0.0, 0.8, 1.2][o % 3],
             "top_k": [0, 5, 20][o % 3], "top_p": [1.0, 0.9, 0.7][o % 3], "seed": 1000 + o}
        owner_rows.append((x, t, p))

    def outputs(order, pads):
        inp, slots = _pack(owner_rows, order, list(pads))
        acc, nxt = _verify(inp)
        return {o: (int(acc[i]), int(nxt[i])) for i, o in enumerate(slots) if o is not None}, acc, nxt, slots

    alone = {o: outputs([o], [])[0][o] for o in range(6)}
    for order, pads in (([0, 1, 2, 3, 4, 5], []), ([5, 3, 1, 0, 2, 4], [0, 2, 2]), ([2, 4], [1]), ([4, 0, 5], [3])):
        got, acc, nxt, slots = outputs(order, pads)
        assert got == {o: alone[o] for o in order}
        for i, o in enumerate(slots):
            if o is None:
                assert (int(acc[i]), int(nxt[i])) == (0, -1)


def test_sample_rows_is_the_rule_at_each_position():
    g = torch.Generator().manual_seed(25)
    inp = cases.sample_case(g, VOCAB, 24, torch.float32)
    got = heads.SampleRows()(**inp)
    for i in range(got.shape[0]):
        want = spec_oracle.sample_row(inp["logits"][i].numpy(), inp["temperature"][i].item(), int(inp["top_k"][i]),
                                      inp["top_p"][i].item(), int(inp["seed"][i]), int(inp["position"][i]))
        assert want.close or int(got[i]) == want.token
