"""`benchmarks/bench_count_pass.py` (the count pass alone, beside its no-list form and other trees'
kernels): in the interpreter at small sizes, its table has a row per tree and list form, the
counts and lists agree, the no-list form claims no slot, and a tree whose pass counts or lists
otherwise fails the run."""

import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_count_pass as bench  # noqa: E402

ARGS = ["--rows", "2", "--vocab", "3000", "--listed", "100", "--kinds", "ties"]


def _tree(tmp_path, name, edit=None):
    dst = tmp_path / name / "kernels"
    shutil.copytree(bench.REPO / "kernels", dst)
    if edit:
        text = (dst / "cut_select.py").read_text()
        assert text.count(edit[0]) == 1
        (dst / "cut_select.py").write_text(text.replace(*edit))
    return str(dst.parent)


def test_trees_side_by_side_agree(tmp_path, capsys):
    assert bench.main(ARGS + ["--tree", _tree(tmp_path, "copy")]) == 0
    out = capsys.readouterr().out
    rows = [line.split("|")[1:-1] for line in out.splitlines() if line.startswith("| ties |")]
    assert [(r[1].strip(), r[2].strip()) for r in rows] == [("tip", "4096"), ("tip", "none"), ("copy", "4096"),
                                                            ("copy", "none"), ("one amax read (floor)", "")], out
    assert "DIFFER" not in out and "counts or lists differ from the first: 0" in out


def test_a_tree_that_counts_otherwise_fails_the_run(tmp_path, capsys):
    count = "    n += tl.sum(member.to(tl.int32), 1)\n    if FINITE"  # (`_tally`'s: every step's count)
    wrong = _tree(tmp_path, "wrong", (count, count.replace(", 1)", ", 1) * 2")))
    assert bench.main(ARGS + ["--tree", wrong]) == 1
    assert "DIFFER" in capsys.readouterr().out


def test_a_tree_that_lists_otherwise_fails_the_run(tmp_path, capsys):
    value = "tl.sum(tl.where(column == v, p, 0), 1), mask="
    wrong = _tree(tmp_path, "wrong", (value, value.replace(", 1), mask=", ", 1) + 1, mask=")))
    assert bench.main(ARGS + ["--tree", wrong]) == 1
    out = capsys.readouterr().out
    assert [line.split("|")[2].strip() for line in out.splitlines() if "DIFFER" in line] == ["wrong"], out


def test_a_tree_without_the_kernels_names_the_fix(tmp_path):
    with pytest.raises(SystemExit, match="git archive"):
        bench.main(ARGS + ["--tree", str(tmp_path)])
