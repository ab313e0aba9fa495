"""torch's mutation analysis of every kernel launch of the three ops (the one AOTInductor
export runs on the TTIR: a tensor it finds written is copied before the kernel). Prints
one JSON object: {"fallbacks": n, "launches": [[kernel, [written args]], ...]}.
Run without TRITON_INTERPRET (the analysis reads JITFunctions); no GPU needed: TTIR is
generated for sm_90. Used by tests/kernels/test_kernels_compile.py.

`--explain ARG` (e.g. logits_ptr) prints instead, for each launch that counts ARG as
written, why: every write (a store, or a helper call that writes one of its arguments) whose
pointer the analysis follows back to ARG, and the helper calls on that way, descending into
the helpers. The analysis follows a helper's result back to every argument of the call (only
a `tt.load` in the same function stops it), so a store whose address a loaded logit picks,
computed through a helper that was given the row pointer, counts as a write to the row."""

import json
import logging
import sys

import torch
import triton
from torch._higher_order_ops import triton_kernel_wrap
from triton.backends.compiler import GPUTarget

from dflash_et.export import cases
from dflash_et.kernels import cached_attention, delta_rows, sample_rows, verify


class Sm90:
    def get_current_target(self):
        return GPUTarget("cuda", 90, 32)


class Fallbacks(logging.Handler):
    """torch logs a warning and assumes every input is mutated when the analysis fails."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def emit(self, record):
        self.count += record.levelno >= logging.WARNING


def written(kernel, kwargs):
    if hasattr(triton_kernel_wrap, "identify_accessed_tensors"):  # torch >= 2.12
        found = triton_kernel_wrap.identify_accessed_tensors(kernel, kwargs, {}).read_writes.writes
        return sorted(d.name for d in found if isinstance(kwargs.get(d.name), torch.Tensor))
    return sorted(triton_kernel_wrap.identify_mutated_tensors(kernel, kwargs, {}))  # torch 2.11


PLAIN = (torch.Tensor, bool, int, float, str, type(None))  # launch arguments whose repr is Python that runs
WRITES = ("tt.store", "tt.atomic_cas", "tt.atomic_rmw")


def _back(ops, start, stop=None):
    """Walk the analysis's way back from `start` (loads stop it): {value: (next value, op)}."""
    came, stack = {start: None}, [start]
    while stack:
        value = stack.pop()
        if value == stop:
            break
        if not isinstance(value, triton_kernel_wrap.Intermediate) or value.fake():
            continue
        for op in ops[value]:
            if op.name == "tt.load":
                continue
            for arg in op.args:
                if arg not in came:
                    came[arg] = (value, op)
                    stack.append(arg)
    return came


def _written(functions, fn, memo):
    """The argument indices of `fn` the analysis counts as written."""
    if fn not in memo:
        memo[fn] = set()
        sinks = [arg for arg, _ in _sinks(functions, fn, memo)]
        memo[fn] = {v.idx for s in sinks for v in _back(functions[fn], s) if isinstance(v, triton_kernel_wrap.Param)}
    return memo[fn]


def _sinks(functions, fn, memo):
    """(pointer value, what writes through it) of every write in `fn`."""
    for op_list in functions[fn].values():
        for op in op_list:
            if op.name == "tt.call":
                for i in sorted(_written(functions, op.fn_call_name, memo)):
                    yield op.args[i], (op.fn_call_name, i)
            elif op.name in WRITES:
                yield op.args[0], op.name


def _short(name):  # dflash_et.kernels.filtered.collect__Pbf16_..._c2.0 -> collect
    return name.split("__")[0].rsplit(".", 1)[-1]


def explain(functions, fn, index, memo, depth=0, seen=None):
    seen = set() if seen is None else seen
    target = triton_kernel_wrap.Param(index)
    for pointer, writer in _sinks(functions, fn, memo):
        came = _back(functions[fn], pointer, stop=target)
        if target not in came:
            continue
        calls, value = [], target
        while came[value] is not None:
            value, op = came[value]
            if op.name == "tt.call":
                calls.append(_short(op.fn_call_name))
        via = f" (via {', '.join(reversed(calls))})" if calls else ""
        if isinstance(writer, tuple):
            print(f"{'  ' * depth}{_short(fn)}: {_short(writer[0])} writes its argument {writer[1]}{via}")
            if (writer, depth) not in seen:
                seen.add((writer, depth))
                explain(functions, writer[0], writer[1], memo, depth + 1, seen)
        else:
            print(f"{'  ' * depth}{_short(fn)}: {writer}{via}")


def main():
    arg = sys.argv[sys.argv.index("--explain") + 1] if "--explain" in sys.argv else None
    triton.runtime.driver.set_active(Sm90())
    fallbacks = Fallbacks()
    triton_kernel_wrap.log.addHandler(fallbacks)
    launches = []

    class Spy:  # stands in for wrap_triton: records each launch's arguments by name
        def __init__(self, kernel):
            self.kernel = kernel

        def __getitem__(self, grid):
            def run(*args, **kw):
                kw = {k: v for k, v in kw.items() if k not in ("num_warps", "num_stages")}
                launches.append((self.kernel, {**dict(zip(self.kernel.arg_names, args)), **kw}))
            return run

    verify.wrap_triton = sample_rows.wrap_triton = cached_attention.wrap_triton = delta_rows.wrap_triton = Spy
    g = torch.Generator().manual_seed(0)
    inp = cases.verify_case(g, 1000, 8, 4, torch.bfloat16)
    verify.launch(*[inp[k] for k in cases.VERIFY_INPUTS])
    verify.launch(*[inp[k] for k in cases.VERIFY_INPUTS], greedy=True)
    sample_rows.launch(**cases.sample_case(g, 1000, 4, torch.bfloat16))
    rows = torch.zeros(3, dtype=torch.int64)
    for cells in (32, 2 * cached_attention.SPLIT_CELLS):  # whole runs; runs in pieces, then their combine
        cache = torch.zeros(2, cells, 2, 16, dtype=torch.bfloat16)
        cached_attention.cached_attention(torch.zeros(3, 4, 16, dtype=torch.bfloat16), cache, cache.clone(), rows,
                                          rows, rows + 5)
    windows, states = torch.zeros(3, 3, 4 * 8 + 2 * 8, dtype=torch.bfloat16), torch.zeros(3, 2, 8, 8)
    mixed, ab = torch.zeros(5, windows.shape[2], dtype=torch.bfloat16), torch.zeros(5, 2, dtype=torch.bfloat16)
    delta_rows.delta_rows(torch.zeros(5, dtype=torch.int64), mixed, ab, ab.clone(),
                          torch.zeros(windows.shape[2], 4, dtype=torch.bfloat16), ab[0].clone(), ab[0].clone(),
                          windows, states)
    if arg is not None:
        for kernel, kwargs in launches:
            ttir, names = triton_kernel_wrap.generate_ttir(kernel, kwargs, {})
            functions = triton_kernel_wrap.ttir_to_functions(ttir)
            top, memo = next(iter(functions)), {}
            if arg in names and names.index(arg) in _written(functions, top, memo):
                print(f"== {kernel.fn.__name__}: {arg} counts as written")
                explain(functions, top, names.index(arg), memo)
        return
    result = [[kernel.fn.__name__, written(kernel, kwargs)] for kernel, kwargs in launches]
    # Inductor writes each constant argument's repr into generated Python: a `tl.constexpr` object's
    # ("constexpr[2]") does not run there (every CUDA export of the sampling heads failed so in sessions 49-53)
    odd = sorted({f"{kernel.fn.__name__}.{name}: {value!r}" for kernel, kwargs in launches
                  for name, value in kwargs.items() if not isinstance(value, PLAIN)})
    print(json.dumps({"fallbacks": fallbacks.count, "launches": result, "odd_arguments": odd}))


if __name__ == "__main__":
    main()
