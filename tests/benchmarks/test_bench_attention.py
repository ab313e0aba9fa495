"""bench_attention.py --smoke on the CPU: the benchmark's verify-step cases (owners' rows at
the end of their lengths, fixed and up to the limit; several rows an owner, and one) through
dflash::cached_attention under the interpreter, checked against the reference, whole and
(a `--variant`) in pieces. A crash here would otherwise cost a GPU call."""

import argparse
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_attention  # noqa: E402


def test_smoke_cases_match_the_reference(capsys):
    assert bench_attention.main(["--smoke", "--variant", "SPLIT_CELLS=16 WAVES=2"]) == 0
    out = capsys.readouterr().out
    assert out.count("the op matches the reference") == 8, out  # 2 series x 2 max_seq_len x 2 row counts
    assert out.count("smoke 1 rows an owner") == 4, out


def test_a_bad_variant_is_named():
    with pytest.raises(argparse.ArgumentTypeError, match="'PIECES=4' is not NAME=INT"):
        bench_attention.variant("WAVES=2 PIECES=4")
    assert bench_attention.variant("WAVES=2 SPLIT_CELLS=16") == {"WAVES": 2, "SPLIT_CELLS": 16}
