"""CPU programs: every config exports, every method loads and runs in executorch.runtime
(a missing portable kernel only shows at load time), and matches the eager reference."""

import dataclasses
import io
import json

import pytest
import torch
from conftest import loads_every_method, small_config

from dflash_et.export import artifact, check, config, exporter

pytestmark = pytest.mark.xdist_group("programs")  # one worker exports the built-in programs once


@pytest.fixture(scope="module")
def builtin_artifacts(tmp_path_factory):
    out = {}
    for name in ("heads-greedy", "heads-sampling"):
        cfg = config.load(name)
        out[name] = (cfg, exporter.export_program(cfg, tmp_path_factory.mktemp(name)))
    return out


@pytest.mark.parametrize("name", ["heads-greedy", "heads-sampling"])
def test_builtin_configs_export_load_and_match_eager(builtin_artifacts, name):
    cfg, directory = builtin_artifacts[name]
    loads_every_method(cfg, directory)
    report = io.StringIO()
    assert check.check_artifact(cfg, directory, runs=6, stream=report), report.getvalue()


SMALL_VOCAB = 257
SMALL_LIMITS = {"max_rows": 64, "max_owners": 16}


@pytest.fixture(scope="module")
def small_vocab_programs(tmp_path_factory):
    """`get(variant, dtype)`: a heads program of vocab SMALL_VOCAB with SMALL_LIMITS, exported
    once per module (the shape-bounds test reads the float16 sampling one)."""
    made = {}

    def get(variant: str, dtype: str):
        if (variant, dtype) not in made:
            base = tmp_path_factory.mktemp(f"{variant}-{dtype}")
            cfg = config.load(str(small_config(base, variant, vocab=SMALL_VOCAB, logits_dtype=dtype, **SMALL_LIMITS)))
            made[variant, dtype] = (cfg, exporter.export_program(cfg, base / "art"))
        return made[variant, dtype]

    return get


@pytest.mark.parametrize("variant,dtype", [("sampling", "bfloat16"), ("sampling", "float16"), ("greedy", "bfloat16")])
def test_small_vocab_programs_in_every_logits_dtype(small_vocab_programs, variant, dtype):
    cfg, directory = small_vocab_programs(variant, dtype)
    report = io.StringIO()
    assert check.check_artifact(cfg, directory, runs=15, stream=report), report.getvalue()


def test_program_runs_at_the_shape_bounds(small_vocab_programs):
    _, directory = small_vocab_programs("sampling", "float16")
    program = check.load_program(directory)
    verify = program.load_method("dflash_verify")
    from dflash_et.export import heads

    v, max_rows, max_owners = SMALL_VOCAB, SMALL_LIMITS["max_rows"], SMALL_LIMITS["max_owners"]
    for rows, owners in ((1, 1), (max_rows, max_owners), (max_rows, 1), (3, 2)):
        g = torch.Generator().manual_seed(rows * 100 + owners)
        logits = torch.randn(rows, v, generator=g).to(torch.float16)
        tokens = torch.randint(0, v, (rows,), generator=g)
        offsets = torch.linspace(0, rows, owners + 1).round().long()
        params = [torch.arange(owners), torch.full((owners,), 0.9), torch.full((owners,), 10),
                  torch.full((owners,), 0.95), torch.arange(owners) + 7]
        got = verify.execute([logits, tokens, offsets, *params])
        want = heads.DFlashVerify()(logits, tokens, offsets, *params)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    past = max_rows + 1
    with pytest.raises(RuntimeError):  # past the bound: refused, not out of bounds
        verify.execute([torch.randn(past, v).to(torch.float16), torch.zeros(past, dtype=torch.int64),
                        torch.tensor([0, past]), *params[:1], *[p[:1] for p in params[1:]]])


def test_manifest_describes_the_program(builtin_artifacts):
    cfg, directory = builtin_artifacts["heads-sampling"]
    manifest = json.loads((directory / artifact.MANIFEST).read_text())
    assert manifest["config_digest"] == cfg.digest()
    assert set(manifest["methods"]) == {"dflash_verify", "sample_rows"}
    verify = manifest["methods"]["dflash_verify"]
    assert [i["name"] for i in verify["inputs"]] == [
        "logits", "tokens", "offsets", "start_position", "temperature", "top_k", "top_p", "seed"]
    assert verify["inputs"][0] == {"name": "logits", "dtype": "float32", "shape": ["rows", 32000]}
    assert verify["outputs"] == [
        {"name": "accepted", "dtype": "int64", "shape": ["owners"]},
        {"name": "next_token", "dtype": "int64", "shape": ["owners"]}]
    assert manifest["dims"]["rows"] == {"min": 1, "max": 256}
    assert manifest["constants"]["get_vocab_size"] == 32000
    assert manifest["files"]["model.pte"]["sha256"] == artifact.sha256((directory / "model.pte").read_bytes())
    assert {"torch", "executorch", "dflash_et"} <= set(manifest["versions"])
    assert (directory / artifact.CONFIG).read_text() == cfg.to_yaml()


def test_check_fails_loudly_on_a_wrong_program(builtin_artifacts, monkeypatch):
    # A reference that disagrees with the program must make the check fail, with a report.
    cfg, directory = builtin_artifacts["heads-greedy"]
    from dflash_et.export import heads

    class OffByOne(heads.DFlashVerifyArgmax):
        def forward(self, logits, tokens, offsets):
            accepted, next_token = super().forward(logits, tokens, offsets)
            return accepted, torch.where(next_token >= 0, next_token + 1, next_token)

    monkeypatch.setitem(heads.HEADS, "dflash_verify_argmax",
                        dataclasses.replace(heads.HEADS["dflash_verify_argmax"], module=OffByOne))
    report = io.StringIO()
    assert not check.check_artifact(cfg, directory, runs=4, stream=report)
    assert "MISMATCH" in report.getvalue() and "check FAILED" in report.getvalue()
