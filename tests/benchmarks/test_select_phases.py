"""select_phases.py's patch (the sample select's steps timed per row, on the GPU) still applies to
the kernels as they are: every step it times is found exactly once, the patched modules compile,
and a step it cannot find fails with the fix named. A drifted patch would otherwise cost a GPU call."""

import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import select_phases  # noqa: E402

from dflash_et.kernels import scratch  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def test_the_patch_applies_to_the_current_kernels(tmp_path):
    assert scratch.STATS.value == select_phases.FIRST  # (the timers' words follow the record's own)
    select_phases.patch_package(str(ROOT), str(tmp_path))
    pkg = tmp_path / "dflash_et" / "kernels"
    for name in ("scratch.py", "cut_select.py"):
        text = (pkg / name).read_text()
        compile(text, name, "exec")
    patched = (pkg / "scratch.py").read_text()
    assert f"STATS = tl.constexpr({select_phases.FIRST + len(select_phases.STEPS)})" in patched
    assert all(f'"t_{step}"' in patched for step in select_phases.STEPS)
    select = (pkg / "cut_select.py").read_text()
    writes = re.findall(r"(?:_tock|_add)\(stats_ptr, (\d+),|stats_ptr \+ (\d+),|tl\.where\(INLINE, (\d+), (\d+)\)",
                        select)
    written = {int(w) for groups in writes for w in groups if w}  # every step's word, and no other
    assert written == set(range(select_phases.FIRST, select_phases.FIRST + len(select_phases.STEPS)))


def test_a_step_it_cannot_find_names_the_fix(tmp_path, monkeypatch):
    edits = select_phases._edits()
    edits["kernels/cut_select.py"].append(("_no_such_call(stats_ptr)\n", "x"))
    monkeypatch.setattr(select_phases, "_edits", lambda: edits)
    with pytest.raises(ValueError, match="holds 0 copies of '_no_such_call.*update select_phases._edits"):
        select_phases.patch_package(str(ROOT), str(tmp_path))
