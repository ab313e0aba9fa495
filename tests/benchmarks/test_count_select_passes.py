"""`benchmarks/count_select_passes.py` (the sample select's passes, counted by the kernel itself in
the interpreter): its table has a cell per kind and filtered mode, the counts are within the
module docstring's bound, and it fails on a token outside SPEC.md's bands; the same for
`dflash_verify`'s select (`--op`), with more top-k modes (`--top-k`)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import count_select_passes as counter  # noqa: E402


def test_counts_every_kind_and_mode_within_the_bound(capsys):
    # V = 5000, just over the default list of 4096: the select's sample and passes run.
    assert counter.main(["--vocab", "5000", "--kinds", "flat", "equal"]) == 0
    out = capsys.readouterr().out
    rows = [line.split("|")[2:-1] for line in out.splitlines() if line.startswith("| flat") or
            line.startswith("| equal")]
    modes = counter.filtered_modes(5000)
    assert len(rows) == 2 and all(len(r) == len(modes) for r in rows), out
    passes = [int(c) for r in rows for c in r]
    assert max(passes) <= 3 + 2 * (14 + 1 + 1) + 1, passes  # the bound at V = 5000, LIST = 4096
    assert max(passes) >= 1, passes  # (the passes ran)
    assert "tokens outside SPEC.md's bands: 0" in out


def test_a_wrong_token_fails_the_run(monkeypatch, capsys):
    real = counter.heads.SampleRows

    class OffByOne(real):
        def forward(self, *args):
            return super().forward(*args) + 1

    monkeypatch.setattr(counter.heads, "SampleRows", OffByOne)
    assert counter.main(["--vocab", "5000", "--kinds", "flat"]) == 1
    assert "tokens outside SPEC.md's bands: 0" not in capsys.readouterr().out


def test_counts_dflash_verify_rows_with_more_top_k_modes(capsys):
    # each row an owner of its own (decided whatever its draft); top-k 2000 above the lanes, a column of its own
    assert counter.main(["--vocab", "5000", "--kinds", "flat", "--op", "dflash_verify", "--dtype", "float32",
                         "--top-k", "2000"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[1].startswith("dflash_verify, V = 5000 float32"), out
    header = next(line for line in out.splitlines() if line.startswith("| kind"))
    assert header.split("|")[-2].strip() == "top-k 2000", header
    assert "tokens outside SPEC.md's bands: 0" in out


def test_a_wrong_dflash_verify_token_fails_the_run(monkeypatch, capsys):
    real = counter.heads.DFlashVerify

    class OffByOne(real):
        def forward(self, *args):
            accepted, token = super().forward(*args)
            return accepted, token + 1

    monkeypatch.setattr(counter.heads, "DFlashVerify", OffByOne)
    assert counter.main(["--vocab", "5000", "--kinds", "flat", "--op", "dflash_verify"]) == 1
    assert "tokens outside SPEC.md's bands: 0" not in capsys.readouterr().out


def test_a_top_k_without_a_cut_is_refused_by_name(capsys):
    with pytest.raises(SystemExit):
        counter.main(["--vocab", "5000", "--top-k", "5000"])
    assert "--top-k [5000]" in capsys.readouterr().err
