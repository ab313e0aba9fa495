"""The CUDA DFlash configs' methods with every verify head fused, run as graphs (before
AOTInductor) inside the reference driver's full speculative loop: on the CPU through the
Triton interpreter here, on a GPU in scripts/gpu-checks.sh. They commit the same tokens as
the eager program (plain ATen heads), token for token, in speculative and target-only mode."""

import io

import pytest
import torch
from conftest import DEVICE

from dflash_et.export import artifact, builder, config, driver, exporter, methods
from dflash_et.lowering.cuda import prepare, traced_fused
from graph_program import graph_program

pytestmark = pytest.mark.xdist_group("fused_programs")  # one worker traces and fuses each config once


@pytest.fixture(scope="module", params=["greedy", "sampling"])
def fused(request):
    cfg = config.load(f"tiny-dflash-{request.param}-cuda")
    spec = builder.build(cfg)
    programs = exporter.trace(spec, artifact.Progress(99, stream=io.StringIO()), device="cpu")
    report = prepare(programs, spec, cfg)  # the heads fused; the attention's markers stripped
    return cfg, spec, programs, report


def test_every_head_of_every_method_is_fused(fused):
    cfg, spec, programs, report = fused
    head = "dflash_verify" if cfg.variant == "sampling" else "dflash_verify_argmax"
    assert report["target_verify"] == [f"{head}@verify"]
    assert report[head] == [f"{head}@<root>"]
    assert report["draft_forward"] == ["greedy_rows@greedy_rows"]  # the drafts' argmax
    if cfg.variant == "sampling":
        assert report["target_prefill"] == ["sample_rows@sample"]
        assert report["sample_rows"] == ["sample_rows@<root>"]
    for name, ep in programs.items():
        left = [n for n in ep.graph.nodes if n.op == "call_function"
                and any("export.heads." in str(c) or "GreedyRows" in str(c)
                        for _, c in (n.meta.get("nn_module_stack") or {}).values())
                and "dflash" not in str(n.target) and "getitem" not in str(n.target)]
        assert left == [], (name, [n.name for n in left[:5]])


def _structure(ep) -> tuple:
    """A program's graph with node names replaced by positions (its ops, their arguments, each
    node's shape and dtype), its signature's kinds and targets, and its range constraints.
    Inputs no node reads (a lifted constant of an erased region) are left out."""
    used = [n for n in ep.graph.nodes if n.op != "placeholder" or n.users]
    position = {n: f"%{i}" for i, n in enumerate(used)}

    def val(v):
        if isinstance(v, torch.Tensor):
            return str(tuple(v.shape)), str(v.dtype)
        return tuple(map(val, v)) if isinstance(v, (tuple, list)) else str(v)

    nodes = [(n.op, str(n.target) if n.op != "placeholder" else "",
              torch.fx.node.map_arg((n.args, n.kwargs), position.get), val(n.meta.get("val"))) for n in used]
    read = {n.name for n in used}
    inputs = [(s.kind, s.target) for s in ep.graph_signature.input_specs if s.arg.name in read]
    outputs = [(s.kind, s.target) for s in ep.graph_signature.output_specs]
    return nodes, inputs, outputs, str(ep.range_constraints)


def test_tracing_the_fused_ops_gives_the_same_fused_graphs(fused):
    """export_program traces each region it fuses as the fused op itself (`traced_fused`: the
    sampling reference's searches were most of a CUDA method's trace time). After `prepare`
    every method is the graph the plain ATen regions' trace gives, node for node (names
    aside), with the same inputs, outputs and dims."""
    cfg, spec, programs, report = fused
    spec = builder.build(cfg)
    with traced_fused(spec, cfg):
        quick = exporter.trace(spec, artifact.Progress(99, stream=io.StringIO()), device="cpu")
    assert not any("forward" in vars(m) for method in spec.methods for m in method.module.modules())  # restored
    assert prepare(quick, spec, cfg) == report
    for name, ep in programs.items():
        assert _structure(quick[name]) == _structure(ep), name


def test_cuda_methods_are_traced_at_the_limits_aotinductor_tunes_for(fused):
    """AOTInductor times its GEMM candidates at the size hints of the traced shapes: a CUDA
    program's methods are traced at max_rows rows and max_owners owners (a verify step's
    sizes), not at the few rows a portable program is traced at."""
    cfg, spec, programs, _ = fused
    assert cfg.limits.max_rows > 5 and cfg.limits.max_owners > 2  # (other than the portable sizes)
    hints = {}  # shape entry ("rows", "owners+1", ...) -> the hints its traced sizes carry
    for m in spec.methods:
        ep = programs[m.name]
        placeholders = {n.name: n for n in ep.graph.find_nodes(op="placeholder")}
        for t, name in zip(m.inputs, ep.graph_signature.user_inputs, strict=True):
            for entry, size in zip(t.shape, placeholders[name].meta["val"].shape):
                if isinstance(entry, str):
                    hints.setdefault(entry, set()).add(size.node.hint)
    assert {"rows", "owners"} <= set(hints), hints
    assert hints == {entry: {methods.dim_max(entry, spec.dims)} for entry in hints}, hints


def test_fused_graphs_commit_the_eager_programs_tokens(fused):
    cfg, spec, programs, _ = fused
    graphs = graph_program(spec, programs, device=DEVICE)
    eager = driver.Program.eager(builder.build(cfg))
    owners = driver.scenario(graphs, seed=3, owners=4)
    for mode in ("speculative", "target_only"):
        got = driver.generate(graphs, owners, mode=mode, max_steps=6)
        want = driver.generate(eager, owners, mode=mode, max_steps=6)
        for name, same, why in driver.compare(got, want, partial=True):
            assert same, f"{mode} {name}: {why}"
        assert sum(len(t) for t in got.tokens.values()) > 10  # the loop did commit tokens


def test_fused_attention_reads_the_same_cells_and_commits_the_eager_tokens():
    """`lowering.fused_attention`: every layer's attention in the target's methods and in
    draft_forward becomes one dflash::cached_attention call, and the rewritten graphs still
    commit the eager program's tokens and propose its drafts (float32: the op and the
    reference differ by rounding only)."""
    import dataclasses

    cfg = config.load("tiny-dflash-greedy-cuda")
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, dtype="float32"),
                              lowering=dataclasses.replace(cfg.lowering, fused_attention=True))
    spec = builder.build(cfg)
    programs = exporter.trace(spec, artifact.Progress(99, stream=io.StringIO()), device="cpu")
    report = prepare(programs, spec, cfg)
    modules = {m.name: m.module for m in spec.methods}
    layers = {"target_prefill": modules["target_verify"].target.cfg.num_layers,
              "target_verify": modules["target_verify"].target.cfg.num_layers,
              "draft_forward": modules["draft_forward"].drafter.cfg.num_layers}
    for name, count in layers.items():
        ops = [str(n.target) for n in programs[name].graph.nodes if n.op == "call_function"]
        attention = [op for op in ops if op == "dflash.cached_attention.default"]
        assert len(attention) == count, (name, ops)
        assert len([r for r in report[name] if r.startswith("cached_attention@")]) == count, report[name]
        assert ops.count("dflash.greedy_rows.default") == (name == "draft_forward"), (name, ops)
        assert not any("scaled_dot_product" in op or "head_boundary" in op for op in ops), name
    graphs = graph_program(spec, programs, device=DEVICE)
    eager = driver.Program.eager(builder.build(cfg))
    owners = driver.scenario(graphs, seed=3, owners=2)  # (the interpreter runs a program per row and KV head)
    got = driver.generate(graphs, owners, mode="speculative", max_steps=2)
    want = driver.generate(eager, owners, mode="speculative", max_steps=2)
    for name, same, why in driver.compare(got, want, partial=True):
        assert same, f"{name}: {why}"
    assert driver.compare_drafts(got, want) is None
    assert sum(len(t) for t in got.tokens.values()) >= 4
