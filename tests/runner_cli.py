"""The C++ runner's build, command line and output, for the tests that drive it
(test_cpp_runner.py and test_hybrid_program.py on the CPU, test_cuda_runner_gpu.py on a GPU)."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from dflash_et.export import driver

SOURCE = Path(__file__).resolve().parents[1] / "examples" / "cpp" / "dflash_runner"


def compiler() -> str | None:
    """The first C++ compiler found ($CXX, c++, g++, clang++)."""
    return next((c for c in (os.environ.get("CXX", "c++"), "c++", "g++", "clang++") if shutil.which(c)), None)


def missing_toolchain() -> str | None:
    """Why the runner cannot be built here (None: it can)."""
    if shutil.which("cmake") is None:
        return "cmake is not installed (the C++ runner is built with CMake)"
    if compiler() is None:
        return "no C++ compiler (c++, g++ or clang++) is installed"
    return None


def build(directory: Path) -> Path:
    """The CPU runner, CMake against the executorch wheel's package config (about 5 s)."""
    import executorch

    prefix = Path(list(executorch.__path__)[0]) / "lib" / "cmake" / "executorch"
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    for cmd in (
        ["cmake", "-S", str(SOURCE), "-B", str(directory), *generator, "-DCMAKE_BUILD_TYPE=Release",
         f"-DCMAKE_PREFIX_PATH={prefix}"],
        ["cmake", "--build", str(directory)],
    ):
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            pytest.fail(f"{' '.join(cmd)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return directory / "dflash_runner"


def owner_spec(o: driver.Owner) -> str:
    """An Owner as the runner's --owner value (repr keeps every float exact)."""
    fields = [f"prompt={','.join(map(str, o.prompt))}", f"max_new={o.max_new}", f"temperature={o.temperature!r}",
              f"top_k={o.top_k}", f"top_p={o.top_p!r}", f"seed={o.seed}", f"join={o.join}"]
    if o.leave is not None:
        fields.append(f"leave={o.leave}")
    return ":".join(fields)


def owner_args(owners: list[driver.Owner]) -> list[str]:
    return [a for o in owners for a in ("--owner", owner_spec(o))]


def parse(stdout: str) -> dict:
    """The runner's records: tokens and stats per owner, acceptance per step, the totals,
    (--timing) the per-method times and the loop's throughput, and (--cuda-graphs) the graphs
    captured and the calls replayed."""
    out = {"tokens": {}, "stats": {}, "steps": [], "drafts": [], "total": None, "timing": {}, "loop": None,
           "cuda_graphs": None}
    for line in stdout.splitlines():
        words = line.split()
        if line.startswith("owner ") and words[2] == "tokens:":
            out["tokens"][int(words[1])] = [int(t) for t in words[3:]]
        elif line.startswith("owner ") and words[2] == "stats:":
            out["stats"][int(words[1])] = dict(zip(words[3::2], map(float, words[4::2])))
        elif line.startswith("step ") and words[2] == "drafts":  # steps with owners only
            out["drafts"].append([[] if d == "-" else [int(t) for t in d.split(",")] for d in words[3:]])
        elif line.startswith("step "):
            acceptance = line.split(" acceptance ")[1].split()
            out["steps"].append([int(a) for a in acceptance if a != "-"])
        elif line.startswith("total: "):
            out["total"] = dict(zip(words[1::2], map(float, words[2::2])))
        elif line.startswith("timing loop "):
            out["loop"] = dict(zip(words[2::2], map(float, words[3::2])))
        elif line.startswith("timing "):
            out["timing"][words[1]] = dict(zip(words[2::2], map(float, words[3::2])))
        elif line.startswith("cuda_graphs "):
            out["cuda_graphs"] = dict(zip(words[1::2], map(int, words[2::2])))
    return out
