"""`benchmarks/bench_cuda_runner.py`'s export in a process of its own (the runner's table: test_roofline.py)."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))  # (it puts tests/ on the path itself)

import bench_cuda_runner  # noqa: E402

from dflash_et.export import config  # noqa: E402


@pytest.mark.skipif(torch.cuda.is_available(), reason="fails by having no GPU: on a GPU it would export")
def test_a_failed_export_in_its_own_process_stops_the_benchmark(tmp_path, capfd):
    """The export runs in a spawned process (its GPU memory gone before the runner loads the
    program); when it fails (here: a CUDA config on a machine without CUDA), the benchmark stops
    with an error that names the export, the child's own error is shown, and nothing is written."""
    out = tmp_path / "program"
    with pytest.raises(SystemExit, match=r"the cuda heads export into .*program failed \(exit 1"):
        bench_cuda_runner.export_in_child(config.load("heads-greedy-cuda"), out, 1)
    assert "CUDA" in capfd.readouterr().err
    assert not out.exists()
