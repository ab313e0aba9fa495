"""The row kinds of export/cases.py are what their names say (the benchmark's worst-case
table and the parity tests rely on it), and a kinds case gives each (kind, mode) its owner."""

import itertools

import pytest
import torch

from dflash_et.export import cases


def test_row_kinds_are_what_they_say():
    g = torch.Generator().manual_seed(0)
    rows, vocab = 3, 2000
    x = {k: cases.kind_logits(g, k, rows, vocab, torch.float32) for k in cases.ROW_KINDS}
    assert bool((x["equal"] == x["equal"][:, :1]).all())
    assert all(len(torch.unique(r)) <= 25 for r in x["ties"])
    bad = x["nan/-inf"]
    assert bool(torch.isnan(bad).any(dim=1).all()) and bool(torch.isneginf(bad).any(dim=1).all())
    peaked = x["peaked"]
    assert bool((peaked.amax(dim=1) > peaked.median(dim=1).values + 10).all())  # a few strongly preferred tokens
    ranked = x["power-law"].sort(dim=1, descending=True).values  # log-probability linear in log rank
    slope = (ranked[:, 0] - ranked[:, 999]) / torch.log(torch.tensor(1000.0))
    assert bool(((slope > 0.79) & (slope < 1.21)).all()) and len(torch.unique(ranked[0])) == vocab
    assert 0.9 < float(x["flat"].std()) < 1.1
    with pytest.raises(ValueError, match="row kind 'zipf' is not one of"):
        cases.kind_logits(g, "zipf", 1, 10, torch.float32)


def test_kinds_case_gives_each_pair_an_owner_with_its_mode():
    g = torch.Generator().manual_seed(1)
    modes = cases.kind_modes(100)
    assert modes["top-k V"] == (1.0, 100, 1.0) and modes["top-k 1000"] == (1.0, 100, 1.0)  # clamped to V
    pairs = list(itertools.product(["equal", "ties"], ["greedy", "top-p 0.95"]))
    inp = cases.kinds_case(g, 100, torch.bfloat16, pairs, rows_per_owner=3)
    assert inp["logits"].shape == (12, 100) and inp["logits"].dtype == torch.bfloat16
    assert inp["offsets"].tolist() == [0, 3, 6, 9, 12]
    assert inp["temperature"].tolist() == [0.0, 1.0, 0.0, 1.0] and inp["top_p"][1].item() == pytest.approx(0.95)
    assert bool((inp["logits"][:6] == 0).all())  # the "equal" owners' rows
    assert set(inp) == set(cases.VERIFY_INPUTS)
