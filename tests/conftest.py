import fcntl
import logging
import os
import sys
import warnings
from pathlib import Path

import pytest
import torch

if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # Triton kernels run on the CPU through the interpreter

sys.path.insert(0, str(Path(__file__).resolve().parent))  # spec_oracle and helpers

if os.environ.get("TRITON_INTERPRET") == "1":
    import fast_interpreter

    fast_interpreter.install()  # two of the interpreter's repeated costs, removed (fast_interpreter.py)
    import interpreter_dot

    interpreter_dot.install()  # bfloat16 tl.dot as the GPU computes it (interpreter_dot.py)
    if os.environ.get("DFLASH_GPU_MIN_MAX") == "1":
        import gpu_min_max

        gpu_min_max.install()  # the GPU's float min / max, NaN dropped (gpu_min_max.py)

logging.getLogger("torchao").setLevel(logging.ERROR)
logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)
warnings.filterwarnings("ignore", category=FutureWarning, message=".*LeafSpec.*")


def small_config(tmp_path: Path, variant: str, vocab: int = 1000, max_rows: int = 64,
                 max_owners: int = 16, logits_dtype: str = "float32", **extra) -> Path:
    """A heads config with a small vocab, written to tmp_path."""
    import yaml

    data = {
        "program": "heads", "backend": "portable", "variant": variant, "logits_dtype": logits_dtype,
        "heads": {"vocab_size": vocab}, "limits": {"max_rows": max_rows, "max_owners": max_owners},
        **extra,
    }
    path = tmp_path / f"heads-{variant}-{vocab}-{logits_dtype}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture
def make_config(tmp_path):
    return lambda *a, **k: small_config(tmp_path, *a, **k)


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models gain nothing from intra-op threads, and OpenMP workers spin-waiting on
    a busy two-core machine can slow eager calls a hundredfold."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def shared_export(tmp_path_factory):
    """`shared_export(name)`: the artifact directory of built-in config `name`, exported once
    per test run and shared by every xdist worker (exports are byte-identical, so whichever
    worker comes first exports under a file lock and the others read it). Read-only."""
    from dflash_et.export import config, exporter

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the run's directory, above each worker's own
    root = root / "shared-exports"
    root.mkdir(exist_ok=True)

    def get(name: str) -> Path:
        target = root / name
        with open(root / f"{name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not (target / "manifest.json").exists():
                exporter.export_program(config.load(name), target)
        return target

    return get


def loads_every_method(cfg, directory: Path):
    """The artifact's program in executorch.runtime, after checking it holds exactly the
    config's methods and constants and loading each method (a missing portable kernel fails
    only at load)."""
    from dflash_et.export import builder, check, methods

    program = check.load_program(directory)
    spec = builder.build(cfg)
    assert set(program.method_names) == {m.name for m in spec.methods} | set(methods.constant_names(spec))
    for method in program.method_names:
        program.load_method(method)
    return program


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items):
    """Tests whose function carries `run_first = True` (the longest ones) move to the front
    of the collection, in their order, the rest keeping theirs. xdist's loadgroup scheduler
    hands out the xdist_group scopes first (largest first), then the other tests in
    collection order: a test of minutes handed out last keeps one worker busy after the
    other has run out of work."""
    items.sort(key=lambda item: not getattr(getattr(item, "obj", None), "run_first", False))
