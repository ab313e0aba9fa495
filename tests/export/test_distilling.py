"""`dflash-et distill` (export/distilling.py): a z-lab checkpoint and an export.yaml that
names it, written whole or not at all; an existing directory is kept unless --force; the
preset target is the same whichever way its drafter comes."""

import json

import pytest
import torch

from dflash_et import cli
from dflash_et.export import config, distilling, models
from dflash_et.export.models import checkpoint_writer

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py
STEPS = ["--steps", "3"]  # the checkpoint's plumbing, not its quality (tests/export/models/test_distill.py)


def _distill(out, *extra):
    return cli.main(["distill", "--config", "tiny-dflash-greedy", "--output-dir", str(out), *STEPS, *extra])


def test_distill_writes_a_checkpoint_that_its_config_exports(tmp_path):
    out = tmp_path / "d"
    assert _distill(out) == 0
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "distill.json", "export.yaml", "model.safetensors"]
    cfg = config.load(str(out / distilling.EXPORT_CONFIG))
    base = config.load("tiny-dflash-greedy")
    assert cfg.model.drafter == str(out) and cfg.model.target == base.model.target and cfg.limits == base.limits
    record = json.loads((out / distilling.RECORD).read_text())
    assert record["recipe"]["steps"] == 3 and len(record["prompts"]) == base.limits.max_owners
    # The preset target is the same with the distilled checkpoint as with its preset drafter
    # (the mask token's embedding row follows the drafter either way), and the drafter is
    # the trained one, not the preset's.
    target, drafter = models.load(cfg.model, cfg.limits)
    preset_target, preset_drafter = models.load(base.model, base.limits)
    for (name, a), b in zip(target.state_dict().items(), preset_target.state_dict().values()):
        assert torch.equal(a, b), name
    assert not all(torch.equal(a, b) for a, b in zip(drafter.parameters(), preset_drafter.parameters()))


def test_an_existing_directory_is_kept_unless_forced(tmp_path, capsys):
    out = tmp_path / "d"
    out.mkdir()
    (out / "mine.txt").write_text("keep")
    assert _distill(out) == 2
    assert "already exists; pass --force" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == ["mine.txt"]
    assert _distill(out, "--force") == 0
    assert not (out / "mine.txt").exists() and (out / "model.safetensors").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["d"]  # no temporary directory left


def test_a_failed_distill_leaves_nothing(tmp_path, monkeypatch):
    def broken(model, directory):
        (directory / "config.json").write_text("{")
        raise OSError("disk full")

    monkeypatch.setattr(checkpoint_writer, "save_drafter", broken)
    with pytest.raises(OSError, match="disk full"):
        _distill(tmp_path / "d")
    assert list(tmp_path.iterdir()) == []


def test_a_heads_config_is_refused(tmp_path, capsys):
    assert cli.main(["distill", "--config", "heads-greedy", "--output-dir", str(tmp_path / "d")]) == 2
    assert "trains a DFlash program's drafter" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
