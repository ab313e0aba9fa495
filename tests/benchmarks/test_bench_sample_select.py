"""`benchmarks/bench_sample_select.py`'s kernels (issue #25's sample select, timed on the GPU) in
the Triton interpreter: the first pass's stats and sample, the cut from a bracket that held it
equal to a sort's, for top-p and top-k rows of every kind, the guards' exact counts and the
sample the estimate reads from the row itself; a bracket that misses says so."""

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
    xs, packed = bench.packed_tokens(x)
    assert torch.equal(got["samples"], xs[:, ::RATE])
    finite = xs > float("-inf")
    assert torch.equal(got["stats"][:, 0].float(), xs.amax(-1))
    assert torch.equal(got["stats"][:, 2], finite.sum(-1).double())
    mass = torch.exp(xs - xs.amax(-1, keepdim=True)).double().sum(-1)
    assert torch.allclose(got["stats"][:, 1], mass, rtol=1e-5)
    # The variants: guards counted exactly, and a sample the estimate reads from the row itself.
    got["stages"]["bracket pass + 2 guards"]()
    guarded = got["variants"]["out"]
    assert torch.equal(guarded[:, :3], got["out"][:, :3])
    for column, threshold in ((3, got["bracket"][:, 2]), (5, got["bracket"][:, 3])):
        assert torch.equal(guarded[:, column], (packed > threshold[:, None]).sum(-1).double())
    assert torch.equal(got["out"][:, 0], (packed > got["bracket"][:, 0, None]).sum(-1).double())
    got["stages"]["estimate, sample read here (8 in a run)"]()
    ends = got["variants"]["bracket"]
    index = 0xFFFFFFFF - (ends & 0xFFFFFFFF)
    edge = (ends == torch.iinfo(torch.int64).max) | (ends == torch.iinfo(torch.int64).min)
    assert bool((edge | (index % (8 * RATE) < 8)).all()), ends  # every end is an edge or a point of a run
    assert bool((edge | (packed.gather(-1, index.clamp(0, V - 1)) == ends)).all())


def test_a_bracket_that_misses_the_cut_says_so():
    g = torch.Generator().manual_seed(4)
    x = torch.randn(2, V, generator=g)
    x[:, ::RATE] = -30.0  # every sample point at the bottom: the estimate is far off
    got = bench.run(x, 1.0, 100, 1.0, RATE, LIST, block=256)
    assert not bool(got["held"].any()), got["held"]


def test_the_benchmark_prints_its_tables(monkeypatch, capsys):
    # (what a GPU run prints, its timings faked: a mistake here would cost a device call)
    monkeypatch.setattr(bench, "copy_bandwidth", lambda: 1e12)
    monkeypatch.setattr(bench, "do_bench", lambda fn, **kw: (fn(), 0.01)[1])
    assert bench.main(["--device", "cpu", "--rows", "3", "--vocab", "1024", "--rate", "16", "--list", "128",
                       "--kinds", "flat", "peaked"]) == 0
    out = capsys.readouterr().out
    for kind in ("flat", "peaked"):
        assert f"## {kind}: bracket held the cut in " in out
    assert out.count("0 of those cuts differ from the sort's") == 2, out
    assert out.count("| the four stages (a cut from its first bracket) | 40.0 |") == 2, out
