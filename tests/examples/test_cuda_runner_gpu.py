"""CUDA programs in ExecuTorch's C++ runtime: the CUDA build of examples/cpp/dflash_runner
(ExecuTorch 1.2.0's CUDA backend with our share-constants patch) drives `model.pte` +
`aoti_cuda_blob.ptd`. Skipped without a GPU or without DFLASH_CUDA_RUNNER (the runner's
path); `scripts/gpu-checks.sh runtime` builds the runner and runs this file.

- State crosses methods on the GPU: target_verify reads the KV cache target_prefill wrote.
  Without the sharing (`--no-shared-state`) the same run commits other tokens.
- float32 exports commit exactly the tokens of the float32 CPU reference (the eager modules
  with the ATen heads, which the CPU program equals: tests/export/test_dflash_program.py), for both
  variants and for the sampling variant with the plain ATen heads compiled by AOTInductor
  (`lowering.fused_verify: false`), with owners of mixed sampling parameters that join and
  leave at different steps and a prompt longer than max_rows (chunked prefill); speculative and target-only. Their
  drafter is distilled on these owners' prompts (`dflash-et distill`), so greedy owners'
  drafts are accepted and steps commit several rows. `sampling-f32-attn-pieces`: the fused
  attention in slots of 4096 cells, so in pieces (the empty ones, the combine) inside
  AOTInductor's program (not in the default set of `scripts/gpu-checks.sh runtime`).
- bfloat16 exports against the eager bfloat16 modules on the same GPU: teacher-forced, the
  eager modules decide at least AGREE of the runner's tokens the same (the rest: compiled
  and eager bf16 round differently; counted, reported).
- Bad input to the CUDA runner: a clear message and exit status 2.
- Timings of every method from the runner (--timing) go to $DFLASH_TIMING_OUT when set.

DFLASH_RUNTIME_EXPORTS (names of EXPORTS, comma-separated; default all) exports only those
programs; a test that needs another one is skipped, so one device call can check one export.
DFLASH_EXPORT_JOBS: the CUDA exports' `--jobs` (default 1).
"""

import dataclasses
import functools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import runner_cli
import teacher_forcing
import torch
import yaml

from dflash_et.export import builder, config, distilling, driver

RUNNER = os.environ.get("DFLASH_CUDA_RUNNER", "")
ROOT = Path(__file__).resolve().parents[2]
EXIT_BAD_INPUT = 2
AGREE = 0.9  # bfloat16: the share of the runner's tokens the eager modules decide the same

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(not RUNNER, reason="DFLASH_CUDA_RUNNER (scripts/build-cuda-runner.sh's runner) is not set"),
]

# name -> (built-in config, model dtype, backend, drafter distilled on the float32 checks' prompts,
# lowering.fused_verify, lowering.fused_attention, lowering.zero_constants)
HYBRID = "qwen3.5 hybrid"
EXPORTS = {
    "sampling-f32": ("tiny-dflash-sampling-cuda", "float32", "cuda", True, True, False, False),
    "greedy-f32": ("tiny-dflash-greedy-cuda", "float32", "cuda", True, True, False, False),
    "greedy-f32-zeros": ("tiny-dflash-greedy-cuda", "float32", "cuda", True, True, False, True),
    "sampling-f32-unfused": ("tiny-dflash-sampling-cuda", "float32", "cuda", True, False, False, False),
    "sampling-f32-attn": ("tiny-dflash-sampling-cuda", "float32", "cuda", True, True, True, False),
    "sampling-f32-attn-pieces": ("tiny-dflash-sampling-cuda", "float32", "cuda", True, True, True, False),
    "sampling-bf16": ("tiny-dflash-sampling-cuda", "bfloat16", "cuda", False, True, False, False),
    "greedy-cpu": ("tiny-dflash-greedy-cuda", "float32", "portable", False, True, False, False),
    "hybrid-f32": (HYBRID, "float32", "cuda", False, True, False, False),  # a Qwen3.5 hybrid target (_hybrid_pair)
}
F32_SEED = 5  # the float32 checks' owners (driver.scenario): the prompts the drafter is distilled on
# limits an export changes: slots of 4096 cells, so that the fused attention runs in pieces (4 at most;
# kernels/cached_attention.py), the pieces past the owners' short cells empty, and their combine
LIMITS = {"sampling-f32-attn-pieces": {"max_seq_len": 4096}}


def _selected() -> list[str]:
    """DFLASH_RUNTIME_EXPORTS' names (default: every export); an unknown name stops the run."""
    names = [n.strip() for n in os.environ.get("DFLASH_RUNTIME_EXPORTS", "").split(",") if n.strip()]
    unknown = sorted(set(names) - set(EXPORTS))
    if unknown:
        raise pytest.UsageError(f"DFLASH_RUNTIME_EXPORTS names {unknown}; the exports are {sorted(EXPORTS)}")
    return names or list(EXPORTS)


def _config(name: str) -> config.ExportConfig:
    base, dtype, backend, distilled, fused, attention, zeros = EXPORTS[name]
    if base == HYBRID:
        return _hybrid_config(backend)
    cfg = config.load(base)
    model = dataclasses.replace(cfg.model, dtype=dtype, drafter=_distilled() if distilled else cfg.model.drafter)
    lowering = dataclasses.replace(cfg.lowering, fused_verify=fused, fused_attention=attention, zero_constants=zeros)
    limits = dataclasses.replace(cfg.limits, **LIMITS.get(name, {}))
    return dataclasses.replace(cfg, backend=backend, model=model, lowering=lowering, limits=limits)


@functools.cache
def _hybrid_pair() -> Path:
    """A random Qwen3.5 hybrid target (a DeltaNet layer, then gated attention) and a drafter
    tapping both (its first layer sliding-window), as tests/export/test_hybrid_program.py's,
    written by our writers: this machine has no transformers (checkpoint_writer's test shows
    transformers reads what save_hybrid_target writes)."""
    from dflash_et.export.models import Drafter, DrafterConfig, checkpoint_writer, layers, presets, qwen3_5

    base = Path(tempfile.mkdtemp(prefix="dflash-hybrid-"))
    cfg = qwen3_5.HybridConfig(vocab_size=101, hidden_size=64, intermediate_size=96, num_layers=2, num_heads=4,
                               num_kv_heads=2, head_dim=16, layer_types=("linear_attention", "full_attention"),
                               linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
                               linear_value_head_dim=8, rope_theta=10_000.0)
    torch.manual_seed(31)
    target = qwen3_5.HybridTarget(cfg, slots=1, max_seq_len=16, max_rows=16)
    with torch.no_grad():  # (norms start at 0 / 1, A_log at 0: perturb every weight)
        for p in target.parameters():
            p.add_(0.1 * torch.randn_like(p))
    checkpoint_writer.save_hybrid_target(target, base / "target")
    drafter = DrafterConfig(hidden_size=64, intermediate_size=96, num_layers=2, num_heads=4, num_kv_heads=2,
                            head_dim=16, block_size=4, target_layer_ids=(0, 1), mask_token_id=100,
                            rope=layers.Rope(theta=10_000.0), layer_types=("sliding_attention", "full_attention"),
                            sliding_window=6)
    checkpoint_writer.save_drafter(presets.init_drafter(Drafter(drafter, 1, 16), seed=32), base / "drafter")
    return base


def _hybrid_config(backend: str) -> config.ExportConfig:
    base = _hybrid_pair()
    path = base / f"{backend}.yaml"
    path.write_text(yaml.safe_dump({
        "program": "dflash", "backend": backend, "variant": "greedy",
        "model": {"target": str(base / "target"), "drafter": str(base / "drafter"), "dtype": "float32"},
        "limits": {"max_rows": 16, "max_owners": 4, "max_seq_len": 64}}))
    return config.load(str(path))


@functools.cache
def _distilled() -> str:
    """The tiny drafter distilled (`dflash-et distill`) on the greedy text of the float32
    checks' prompts: their greedy owners commit whole blocks, so the runner's commits of
    several rows per step run (a random drafter's drafts are rejected)."""
    cfg = config.load(EXPORTS["greedy-f32"][0])  # the float32 exports' limits, target and drafter
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, dtype="float32"))
    out = Path(tempfile.mkdtemp(prefix="dflash-distilled-")) / "drafter"
    return str(distilling.distill_checkpoint(cfg, out, seed=F32_SEED, say=lambda text: None))


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """Every selected export of EXPORTS (DFLASH_RUNTIME_EXPORTS), as parallel processes:
    name -> directory, or the log of a failed export (the tests that need it fail with it).
    Wall times are printed. The CUDA exports compile their methods in DFLASH_EXPORT_JOBS
    worker processes (default 1: the exports run side by side). Each export gets its own
    inductor cache: side by side in one cache, two compiles of the same kernel raced (one link step found another's object files gone: `ld: cannot find ...fatbin.o`)."""
    base = tmp_path_factory.mktemp("cuda_runner")
    jobs = {}
    for name in _selected():
        path = base / f"{name}.yaml"
        path.write_text(_config(name).to_yaml())
        cmd = [sys.executable, "-m", "dflash_et.cli", "export", "--config", str(path), "--output-dir", str(base / name)]
        if EXPORTS[name][2] == "cuda":
            cmd += ["--jobs", os.environ.get("DFLASH_EXPORT_JOBS", "1")]
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(base / f"inductor-{name}")}
        # The log is written as the export runs: a call cut short still shows how far it got.
        log_path = Path(os.environ.get("DFLASH_LOG_DIR") or base) / f"export-{name}.log"
        with open(log_path, "w") as log:
            jobs[name] = (time.perf_counter(), log_path,
                          subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env))
    out = {}
    for name, (start, log_path, job) in jobs.items():
        job.wait()
        seconds = time.perf_counter() - start
        log = log_path.read_text(errors="replace")
        if job.returncode != 0:
            out[name] = f"exporting {name} failed:\n{log[-4000:]}"
            print(f"\nexport {name}: FAILED after {seconds:.0f} s")
            continue
        out[name] = base / name
        sizes = {p.name: p.stat().st_size for p in out[name].iterdir() if p.suffix in (".pte", ".ptd")}
        print(f"\nexport {name}: {seconds:.0f} s (side by side with {len(jobs) - 1} others), {sizes}")
    return out


class Artifacts:
    def __init__(self, exports: dict):
        self.exports = exports

    def __getitem__(self, name: str) -> Path:
        if name not in self.exports:
            pytest.skip(f"{name} is not exported in this run (DFLASH_RUNTIME_EXPORTS)")
        found = self.exports[name]
        if not isinstance(found, Path):
            pytest.fail(found)
        return found


@pytest.fixture(scope="module")
def artifacts(exports):
    return Artifacts(exports)


def _eager(name: str, device: str) -> driver.Program:
    """The config's own modules (ATen heads) on `device`; inputs in, outputs back on the CPU."""
    spec = builder.build(dataclasses.replace(_config(name), backend="portable"))
    table = {m.name: m.module.eval().to(device) for m in spec.methods}

    def call(method, args):
        with torch.no_grad():
            out = table[method](*[a.to(device) for a in args])
        return [t.cpu() for t in (out if isinstance(out, tuple) else (out,))]

    return driver.Program(spec, call)


def _run(*args) -> subprocess.CompletedProcess:
    return subprocess.run([RUNNER, *map(str, args)], capture_output=True, text=True, timeout=300)


def _runner(artifacts, name: str, owners: list[driver.Owner], *extra: str) -> dict:
    d = artifacts[name]
    done = _run("--program", d / "model.pte", "--data", d / "aoti_cuda_blob.ptd", *extra,
                *runner_cli.owner_args(owners))
    assert done.returncode == 0, f"runner failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    return runner_cli.parse(done.stdout)


def _owners(program: driver.Program, seed: int) -> list[driver.Owner]:
    """driver.scenario's 8 owners: mixed sampling parameters (greedy in a greedy program),
    joins at steps 0-4, a leave, a prompt of max_rows + 6 tokens (two prefill calls), a
    later joiner reusing a freed slot."""
    return [o.fresh(name=f"owner{i}") for i, o in enumerate(driver.scenario(program, seed=seed, owners=8))]


def _same_as_cpu(artifacts, name: str, program: driver.Program, owners: list[driver.Owner], mode: str,
                 *flags: str) -> tuple[dict, driver.Run]:
    """The runner's run of export `name` (with `flags`) against the CPU reference's run in
    `mode`: every owner's tokens and every step's acceptance are the same (printed)."""
    want = driver.generate(program, owners, mode=mode)
    got = _runner(artifacts, name, owners, *flags)
    differ = _differing(got, want, owners)
    tokens = sum(len(t) for t in got["tokens"].values())
    print(f"\nfloat32 {name} {mode} {' '.join(flags)}: C++ CUDA runner vs CPU reference: "
          f"{len(owners) - len(differ)}/{len(owners)} owners identical over {tokens} tokens, "
          f"steps {len(got['steps'])}"
          + (f"; graphs {got['cuda_graphs']}" if got["cuda_graphs"] else ""))
    assert differ == [], differ
    assert got["steps"] == [s.acceptance for s in want.steps]
    return got, want


def _differing(got: dict, want: driver.Run, owners: list[driver.Owner]) -> list[str]:
    out = []
    for i, o in enumerate(owners):
        a, b = got["tokens"][i], want.tokens[o.name]
        if a != b:
            at = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            out.append(f"owner {i} ({o.describe()}): first difference at token {at}: {a[at:at + 4]} vs {b[at:at + 4]}")
    return out


def test_target_verify_reads_the_cache_target_prefill_wrote(artifacts):
    """Prefill writes the KV cache in target_prefill's AOTInductor library; the first verify of
    the pending token reads it from target_verify's. With the methods' state shared, the
    tokens are the CPU reference's; with it private (--no-shared-state), verify sees an empty
    cache and the tokens after the first (which prefill decides) differ."""
    program = _eager("greedy-f32", "cpu")
    owners = [driver.Owner("owner0", [3, 141, 59, 26, 53, 58, 97, 93], 12)]
    want = driver.generate(program, owners, mode="target_only").tokens["owner0"]
    shared = _runner(artifacts, "greedy-f32", owners, "--target-only")["tokens"][0]
    private = _runner(artifacts, "greedy-f32", owners, "--target-only", "--no-shared-state")["tokens"][0]
    print(f"\nshared state: {shared}\nprivate state: {private}\nCPU reference: {want}")
    assert shared == want
    assert private[0] == want[0] and private != want


@pytest.mark.parametrize("name", ["greedy-f32", "sampling-f32", "sampling-f32-unfused", "sampling-f32-attn",
                                  "sampling-f32-attn-pieces"])
def test_float32_commits_the_cpu_reference_tokens(artifacts, name):
    artifacts[name]  # skipped when not exported in this run
    program = _eager(name, "cpu")
    owners = _owners(program, seed=F32_SEED)
    for mode, flags in (("speculative", ["--drafts"]), ("target_only", ["--target-only"])):
        got, want = _same_as_cpu(artifacts, name, program, owners, mode, *flags)
        if mode == "speculative":
            drafts = [s.drafts for s in want.steps if s.owners]
            same = sum(a == b for a, b in zip(got["drafts"], drafts))
            rows = [a for s in want.steps for a in s.acceptance]
            print(f"  drafts identical in {same}/{len(drafts)} steps; mean acceptance {sum(rows) / len(rows):.2f}")
            assert max(rows) == program.constants["block_size"]  # whole blocks committed: real drafts


def test_caches_left_out_of_the_blob_are_zeroed_at_load(artifacts):
    """`lowering.zero_constants` (lowering/zero_constants.py): the caches are not in the .ptd (it
    is smaller than greedy-f32's by their bytes at least), the runner's zero-constants patch
    allocates and zeroes them at load, and the tokens are the CPU reference's, speculative and
    target-only, the methods' state shared as ever."""
    d = artifacts["greedy-f32-zeros"]
    program = _eager("greedy-f32-zeros", "cpu")
    caches = {}
    for m in builder.build(_config("greedy-f32-zeros")).methods:
        caches.update({n: b.nbytes for n, b in m.module.named_buffers() if b.numel() and not bool(b.any())})
    full = artifacts["greedy-f32"] / "aoti_cuda_blob.ptd"
    saved = full.stat().st_size - (d / "aoti_cuda_blob.ptd").stat().st_size
    print(f"\ngreedy-f32-zeros: .ptd {saved} bytes smaller than greedy-f32's; {len(caches)} zero buffers, "
          f"{sum(caches.values())} bytes")
    assert caches and saved >= sum(caches.values())
    owners = _owners(program, seed=F32_SEED)
    for mode, flags in (("speculative", ["--drafts"]), ("target_only", ["--target-only"])):
        _same_as_cpu(artifacts, "greedy-f32-zeros", program, owners, mode, *flags)


@pytest.mark.parametrize("name", ["greedy-f32", "sampling-f32-attn"])
def test_cuda_graphs_commit_the_same_tokens(artifacts, name):
    """--cuda-graphs (cuda/executorch-v1.2.0-cuda-graphs.patch): each method's calls replayed as
    CUDA graphs commit the CPU reference's tokens, speculative and target-only, and graphs were
    captured and replayed (a backend that captured nothing would pass the token check alone)."""
    artifacts[name]
    program = _eager(name, "cpu")
    owners = _owners(program, seed=F32_SEED)
    for mode, flags in (("speculative", ["--drafts"]), ("target_only", ["--target-only"])):
        got, _ = _same_as_cpu(artifacts, name, program, owners, mode, "--cuda-graphs", *flags)
        graphs = got["cuda_graphs"]
        assert graphs is not None and graphs["captured"] >= 1 and graphs["replayed"] >= 1, graphs


def test_a_hybrid_target_commits_the_cpu_reference_tokens(artifacts):
    """A Qwen3.5 hybrid target (issue #27) in a CUDA program, its recurrence `dflash::delta_rows`
    (a verify defers the state, the next call commits the accepted rows): the runner commits
    the CPU program's tokens, speculative, target-only and with --cuda-graphs."""
    artifacts["hybrid-f32"]
    program = _eager("hybrid-f32", "cpu")
    owners = [o.fresh(name=f"owner{i}") for i, o in enumerate(driver.scenario(program, seed=3, owners=5))]
    for mode, flags in (("speculative", []), ("target_only", ["--target-only"]), ("speculative", ["--cuda-graphs"])):
        _same_as_cpu(artifacts, "hybrid-f32", program, owners, mode, *flags)


def test_bfloat16_against_the_eager_model_on_the_gpu(artifacts):
    """bfloat16: the compiled model (AOTInductor's fused kernels) and the eager modules round
    differently, and on the tiny random model's near-flat rows a last-bit logit change picks
    another token, after which two free-running loops share nothing (H200, 2026-12-02: 0/8
    owners identical, first differences at tokens 0-26). So every token the runner committed
    is decided again by the eager bf16 modules on the runner's own prefix (teacher-forced,
    tests/teacher_forcing.py), and at least AGREE of them must be the same. Also held: the
    loop's shape (every owner that stays gets max_new tokens) and every id in the vocab."""
    program = _eager("sampling-bf16", "cuda")
    owners = _owners(program, seed=7)
    got = _runner(artifacts, "sampling-bf16", owners)
    vocab = program.constants["vocab_size"]
    same = []
    for i, o in enumerate(owners):
        tokens = got["tokens"][i]
        n = len(tokens)  # an owner that leaves early has what its steps committed
        assert n == o.max_new if o.leave is None else 1 <= n <= o.max_new, o.describe()
        assert all(0 <= t < vocab for t in tokens)
        same += teacher_forcing.agreement(program, o, tokens)
    print(f"\nbfloat16 sampling: C++ CUDA runner vs eager bf16 on the GPU, teacher-forced: {sum(same)}/{len(same)} "
          f"tokens decided the same ({len(same) - sum(same)} differ: model rounding, compiled vs eager)")
    assert sum(same) >= AGREE * len(same)


def _bad_inputs(a: dict) -> dict:
    pte, ptd = a["sampling-f32"] / "model.pte", a["sampling-f32"] / "aoti_cuda_blob.ptd"
    one = ["--owner", "prompt=1,2:max_new=4"]
    return {
        "no --data": ([ "--program", pte, *one], "is a CUDA program: give --data"),
        "missing .ptd": (["--program", pte, "--data", a["sampling-f32"] / "nope.ptd", *one], "no such file"),
        ".ptd of another export": (["--program", pte, "--data", a["sampling-bf16"] / "aoti_cuda_blob.ptd", *one],
                                   "is not the .ptd exported with"),
        "CPU program with --data": (["--program", a["greedy-cpu"] / "model.pte", "--data", ptd, *one],
                                    "is a CPU program (no CudaBackend delegate)"),
        "owner past max_owners": (["--program", pte, "--data", ptd, *one * 9], "serves at most max_owners = 8"),
        "prompt past max_seq_len": (["--program", pte, "--data", ptd, "--owner", "prompt=1,2:max_new=127"],
                                    "exceeds the program's max_seq_len (128)"),
    }


def test_bad_input_to_the_cuda_runner_is_refused_with_a_message(artifacts):
    for case, (args, message) in _bad_inputs(artifacts).items():
        done = _run(*args)
        print(f"\n{case}: exit {done.returncode}: {done.stderr.strip().splitlines()[-1] if done.stderr else ''}")
        assert done.returncode == EXIT_BAD_INPUT, f"{case}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
        assert message in done.stderr, f"{case}: {done.stderr}"
        assert "tokens:" not in done.stdout


def test_timing(artifacts):
    """Per-method times and throughput of max_owners owners, speculative and target-only (not a
    pass/fail check: the numbers go to benchmarks/RESULTS.md)."""
    rows = []
    for name in ("sampling-bf16", "sampling-f32", "sampling-f32-unfused", "sampling-f32-attn", "greedy-f32"):
        if name not in artifacts.exports:
            continue
        program = _eager(name, "cpu")
        c = program.constants
        owners = [driver.Owner(f"owner{i}", [(i * 31 + k) % c["vocab_size"] for k in range(8)], 96,
                               temperature=0.8 if c["variant"] == "sampling" else 0.0, top_k=40, top_p=0.9, seed=i)
                  for i in range(c["max_owners"])]
        for mode, flags in (("speculative", []), ("target_only", ["--target-only"])):
            got = _runner(artifacts, name, owners, "--timing", *flags)
            rows.append({"export": name, "mode": mode, "owners": len(owners), **got["loop"],
                         "mean_acceptance": got["total"]["mean_acceptance"],
                         **{f"{m}_median_us": t["median_us"] for m, t in got["timing"].items()}})
            print(f"\n{name} {mode}: {json.dumps(rows[-1])}")
    out = os.environ.get("DFLASH_TIMING_OUT")
    if out:
        Path(out).write_text(yaml.safe_dump(rows, sort_keys=False))
