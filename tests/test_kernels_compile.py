"""Every kernel variant the launchers produce compiles for sm_90 (H100 / H200) on this
CPU-only machine: Triton's compiler and ptxas ship with the wheel. The interpreter runs
the kernels' Python, not their compilation, so this is where a non-constexpr global, a
type mismatch in a branch the test data never takes, or a spill shows up before GPU time.
(A subprocess: the tests run the kernels under TRITON_INTERPRET=1, which replaces them.)"""

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_every_kernel_variant_compiles_for_sm90_without_spills():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "kernel_registers.py")], env=env,
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    lines = [x for x in run.stdout.splitlines() if "REG:" in x]
    assert len(lines) == 27, lines  # 3 logits dtypes x (6 verify + 3 sample_rows) variants
    for line in lines:
        assert int(re.search(r"REG:(\d+)", line).group(1)) <= 255 and "LOCAL:0" in line, line  # no spills
