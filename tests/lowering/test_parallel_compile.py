"""The CUDA lowering's methods compiled in worker processes (lowering/parallel_compile.py)
give the same program as compiling them in one process. Without a GPU: CudaBackend's real
`preprocess` runs with AOTInductor replaced by tests/fake_cuda_compile.py, whose output is
a hash of the graph and weights it was handed, so a worker that compiled another graph, or
bytes put under another method's name, changes the files."""

import contextlib
import copy
import dataclasses
import re
import tempfile
from pathlib import Path

import fake_cuda_compile
import pytest

from dflash_et.export import artifact, builder, config, methods
from dflash_et.export import exporter
from dflash_et.export.exporter import trace
from dflash_et.lowering import cuda
from dflash_et.lowering.errors import LoweringError
from dflash_et.lowering.parallel_compile import compiled_by_workers, tensor_summary

METHODS = ("target_verify", "draft_forward")  # the fused verify head and KV-cache writes; the drafter


def _config():
    cfg = config.load("tiny-dflash-greedy-cuda")
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, dtype="float32"))


@pytest.fixture(scope="module")
def fused():
    """The tiny greedy CUDA program's METHODS, traced and fused on the CPU (float32), as
    export_program hands them to the CUDA lowering."""
    cfg = _config()
    spec = builder.build(cfg)
    spec = dataclasses.replace(spec, methods=[m for m in spec.methods if m.name in METHODS])
    with cuda.traced_fused(spec, cfg):
        programs = trace(spec, artifact.Progress(total=99, stream=open("/dev/null", "w")))
    cuda.prepare(programs, spec, cfg)
    return spec, programs


@pytest.fixture
def traced(fused):
    """A fresh copy of `fused` (lowering changes the programs it is given)."""
    spec, programs = fused
    return spec, copy.deepcopy(programs)


@pytest.fixture
def fake_aoti(monkeypatch):
    fake_cuda_compile.install(monkeypatch.setattr)
    monkeypatch.setenv("DFLASH_FAKE_AOTI", "1")  # the workers install it too
    fake_cuda_compile.CALLS.clear()
    return fake_cuda_compile.CALLS


def _files(edge) -> dict[str, bytes]:
    program = edge.to_executorch(cuda.executorch_config())
    files = {artifact.PTE: program.buffer}
    with tempfile.TemporaryDirectory() as tmp:
        program.write_tensor_data_to_file(tmp)
        files.update((p.name, p.read_bytes()) for p in Path(tmp).glob("*.ptd"))
    return files


def _lower(traced, recipe=f"{cuda.__name__}:lower_edge", producer=f"{exporter.__name__}:traced_cuda_method",
           jobs=2, said=None):
    spec, programs = traced
    said = [] if said is None else said
    producer = (producer, {"config": _config().to_dict(), "device": "cpu"})
    with compiled_by_workers(list(programs), _backend(), producer, (recipe, {"autotune": "gemm"}), jobs,
                             preload=(cuda.KERNELS, "fake_cuda_compile"), say=said.append):
        return _files(cuda.lower_edge(programs, "gemm", methods.constant_values(spec)))


def _backend():
    from executorch.backends.cuda.cuda_backend import CudaBackend

    return CudaBackend


def test_workers_give_the_program_of_one_process(traced, fake_aoti, monkeypatch):
    """target_verify comes from its worker; draft_forward's worker lowered other weights (the
    recipe changed one), so that method is compiled here; the files equal one process's.

    One process's files are also those of a lowering whose copies of the methods are whole:
    ExecuTorch's copy of each method shares its weights and caches (lowering/shared_state.py),
    and the methods share tensors (both hold the target's embedding), so a pass that wrote into
    one while lowering one method would change what a later method's compile is handed (the
    fake compile hashes it)."""
    spec, programs = traced
    alone = _files(cuda.lower_edge(copy.deepcopy(programs), "gemm", methods.constant_values(spec)))
    assert sorted(fake_aoti) == sorted(METHODS) and cuda.PTD in alone
    with monkeypatch.context() as patched:
        patched.setattr(cuda, "tensors_shared_on_deepcopy", contextlib.nullcontext)
        assert _files(cuda.lower_edge(copy.deepcopy(programs), "gemm", methods.constant_values(spec))) == alone
    fake_aoti.clear()
    said = []
    parallel = _lower(traced, recipe="fake_cuda_compile:drafter_perturbed", said=said)
    assert parallel == alone
    assert fake_aoti == ["draft_forward"]
    assert any(s.startswith("target_verify: compiled in") and "by its worker" in s for s in said), said
    differs = [s for s in said if "differs from every worker's" in s]
    weight = next(iter(programs["draft_forward"].state_dict))
    # It names the method and the one part that differs: the changed weight, with what each side holds
    # (the recipe added 1 to one of its values).
    mine = programs["draft_forward"].state_dict[weight]
    said_weight = re.fullmatch(
        rf"a delegate's input \(draft_forward\) differs from every worker's \(from its worker's in: "
        rf"tensor {re.escape(weight)} \[here (.*), the worker's (.*)\]\): compiling it in this process",
        differs[0]) if len(differs) == 1 else None
    assert said_weight and said_weight[1] == tensor_summary(mine), said
    theirs = re.fullmatch(r"(\(.*\) \S+) sum (\S+) max\|x\| (\S+)", said_weight[2])
    assert theirs and theirs[1] == f"{tuple(mine.shape)} {mine.dtype}", said_weight[2]
    assert float(theirs[2]) == pytest.approx(mine.double().sum().item() + 1.0)


def test_a_failed_worker_fails_the_lowering_with_its_log_and_out_of_memory_names_the_fix(traced, fake_aoti):
    """(One worker start: a compile that ran the GPU out of memory; the hint is the only part
    of the message that is not any failed worker's.)"""
    with pytest.raises(LoweringError, match=r"compiling (target_verify|draft_forward) in a worker process failed "
                                            r"\(exit 1\); the end of its log (.|\n)*CUDA out of memory(.|\n)*"
                                            r"The GPU ran out of memory with 2 compiles side by side(.|\n)*"
                                            r"export with fewer, --jobs 1 \(one after the other\)\."):
        _lower(traced, producer="fake_cuda_compile:out_of_memory", jobs=2)


def test_differences_name_the_parts_and_a_graphs_first_differing_line():
    from dflash_et.lowering.parallel_compile import Compiled, differences

    mine = {"graph <root>": "a", "signature": "s", "tensor p_w": "w1", "tensor c_only_here": "c"}
    theirs = Compiled("m", None, {"graph <root>": "b", "signature": "s", "tensor p_w": "w2", "tensor b_x": "x"},
                      {"graph <root>": "def forward(self, x):\n    y = x + 1\n    return y"})
    codes = {"graph <root>": "def forward(self, x):\n    y = x + 2\n    return y"}
    assert differences(mine, codes, theirs) == (
        "graph <root>, tensor b_x (only the worker's), tensor c_only_here (only here), tensor p_w; "
        "graph <root>, line 2: here 'y = x + 2', the worker's 'y = x + 1'")
    assert differences(mine, codes, theirs, limit=1) == (
        "graph <root> (and 3 more); graph <root>, line 2: here 'y = x + 2', the worker's 'y = x + 1'")
