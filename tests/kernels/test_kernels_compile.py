"""Every kernel variant the launchers produce compiles for sm_90 (H100 / H200) on this
CPU-only machine: Triton's compiler and ptxas ship with the wheel. The interpreter runs
the kernels' Python, not their compilation, so this is where a non-constexpr global, a
type mismatch in a branch the test data never takes, or a spill shows up before GPU time.
(A subprocess: the tests run the kernels under TRITON_INTERPRET=1, which replaces them.)"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("logits", ["bf16", "fp32"])
def test_every_kernel_variant_compiles_for_sm90_without_spills(logits):
    """One logits dtype's variants each: tests of minutes that xdist can hand to either
    worker, instead of one that keeps a worker busy twice as long. float16 rows have
    bfloat16's layout (2-byte logits: the same steps, lanes and registers, one other
    conversion instruction), so its variants stop at TTIR, in the test below (~150 s of
    CI saved)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "kernel_registers.py"), "--logits", logits],
                         env=env, capture_output=True, text=True, timeout=1200)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    lines = [x for x in run.stdout.splitlines() if "REG:" in x]
    assert len(lines) == 26 and all(f"*{logits}" in x for x in lines), lines  # verify 10 (5 select stages),
    # greedy_rows, sample_rows 7 (4 select stages), attention 7 (2 head layouts: whole, in pieces, combine; the
    # plan), delta_rows
    for line in lines:
        assert int(re.search(r"REG:(\d+)", line).group(1)) <= 255 and "LOCAL:0" in line, line  # no spills
    for line in lines:  # the sample select's launches: no stack frame either (their descents over a
        # 4096-entry list sit at the edge of 255 registers: a frame there is spills, `kernels/cut_select.py`)
        if "verify_filtered" in line or "filtered=True" in line or "sample_select" in line:
            assert "STACK:0" in line, line


test_every_kernel_variant_compiles_for_sm90_without_spills.run_first = True  # (conftest.py: the longest tests)


def test_jit_helpers_and_constexpr_globals_have_one_meaning_per_name():
    """AOTInductor (the CUDA delegate's compiler) copies each kernel and the @triton.jit
    helpers and constexpr globals it uses into one source file, by name: two helpers of one
    name in different kernel modules collide there (seen on the H200: nucleus' and
    sampling_rule's `_kept`, "missing 5 required positional arguments"), which neither the
    interpreter nor triton.compile shows."""
    import importlib
    import pkgutil

    import triton.language as tl

    from dflash_et import kernels

    helpers, constants = {}, {}
    for info in pkgutil.iter_modules(kernels.__path__):
        module = importlib.import_module(f"dflash_et.kernels.{info.name}")
        for name, obj in vars(module).items():
            fn = getattr(obj, "fn", None)  # JITFunction, or InterpretedFunction under TRITON_INTERPRET=1
            if callable(fn) and hasattr(obj, "run") and fn.__module__ == module.__name__:
                assert name not in helpers, f"@triton.jit {name} in {helpers.get(name)} and {module.__name__}"
                helpers[name] = module.__name__
            elif isinstance(obj, tl.constexpr):
                assert constants.setdefault(name, obj.value) == obj.value, f"constexpr {name} has two values"
    assert len(helpers) > 40, sorted(helpers)  # (the walk found the kernel modules' helpers)


def test_kernels_compile_with_vocab_as_a_constant():
    """During AOTInductor export torch analyses each kernel for the tensors it mutates and
    compiles it with the static ints, V among them, as Python constants. A helper that
    calls .to() on V fails there (seen on the H200: "'int' object has no attribute 'to'"),
    and torch then assumes every input is mutated (copies of the logits). float16 variants,
    taken as far as that analysis takes them: TTIR (the frontend, where such a helper fails,
    as would a type error of float16's own conversions; the spill test above compiles the
    bfloat16 and float32 variants to the end)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "kernel_registers.py"), "--const-vocab",
                          "--ttir", "--logits", "fp16"], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert len([x for x in run.stdout.splitlines() if "TTIR ops:" in x]) == 26, run.stdout  # as above


def test_kernel_sources_survive_inductors_source_file():
    """AOTInductor writes each kernel's source, with its helpers, into a Python file inside a
    ''' string literal (`async_compile.triton(name, '''...''')`): a backslash escape in the
    source turns into the character it names there (seen on the H200: an old kernel's fence asm
    text, "fence...;\\n...", became an unterminated string, and every CUDA export of the
    sampling heads failed). Each kernel's source, pasted as Inductor pastes it, parses back
    to the same text. (A subprocess: Inductor reads JITFunctions, which TRITON_INTERPRET=1
    replaces.)"""
    script = """
import ast, importlib, pkgutil
from torch._inductor.codegen.wrapper import user_defined_triton_kernel_transitive_closure_source_code as source
from triton.runtime.jit import JITFunction
from dflash_et import kernels
seen = 0
for info in pkgutil.iter_modules(kernels.__path__):
    module = importlib.import_module(f"dflash_et.kernels.{info.name}")
    for name, obj in vars(module).items():
        if isinstance(obj, JITFunction) and name.endswith("_kernel") and obj.fn.__module__ == module.__name__:
            src = source(obj)
            pasted = "async_compile.triton(" + repr(name) + ", '''\\n" + src + "\\n''')\\n"
            text = ast.parse(pasted).body[0].value.args[1].value
            assert text.strip() == src.strip(), f"{module.__name__}.{name}: the pasted source reads differently"
            ast.parse(text)
            seen += 1
print("kernels", seen)
"""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert int(run.stdout.split()[-1]) == 12, run.stdout  # verify.py 3 (argmax among them), sample_rows.py 3,
    # attention 4 (whole runs; the plan, the pieces and their combine), greedy_rows 1, delta_rows 1


def test_torch_mutation_analysis_finds_no_launch_writing_an_input():
    """AOTInductor export runs torch's mutation analysis on each kernel's TTIR and copies
    every tensor it finds written before the launch. Inline assembly stops it (a fence in an
    old kernel, seen on the H200): every input then counts as written. The analysis also
    over-approximates: it follows a @triton.jit helper's result back to every argument of the
    call (only a load stops it), so a store whose address a logit picks through such a result
    counts as a write to the logits (the filtered launches did: a copy of the logits before
    them, ~146 us at the headline shape; the package docstring says how the kernels avoid it).
    Every launch of the three ops is analysed without the fallback, and each writes exactly
    its outputs and scratch: no input, the logits and the owners' parameters among them.
    Every launch argument is a tensor or a plain Python value: Inductor pastes a constant's repr
    into the Python it runs to autotune, where a `tl.constexpr` object's ("constexpr[2]") is a
    NameError (every CUDA export of the sampling heads failed so, sessions 49-53)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, str(ROOT / "tests" / "mutation_analysis.py")], env=env,
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    found = json.loads(run.stdout.splitlines()[-1])
    assert found["fallbacks"] == 0, run.stderr[-3000:]
    assert found["odd_arguments"] == [], found["odd_arguments"]  # pass ints, not tl.constexpr objects
    launches = found["launches"]
    assert len(launches) == 24, launches  # verify 9 (6 of the select), verify_argmax 2, sample_rows 8 (5 of the
    # select), cached_attention 4 (whole runs; runs in pieces: the plan, the pieces, their combine), delta_rows 1
    scratch = {"work_ptr", "part_ptr", "m_ptr", "l_ptr", "acc_ptr", "count_ptr", "plan_ptr"}
    outputs = {"accepted_ptr", "next_token_ptr", "out_ptr", "windows_out_ptr", "states_out_ptr", "core_ptr"}
    for kernel, writes in launches:
        assert writes and set(writes) <= scratch | outputs, (kernel, writes)
    exact = {"verify_rows_kernel": ["work_ptr"], "verify_filtered_kernel": ["work_ptr"],
             "verify_accept_kernel": ["accepted_ptr", "next_token_ptr"], "chunk_kernel": ["part_ptr", "work_ptr"],
             "combine_kernel": ["out_ptr"],
             "delta_rows_kernel": ["core_ptr", "states_out_ptr", "windows_out_ptr"]}
    for kernel, writes in launches:
        assert writes == exact.get(kernel, writes), (kernel, writes)
    assert sorted(w for k, w in launches if k == "sample_rows_kernel") == [["out_ptr"], ["out_ptr", "work_ptr"]]
    attention = [(k, w) for k, w in launches if k.startswith("cached_attention")]
    assert attention == [("cached_attention_kernel", ["out_ptr"]), ("cached_attention_plan_kernel", ["plan_ptr"]),
                         ("cached_attention_pieces_kernel", ["acc_ptr", "count_ptr", "l_ptr", "m_ptr"])], attention
    assert all(w in (["work_ptr"], ["out_ptr", "work_ptr"]) for k, w in launches if k == "sample_select_kernel")
    # --explain names, for a launch that would count an input as written, the writes that lead there
    run = subprocess.run([sys.executable, str(ROOT / "tests" / "mutation_analysis.py"), "--explain", "work_ptr"],
                         env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    explained = {line.split()[1].rstrip(":") for line in run.stdout.splitlines() if line.startswith("== ")}
    assert explained == {k for k, writes in launches if "work_ptr" in writes}, run.stdout
    assert "tt.store" in run.stdout and "writes its argument" in run.stdout, run.stdout
