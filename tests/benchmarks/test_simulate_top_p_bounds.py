"""`benchmarks/simulate_top_p_bounds.py` (the CPU simulation behind `kernels/filtered.py`'s
lane-count figures) runs, and names a bad argument (a subprocess, as a user runs it)."""

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.quick  # scripts/test.sh --quick

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "simulate_top_p_bounds.py"


def _run(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300)


def test_simulation_prints_a_row_per_step():
    run = _run("--rows", "8", "--vocab", "4096", "--step-bytes", "256", "512")
    assert run.returncode == 0, run.stderr[-2000:]
    rows = [line for line in run.stdout.splitlines() if line.startswith("| 256 B") or line.startswith("| 512 B")]
    assert [r.split("|")[2].strip() for r in rows] == ["16", "32"], run.stdout  # lanes: 16 bytes each


def test_simulation_names_a_bad_step():
    run = _run("--rows", "2", "--step-bytes", "3000")
    assert run.returncode != 0 and "--step-bytes [3000]" in run.stderr, run.stderr
