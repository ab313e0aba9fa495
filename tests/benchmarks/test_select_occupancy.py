"""select_occupancy.py (the select's begin and rounds launches under launch variants) on the CPU,
the kernels in the interpreter and the timing replaced: a variant's options reach those two
launches only, a variant of one row a program gives the same tokens as the heads' launches, and a
bad variant name fails with the fix named. A crash here would otherwise cost a GPU call."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_verify  # noqa: E402
import roofline  # noqa: E402
import select_occupancy  # noqa: E402

from dflash_et.kernels import verify  # noqa: E402
from dflash_et.kernels.cut_select import SELECT_BEGIN, SELECT_ROUNDS  # noqa: E402

CASES = select_occupancy.QUICK[:2]  # (top-p rows, top-k + top-p rows: every select launch; the interpreter is slow)


def test_variant_names():
    assert select_occupancy.launch_options("base") == (None, {})
    assert select_occupancy.launch_options("g1-r80") == (1, {"maxnreg": 80})
    assert select_occupancy.launch_options("w4-r128") == (None, {"num_warps": 4, "maxnreg": 128})
    for bad in ("r300", "g0", "fast"):
        with pytest.raises(ValueError, match="use base, gN"):
            select_occupancy.launch_options(bad)


def _run(monkeypatch, variant):
    """(each verify_filtered_kernel launch's (STAGE, maxnreg), the tokens of each case) of one variant."""
    launches, tokens = [], []
    real = verify.wrap_triton

    def spy(kernel, kwargs):  # the heads' launcher, recording what the patched one passes on
        if kernel is verify.verify_filtered_kernel:
            launches.append((kwargs["STAGE"], kwargs.get("maxnreg")))
        return kwargs

    def one_call(fn, argsets):
        tokens.append([t.clone() for t in fn(*argsets[0])])
        return 1.0

    monkeypatch.setattr(verify, "wrap_triton", bench_verify.launcher_with(real, spy))
    monkeypatch.setattr(verify, "GROUP", verify.GROUP)  # (restored after the variant's change)
    monkeypatch.setattr(bench_verify, "DEVICE", "cpu")
    monkeypatch.setattr(bench_verify, "KINDS_SHAPE", (2, 64))
    monkeypatch.setattr(bench_verify, "graph_ms", one_call)
    monkeypatch.setattr(roofline, "copy_bandwidth", lambda: 1e9)
    monkeypatch.setattr(select_occupancy, "COPIES", 1)
    select_occupancy.time_variant(variant, CASES)
    return launches, tokens


def test_options_reach_the_begin_and_rounds_launches_only_and_tokens_stay(monkeypatch, capsys):
    base_launches, base_tokens = _run(monkeypatch, "base")
    monkeypatch.undo()
    launches, tokens = _run(monkeypatch, "g1-r80")
    out = capsys.readouterr().out
    cases = len(CASES)
    assert out.count("| g1-r80 |") == cases and out.count("| base |") == cases
    assert {s for s, _ in launches} == {s for s, _ in base_launches} and len(launches) == len(base_launches)
    assert all(r is None for _, r in base_launches)
    heavy = (SELECT_BEGIN.value, SELECT_ROUNDS.value)
    assert all((r == 80) == (s in heavy) for s, r in launches) and any(s in heavy for s, _ in launches)
    assert len(tokens) == len(base_tokens) == cases
    for got, want in zip(tokens, base_tokens):
        assert all(torch.equal(a, b) for a, b in zip(got, want))
