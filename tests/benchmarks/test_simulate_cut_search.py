"""`benchmarks/simulate_cut_search.py` (issue #25's probe search, simulated on the CPU): its
searches find SPEC.md's cuts on every row kind and mode (the script checks each against a
sort and fails otherwise), and a key-even search keeps to its stated bound."""

import math
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import simulate_cut_search as sim  # noqa: E402

pytestmark = pytest.mark.quick  # scripts/test.sh --quick


def test_every_kind_and_mode_gets_the_sorted_cuts_within_the_bound(capsys):
    assert sim.main(["--rows", "1", "--vocab", "4096", "--probes", "4", "--strategies", "key", "mixed"]) == 0
    table = [line.split("|") for line in capsys.readouterr().out.splitlines()
             if line.startswith("| torch.")]
    assert len(table) == 4, table  # (2 dtypes x 2 strategies)
    for row in table:
        bits = 16 if "bfloat16" in row[1] else 32
        passes = int(row[4].split()[0])
        if row[3].strip() == "key":  # two searches at most, each within its bound
            assert 0 < passes <= 2 * math.ceil(bits / math.log2(4 + 1)), row


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_keys_order_the_values_of_the_dtype(dtype):
    x = torch.tensor([-3.0e38, -2.5, -1.0, -1e-30, 0.0, 1e-30, 0.5, 2.0, 3.0e38]).to(dtype).float()
    k = sim.keys(x, dtype)
    assert bool((k[1:] > k[:-1]).all()), k
    assert [sim.value_of_key(int(v), dtype) for v in k] == x.tolist()
