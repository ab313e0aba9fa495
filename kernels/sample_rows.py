"""`dflash::sample_rows`: the sampling rule of SPEC.md on every row, fused.

Algorithm: one program per row runs `sampling_rule.decide` with the token always
needed (see that module: one HBM pass; a search pass for temperature-only rows;
streamed candidates sorted in registers for top-k / top-p rows). Two launches:
a light instance for greedy and temperature-only rows, a FILTERED one for top-k /
top-p rows (each skips the other's rows).

Supported domain (`supports`): float32 / bfloat16 / float16 logits, 1 <= V < 2^31,
CUDA tensors (or CPU under TRITON_INTERPRET=1). Reference: `export.heads.SampleRows`.
"""

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

from .launch import supports  # noqa: F401  (this head's domain: the one in launch.py)
from .launch import check_inputs, check_length, launch_config
from .sampling_rule import decide

@triton.jit
def sample_rows_kernel(logits_ptr, stride, position_ptr, temperature_ptr, top_k_ptr, top_p_ptr,
                       seed_ptr, out_ptr, work_ptr, vocab, FILTERED: tl.constexpr,
                       BLOCK: tl.constexpr, CAP: tl.constexpr, BUF: tl.constexpr,
                       STAGES: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    token, _, _, _ = decide(
        logits_ptr + row * stride, vocab, tl.load(temperature_ptr + row), tl.load(top_k_ptr + row),
        tl.load(top_p_ptr + row), tl.load(seed_ptr + row), tl.load(position_ptr + row), -1,
        work_ptr + row * BUF, FILTERED, True, BLOCK, CAP, BUF, STAGES)
    if token != -3:  # -3: a row of the other instance
        tl.store(out_ptr + row, token)


def launch(logits, position, temperature, top_k, top_p, seed, cap: int | None = None,
           block: int | None = None):
    n, vocab = logits.shape
    out = torch.empty(n, dtype=torch.int64, device=logits.device)
    light, heavy = launch_config(vocab, cap, block, logits.element_size())
    work = torch.empty(n, heavy.buf, dtype=torch.int64, device=logits.device)
    if n > 0:
        for cfg, filtered in ((light, False), (heavy, True)):
            wrap_triton(sample_rows_kernel)[(n,)](
                logits, logits.stride(0), position, temperature, top_k, top_p, seed, out, work, vocab,
                FILTERED=filtered, BLOCK=cfg.block, CAP=cfg.cap, BUF=heavy.buf, STAGES=cfg.stages,
                num_warps=cfg.warps)
    return out


@triton_op("dflash::sample_rows", mutates_args={})
def sample_rows(
    logits: torch.Tensor,  # [N, V]
    position: torch.Tensor,  # [N] int64
    temperature: torch.Tensor,  # [N] float32
    top_k: torch.Tensor,  # [N] int64
    top_p: torch.Tensor,  # [N] float32
    seed: torch.Tensor,  # [N] int64
) -> torch.Tensor:  # [N] int64
    params = {"position": position, "temperature": temperature, "top_k": top_k, "top_p": top_p,
              "seed": seed}
    check_inputs("sample_rows", logits, **params)
    for name, t in params.items():
        check_length("sample_rows", name, t, logits.shape[0], "N (logits rows)")
    return launch(logits, position, temperature, top_k, top_p, seed)


@sample_rows.register_fake
def _(logits, position, temperature, top_k, top_p, seed):
    return logits.new_empty((logits.shape[0],), dtype=torch.int64)

