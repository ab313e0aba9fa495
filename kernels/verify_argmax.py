"""`dflash::dflash_verify_argmax`: `dflash_verify` with every owner greedy.

Algorithm: the row and accept launches of `verify.py` with GREEDY set: per pair slot one
streaming argmax over the row (lowest index of the maximum, NaN as -inf, +inf as
FLT_MAX), then per owner the first unmatched draft. No randomness, no sampling
inputs.

Supported domain (`supports`): float32 / bfloat16 / float16 logits, 1 <= V <= 2^30.
Reference: `export.heads.DFlashVerifyArgmax`.
"""

import torch
from torch.library import triton_op

from . import verify
from .launch import check_inputs, check_length


@triton_op("dflash::dflash_verify_argmax", mutates_args={})
def dflash_verify_argmax(
    logits: torch.Tensor,  # [R, V]
    tokens: torch.Tensor,  # [R] int64
    offsets: torch.Tensor,  # [O+1] int64
) -> tuple[torch.Tensor, torch.Tensor]:  # accepted [O], next_token [O]
    check_inputs("dflash_verify_argmax", logits, tokens=tokens, offsets=offsets)
    check_length("dflash_verify_argmax", "tokens", tokens, logits.shape[0], "R (logits rows)")
    # The sampling inputs are never read on the greedy path; any int64 tensor stands in.
    return verify.launch(logits, tokens, offsets, offsets, offsets, offsets, offsets, offsets,
                         greedy=True)


@dflash_verify_argmax.register_fake
def _(logits, tokens, offsets):
    owners = offsets.shape[0] - 1
    return (offsets.new_empty((owners,), dtype=torch.int64), offsets.new_empty((owners,), dtype=torch.int64))


supports = verify.supports  # the same domain as dflash_verify
