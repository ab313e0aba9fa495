"""`benchmarks/simulate_sample_select.py` (issue #25's sample select, simulated on the CPU): its
brackets find SPEC.md's cuts on every row kind and mode (the script checks each against a sort
and fails otherwise), its estimate of a top-p cut survives heavy tokens the sample missed, and
a row built against the sample ends in the key splits within the design's bound."""

import math
import sys
from argparse import Namespace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import simulate_sample_select as sim  # noqa: E402

ARGS = Namespace(rate=16, list=64, fill=0.5, guards=4, splits=16, brackets=3)


def _rows(out: str) -> list[list[str]]:
    return [line.split("|") for line in out.splitlines() if line.startswith("| ")
            and not line.startswith("| kind") and not line.startswith("| dtype") and "torch." not in line]


def test_every_kind_and_mode_gets_the_sorted_cuts_within_the_bound(capsys):
    # A list of 64 tokens at V = 4096, a point per 16 tokens: brackets of ~2 points.
    assert sim.main(["--rows", "1", "--vocab", "4096", "--list", "64", "--rate", "16"]) == 0
    rows = _rows(capsys.readouterr().out)
    assert len(rows) == 2 * 6 * 9, len(rows)  # dtypes x kinds x the modes with a cut
    # Per row: the bracket passes, then per cut the key splits of 32-bit keys and a list; step 7.
    bound = ARGS.brackets + 2 * (math.ceil(32 / math.log2(ARGS.splits)) + 1) + 1
    passes = [int(r[3].split("/")[1]) for r in rows]
    assert max(passes) <= bound, rows
    assert max(passes) >= 3, "every cut was found by its first bracket: the test does not exercise a miss"
    assert all(int(r[5]) <= 64 for r in rows), rows


def test_heavy_tokens_between_the_sample_points_do_not_move_the_top_p_estimate():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4096, generator=g) * 0.1  # a flat body ...
    x[torch.arange(20) * 16 + 7] = 8.0  # ... and heavy tokens (94% of the mass), none a sample point (index % 16)
    o = sim.Ordered.of(x, torch.float32, 1.0, ARGS.rate)
    n = len(o.e)
    for top_p in (0.95, 0.97, 0.99):  # cuts in the body: 1/5, 1/2 and 5/6 of the way down
        goal = top_p * float(o.e.sum())
        want = int(sim.kept_until(o, True, goal, n).sum()) - 1  # the last rank kept
        got = int(o.sample[sim._estimate(o, True, goal, 0, n, 0.0, o.sample)])
        # (scaling the sample's mass up to S instead puts all three past rank 3900)
        assert abs(got - want) <= 0.05 * n, (top_p, got, want)


def test_a_row_built_against_the_sample_ends_in_key_splits_within_the_bound():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(4096, generator=g)
    x[::16] = -30.0  # every sample point at the bottom: the sample says nothing of the top
    for top_k, top_p in ((1000, 1.0), (0, 0.9)):
        cut_k, cut_p, stats = sim.simulate(x, torch.float32, 1.0, top_k, top_p, ARGS)
        want_k, want_p = sim.sorted_cuts(x, sim.keys(x, torch.float32), 1.0, top_k, top_p)
        assert (cut_k if top_k else cut_p) == (want_k if top_k else want_p)
        assert stats["splits"] >= 1, stats
        assert stats["passes"] <= ARGS.brackets + math.ceil(32 / math.log2(ARGS.splits)) + 1 + 1, stats
