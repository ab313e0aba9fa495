"""`benchmarks/simulate_window_select.py` (issue #25's window select, simulated on the CPU): its
windows find SPEC.md's cuts on every row kind and mode (the script checks each against a sort
and fails otherwise) with lists small enough that the windows narrow over several passes, and
the passes stay within one per level of the codes."""

import math
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import simulate_window_select as sim  # noqa: E402


def test_every_kind_and_mode_gets_the_sorted_cuts_within_the_bound(capsys):
    # A list of 16 tokens at V = 2048: most rows need histogram passes before their list.
    assert sim.main(["--rows", "1", "--vocab", "2048", "--list", "16", "--bins", "6"]) == 0
    rows = [line.split("|") for line in capsys.readouterr().out.splitlines() if line.startswith("| ")
            and not line.startswith("| kind") and not line.startswith("| dtype") and "torch." not in line]
    assert rows
    # Per cut: one pass per level of weight codes (24 bits) and of keys (32 bits), its list pass; two
    # cuts, then step 7. (The design's proven bound is NB passes per level; this is what it takes.)
    per_cut = math.ceil(24 / math.log2(6)) + math.ceil(32 / math.log2(6)) + 1
    passes = [int(r[3].split("/")[1]) for r in rows]
    assert max(passes) <= 2 * per_cut + 1, rows
    assert max(passes) >= 3, "no row needed a histogram pass: the test does not exercise the windows"
    assert all(int(r[4]) <= 16 or "top-k V" in r[2] for r in rows if int(r[4]) > 0), rows


def test_a_row_of_one_value_repeated_needs_no_list():
    x = torch.zeros(512)
    _, cut_p, stats = sim.simulate(x, torch.float32, 1.0, 0, 0.5, 30, 16)
    assert cut_p == int(sim.keys(torch.zeros(1), torch.float32)[0])
    assert stats["list"] == 0 and stats["passes"] == 2, stats  # one pass finds the one key, step 7
