"""`benchmarks/bench_sample_select.py`'s kernels (issue #25's sample select, timed on the GPU) in
the Triton interpreter: the first pass's stats and sample, and the cut from a bracket that held
it equal to a sort's, for top-p and top-k rows of every kind; a bracket that misses says so."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

bench = pytest.importorskip("bench_sample_select")

from dflash_et.export import cases  # noqa: E402

V, RATE, LIST = 2048, 16, 256


@pytest.mark.parametrize("kind", list(cases.ROW_KINDS))
@pytest.mark.parametrize("top_k, top_p", [(0, 0.9), (0, 0.99), (100, 1.0)])
def test_a_held_cut_is_the_sorts(kind, top_k, top_p):
    g = torch.Generator().manual_seed(3)
    x = cases.kind_logits(g, kind, 3, V, torch.bfloat16)
    got = bench.run(x, 1.0, top_k, top_p, RATE, LIST, block=256)
    want = bench.reference_cut(x, 1.0, top_k, top_p)
    held = got["held"]
    assert bool(held.any()), "no bracket held its cut: the test checks nothing"
    assert torch.equal(got["cut"][held], want[held])
    xs = x.float().nan_to_num(nan=float("-inf"), posinf=torch.finfo(torch.float32).max, neginf=float("-inf"))
    assert torch.equal(got["samples"], xs[:, ::RATE])
    finite = xs > float("-inf")
    assert torch.equal(got["stats"][:, 0].float(), xs.amax(-1))
    assert torch.equal(got["stats"][:, 2], finite.sum(-1).double())
    mass = torch.exp(xs - xs.amax(-1, keepdim=True)).double().sum(-1)
    assert torch.allclose(got["stats"][:, 1], mass, rtol=1e-5)


def test_a_bracket_that_misses_the_cut_says_so():
    g = torch.Generator().manual_seed(4)
    x = torch.randn(2, V, generator=g)
    x[:, ::RATE] = -30.0  # every sample point at the bottom: the estimate is far off
    got = bench.run(x, 1.0, 100, 1.0, RATE, LIST, block=256)
    assert not bool(got["held"].any()), got["held"]
