"""ExecuTorch's CPU probe lines are dropped from stderr; every other line passes."""

import os
import subprocess
import sys

import pytest

from dflash_et.export import runtime_log

pytestmark = pytest.mark.quick  # scripts/test.sh --quick


def test_probe_lines_are_dropped_and_other_native_lines_pass(capfd):
    with runtime_log.without_probe_lines():
        os.write(2, b"[cpuinfo_utils.cpp:125] CPU info and manual query on # of cpus dont match.\n")
        os.write(2, b"executorch: E a real error\n[cpuinfo_utils.cpp:71] Reading file x\nlast line, no newline")
    os.write(2, b"\n[cpuinfo_utils.cpp:1] after the block: passes\n")
    assert capfd.readouterr().err == (
        "executorch: E a real error\nlast line, no newline\n[cpuinfo_utils.cpp:1] after the block: passes\n")


def test_check_of_a_program_prints_no_probe_lines(make_config, tmp_path):
    """The whole path a user sees: `dflash-et check` in its own process (the probe runs once
    per process, at the first method call)."""
    path = make_config("greedy", vocab=16)
    cli = [sys.executable, "-m", "dflash_et.cli"]
    subprocess.run([*cli, "export", "--config", str(path), "--output-dir", str(tmp_path / "a")], check=True,
                   capture_output=True)
    done = subprocess.run([*cli, "check", "--config", str(path), "--artifact", str(tmp_path / "a")],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "check passed" in done.stdout and "cpuinfo_utils" not in done.stderr, done.stderr
