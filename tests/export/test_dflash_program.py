"""DFlash programs exported, loaded in executorch.runtime and driven through the full
speculative loop: committed tokens equal target-only decoding from the same program,
the eager modules give the same tokens (and drafts) as the .pte, known-right drafts
are all accepted, and checkpoints written as HF / z-lab files export and run."""

import io

import pytest
import torch
import yaml

from dflash_et import cli
from dflash_et.export import artifact, builder, check, config, driver, exporter
from dflash_et.export.models import layers
from dflash_et.lowering.parallel_compile import fingerprint_parts

import checkpoint_writer
from conftest import loads_every_method
from small_models import small_drafter, small_target

CONFIGS = ("tiny-dflash-greedy", "tiny-dflash-sampling")


pytestmark = [
    pytest.mark.usefixtures("one_thread"),  # conftest.py
    pytest.mark.xdist_group("dflash_program"),  # one worker exports the module's program once
]


@pytest.fixture(scope="module")
def tiny(shared_export):
    """`tiny(name)`: (config, artifact directory) of a tiny DFlash config, the run's shared export
    (the C++ runner's too), exported or waited for at first use: this module's greedy tests
    run while another worker exports the sampling program (the parametrized tests are
    grouped by config, greedy first)."""
    return lambda name: (config.load(name), shared_export(name))


def _loop(cfg, directory, seed=0):
    spec = builder.build(cfg)
    program = driver.Program.load(spec, directory)
    owners = driver.scenario(program, seed)
    reference = driver.generate(program, [o.fresh(join=0, leave=None) for o in owners], mode="target_only")
    return spec, program, owners, reference


def test_kv_caches_are_one_shared_buffer_per_program(tiny):
    # The mechanism behind the step loop: every method that touches a cache names the same
    # buffer, planned in the program's shared mutable arena (mem_id 2), not per method.
    from executorch.exir._serialize._program import deserialize_pte_binary

    _, directory = tiny("tiny-dflash-greedy")
    pte = deserialize_pte_binary((directory / artifact.PTE).read_bytes())
    plans = {p.name: p for p in getattr(pte, "program", pte).execution_plan}
    caches = {}
    for name in ("target_prefill", "target_verify", "draft_prefill", "draft_forward"):
        for v in plans[name].values:
            info = getattr(v.val, "extra_tensor_info", None)
            if info is not None and info.fully_qualified_name:
                alloc = v.val.allocation_info
                where = (name, alloc.memory_id, alloc.memory_offset_low)
                caches.setdefault(info.fully_qualified_name, set()).add(where)
    target = {k: v for k, v in caches.items() if k.startswith("target.")}
    drafter = {k: v for k, v in caches.items() if k.startswith("drafter.")}
    assert len(target) == 2 * 4 and len(drafter) == 2 * 1  # K and V per layer
    for where in target.values():
        assert {n for n, _, _ in where} == {"target_prefill", "target_verify"}
        assert len({(m, o) for _, m, o in where}) == 1 and next(iter(where))[1] == 2
    for where in drafter.values():
        assert {n for n, _, _ in where} == {"draft_prefill", "draft_forward"}
        assert len({(m, o) for _, m, o in where}) == 1 and next(iter(where))[1] == 2


def test_the_program_refuses_shapes_past_its_bounds(tiny):
    cfg, directory = tiny("tiny-dflash-greedy")
    program = check.load_program(directory)
    verify = program.load_method("target_verify")
    rows = cfg.limits.max_rows + 1
    with pytest.raises(RuntimeError):
        verify.execute([torch.zeros(rows, dtype=torch.int64), torch.tensor([0, rows]), torch.tensor([0]),
                        torch.tensor([0])])


def _checkpoint_config(tmp_path, target_dir, drafter_dir, variant="greedy", **limits) -> config.ExportConfig:
    data = {"program": "dflash", "backend": "portable", "variant": variant,
            "model": {"target": str(target_dir), "drafter": str(drafter_dir), "dtype": "float32"},
            "limits": {"max_rows": 64, "max_owners": 8, "max_seq_len": 128, **limits}}
    path = tmp_path / f"{variant}.yaml"
    path.write_text(yaml.safe_dump(data))
    return config.load(str(path))


def _traced(spec) -> dict:
    """Each method's traced program as what decides the exported bytes, part by part (every
    graph's code, the signature, every weight, buffer and constant with its bytes): the
    parallel compile's fingerprint of a method."""
    programs = exporter.trace(spec, artifact.Progress(total=99, stream=io.StringIO()))
    return {name: fingerprint_parts(program, []) for name, program in programs.items()}


def test_presets_written_as_checkpoints_trace_the_same_program(tmp_path):
    """tiny + tiny-dflash -> HF Qwen3 and z-lab files -> the real loader -> the same traced
    methods (graphs and tensors, bit for bit) and constants as the presets. The lowering that
    follows is a function of those alone (test_cli.py: the same config exports the same
    bytes), so the program is the same; tracing instead of exporting saves a minute of CI."""
    spec = builder.build(config.load("tiny-dflash-greedy"))
    checkpoint_writer.save_target(spec.methods[0].module.target, tmp_path / "qwen3")
    checkpoint_writer.save_drafter(spec.methods[2].module.drafter, tmp_path / "dflash")
    from_files = builder.build(_checkpoint_config(tmp_path, tmp_path / "qwen3", tmp_path / "dflash"))
    assert from_files.constants == spec.constants and from_files.dims == spec.dims
    assert from_files.constants["target_layer_ids"] == [1, 2] and from_files.constants["program"] == "dflash"
    want, got = _traced(spec), _traced(from_files)
    assert list(got) == list(want)
    for name, parts in want.items():
        assert got[name].keys() == parts.keys(), name
        assert [part for part in parts if got[name][part] != parts[part]] == [], name


def test_llama_checkpoint_round_trip_exports_and_runs(tmp_path):
    rope = layers.Rope(theta=500_000.0, kind="llama3", factor=8.0, original_max_position=16)
    checkpoint_writer.save_target(small_target("llama", tie=False, bias=True, rope=rope, seed=21), tmp_path / "llama")
    checkpoint_writer.save_drafter(small_drafter(block_size=3, taps=(2, 1), seed=22), tmp_path / "dflash")
    cfg = _checkpoint_config(tmp_path, tmp_path / "llama", tmp_path / "dflash", max_rows=20, max_owners=4,
                             max_seq_len=48)
    directory = exporter.export_program(cfg, tmp_path / "art")
    report = io.StringIO()
    assert check.check_artifact(cfg, directory, runs=3, stream=report), report.getvalue()
    spec, program, owners, reference = _loop(cfg, directory, seed=6)
    assert program.constants["block_size"] == 3 and program.constants["hidden_width"] == 64
    run = driver.generate(program, owners, oracle=reference.tokens)
    assert all(a == n for s in run.steps for a, n in zip(s.acceptance, s.rows))
    assert max(n for s in run.steps for n in s.rows) == 3


@pytest.mark.parametrize("name", CONFIGS, scope="module")
def test_every_method_loads_and_the_check_passes(tiny, name):
    cfg, directory = tiny(name)
    program = loads_every_method(cfg, directory)
    assert program.load_method("get_target_layer_ids").execute([])[0].tolist() == [1, 2]
    report = io.StringIO()
    assert check.check_artifact(cfg, directory, runs=4, stream=report), report.getvalue()
    text = report.getvalue()
    for line in ("speculative == target-only", "known-right drafts all accepted", "eager == program"):
        assert f"loop: {line}" in text


@pytest.mark.parametrize("name", CONFIGS, scope="module")
def test_speculative_tokens_equal_target_only_decoding(tiny, name):
    cfg, directory = tiny(name)
    spec, program, owners, reference = _loop(cfg, directory, seed=1)
    run = driver.generate(program, owners)
    assert [ok for _, ok, _ in driver.compare(run, reference)] == [True] * len(owners), driver.compare(run, reference)
    # the scenario did what it says: chunked prefill, a slot reused, owners of both kinds
    assert len(owners[1].prompt) > cfg.limits.max_rows
    assert len(run.tokens["owner2"]) < owners[2].max_new  # left before it was done
    assert run.owners[3].slot == run.owners[2].slot and len(owners[3].prompt) < len(owners[2].prompt)
    assert sum(len(t) for t in run.tokens.values()) > 100
    if cfg.variant == "sampling":
        assert {o.temperature > 0 for o in owners} == {True, False}
        # sampling owners really sample: another seed changes their tokens, not the greedy owner's
        other = driver.generate(program, [o.fresh(seed=o.seed + 1, join=0, leave=None) for o in owners],
                                mode="target_only")
        assert other.tokens["owner0"] == reference.tokens["owner0"]
        assert other.tokens["owner1"] != reference.tokens["owner1"]


@pytest.mark.parametrize("name", CONFIGS, scope="module")
def test_known_right_drafts_are_all_accepted(tiny, name):
    cfg, directory = tiny(name)
    spec, program, owners, reference = _loop(cfg, directory, seed=2)
    run = driver.generate(program, owners, oracle=reference.tokens)
    assert all(ok for _, ok, _ in driver.compare(run, reference))
    pairs = [(a, n) for s in run.steps for a, n in zip(s.acceptance, s.rows)]
    assert all(a == n for a, n in pairs)
    assert sum(n == spec.constants["block_size"] for _, n in pairs) > len(pairs) // 2  # full blocks accepted
    assert run.acceptance_length() > 3.0 > driver.generate(program, owners).acceptance_length()


def test_eager_modules_give_the_same_tokens_and_drafts_as_the_program(tiny):
    cfg, directory = tiny("tiny-dflash-sampling")
    spec = builder.build(cfg)
    owners = driver.scenario(driver.Program.eager(spec), seed=4)
    pte = driver.generate(driver.Program.load(spec, directory), owners)
    eager = driver.generate(driver.Program.eager(spec), owners)
    assert all(ok for _, ok, _ in driver.compare(eager, pte))
    assert driver.compare_drafts(eager, pte) is None


def test_methods_match_eager_call_by_call(tiny):
    # One call of each model method on the same inputs: same tokens, same hidden rows.
    cfg, directory = tiny("tiny-dflash-sampling")
    spec = builder.build(cfg)
    pte, eager = driver.Program.load(spec, directory), driver.Program.eager(spec)
    g = torch.Generator().manual_seed(5)
    rows = {"offsets": torch.tensor([0, 9, 9, 20]), "start_position": torch.tensor([0, 0, 0]),
            "slots": torch.tensor([4, 1, 0])}
    params = {"temperature": torch.tensor([0.0, 0.9, 1.1]), "top_k": torch.tensor([0, 3, 50]),
              "top_p": torch.tensor([1.0, 0.8, 0.7]), "seed": torch.tensor([1, 2, 3])}
    tokens = torch.randint(0, 256, (20,), generator=g)
    got = [p("target_prefill", tokens=tokens, **rows, **params) for p in (pte, eager)]
    assert torch.equal(got[0]["first_token"], got[1]["first_token"]) and got[0]["first_token"][1] == -1
    torch.testing.assert_close(got[0]["hidden"], got[1]["hidden"], rtol=1e-4, atol=1e-4)  # float sums differ
    stored = [p("draft_prefill", hidden=got[0]["hidden"], **rows)["stored"] for p in (pte, eager)]
    assert stored[0].tolist() == stored[1].tolist() == [9, 0, 11]
    step = {"hidden": got[0]["hidden"], "hidden_start": torch.tensor([3, 0, 14]),
            "committed": torch.tensor([0, 0, 2]),
            "pending": got[0]["first_token"].clamp(min=0), "start_position": torch.tensor([9, 0, 11]),
            "slots": rows["slots"]}
    drafts = [p("draft_forward", **step)["drafts"] for p in (pte, eager)]
    assert drafts[0].shape == (3, 3) and torch.equal(drafts[0], drafts[1])
    verify = {"tokens": torch.cat([step["pending"][:1], drafts[0][0], step["pending"][2:], drafts[0][2, :1]]),
              "offsets": torch.tensor([0, 4, 4, 6]), "start_position": step["start_position"], "slots": rows["slots"]}
    out = [p("target_verify", **verify, **params) for p in (pte, eager)]
    for key in ("accepted", "next_token"):
        assert torch.equal(out[0][key], out[1][key]), key
    assert out[0]["next_token"][1] == -1  # an owner without rows
    torch.testing.assert_close(out[0]["hidden"], out[1]["hidden"], rtol=1e-4, atol=1e-4)


def test_run_command_prints_tokens_and_statistics(tiny, capsys):
    cfg, directory = tiny("tiny-dflash-sampling")
    assert cli.main(["run", "--config", "tiny-dflash-sampling", "--artifact", str(directory), "--steps", "6"]) == 0
    out = capsys.readouterr().out
    assert "owner0 committed" in out and "T=0.8 top_k=40 top_p=0.9" in out
    assert "tokens/step" in out and "mean acceptance length" in out and "ms/step" in out
    assert "committed tokens equal target-only decoding; with known-right drafts" in out
    assert len([line for line in out.splitlines() if line[:4].strip().isdigit()]) == 6  # one line per step
    code = cli.main(["run", "--config", "heads-greedy", "--artifact", str(directory)])
    assert code == 2 and "dflash-et run drives a DFlash program" in capsys.readouterr().err
    code = cli.main(["run", "--config", "tiny-dflash-greedy", "--artifact", str(directory)])
    assert code == 2 and "different config" in capsys.readouterr().err
