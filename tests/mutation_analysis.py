"""torch's mutation analysis of every kernel launch of the three ops (the one AOTInductor
export runs on the TTIR: a tensor it finds written is copied before the kernel). Prints
one JSON object: {"fallbacks": n, "launches": [[kernel, [written args]], ...]}.
Run without TRITON_INTERPRET (the analysis reads JITFunctions); no GPU needed: TTIR is
generated for sm_90. Used by tests/kernels/test_kernels_compile.py."""

import json
import logging

import torch
import triton
from torch._higher_order_ops import triton_kernel_wrap
from triton.backends.compiler import GPUTarget

from dflash_et.export import cases
from dflash_et.kernels import sample_rows, verify


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


def main():
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

    verify.wrap_triton = sample_rows.wrap_triton = Spy
    g = torch.Generator().manual_seed(0)
    inp = cases.verify_case(g, 1000, 8, 4, torch.bfloat16)
    verify.launch(*[inp[k] for k in cases.VERIFY_INPUTS])
    verify.launch(*[inp[k] for k in cases.VERIFY_INPUTS], greedy=True)
    sample_rows.launch(**cases.sample_case(g, 1000, 4, torch.bfloat16))
    result = [[kernel.fn.__name__, written(kernel, kwargs)] for kernel, kwargs in launches]
    print(json.dumps({"fallbacks": fallbacks.count, "launches": result}))


if __name__ == "__main__":
    main()
