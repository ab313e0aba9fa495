"""The verify-head fusion pass: finds each head by its module, checks its boundary,
swaps the whole subgraph for one dflash:: op; the rewritten graph gives the
reference's token ids (Triton interpreter on the CPU)."""

import dataclasses
import inspect

import pytest
import torch
from conftest import DEVICE

from dflash_et.export import artifact, boundary, builder, cases, config, heads, methods
from dflash_et.export.exporter import trace
from dflash_et.lowering.fuse_verify import FuseError, FuseVerifyHeads, head_paths, match


def _quiet():
    return artifact.Progress(total=99, stream=open("/dev/null", "w"))


def _traced(variant, vocab=64, logits_dtype="float32"):
    cfg = config.from_dict({"program": "heads", "variant": variant, "logits_dtype": logits_dtype,
                            "heads": {"vocab_size": vocab}, "limits": {"max_rows": 32, "max_owners": 8}})
    spec = builder.build(cfg)
    return spec, trace(spec, _quiet())


def _head_nodes(ep):
    return [n for n in ep.graph.nodes if n.op == "call_function" and "dflash" not in str(n.target)
            and any("heads." in str(c) for _, c in (n.meta.get("nn_module_stack") or {}).values())]


def _dflash_calls(ep):
    return [n.target for n in ep.graph.nodes if n.op == "call_function" and "dflash" in str(n.target)]


@pytest.mark.parametrize("variant", [pytest.param("greedy", marks=pytest.mark.quick), "sampling"])
def test_pass_rewrites_exactly_the_heads_and_keeps_the_signature(variant):
    spec, programs = _traced(variant)
    g = torch.Generator().manual_seed(1)
    for m in spec.methods:
        ep = programs[m.name]
        before_sig = (list(ep.graph_signature.input_specs), list(ep.graph_signature.output_specs))
        assert len(_head_nodes(ep)) > 50  # the ATen head: searches, masks, sums
        result = FuseVerifyHeads(expected=[""])(ep)
        assert (result.modified, result.count, result.heads) == (True, 1, [f"{m.head}@<root>"])
        assert _head_nodes(ep) == []
        assert _dflash_calls(ep) == [getattr(torch.ops.dflash, m.head).default]
        assert (list(ep.graph_signature.input_specs), list(ep.graph_signature.output_specs)) == before_sig
        for _ in range(3):  # the rewritten graph runs (Triton interpreter) and matches the reference
            if m.head == "sample_rows":
                inp = cases.sample_case(g, 64, 24, torch.float32)
            else:
                inp = cases.verify_case(g, 64, 32, 8, torch.float32, greedy_only=m.head == "dflash_verify_argmax")
            args = [inp[t.name].to(DEVICE) for t in m.inputs]
            got = ep.module()(*args)
            want = heads.HEADS[m.head].module()(*[a.cpu() for a in args])
            got, want = (got, want) if isinstance(want, tuple) else ((got,), (want,))
            for a, b in zip(got, want):
                assert torch.equal(a.cpu(), b), (m.name, inp.get("offsets"))


class _Target(torch.nn.Module):
    """A toy 'model + greedy head' method: logits come from a layer, the head is a submodule."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 40)
        self.verify = heads.DFlashVerifyArgmax()

    def forward(self, hidden, tokens, offsets):
        return self.verify(self.proj(hidden), tokens, offsets)


class _SamplingTarget(_Target):
    def __init__(self):
        super().__init__()
        self.verify = heads.DFlashVerify(16)

    def forward(self, hidden, tokens, offsets, start_position, temperature, top_k, top_p, seed):
        return self.verify(self.proj(hidden), tokens, offsets, start_position, temperature, top_k, top_p, seed)


def _export_target(sampling):
    torch.manual_seed(0)
    module = _SamplingTarget() if sampling else _Target()
    ex = (torch.randn(5, 8), torch.zeros(5, dtype=torch.int64), torch.tensor([0, 2, 5]))
    ds = ({0: torch.export.Dim("rows", min=1, max=16)},) * 2 + ({0: torch.export.Dim("owners", min=1, max=8) + 1},)
    if sampling:
        owners = ds[2][0] - 1
        ex += (torch.tensor([3, 4]), torch.tensor([0.0, 0.9]), torch.tensor([0, 5]), torch.tensor([1.0, 0.8]), torch.tensor([1, 2]))
        ds += ({0: owners},) * 5
    with torch.no_grad():  # as the exporter traces (the scan of the heads needs it)
        ep = torch.export.export(module, ex, dynamic_shapes=ds, strict=False)
    return module, ep


@pytest.mark.parametrize("sampling", [False, True])
def test_pass_rewrites_a_head_inside_a_model(sampling):
    module, ep = _export_target(sampling)
    assert head_paths(module) == [("verify", "dflash_verify" if sampling else "dflash_verify_argmax")]
    result = FuseVerifyHeads(expected=["verify"])(ep)
    assert result.count == 1 and _head_nodes(ep) == []
    assert [n.target for n in ep.graph.nodes if n.op == "call_function" and "linear" in str(n.target)]
    g = torch.Generator().manual_seed(2)
    for _ in range(3):
        hidden = torch.randn(9, 8, generator=g)
        tokens = torch.randint(0, 40, (9,), generator=g)
        offsets = torch.tensor([0, 4, 4, 9])
        params = (torch.tensor([7, 8, 9]), torch.tensor([0.7, 0.0, 1.1]), torch.tensor([0, 3, 10]),
                  torch.tensor([0.95, 1.0, 0.5]), torch.tensor([5, 6, 7])) if sampling else ()
        with torch.no_grad():
            got = ep.module()(hidden, tokens, offsets, *params)
            want = module(hidden, tokens, offsets, *params)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_no_head_is_a_no_op_but_an_expected_head_must_match():
    class Plain(torch.nn.Module):
        def forward(self, x):
            return x.argmax(-1)

    ep = torch.export.export(Plain(), (torch.randn(3, 5),))
    nodes = len(ep.graph.nodes)
    result = FuseVerifyHeads()(ep)
    assert (result.modified, result.count) == (False, 0) and len(ep.graph.nodes) == nodes
    with pytest.raises(FuseError, match="heads at verify matched no region"):
        FuseVerifyHeads(expected=["verify"])(ep)


@pytest.mark.quick
def test_an_altered_boundary_raises_naming_the_node_and_changes_nothing():
    from dflash_et.export.boundary import MARKER

    _, ep = _export_target(False)
    graph = ep.graph_module.graph
    enter = next(n for n in graph.nodes if n.target is MARKER and n.args[2] == "inputs")
    tokens_in = next(u for u in enter.users if u.args[1] == 1)  # the head's view of `tokens`
    victim = next(iter(tokens_in.users))
    tokens = next(n for n in graph.nodes if n.name == "tokens")
    with graph.inserting_before(victim):
        outside = graph.call_function(torch.ops.aten.clone.default, (tokens,))
    outside.meta["val"] = tokens.meta["val"]
    victim.replace_input_with(tokens_in, outside)
    count = len(graph.nodes)
    with pytest.raises(FuseError, match=rf"node {victim.name} reads {outside.name}, which is neither a head input"):
        FuseVerifyHeads(expected=["verify"])(ep)
    assert len(graph.nodes) == count  # nothing was rewritten


def test_an_unsupported_head_raises():
    spec, programs = _traced("greedy")
    ep = programs["dflash_verify_argmax"]
    logits = next(n for n in ep.graph.nodes if n.name == "logits")
    logits.meta["val"] = logits.meta["val"].to(torch.float64)  # as if the head read float64 logits
    with pytest.raises(FuseError, match="expected float logits|does not support torch.float64"):
        match(ep)


def test_a_traced_region_is_its_fused_op_where_the_kernel_takes_the_inputs():
    """`fused_at_trace`: the region traces as its op between its markers; with inputs its kernel
    does not take (float64 logits), as its ATen body, so the pass names what is unsupported."""
    from dflash_et.export.heads import DFlashVerifyArgmax
    from dflash_et.lowering.fuse_verify import fused_at_trace

    head, tokens, offsets = DFlashVerifyArgmax(), torch.zeros(6, dtype=torch.int64), torch.tensor([0, 2, 6])
    for dtype in (torch.float32, torch.float64):
        with fused_at_trace([head], ("dflash_verify_argmax",)):
            ep = torch.export.export(head, (torch.randn(6, 50, dtype=dtype), tokens, offsets), strict=False)
        assert "forward" not in vars(head)  # the module's own forward again
        ops = [str(n.target) for n in ep.graph.nodes if n.op == "call_function" and "getitem" not in str(n.target)]
        if dtype == torch.float32:
            assert ops == ["dflash.head_boundary.default", "dflash.dflash_verify_argmax.default",
                           "dflash.head_boundary.default"], ops
            assert FuseVerifyHeads(expected=[""])(ep).heads == ["dflash_verify_argmax@<root>"]
        else:
            assert "dflash.dflash_verify_argmax.default" not in ops and len(ops) > 5, ops
            with pytest.raises(FuseError, match="does not support torch.float64"):
                FuseVerifyHeads()(ep)


def test_cpu_backend_exports_keep_the_aten_head(make_config, tmp_path):
    from dflash_et.export import exporter

    cfg = config.load(str(make_config("greedy", vocab=50)))
    directory = exporter.export_program(cfg, tmp_path / "a", progress=_quiet())
    import json

    assert "lowering" not in json.loads((directory / "manifest.json").read_text())


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only error")
def test_cuda_backend_without_a_gpu_is_a_clear_error(tmp_path, capsys):
    from dflash_et import cli

    code = cli.main(["export", "--config", "heads-greedy-cuda", "--output-dir", str(tmp_path / "c")])
    err = capsys.readouterr().err
    assert code == 2 and "backend: cuda needs a CUDA GPU" in err and "Traceback" not in err
    assert not (tmp_path / "c" / "model.pte").exists()


def test_cuda_lowering_hands_each_fused_method_whole_to_aotinductor(monkeypatch):
    """This machine's ExecuTorch (1.5 in CI), up to where AOTInductor needs a GPU: every
    method becomes one CUDA partition whose program holds the fused dflash:: call and the
    method's inputs (the GPU machine runs the rest with ExecuTorch 1.2)."""
    from executorch.backends.cuda.cuda_backend import CudaBackend

    from dflash_et.lowering import cuda

    class Reached(Exception):
        pass

    seen = {}

    def stop(cls, program, device, compile_specs):
        seen.setdefault(cls.method_name_from_compile_specs(compile_specs), []).append(program)
        raise Reached

    monkeypatch.setattr(CudaBackend, "move_program_to_device", classmethod(stop))
    monkeypatch.setattr(cuda, "require_cuda", lambda: None)
    cfg = config.load("heads-sampling-cuda")
    spec = builder.build(dataclasses.replace(cfg, heads=config.HeadsConfig(vocab_size=64)))
    programs = trace(spec, _quiet())
    for m in spec.methods:
        one = methods.ProgramSpec([m], spec.constants, spec.dims)
        with pytest.raises(Reached):
            cuda.lower({m.name: programs[m.name]}, one, cfg)
        (program,) = seen[m.name]
        ops = [str(n.target) for n in program.graph.nodes if n.op == "call_function"]
        fused = [op for op in ops if "dflash." in op]
        assert len(fused) == 1 and f"dflash.{m.head}.default" in fused[0], fused
        assert len(ops) < 8, ops  # the head's ATen ops are gone: the call and its getitems (and a few casts)
        assert list(program.graph_signature.user_inputs) == [t.name for t in m.inputs]


def test_a_cuda_export_reports_the_fused_heads_per_method(monkeypatch, tmp_path):
    """The exporter's side of a CUDA export (the lowering itself needs a GPU: stubbed here):
    the fused heads of every method are printed and land in the manifest, and the compile
    workers start before the tracing (they make their methods while this process traces)."""
    import contextlib
    import io
    import json

    from dflash_et.export import exporter
    from dflash_et.lowering import cuda

    report = {"fused_verify": True, "fused_heads": {"dflash_verify": ["dflash_verify@<root>"], "sample_rows": []},
              "delegates": {}}
    monkeypatch.setattr(cuda, "require_cuda", lambda: None)
    events, handed = [], {}

    @contextlib.contextmanager
    def compiles(names, autotune, jobs, producer, say, zero_constants):
        handed.update(names=names, jobs=jobs, producer=producer, zero_constants=zero_constants)
        events.append("workers started")
        yield
        events.append("workers stopped")

    def lower(programs, spec, cfg, say, compiling):
        with compiling:
            events.append("lowered")
        return {"model.pte": b"pte", cuda.PTD: b"ptd"}, report

    monkeypatch.setattr(cuda, "compiles", compiles)
    monkeypatch.setattr(exporter, "trace", lambda spec, progress, device: events.append("traced") or {})
    monkeypatch.setattr(cuda, "lower", lower)
    stream = io.StringIO()
    cfg = config.load("heads-sampling-cuda")
    cfg = dataclasses.replace(cfg, lowering=dataclasses.replace(cfg.lowering, zero_constants=True))
    directory = exporter.export_program(cfg, tmp_path / "x", progress=artifact.Progress(9, stream=stream))
    assert "fused verify heads: dflash_verify 1 (dflash_verify@<root>), sample_rows 0" in stream.getvalue()
    assert json.loads((directory / "manifest.json").read_text())["lowering"] == report
    assert events == ["workers started", "traced", "lowered", "workers stopped"]
    # the workers of the parallel compile remake each method from the same config
    assert handed == {"names": [m.name for m in builder.build(cfg).methods], "jobs": None,
                      "producer": (f"{exporter.__name__}:traced_cuda_method", {"config": cfg.to_dict()}),
                      "zero_constants": True}  # (the workers' lowering leaves the zeros out too)


def test_auto_jobs_is_one_worker_per_method_on_at_most_half_the_cores():
    from dflash_et.lowering.cuda import auto_jobs

    assert auto_jobs(6, cores=16) == 6
    assert auto_jobs(6, cores=8) == 4
    assert auto_jobs(5, cores=2) == 1  # CI's machine: compiled in the exporting process
    assert auto_jobs(6, cores=1) == 1
    assert auto_jobs(1, cores=64) == 1


def test_cuda_programs_take_their_inputs_by_pointer():
    """The CUDA lowering's emit settings leave method inputs unplanned: ExecuTorch then hands
    the caller's tensor over by pointer (a GPU tensor from another method's output stays on
    the GPU) instead of copying it into a planned host buffer, which the default does."""
    from executorch.exir import to_edge_transform_and_lower
    from executorch.runtime import Runtime

    from dflash_et.lowering import cuda

    cfg = config.load("heads-greedy")
    spec = builder.build(dataclasses.replace(cfg, heads=config.HeadsConfig(vocab_size=64)))
    (m,) = spec.methods
    planned = {}
    for label, emit in (("default", None), ("cuda", cuda.executorch_config())):
        program = trace(spec, _quiet())[m.name]  # to_executorch changes what it is given: one each
        boundary.strip(program)
        pte = to_edge_transform_and_lower({m.name: program}).to_executorch(emit).buffer
        meta = Runtime.get().load_program(pte).metadata(m.name)
        planned[label] = [meta.input_tensor_meta(i).is_memory_planned() for i in range(meta.num_inputs())]
    assert planned["default"] == [True] * len(m.inputs)
    assert planned["cuda"] == [False] * len(m.inputs)


@pytest.mark.quick
def test_a_narrowed_input_bound_is_an_error_naming_the_input():
    """check_bounds reads every input's serialized capacity back from the program: equal to
    the declared dims passes; a program serialized for fewer rows than the dims allow (what
    a compiler guard on a dynamic size does) is refused, naming the method, input and sizes."""
    from executorch.exir import to_edge_transform_and_lower

    from dflash_et.lowering import cuda
    from dflash_et.lowering.errors import LoweringError

    cfg = config.load("heads-greedy")
    spec = builder.build(dataclasses.replace(cfg, heads=config.HeadsConfig(vocab_size=64),
                                             limits=config.LimitsConfig(max_rows=12, max_owners=3)))
    (m,) = spec.methods
    program = trace(spec, _quiet())[m.name]
    boundary.strip(program)
    pte = to_edge_transform_and_lower({m.name: program}).to_executorch(cuda.executorch_config()).buffer
    cuda.check_bounds(pte, spec)
    wider = methods.ProgramSpec(spec.methods, spec.constants, {**spec.dims, "rows": (1, 13)})
    with pytest.raises(LoweringError, match=r"dflash_verify_argmax: input logits was serialized for at most "
                                            r"\[12, 64\], but its dims \['rows', 64\] allow \[13, 64\]"):
        cuda.check_bounds(pte, wider)


@pytest.mark.quick
@pytest.mark.parametrize("mode", config.AUTOTUNE)
def test_lowering_autotune_sets_the_inductor_options_only_while_lowering(mode):
    from executorch.backends.cuda.cuda_backend import CudaBackend

    from dflash_et.lowering import cuda

    before = inspect.getattr_static(CudaBackend, "get_aoti_compile_options")
    with cuda.compile_options(mode):
        options = CudaBackend.get_aoti_compile_options([])
    assert options["max_autotune"] is (mode == "full")
    assert options.get("max_autotune_gemm", False) is (mode in ("gemm", "none"))
    assert options.get("deterministic", False) is (mode == "none")  # no benchmarks at all
    assert options["max_autotune_gemm_backends"] == "TRITON"  # ExecuTorch's own options stay
    import torch._inductor.config as inductor_config

    assert all(hasattr(inductor_config, key) for key in cuda.autotune_options(mode)), cuda.autotune_options(mode)
    assert inspect.getattr_static(CudaBackend, "get_aoti_compile_options") is before
