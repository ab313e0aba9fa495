"""The command line: documented errors, nothing half-written, reproducible artifacts."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from dflash_et import cli
from dflash_et.export import artifact, exporter

ROOT = Path(__file__).resolve().parents[1]

BAD_CONFIGS = [
    ({"program": "heads", "heads": {"vocab_size": 10}, "colour": "red"}, "unknown key colour; valid keys"),
    ({"program": "heads", "heads": {"vocab_size": 10, "vocab": 3}}, "unknown key heads.vocab"),
    ({"program": "heads", "heads": {"vocab_size": "big"}}, "heads.vocab_size must be an integer, got 'big'"),
    ({"program": "heads", "heads": {"vocab_size": 0}}, "heads.vocab_size must be in [1, 1048576], got 0"),
    ({"program": "heads", "heads": {"vocab_size": 10}, "limits": {"max_rows": True}},
     "limits.max_rows must be an integer, got True"),
    ({"program": "heads", "heads": {"vocab_size": 10}, "limits": {"max_rows": 4, "max_owners": 8}},
     "limits.max_owners (8) must not exceed limits.max_rows (4)"),
    ({"program": "heads", "heads": {"vocab_size": 10}, "variant": "beam"},
     "variant must be one of greedy, sampling; got 'beam'"),
    ({"program": "heads", "heads": {"vocab_size": 10}, "logits_dtype": "float64"},
     "logits_dtype must be one of float32, bfloat16, float16; got 'float64'"),
    ({"program": "heads"}, "program: heads needs a heads: section"),
    ({"program": "dflash", "model": {"target": "tiny"}}, "missing key model.drafter"),
    ({"heads": {"vocab_size": 10}}, "missing key program"),
    ([1, 2], "the config must be a mapping of keys"),
]


def _run_cli(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.quick
@pytest.mark.parametrize("data,message", BAD_CONFIGS)
def test_bad_configs_give_the_documented_error(tmp_path, capsys, data, message):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    code, _, err = _run_cli(capsys, "export", "--config", str(path), "--output-dir", str(tmp_path / "out"))
    assert code == 2
    assert message in err
    assert "Traceback" not in err
    assert not (tmp_path / "out").exists()


@pytest.mark.quick
def test_missing_and_malformed_config_files(tmp_path, capsys):
    code, _, err = _run_cli(capsys, "export", "--config", str(tmp_path / "nope.yaml"))
    assert code == 2 and "nope.yaml does not exist" in err and "heads-sampling" in err
    bad = tmp_path / "broken.yaml"
    bad.write_text("program: [heads\n")
    code, _, err = _run_cli(capsys, "export", "--config", str(bad))
    assert code == 2 and "is not valid YAML" in err


@pytest.mark.quick
def test_help_documents_every_command_and_flag(capsys):
    builtin = sorted(p.stem for p in (ROOT / "configs").glob("*.yaml"))
    assert "qwen3-smoke-sampling-cuda" in builtin
    for argv, words in (([], ["export", "check", "run", *builtin]),
                        (["export"], ["--config", "--output-dir", "--force", "--jobs"]),
                        (["check"], ["--config", "--artifact", "--cases", "--seed"]),
                        (["run"], ["--config", "--artifact", "--steps"])):
        with pytest.raises(SystemExit) as e:
            cli.main(argv + ["--help"])
        assert e.value.code == 0
        out = capsys.readouterr().out
        for w in words:
            assert w in out


@pytest.mark.parametrize("jobs", ["0", "-2", "two"])
def test_a_bad_jobs_count_is_refused_with_the_value(capsys, jobs):
    with pytest.raises(SystemExit) as e:
        cli.main(["export", "--config", "heads-greedy", "--jobs", jobs])
    assert e.value.code == 2
    assert f"'{jobs}' is not a positive whole number or auto (e.g. --jobs 4)" in capsys.readouterr().err


@pytest.mark.quick
def test_jobs_is_a_count_or_auto(monkeypatch, capsys):
    from dflash_et.export import exporter

    handed = []
    monkeypatch.setattr(exporter, "export_program", lambda cfg, out, force, jobs: handed.append(jobs))
    for argv, want in (([], None), (["--jobs", "auto"], None), (["--jobs", "3"], 3)):
        assert cli.main(["export", "--config", "heads-greedy", *argv]) == 0
        assert handed.pop() == want


def test_export_is_byte_identical_and_guards_other_configs(make_config, tmp_path, capsys):
    greedy = make_config("greedy", vocab=100)
    other = make_config("greedy", vocab=101)  # another config (a greedy one: its export takes seconds)
    a, b = tmp_path / "a", tmp_path / "b"
    assert _run_cli(capsys, "export", "--config", str(greedy), "--output-dir", str(a))[0] == 0
    err = capsys.readouterr().err
    assert _run_cli(capsys, "export", "--config", str(greedy), "--output-dir", str(b))[0] == 0
    for name in ("model.pte", "config.yaml", "manifest.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    # same config again into the same directory: allowed (idempotent)
    assert _run_cli(capsys, "export", "--config", str(greedy), "--output-dir", str(a))[0] == 0
    # another config: refused without --force, and nothing was touched
    before = (a / "model.pte").read_bytes()
    code, _, err = _run_cli(capsys, "export", "--config", str(other), "--output-dir", str(a))
    assert code == 2 and "different config" in err and "--force" in err
    assert (a / "model.pte").read_bytes() == before
    code, _, err = _run_cli(capsys, "export", "--config", str(other), "--output-dir", str(a), "--force")
    assert code == 0 and (a / "model.pte").read_bytes() != before
    assert "[1/" in err and "done in" in err  # stage progress with timings on stderr


@pytest.mark.quick
def test_check_command_reports_and_exit_codes(make_config, tmp_path, capsys):
    greedy = make_config("greedy", vocab=100)
    sampling = make_config("sampling", vocab=100)
    a = tmp_path / "a"
    assert _run_cli(capsys, "export", "--config", str(greedy), "--output-dir", str(a))[0] == 0
    code, out, _ = _run_cli(capsys, "check", "--config", str(greedy), "--artifact", str(a), "--cases", "5")
    assert code == 0 and "check passed" in out and "dflash_verify_argmax" in out
    code, _, err = _run_cli(capsys, "check", "--config", str(sampling), "--artifact", str(a))
    assert code == 2 and "different config" in err
    code, _, err = _run_cli(capsys, "check", "--config", str(greedy), "--artifact", str(tmp_path / "none"))
    assert code == 2 and "run `dflash-et export` first" in err
    pte = a / "model.pte"
    data = pte.read_bytes()
    pte.write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))
    code, _, err = _run_cli(capsys, "check", "--config", str(greedy), "--artifact", str(a))
    assert code == 2 and "does not match its manifest" in err


def test_a_failed_write_leaves_no_partial_file(make_config, tmp_path, monkeypatch, capsys):
    greedy = make_config("greedy", vocab=100)
    out = tmp_path / "out"
    real_replace = os.replace

    def crash_on_pte(src, dst):
        if str(dst).endswith("model.pte"):
            raise OSError("disk full")
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", crash_on_pte)
    with pytest.raises(OSError):
        exporter.export_program(__import__("dflash_et.export.config", fromlist=["load"]).load(str(greedy)), out)
    assert sorted(p.name for p in out.iterdir()) == []  # no temp file, no manifest, no model.pte


def test_interrupted_export_leaves_no_artifact(make_config, tmp_path):
    config = make_config("sampling", vocab=300)
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [sys.executable, "-m", "dflash_et.cli", "export", "--config", str(config), "--output-dir", str(out)],
        stderr=subprocess.PIPE, text=True,
        # A test run started in the background (`cmd &`) inherits SIGINT ignored, and Python
        # then keeps ignoring it: give the export the default a terminal user has.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    seen = []
    deadline = time.time() + 300
    for line in proc.stderr:  # interrupt in the middle of lowering
        seen.append(line)
        if "lowering" in line or time.time() > deadline:
            break
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    rest = proc.stderr.read()
    assert proc.wait(timeout=120) == 130, "".join(seen) + rest
    assert "interrupted" in rest
    assert not out.exists() or not any(out.iterdir())
    assert not (out / artifact.PTE).exists()



@pytest.mark.quick
def test_an_interrupt_that_torch_turned_into_another_error_still_exits_130(monkeypatch, capsys):
    """torch's C++ argument parsers turn a KeyboardInterrupt they meet into a TypeError that
    names it (seen in CI); the CLI goes by the SIGINT it noted, not by the exception type."""

    def export_interrupted_inside_torch(args):
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)  # the handler raises before this ends
        except KeyboardInterrupt:
            raise TypeError("empty_permuted(): argument 'size' failed to unpack the object at pos 1 with "
                            "error \"KeyboardInterrupt: <EMPTY MESSAGE>\"") from None

    def plain_error(args):
        raise TypeError("a bug, not an interrupt")

    before = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal
    try:
        monkeypatch.setattr(cli, "_main", export_interrupted_inside_torch)
        assert cli.main(["export", "--config", "heads-greedy"]) == 130
        assert "interrupted; nothing half-written" in capsys.readouterr().err
        monkeypatch.setattr(cli, "_main", plain_error)
        with pytest.raises(TypeError, match="a bug"):
            cli.main(["export", "--config", "heads-greedy"])
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, before)
