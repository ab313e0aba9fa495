"""A DFlash program over a Qwen3.5 hybrid target (issue #27): a checkpoint transformers
writes at test time, a z-lab-format drafter of its width, exported to a portable
ExecuTorch program and driven through the speculative loop with packed owners that join,
leave, chunk their prompts and reuse a slot. Every owner's committed tokens equal
transformers' own `generate(do_sample=False)`, with random drafts (nearly all rejected),
known-right drafts (whole blocks committed) and drafts that go wrong part-way (a verify's
recurrent state kept for exactly the accepted rows); also in the C++ runner."""

import io
import subprocess

import dflash_reference as ref
import pytest
import torch
import yaml

import hf_reference
import runner_cli
from conftest import DEVICE
from graph_program import graph_program

from dflash_et.export import artifact, builder, check, config, driver, exporter, models
from dflash_et.lowering.cuda import prepare, traced_fused
from dflash_et.export.models import Drafter, DrafterConfig, checkpoint_writer, layers, presets

pytestmark = [
    pytest.mark.usefixtures("one_thread"),  # conftest.py
    pytest.mark.xdist_group("hybrid_program"),  # one worker exports the module's program once
]

VOCAB, BLOCK = 101, 4
LIMITS = {"max_rows": 16, "max_owners": 4, "max_seq_len": 64}  # 4 owners x 1 block per verify call


def _config(tmp_path, variant: str, backend: str = "portable") -> config.ExportConfig:
    data = {"program": "dflash", "backend": backend, "variant": variant,
            "model": {"target": str(tmp_path / "target"), "drafter": str(tmp_path / "drafter"), "dtype": "float32"},
            "limits": LIMITS}
    path = tmp_path / f"{variant}-{backend}.yaml"
    path.write_text(yaml.safe_dump(data))
    return config.load(str(path))


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """(directory, transformers model): a 2-layer hybrid (DeltaNet, then gated attention) and
    a random drafter tapping both layers, as checkpoints; the drafter's first layer is a
    sliding-window one, as in z-lab's drafters for these targets."""
    base = tmp_path_factory.mktemp("hybrid")
    model, _ = hf_reference.qwen3_5_model(seed=31, vocab=VOCAB, layers=2)
    model.save_pretrained(base / "target")
    cfg = DrafterConfig(hidden_size=64, intermediate_size=96, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
                        block_size=BLOCK, target_layer_ids=(0, 1), mask_token_id=VOCAB - 1,
                        rope=layers.Rope(theta=10_000.0), layer_types=("sliding_attention", "full_attention"),
                        sliding_window=6)
    checkpoint_writer.save_drafter(presets.init_drafter(Drafter(cfg, 1, 16), seed=32), base / "drafter")
    return base, model


@pytest.fixture(scope="module")
def exported(pair):
    base, _ = pair
    cfg = _config(base, "greedy")
    return cfg, exporter.export_program(cfg, base / "greedy")


def _owners(program) -> list[driver.Owner]:
    """driver.scenario's owners: joins at steps 0-4, a prompt of max_rows + 6 tokens (two
    prefill calls), an owner leaving early, a later joiner in its slot."""
    return driver.scenario(program, seed=3, owners=5)


def _want(model, owners: list[driver.Owner], run: driver.Run) -> dict[str, list[int]]:
    """transformers' greedy tokens per owner, cut to what the owner committed (one that
    leaves early commits a prefix)."""
    return {o.name: hf_reference.greedy(model, o.prompt, o.max_new)[:len(run.tokens[o.name])] for o in owners}


def test_the_program_commits_transformers_greedy_tokens(pair, exported):
    _, model = pair
    cfg, directory = exported
    program = driver.Program.load(builder.build(cfg), directory)
    owners = _owners(program)
    assert any(o.leave is not None for o in owners) and max(len(o.prompt) for o in owners) > LIMITS["max_rows"]
    # (an owner that leaves early has committed as many tokens as its steps gave it: a prefix)
    right = {o.name: hf_reference.greedy(model, o.prompt, o.max_new) for o in owners}
    runs = {mode: driver.generate(program, owners, mode=mode) for mode in ("target_only", "speculative")}
    # known-right drafts: whole blocks committed
    runs["right drafts"] = driver.generate(program, owners, oracle=right)
    # drafts right up to a wrong one: partial commits, the recurrent state kept for exactly those rows
    wrong = {name: [(t + 1) % VOCAB if i % 3 == 2 else t for i, t in enumerate(tokens)] for name, tokens in right.items()}
    runs["drafts wrong at every third"] = driver.generate(program, owners, oracle=wrong)
    for mode, run in runs.items():
        assert run.tokens == {name: tokens[:len(run.tokens[name])] for name, tokens in right.items()}, mode
        assert all(len(run.tokens[o.name]) == o.max_new for o in owners if o.leave is None), mode
    assert max(a for s in runs["right drafts"].steps for a in s.acceptance) == BLOCK
    accepted = {a for s in runs["drafts wrong at every third"].steps for a in s.acceptance}
    assert accepted & set(range(2, BLOCK)), accepted  # commits of more than one row and fewer than a block


@torch.no_grad()
def test_drafts_are_z_labs_step_for_step(pair, exported):
    """One owner, drafts right up to every third token: each step's drafts are z-lab's DFlash
    forward (tests/dflash_reference.py, float64) over transformers' hidden states of the
    committed tokens. So the taps of deferred verify rows reach the drafter's context right."""
    _, model = pair
    cfg, directory = exported
    program = driver.Program.load(builder.build(cfg), directory)
    owner = driver.Owner("solo", [7, 3, 58, 21, 90, 4], 20)
    right = hf_reference.greedy(model, owner.prompt, owner.max_new)
    run = driver.generate(program, [owner], oracle={"solo": [(t + 1) % VOCAB if i % 3 == 2 else t
                                                              for i, t in enumerate(right)]})
    assert run.tokens["solo"] == right
    drafter, target = models.load_drafter(cfg.model, cfg.limits), models.load_target(cfg.model, cfg.limits)
    seq = owner.prompt + right
    hidden = model(torch.tensor([seq]), output_hidden_states=True).hidden_states  # layer i's output: [i + 1]
    context = torch.cat([hidden[i + 1][0] for i in drafter.cfg.target_layer_ids], dim=-1)
    done = 1  # tokens committed before the step (target_prefill's first)
    for step in [s for s in run.steps if s.owners]:
        start = len(owner.prompt) + done - 1  # the pending token's position
        want = ref.drafter_logits(drafter, target, context[:start], seq[start], start).argmax(-1).tolist()
        assert step.drafts[0] == want, (len(owner.prompt), done)
        done += step.acceptance[0]
    assert {a for s in run.steps for a in s.acceptance} & set(range(2, BLOCK + 1))


def test_the_check_command_passes(exported):
    cfg, directory = exported
    report = io.StringIO()
    assert check.check_artifact(cfg, directory, runs=2, stream=report), report.getvalue()
    for line in ("speculative == target-only", "known-right drafts all accepted", "eager == program"):
        assert f"loop: {line}" in report.getvalue()


def test_the_sampling_variant_commits_target_only_tokens(pair):
    """The sampling program's modules (eager: its export is the greedy one's plus the heads
    the Llama programs test): speculative decoding under mixed sampling parameters commits
    what target-only decoding does, and its greedy owners transformers' tokens."""
    base, model = pair
    program = driver.Program.eager(builder.build(_config(base, "sampling")))
    owners = _owners(program)
    assert {o.temperature > 0 for o in owners} == {True, False}
    reference = driver.generate(program, owners, mode="target_only")
    assert driver.generate(program, owners).tokens == reference.tokens
    greedy = [o for o in owners if o.temperature == 0]
    assert {o.name: reference.tokens[o.name] for o in greedy} == _want(model, greedy, reference)


def test_a_cuda_export_fuses_every_recurrence_and_commits_transformers_tokens(pair):
    """backend: cuda. The methods traced as a CUDA export traces them (`traced_fused`) and
    prepared: each DeltaNet layer's two recurrences (the commit of the pending rows, the
    call's own rows) are one `dflash::delta_rows` call each, no scan is left (ExecuTorch's
    CUDA partitioner cannot take one), and the rewritten graphs, run here through the Triton
    interpreter, commit transformers' greedy tokens with drafts wrong at every third token
    (partial commits: the deferred rows replayed by the op). Six steps: the interpreter is
    slow, and they cover prefill chunks, joins and commits of one to several rows."""
    base, model = pair
    cfg = _config(base, "greedy", backend="cuda")
    spec = builder.build(cfg)
    with traced_fused(spec, cfg):
        programs = exporter.trace(spec, artifact.Progress(99, stream=io.StringIO()), device="cpu")
    report = prepare(programs, spec, cfg)
    linear = model.config.layer_types.count("linear_attention")
    for name in ("target_prefill", "target_verify"):
        ops = [str(n.target) for n in programs[name].graph.nodes if n.op == "call_function"]
        assert ops.count("dflash.delta_rows.default") == 2 * linear, (name, ops)
        assert len([r for r in report[name] if r.startswith("delta_rows@")]) == 2 * linear, report[name]
        assert not any("scan" in op or "head_boundary" in op for op in ops), name
    graphs = graph_program(spec, programs, device=DEVICE)
    owners = _owners(graphs)
    right = {o.name: hf_reference.greedy(model, o.prompt, o.max_new) for o in owners}
    wrong = {name: [(t + 1) % VOCAB if i % 3 == 2 else t for i, t in enumerate(tokens)]
             for name, tokens in right.items()}
    run = driver.generate(graphs, owners, oracle=wrong, max_steps=6)
    assert run.tokens == {name: tokens[:len(run.tokens[name])] for name, tokens in right.items()}
    accepted = {a for s in run.steps for a in s.acceptance}
    assert accepted & set(range(2, BLOCK)), accepted  # commits of more than one row and fewer than a block


@pytest.mark.skipif(runner_cli.missing_toolchain() is not None, reason=str(runner_cli.missing_toolchain()))
def test_the_cpp_runner_commits_transformers_greedy_tokens(pair, exported, tmp_path):
    """The runner drives the hybrid program as any other (the contract is the same)."""
    _, model = pair
    cfg, directory = exported
    owners = _owners(driver.Program.load(builder.build(cfg), directory))
    runner = runner_cli.build(tmp_path / "build")
    for flags in ([], ["--target-only"]):
        done = subprocess.run([str(runner), "--program", str(directory / "model.pte"), *flags,
                               *runner_cli.owner_args(owners)], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        got = runner_cli.parse(done.stdout)["tokens"]
        want = {i: hf_reference.greedy(model, o.prompt, o.max_new)[:len(got[i])] for i, o in enumerate(owners)}
        assert got == want, flags
        assert all(len(got[i]) == o.max_new for i, o in enumerate(owners) if o.leave is None), flags
