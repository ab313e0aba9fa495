"""A program's delegates compiled side by side, one worker process per method.

AOTInductor's compile of a method (its re-trace, Triton code generation, GEMM
autotuning, the C++ build) is most of a CUDA export's time, and ExecuTorch runs the
methods' compiles one after another. Here each method is made again and lowered on
its own in a worker process (`python -m dflash_et.lowering.parallel_compile WORKDIR
METHOD`), while this process lowers every method as usual with the backend's
`preprocess` replaced: a call waits for the workers and takes the result they made
for the same input. (A worker makes its method with the producer rather than loading
this process's program: `torch.export.save` / `load` of a traced DFlash method did not
round-trip, the loaded program failing ExecuTorch's decompositions on its unbacked
symbols.)

"The same input" is checked, not assumed: both sides hash what `preprocess` is
handed (every graph's code, the signature, the weights and constants with their
bytes, the compile specs). A call whose hash no worker produced compiles here, as without
workers, and says so. A failed worker fails the export with its log's tail; any
exit (an error, Ctrl-C) stops the workers still running.

A worker runs two functions named `module:function`: the producer,
`producer(method, **producer_options)`, returns {method: ExportedProgram} as this
process has it before lowering; the recipe, `recipe(programs, **options)`, lowers
them as this process does. The recipe must lower a program the same way whatever the
other programs are (ExecuTorch partitions and compiles each method on its own).

`dflash-et export` uses it by default (`--jobs auto`, lowering/cuda.py: `auto_jobs`); on
one GPU the side-by-side compiles slow each other, but the export's wall time is bounded by
the slowest method rather than the sum (docs/CONTRACT.md, "Compiling the methods side by
side").
"""

import concurrent.futures
import contextlib
import dataclasses
import hashlib
import importlib
import inspect
import json
import os
import pickle
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

from .errors import LoweringError

LOG_TAIL = 4000  # characters of a failed worker's log in the error
SUMMARY_CHUNK = 1 << 24  # elements per float64 step of `tensor_summary`


def fingerprint_parts(program, compile_specs) -> dict[str, str]:
    """What a backend's `preprocess` compiles, part by part (each graph's code, the
    signature, each weight or constant with its name, shape, dtype and bytes, the compile
    specs): part -> a hash of it. `fingerprint_of` hashes them all; the parts name what differs
    when a worker's input is not the exporting process's."""
    parts = {}
    for name, module in program.graph_module.named_modules():
        if isinstance(module, torch.fx.GraphModule):
            parts[f"graph {name or '<root>'}"] = _digest(module.code.encode())
    parts["signature"] = _digest(str(program.graph_signature).encode())
    for part, t in _tensor_parts(program).items():
        head = f"{tuple(getattr(t, 'shape', ()))}:{getattr(t, 'dtype', type(t).__name__)}".encode()
        data = b""
        if isinstance(t, torch.Tensor) and t.numel():
            data = t.detach().reshape(-1).contiguous().view(torch.uint8).cpu().numpy().tobytes()
        parts[part] = _digest(head, data)
    parts["compile specs"] = _digest(*(spec.key.encode() + b"=" + bytes(spec.value) for spec in compile_specs))
    return parts


def tensor_summaries(program) -> dict[str, str]:
    """Each weight or constant's `tensor_summary`, by its fingerprint part's name: what
    `differences` shows of a tensor whose bytes differ (display only, never compared: a sum
    in another order may differ in its last bits)."""
    return {part: tensor_summary(t) for part, t in _tensor_parts(program).items()}


def _tensor_parts(program) -> dict:
    """A program's weights and constants by their fingerprint part's name ("tensor NAME"), sorted."""
    tensors = {**program.state_dict, **program.constants}
    return {f"tensor {name}": tensors[name] for name in sorted(tensors)}


def tensor_summary(t) -> str:
    """Shape, dtype, and the float64 sum and largest magnitude of the values, e.g.
    "(256, 128) torch.float32 sum 1.25 max|x| 1" (two tensors that differ in a few bits
    usually differ in the sum too; NaN shows as nan)."""
    if not isinstance(t, torch.Tensor):
        return type(t).__name__
    text = f"{tuple(t.shape)} {t.dtype}"
    if t.numel() and not t.is_complex() and t.dtype != torch.bool:
        try:  # (display only: a dtype without a float64 conversion must not fail a worker's compile)
            flat, total, peak = t.detach().reshape(-1), 0.0, 0.0
            for start in range(0, flat.numel(), SUMMARY_CHUNK):  # (a KV cache of tens of GB: no float64 copy of it)
                x = flat[start:start + SUMMARY_CHUNK].to(torch.float64)
                most = x.abs().max().item()
                total, peak = total + x.sum().item(), most if most != most else max(peak, most)  # (NaN stays)
        except (RuntimeError, TypeError):
            return text
        text += f" sum {total!r} max|x| {peak!r}"
    return text


def fingerprint_of(parts: dict[str, str]) -> str:
    """One hash of a `fingerprint_parts`: equal exactly when every part is."""
    return _digest(*(f"{k}={v}".encode() for k, v in sorted(parts.items())))


def graph_codes(program) -> dict[str, str]:
    """Each graph's code, by its fingerprint part's name (for the first differing line)."""
    return {f"graph {name or '<root>'}": module.code for name, module in program.graph_module.named_modules()
            if isinstance(module, torch.fx.GraphModule)}


def _digest(*chunks: bytes) -> str:
    h = hashlib.sha256()
    for chunk in chunks:
        h.update(len(chunk).to_bytes(8, "little") + chunk)
    return h.hexdigest()


@dataclasses.dataclass
class Compiled:
    """A worker's compile: its method, the backend's result, its input's fingerprint parts,
    graph code and tensor summaries."""
    method: str
    result: object
    parts: dict[str, str]
    codes: dict[str, str]
    summaries: dict[str, str] = dataclasses.field(default_factory=dict)


def differences(mine: dict[str, str], my_codes: dict[str, str], theirs: Compiled, limit: int = 6,
                my_summaries: dict[str, str] | None = None) -> str:
    """Where an input differs from a worker's: the differing parts, e.g. "graph <root>,
    tensor p_w [here (4,) torch.float32 sum 1.0 max|x| 1.0, the worker's (4,) ... sum 2.0
    ...] (and 3 more)" (a tensor's summaries where both sides have one), and the first
    differing line of the first differing graph."""
    names = sorted(k for k in mine.keys() | theirs.parts.keys() if mine.get(k) != theirs.parts.get(k))
    my_summaries = my_summaries or {}

    def shown(name: str) -> str:
        if name not in theirs.parts:
            return name + " (only here)"
        if name not in mine:
            return name + " (only the worker's)"
        if name in my_summaries and name in theirs.summaries:
            return f"{name} [here {my_summaries[name]}, the worker's {theirs.summaries[name]}]"
        return name

    said = [shown(n) for n in names[:limit]]
    text = ", ".join(said) + (f" (and {len(names) - limit} more)" if len(names) > limit else "")
    for name in names:
        if name in my_codes and name in theirs.codes:
            here, there = my_codes[name].splitlines(), theirs.codes[name].splitlines()
            line = next((i for i, (a, b) in enumerate(zip(here, there)) if a != b), min(len(here), len(there)))
            text += (f"; {name}, line {line + 1}: here {here[line].strip() if line < len(here) else '<end>'!r}, "
                     f"the worker's {there[line].strip() if line < len(there) else '<end>'!r}")
            break
    return text


def supported(backend: type) -> bool:
    """Whether `backend` compiles each method on its own (its `preprocess`), which workers can
    do apart. A backend with its own `preprocess_multimethod` compiles a program's methods
    together (ExecuTorch 1.5's CudaBackend: one weight store for all methods)."""
    from executorch.exir.backend.backend_details import BackendDetails

    def function(owner):
        return inspect.getattr_static(owner, "preprocess_multimethod").__func__

    return function(backend) is function(BackendDetails)


def _resolve(path: str):
    module, _, name = path.partition(":")
    found = importlib.import_module(module)
    for part in name.split("."):
        found = getattr(found, part)
    return found


@contextlib.contextmanager
def classmethod_replaced(owner: type, name: str, make):
    """Replace the classmethod `owner.name` by `make(original_function)` for the block
    (restored after, also when it was inherited)."""
    own = name in vars(owner)
    original = inspect.getattr_static(owner, name)  # the classmethod object
    setattr(owner, name, classmethod(make(original.__func__)))
    try:
        yield
    finally:
        if own:
            setattr(owner, name, original)
        else:
            delattr(owner, name)


class Workers:
    """The running workers of one lowering; `take` is the replaced `preprocess`'s lookup."""

    def __init__(self, workdir: Path, methods: list[str], jobs: int, say):
        self.workdir, self.say, self.jobs = workdir, say, jobs
        self._procs: dict[str, subprocess.Popen] = {}
        self._stopped = threading.Event()
        self._lock = threading.Lock()
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="compile")
        self._futures = {m: self._pool.submit(self._run, m) for m in methods}
        self._results: dict[str, Compiled] = {}  # fingerprint -> a worker's compile

    def _run(self, method: str) -> dict[str, tuple]:
        if self._stopped.is_set():
            return {}
        log = self.workdir / f"{method}.log"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        # An Inductor cache per method: two compiles of one kernel side by side in one cache
        # raced (one link step found the other's object files gone). One Triton cache for all
        # (its entries are written whole, then renamed): a kernel that two methods hold (the
        # verify heads in target_verify and dflash_verify) is compiled once where one worker
        # reaches it after the other has stored it.
        base = os.environ.get("TORCHINDUCTOR_CACHE_DIR") or _default_cache_dir()
        env["TORCHINDUCTOR_CACHE_DIR"] = str(Path(base) / f"dflash-method-{method}")
        env.setdefault("TRITON_CACHE_DIR", str(Path(base) / "dflash-triton"))
        start = time.perf_counter()
        with open(log, "wb") as out, self._lock:
            if self._stopped.is_set():
                return {}
            proc = subprocess.Popen([sys.executable, "-m", __name__, str(self.workdir), method],
                                    stdout=out, stderr=subprocess.STDOUT, env=env)
            self._procs[method] = proc
        code = proc.wait()
        if code != 0:
            if self._stopped.is_set():
                return {}
            tail = log.read_text(errors="replace")[-LOG_TAIL:]
            hint = ""
            if "CUDA out of memory" in tail:  # (seen: the 8k program's compiles, 5 side by side, on an 80 GB H100)
                fewer = (f"e.g. --jobs {self.jobs // 2} (--jobs 1: one after the other)" if self.jobs >= 4
                         else "--jobs 1 (one after the other)")
                hint = (f"\nThe GPU ran out of memory with {self.jobs} compiles side by side (each holds its method's "
                        f"weights and caches on the GPU): export with fewer, {fewer}.")
            raise LoweringError(f"compiling {method} in a worker process failed (exit {code}); the end of its "
                                f"log ({log}):\n{tail}{hint}")
        with open(self.workdir / f"{method}.result", "rb") as f:
            found = pickle.load(f)
        for seconds in found["seconds"]:
            self.say(f"{method}: compiled in {seconds:.1f}s by its worker "
                     f"({time.perf_counter() - start:.1f}s with the worker's start)")
        return {fingerprint_of(parts): Compiled(method, result, parts, codes, summaries)
                for parts, codes, summaries, result in found["results"]}

    def take(self, parts: dict[str, str]) -> "Compiled | None":
        """The workers' result for the input with fingerprint parts `parts`, or None when none
        made it. Waits for the workers in method order (this process lowers the methods in
        that order)."""
        fp = fingerprint_of(parts)
        for method, future in self._futures.items():
            if fp in self._results:
                break
            self._results.update(future.result())
        return self._results.pop(fp, None)

    def unmatched(self, method: str) -> "list[Compiled]":
        """The workers' results for `method` that no input took."""
        return [c for c in self._results.values() if c.method == method]

    def stop(self) -> None:
        self._stopped.set()
        with self._lock:
            for proc in self._procs.values():
                if proc.poll() is None:
                    proc.kill()
        self._pool.shutdown(wait=True, cancel_futures=True)


def _default_cache_dir() -> str:
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    return default_cache_dir()


@contextlib.contextmanager
def compiled_by_workers(methods: list[str], backend, producer: tuple[str, dict], recipe: tuple[str, dict],
                        jobs: int, preload: tuple[str, ...] = (), say=lambda text: None):
    """While lowering `methods`: `backend`'s compiles run in up to `jobs` worker processes,
    each making one method with `producer` and lowering it with `recipe` (both
    ("module:function", options)); a worker imports `preload` first."""
    if not supported(backend):
        raise LoweringError(f"{backend.__name__} compiles a program's methods together; they cannot be "
                            "compiled in separate processes (export with --jobs 1)")
    with tempfile.TemporaryDirectory(prefix="dflash-compile-") as tmp:
        workdir = Path(tmp)
        (workdir / "job.json").write_text(json.dumps({
            "producer": producer, "recipe": recipe, "preload": list(preload),
            "backend": f"{backend.__module__}:{backend.__qualname__}",
        }))
        say(f"compiling {len(methods)} methods in {min(jobs, len(methods))} worker processes")
        workers = Workers(workdir, list(methods), jobs, say)

        def make(original):
            def preprocess(cls, edge_program, compile_specs):
                parts = fingerprint_parts(edge_program, compile_specs)
                found = workers.take(parts)
                if found is None:
                    named = [bytes(c.value).decode(errors="replace") for c in compile_specs if c.key == "method_name"]
                    method = named[0] if named else None
                    unmatched = workers.unmatched(method)
                    summaries = tensor_summaries(edge_program) if unmatched else {}
                    why = [differences(parts, graph_codes(edge_program), c, my_summaries=summaries) for c in unmatched]
                    say(f"a delegate's input{' (' + method + ')' if method else ''} differs from every worker's"
                        + (f" (from its worker's in: {why[0]})" if why else "") + ": compiling it in this process")
                    return original(cls, edge_program, compile_specs)
                return found.result
            return preprocess

        try:
            with classmethod_replaced(backend, "preprocess", make):
                yield
        finally:
            workers.stop()


def work(workdir: Path, method: str) -> None:
    """A worker: make `method` with the job's producer, lower it with its recipe, and store
    every result of the backend's `preprocess` under the fingerprint of its input."""
    job = json.loads((workdir / "job.json").read_text())
    for module in job["preload"]:
        importlib.import_module(module)
    backend = _resolve(job["backend"])
    (producer, producer_options), (recipe, options) = job["producer"], job["recipe"]
    programs = _resolve(producer)(method, **producer_options)
    results, seconds = [], []

    def make(original):
        def preprocess(cls, edge_program, compile_specs):
            # Fingerprinted before the compile: ExecuTorch 1.2's preprocess rewrites the graph
            # it is handed in place (slice_copy -> slice), and the exporting process
            # fingerprints its input before any compile too.
            parts, codes = fingerprint_parts(edge_program, compile_specs), graph_codes(edge_program)
            summaries = tensor_summaries(edge_program)
            start = time.perf_counter()
            result = original(cls, edge_program, compile_specs)
            seconds.append(time.perf_counter() - start)
            results.append((parts, codes, summaries, result))
            return result
        return preprocess

    with classmethod_replaced(backend, "preprocess", make):
        _resolve(recipe)(programs, **options)
    tmp = workdir / f".{method}.result.tmp"
    with open(tmp, "wb") as f:
        pickle.dump({"results": results, "seconds": seconds}, f, protocol=pickle.HIGHEST_PROTOCOL)
    os.replace(tmp, workdir / f"{method}.result")


if __name__ == "__main__":
    work(Path(sys.argv[1]), sys.argv[2])
