"""CUDA DFlash programs on a GPU (skipped without CUDA; scripts/gpu-checks.sh dflash runs them).

- Both tiny CUDA configs export model.pte + aoti_cuda_blob.ptd, every method a CUDA
  delegate, every configured head fused.
- The rewritten graphs of every method run on the GPU inside the reference driver's full
  speculative loop and commit the same tokens as the same graphs with the ATen heads
  (same logits, so only the heads differ: exact up to SPEC.md's legal bands).
- In float32 (same architecture and seed, backend cuda vs portable) the GPU loop commits
  the same tokens as the CPU `.pte` in executorch.runtime.
- In bfloat16 the GPU loop is compared with the eager bf16 model on the CPU: the models'
  own rounding differs between the devices (not the heads), so differences are counted
  and reported, and only a majority of identical owners is required.
"""

import dataclasses
import io
import json
import time

import pytest
import torch

from dflash_et.export import artifact, builder, config, driver, exporter

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

STEPS = 8


def _quiet():
    return artifact.Progress(99, stream=io.StringIO())


def _graphs(cfg, fused: bool) -> driver.Program:
    from dflash_et.lowering.cuda import prepare
    from graph_program import graph_program

    spec = builder.build(cfg)
    programs = exporter.trace(spec, _quiet(), device="cuda")
    lowering = dataclasses.replace(cfg.lowering, fused_verify=fused)
    prepare(programs, spec, dataclasses.replace(cfg, lowering=lowering))  # every marker left is stripped
    return graph_program(spec, programs, device="cuda")


def _differences(got: driver.Run, want: driver.Run) -> list[str]:
    return [f"{name}: {why}" for name, same, why in driver.compare(got, want, partial=True) if not same]


@pytest.mark.parametrize("variant", ["greedy", "sampling"])
def test_tiny_dflash_cuda_config_exports_pte_and_ptd(variant, tmp_path):
    from dflash_et.lowering.cuda import delegates

    cfg = config.load(f"tiny-dflash-{variant}-cuda")
    t0 = time.perf_counter()
    directory = exporter.export_program(cfg, tmp_path / variant, progress=_quiet())
    seconds = time.perf_counter() - t0
    manifest = json.loads((directory / "manifest.json").read_text())
    assert set(manifest["files"]) == {"model.pte", "aoti_cuda_blob.ptd"}
    spec = builder.build(cfg)
    found = delegates((directory / "model.pte").read_bytes())
    assert {m.name: found[m.name] for m in spec.methods} == {m.name: ["CudaBackend"] for m in spec.methods}
    head = "dflash_verify" if variant == "sampling" else "dflash_verify_argmax"
    fused = manifest["lowering"]["fused_heads"]
    assert fused["target_verify"] == [f"{head}@verify"]
    assert fused["draft_forward"] == ["greedy_rows@greedy_rows"] and fused["draft_prefill"] == []
    if variant == "sampling":
        assert fused["target_prefill"] == ["sample_rows@sample"]
    sizes = {f: (directory / f).stat().st_size for f in ("model.pte", "aoti_cuda_blob.ptd")}
    print(f"\nexport tiny-dflash-{variant}-cuda: {seconds:.0f} s, {sizes}, fused {fused}")


@pytest.mark.parametrize("variant", ["greedy", "sampling"])
def test_gpu_loop_fused_heads_commit_the_aten_heads_tokens(variant):
    cfg = config.load(f"tiny-dflash-{variant}-cuda")
    fused, aten = _graphs(cfg, fused=True), _graphs(cfg, fused=False)
    owners = driver.scenario(fused, seed=11, owners=8)
    for mode in ("speculative", "target_only"):
        got = driver.generate(fused, owners, mode=mode, max_steps=STEPS)
        want = driver.generate(aten, owners, mode=mode, max_steps=STEPS)
        committed = sum(len(t) for t in got.tokens.values())
        print(f"\n{variant} {mode}: {committed} tokens over {len(got.steps)} steps, "
              f"{got.tokens_per_step():.2f} tokens per step")
        assert committed > 40
        # Same logits on both sides: any difference is a head decision, legal only in SPEC.md's bands
        # (which random model logits essentially never hit).
        assert _differences(got, want) == []


@pytest.mark.parametrize("variant", ["greedy", "sampling"])
def test_gpu_loop_float32_commits_the_cpu_programs_tokens(variant, tmp_path):
    cfg = config.load(f"tiny-dflash-{variant}-cuda")
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, dtype="float32"))
    cpu_cfg = dataclasses.replace(cfg, backend="portable")
    directory = exporter.export_program(cpu_cfg, tmp_path / "cpu", progress=_quiet())
    cpu = driver.Program.load(builder.build(cpu_cfg), directory)
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # float32 means float32 on both sides
    try:
        gpu = _graphs(cfg, fused=True)
        owners = driver.scenario(gpu, seed=5, owners=8)
        got = driver.generate(gpu, owners, mode="speculative", max_steps=STEPS)
        want = driver.generate(cpu, owners, mode="speculative", max_steps=STEPS)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old
    differ = _differences(got, want)
    print(f"\nfloat32 {variant}: GPU fused graphs vs CPU .pte: {len(owners) - len(differ)}/{len(owners)} owners "
          f"identical over {sum(len(t) for t in got.tokens.values())} tokens; {differ}")
    assert differ == []


@pytest.mark.parametrize("variant", ["greedy", "sampling"])
def test_gpu_loop_bfloat16_against_the_cpu_eager_model(variant):
    cfg = config.load(f"tiny-dflash-{variant}-cuda")
    gpu = _graphs(cfg, fused=True)
    cpu = driver.Program.eager(builder.build(cfg))  # same bf16 weights, ATen heads, CPU arithmetic
    owners = driver.scenario(gpu, seed=7, owners=8)
    got = driver.generate(gpu, owners, mode="speculative", max_steps=STEPS)
    want = driver.generate(cpu, owners, mode="speculative", max_steps=STEPS)
    differ = _differences(got, want)
    tokens = sum(len(t) for t in got.tokens.values())
    print(f"\nbfloat16 {variant}: GPU fused graphs vs CPU eager: {len(owners) - len(differ)}/{len(owners)} owners "
          f"identical over {tokens} tokens; model rounding differs by device: {differ}")
    assert len(differ) <= len(owners) // 2, differ
