"""CUDA programs on a GPU (skipped without CUDA): both CUDA head configs export
model.pte + aoti_cuda_blob.ptd whose methods are CUDA delegates; the rewritten graph
(before AOTInductor) and its torch.compile run on the GPU and match the reference."""

import json

import pytest
import torch

from dflash_et.export import artifact, builder, cases, config, exporter, heads
from dflash_et.lowering.fuse_verify import FuseVerifyHeads

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _quiet():
    return artifact.Progress(total=99, stream=open("/dev/null", "w"))


@pytest.mark.parametrize("name", ["heads-greedy-cuda", "heads-sampling-cuda"])
def test_cuda_configs_export_pte_and_ptd_with_cuda_delegates(name, tmp_path):
    from dflash_et.lowering.cuda import delegates

    cfg = config.load(name)
    directory = exporter.export_program(cfg, tmp_path / name)
    manifest = json.loads((directory / "manifest.json").read_text())
    assert set(manifest["files"]) == {"model.pte", "aoti_cuda_blob.ptd"}
    spec = builder.build(cfg)
    found = delegates((directory / "model.pte").read_bytes())
    for m in spec.methods:
        assert found[m.name] == ["CudaBackend"], found
    assert manifest["lowering"]["fused_heads"] == {m.name: [f"{m.head}@<root>"] for m in spec.methods}
    print(name, {f: (directory / f).stat().st_size for f in ("model.pte", "aoti_cuda_blob.ptd")})


@pytest.mark.parametrize("variant", ["greedy", "sampling"])
def test_rewritten_graph_and_its_compile_match_the_reference_on_gpu(variant):
    cfg = config.load(f"heads-{variant}-cuda")
    spec = builder.build(cfg)
    programs = exporter.trace(spec, _quiet(), device="cuda")
    g = torch.Generator().manual_seed(3)
    vocab = cfg.heads.vocab_size
    for m in spec.methods:
        ep = programs[m.name]
        assert FuseVerifyHeads(expected=[""])(ep).count == 1
        run, compiled = ep.module(), torch.compile(ep.module())
        for _ in range(2):
            if m.head == "sample_rows":
                inp = cases.sample_case(g, vocab, 64, torch.bfloat16)
            else:
                inp = cases.verify_case(g, vocab, 64, 16, torch.bfloat16, greedy_only=m.head == "dflash_verify_argmax")
            args = [inp[t.name].cuda() for t in m.inputs]
            want = heads.HEADS[m.head].module()(*args)
            want = want if isinstance(want, tuple) else (want,)
            for impl in (run, compiled):
                got = impl(*args)
                got = got if isinstance(got, tuple) else (got,)
                if m.head == "dflash_verify":
                    from dflash_et.export import legal

                    close = legal.close_owners(*args)
                    differ = (got[0] != want[0]) | (got[1] != want[1])
                    assert not bool((differ & ~close).any())
                elif m.head == "sample_rows":
                    from dflash_et.export import legal, rng

                    u = rng.uniform(args[5], args[1], rng.SAMPLE)
                    close = legal.close_rows(args[0], args[2], args[3], args[4], u)
                    assert not bool(((got[0] != want[0]) & ~close).any())
                else:
                    assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_fused_verify_off_puts_the_aten_head_into_the_cuda_delegate(tmp_path):
    """lowering.fused_verify: false (the fallback / comparison build): no dflash:: op, the
    plain ATen head compiled by AOTInductor inside the CUDA delegate."""
    import dataclasses

    from dflash_et.lowering.cuda import delegates

    cfg = config.load("heads-greedy-cuda")
    cfg = dataclasses.replace(cfg, lowering=dataclasses.replace(cfg.lowering, fused_verify=False))
    directory = exporter.export_program(cfg, tmp_path / "aten")
    manifest = json.loads((directory / "manifest.json").read_text())
    assert manifest["lowering"]["fused_verify"] is False
    assert manifest["lowering"]["fused_heads"] == {m.name: [] for m in builder.build(cfg).methods}
    found = delegates((directory / "model.pte").read_bytes())
    assert all(found[m.name] == ["CudaBackend"] for m in builder.build(cfg).methods), found
