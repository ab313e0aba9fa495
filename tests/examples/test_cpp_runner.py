"""The C++ runner (examples/cpp/dflash_runner), built against the installed ExecuTorch
package and run on the tiny DFlash programs of both variants: its committed tokens, its
drafts and its per-step acceptance equal the Python reference driver's (export/driver.py)
for the same owners on the same .pte, and bad input gives a message and exit status 2,
never a crash. (Committed tokens alone would not catch a drafter bookkeeping error: they
equal target-only decoding whatever the drafts; the drafts do.)

The fixture exports the programs in a subprocess and builds the runner meanwhile (the
build goes to a pytest temporary directory, so a fresh clone builds it here)."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import runner_cli
import yaml

from dflash_et.export import builder, config, driver, methods

ROOT = Path(__file__).resolve().parents[2]
SOURCE = runner_cli.SOURCE
VARIANTS = ("greedy", "sampling")
EXIT_BAD_INPUT = 2


pytestmark = [
    pytest.mark.skipif(runner_cli.missing_toolchain() is not None, reason=str(runner_cli.missing_toolchain())),
    pytest.mark.xdist_group("cpp_runner"),  # one worker builds the runner and exports once
]


def _heads_yaml(directory: Path) -> Path:
    path = directory / "heads-greedy-small.yaml"
    path.write_text(yaml.safe_dump({
        "program": "heads", "backend": "portable", "variant": "greedy", "logits_dtype": "float32",
        "heads": {"vocab_size": 64}, "limits": {"max_rows": 16, "max_owners": 4},
    }))
    return path


# The small heads program, then the same claiming the next contract_version (the runner must
# refuse it before anything else), then one of contract_version 1, whose constant methods had
# no get_ prefix: one process (each start imports torch and executorch, ~5 s of CPU).
_HEADS_EXPORTS = textwrap.dedent("""
    import sys
    from dflash_et.export import config, exporter, methods
    cfg = config.load(sys.argv[1])
    exporter.export_program(cfg, sys.argv[2])
    methods.CONTRACT_VERSION += 1
    exporter.export_program(cfg, sys.argv[3])
    methods.CONTRACT_VERSION = 1
    methods.CONSTANT_METHODS = {k: k for k in methods.CONSTANT_METHODS}
    exporter.export_program(cfg, sys.argv[4])
""")


@pytest.fixture(scope="module")
def setup(tmp_path_factory, shared_export):
    """{'runner': path, 'greedy' / 'sampling' / 'heads' / 'future' / 'old': artifact directories}.
    The small heads exports run in a process of their own while the runner builds; the tiny DFlash
    programs are the run's shared exports (test_dflash_program.py reads them too; this module
    asks for them in the other order, so two workers export one each)."""
    base = tmp_path_factory.mktemp("cpp_runner")
    heads = _heads_yaml(base)
    dirs = {k: base / k for k in ("heads", "future", "old")}
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    job = subprocess.Popen([sys.executable, "-c", _HEADS_EXPORTS, str(heads), *(str(dirs[k]) for k in dirs)],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT)
    try:
        runner = runner_cli.build(base / "build")
        dirs |= {v: shared_export(f"tiny-dflash-{v}") for v in reversed(VARIANTS)}
    finally:
        log = job.communicate()[0]
    if job.returncode != 0:
        pytest.fail(f"exporting the heads programs failed:\n{log[-3000:]}")
    return {"runner": runner, **dirs}


@pytest.fixture(scope="module")
def programs(setup):
    """The Python reference's view of the same .pte files."""
    return {v: driver.Program.load(builder.build(config.load(f"tiny-dflash-{v}")), setup[v]) for v in VARIANTS}


def _run(runner: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(runner), *map(str, args)], capture_output=True, text=True, timeout=120)


def _run_owners(setup, variant: str, owners: list[driver.Owner], *extra: str) -> dict:
    done = _run(setup["runner"], "--program", setup[variant] / "model.pte", *extra, *runner_cli.owner_args(owners))
    assert done.returncode == 0, f"runner failed ({done.returncode}):\n{done.stderr}"
    return runner_cli.parse(done.stdout)


def _mixed(program: driver.Program) -> list[driver.Owner]:
    """Three owners: greedy, temperature + top-k + top-p, temperature alone with a negative
    seed (all greedy in a greedy program); the third joins late."""
    sampling = program.constants["variant"] == "sampling"
    params = [
        dict(temperature=0.0),
        dict(temperature=0.8, top_k=40, top_p=0.9, seed=7) if sampling else dict(seed=7),
        dict(temperature=1.1, seed=-(1 << 60)) if sampling else dict(),
    ]
    prompts = [[5, 17, 42], [200, 3, 3, 9, 81, 128, 1], [77]]
    budgets = [20, 16, 24]
    joins = [0, 0, 2]
    return [driver.Owner(f"owner{i}", prompts[i], budgets[i], join=joins[i], **params[i]) for i in range(3)]


def _crowd(program: driver.Program) -> list[driver.Owner]:
    """max_owners owners with long budgets: enough verify calls that the random tiny drafter
    gets some drafts accepted, so the commit of accepted drafts runs."""
    c = program.constants
    temperature = 0.7 if c["variant"] == "sampling" else 0.0
    return [driver.Owner(f"owner{i}", [i * 31 % c["vocab_size"], i * 7 + 3, i * 13 + 5], 120,
                         temperature=temperature, seed=i) for i in range(c["max_owners"])]


OWNER_SETS = {
    "mixed": _mixed,
    "scenario": lambda program: driver.scenario(program, seed=0),  # chunked prefill, leave, slot reuse
    "crowd": _crowd,
}


@pytest.mark.parametrize("owners", sorted(OWNER_SETS))
@pytest.mark.parametrize("variant", VARIANTS)
def test_runner_commits_the_reference_tokens(setup, programs, variant, owners):
    program = programs[variant]
    group = [o.fresh(name=f"owner{i}") for i, o in enumerate(OWNER_SETS[owners](program))]
    want = driver.generate(program, group)
    got = _run_owners(setup, variant, group, "--drafts")
    for i, o in enumerate(group):
        assert got["tokens"][i] == want.tokens[o.name], f"owner {i} ({o.describe()})"
    assert got["steps"] == [s.acceptance for s in want.steps]
    assert got["drafts"] == [s.drafts for s in want.steps if s.owners]
    for i, o in enumerate(group):
        stats = got["stats"][i]
        assert stats["committed"] == len(got["tokens"][i]) - 1  # every token after the first one
        assert stats["mean_acceptance"] == pytest.approx(stats["committed"] / stats["verifies"], abs=1e-4)
    assert got["total"]["verifies"] == sum(len(s.acceptance) for s in want.steps)
    assert got["total"]["mean_acceptance"] == pytest.approx(want.acceptance_length(), abs=1e-4)
    assert got["total"]["tokens_per_step"] == pytest.approx(want.tokens_per_step(), abs=1e-4)
    if owners == "crowd":
        assert any(a > 1 for s in want.steps for a in s.acceptance), (
            "no draft was accepted in the whole run: the test no longer covers committing accepted drafts; "
            "give _crowd other prompts")


@pytest.mark.parametrize("variant", VARIANTS)
def test_target_only_gives_the_same_tokens(setup, programs, variant):
    group = [o.fresh(name=f"owner{i}") for i, o in enumerate(_mixed(programs[variant]))]
    speculative = _run_owners(setup, variant, group)
    target_only = _run_owners(setup, variant, group, "--target-only")
    assert target_only["tokens"] == speculative["tokens"]
    assert all(a == [1] * len(a) for a in target_only["steps"])


def test_owners_from_a_file_are_the_owners_of_the_command_line(setup, programs, tmp_path):
    """--owners FILE (one SPEC a line, '#' and blank lines skipped) after an --owner: the same
    owners, in the same order, the same tokens."""
    group = [o.fresh(name=f"owner{i}") for i, o in enumerate(_mixed(programs["sampling"]))]
    specs = [runner_cli.owner_spec(o) for o in group]
    listed = tmp_path / "owners.txt"
    listed.write_text("# owners 1 and 2\n" + specs[1] + "\n\n" + specs[2] + "\r\n")
    inline = _run_owners(setup, "sampling", group)
    done = _run(setup["runner"], "--program", setup["sampling"] / "model.pte", "--owner", specs[0], "--owners", listed)
    assert done.returncode == 0, done.stderr
    assert runner_cli.parse(done.stdout)["tokens"] == inline["tokens"]


def _owner_args(*specs: str) -> list[str]:
    return [a for s in specs for a in ("--owner", s)]


BAD_INPUTS = {
    "missing file": (lambda d: ["--program", d["sampling"] / "nope.pte", *_owner_args("prompt=1:max_new=2")],
                     "no such file"),
    "not a program": (lambda d: ["--program", d["sampling"] / "config.yaml", *_owner_args("prompt=1:max_new=2")],
                      "is not an ExecuTorch program"),
    "heads program": (lambda d: ["--program", d["heads"] / "model.pte", *_owner_args("prompt=1:max_new=2")],
                      "is a dflash-et 'heads' program; this runner drives DFlash programs"),
    "future contract": (lambda d: ["--program", d["future"] / "model.pte", *_owner_args("prompt=1:max_new=2")],
                        "has contract_version 3; this runner understands contract_version 2"),
    "contract 1 names": (lambda d: ["--program", d["old"] / "model.pte", *_owner_args("prompt=1:max_new=2")],
                         "has contract_version 1; this runner understands contract_version 2 only: re-export it"),
    "token id = vocab": (lambda d: ["--program", d["sampling"] / "model.pte",
                                    *_owner_args("prompt=1:max_new=2", "prompt=3,256,4:max_new=2")],
                         "owner 1: prompt token 256 is outside the vocab [0, 256)"),
    "negative token id": (lambda d: ["--program", d["greedy"] / "model.pte", *_owner_args("prompt=-1:max_new=2")],
                          "prompt token -1 is outside the vocab"),
    "too many owners": (lambda d: ["--program", d["sampling"] / "model.pte", *_owner_args(*["prompt=1:max_new=2"] * 9)],
                        "serves at most max_owners = 8"),
    "past max_seq_len": (lambda d: ["--program", d["greedy"] / "model.pte", *_owner_args("prompt=1,2:max_new=127")],
                         "exceeds the program's max_seq_len (128)"),
    "sampling owner, greedy program": (
        lambda d: ["--program", d["greedy"] / "model.pte", *_owner_args("prompt=1:max_new=2:temperature=0.7")],
        "a greedy program only decodes greedily"),
    "bad owner field": (lambda d: ["--program", d["greedy"] / "model.pte", *_owner_args("prompt=1:max_new=2:topk=3")],
                        "'topk=3' is not key=value with a key among"),
    "bad number": (lambda d: ["--program", d["greedy"] / "model.pte", *_owner_args("prompt=1,x:max_new=2")],
                   "prompt token must be an integer (int64), got 'x'"),
    "no owners": (lambda d: ["--program", d["greedy"] / "model.pte"], "give at least one --owner"),
    "--data for a CPU program": (lambda d: ["--program", d["greedy"] / "model.pte", "--data", d["greedy"] / "config.yaml",
                                            *_owner_args("prompt=1:max_new=2")],
                                 "is a CPU program (no CudaBackend delegate) and has no .ptd: run it without --data"),
    "missing .ptd": (lambda d: ["--program", d["greedy"] / "model.pte", "--data", d["greedy"] / "nope.ptd",
                                *_owner_args("prompt=1:max_new=2")], "nope.ptd: no such file"),
    "--no-shared-state for a CPU program": (
        lambda d: ["--program", d["greedy"] / "model.pte", "--no-shared-state", *_owner_args("prompt=1:max_new=2")],
        "--no-shared-state is for CUDA programs"),
    "--cuda-graphs for a CPU program": (
        lambda d: ["--program", d["greedy"] / "model.pte", "--cuda-graphs", *_owner_args("prompt=1:max_new=2")],
        "--cuda-graphs is for CUDA programs"),
    "--profile-steps for a CPU program": (
        lambda d: ["--program", d["greedy"] / "model.pte", "--profile-steps", *_owner_args("prompt=1:max_new=2")],
        "--profile-steps is for CUDA programs"),
    "unknown flag": (lambda d: ["--steps", "3"], "unknown argument '--steps'"),
    "missing owners file": (lambda d: ["--program", d["greedy"] / "model.pte", "--owners", d["greedy"] / "nope.txt"],
                            "nope.txt: cannot read the file"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_is_refused_with_a_message(setup, case):
    args, message = BAD_INPUTS[case]
    done = _run(setup["runner"], *args(setup))
    assert done.returncode == EXIT_BAD_INPUT, f"exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    assert message in done.stderr
    assert "tokens:" not in done.stdout


@pytest.mark.parametrize("case", ["no CUDA toolkit", "no ExecuTorch source"])
def test_the_cuda_build_fails_clearly_without_what_it_needs(tmp_path, case):
    """-DDFLASH_RUNNER_CUDA=ON on a machine without the CUDA toolkit, or without an ExecuTorch
    v1.2.0 source tree, stops at configure time with the missing piece and the fix."""
    args = ["cmake", "-S", str(SOURCE), "-B", str(tmp_path / "b"), "-DDFLASH_RUNNER_CUDA=ON"]
    if case == "no CUDA toolkit":
        args += ["-DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON"]
        message = "DFLASH_RUNNER_CUDA=ON needs the CUDA toolkit"
    else:
        message = "is not an ExecuTorch source tree"
    done = subprocess.run(args + [f"-DEXECUTORCH_SOURCE={tmp_path / 'nowhere'}"], capture_output=True, text=True)
    assert done.returncode != 0
    if case == "no ExecuTorch source" and "needs the CUDA toolkit" in done.stderr:
        pytest.skip("this machine has no CUDA toolkit: the source check is not reached")
    assert message in " ".join(done.stderr.split()), done.stderr


def test_the_cuda_code_of_the_runner_compiles():
    """The runner's CUDA-only code (`#ifdef DFLASH_RUNNER_CUDA`: the backend's options, the memory
    pool, the device copies) is compiled only on the GPU machine; a slip there would cost a
    device call. Checked here against ExecuTorch's installed headers and the CUDA runtime
    headers Triton ships (syntax and types, no link)."""
    import executorch
    import triton

    cxx = runner_cli.compiler()
    et = Path(list(executorch.__path__)[0]) / "include"
    cuda = Path(list(triton.__path__)[0]) / "backends" / "nvidia" / "include"
    assert (cuda / "cuda_runtime.h").is_file(), cuda
    args = [cxx, "-std=c++17", "-fsyntax-only", "-DDFLASH_RUNNER_CUDA", "-DC10_USING_CUSTOM_GENERATED_MACROS",
            f"-I{et}", f"-I{et / 'executorch/runtime/core/portable_type/c10'}", f"-I{cuda}", f"-I{SOURCE}",
            str(SOURCE / "main.cpp")]
    done = subprocess.run(args, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-4000:]


def test_help_documents_the_owner_syntax(setup):
    done = _run(setup["runner"], "--help")
    assert done.returncode == 0
    for key in ("prompt=", "max_new=", "temperature=", "top_k=", "top_p=", "seed=", "join=", "leave="):
        assert key in done.stdout


SHIM_CHECK_DRIVER = r"""
#include "shim_check.h"
#include <cstdio>
#include <fstream>
#include <iterator>
extern "C" int aoti_torch_defined_here(void*) { return 0; }  // as the runner's own shims
int main(int, char** argv) {
  std::ifstream f(argv[1], std::ios::binary);
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(f)), {});
  std::string error;
  auto names = dflash::undefined_symbols(bytes.data(), bytes.size(), "aoti_", error);
  if (!error.empty()) { std::printf("error: %s\n", error.c_str()); return 0; }
  for (auto& n : names) std::printf("imports %s\n", n.c_str());
  for (auto& n : dflash::not_in_executable(names)) std::printf("missing %s\n", n.c_str());
}
"""


def test_the_cuda_runners_shim_check_names_the_shims_it_lacks(tmp_path):
    """cuda/shim_check.cpp (the CUDA runner's warning about AOTInductor shims it does not
    define), on the CPU: a library importing three aoti_ functions, run by an executable that
    defines one, with another in a library beside it (as libtorch is): the two not in the
    executable are named; a truncated or non-ELF file is an error, not a crash."""
    cxx = runner_cli.compiler()
    (tmp_path / "lib.cpp").write_text(
        'extern "C" int aoti_torch_defined_here(void*); extern "C" int aoti_torch_zero_(void*);\n'
        'extern "C" int aoti_torch_in_libtorch(void*); extern "C" int other_function(void*);\n'
        'extern "C" int run(void* t) { return aoti_torch_defined_here(t) + aoti_torch_zero_(t)'
        ' + aoti_torch_in_libtorch(t) + other_function(t); }\n')
    (tmp_path / "torchlike.cpp").write_text('extern "C" int aoti_torch_in_libtorch(void*) { return 0; }\n')
    (tmp_path / "driver.cpp").write_text(SHIM_CHECK_DRIVER)
    cuda_dir = SOURCE / "cuda"
    for command in (
        [cxx, "-shared", "-fPIC", "-o", "libtorchlike.so", "torchlike.cpp"],
        [cxx, "-shared", "-fPIC", "-o", "method.so", "lib.cpp"],
        [cxx, "-std=c++17", "-rdynamic", f"-I{cuda_dir}", "driver.cpp", str(cuda_dir / "shim_check.cpp"),
         "-o", "driver", "-L.", "-ltorchlike", "-Wl,-rpath,$ORIGIN", "-ldl"],
    ):
        done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
    data = (tmp_path / "method.so").read_bytes()
    (tmp_path / "truncated.so").write_bytes(data[:1000])

    def check(name):
        return subprocess.run([str(tmp_path / "driver"), str(tmp_path / name)], capture_output=True, text=True,
                              timeout=30).stdout.splitlines()

    assert check("method.so") == [
        "imports aoti_torch_defined_here", "imports aoti_torch_in_libtorch", "imports aoti_torch_zero_",
        "missing aoti_torch_in_libtorch", "missing aoti_torch_zero_"]
    assert check("truncated.so") == ["error: a section header lies outside the file"]
    assert check("driver.cpp") == ["error: not an ELF64 shared library"]
