"""`dflash::greedy_rows`: each row's greedy token, `sampling.greedy(sampling.sanitize(x))`.

The drafter's drafts (`draft_forward`: block_size - 1 rows per owner, each over the
whole vocabulary) are this. Inductor's compiled reduction reads the rows well below the
copy bandwidth (benchmarks/HISTORY.md, session 41); this is the row pass of
`dflash_verify_argmax` on its own.

Algorithm, one launch of one program per row (`launch.decide_config`: 4 KB steps, 4
warps, 5 stages): the streaming argmax of `sampling_rule.scan_lanes` (NaN as -inf,
+inf as FLT_MAX, the lowest index of the maximum), then -1 for a row with no finite
logit (`sampling_rule.light_decision`). Nothing random, no host synchronisation.

Supported domain (`supports`): float32 / bfloat16 / float16 logits, 1 <= V <= 2^30.
Reference: `export.models.layers.GreedyRows`.
"""

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

from .launch import supports  # noqa: F401  (the heads' domain: the one in launch.py)
from .launch import check_inputs, decide_config
from .sampling_rule import decide_light


@triton.jit
def greedy_rows_kernel(logits_ptr, stride, out_ptr, vocab, BLOCK: tl.constexpr, STAGES: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    zero = tl.zeros((), dtype=tl.int64)
    # temperature 0: greedy (no mass, no draw); draft -1: no match to decide
    token, _, _, _ = decide_light(logits_ptr + row * stride, vocab, zero.to(tl.float32), zero, zero, zero - 1,
                                  BLOCK, STAGES)
    tl.store(out_ptr + row, token)


def launch(logits: torch.Tensor, block: int | None = None) -> torch.Tensor:
    """`block` (tests) overrides the step, as in `launch.decide_config`."""
    rows, vocab = logits.shape
    out = torch.empty(rows, dtype=torch.int64, device=logits.device)
    if rows > 0:
        cfg = decide_config(vocab, block, logits.element_size())
        wrap_triton(greedy_rows_kernel)[(rows,)](logits, logits.stride(0), out, vocab, BLOCK=cfg.block,
                                                 STAGES=cfg.stages, num_warps=cfg.warps)
    return out


@triton_op("dflash::greedy_rows", mutates_args={})
def greedy_rows(logits: torch.Tensor) -> torch.Tensor:  # [N, V] -> [N] int64
    check_inputs("greedy_rows", logits)
    return launch(logits)


@greedy_rows.register_fake
def _(logits):
    return logits.new_empty((logits.shape[0],), dtype=torch.int64)
