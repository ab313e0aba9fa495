"""Fused Triton kernels of the verify heads, registered as `torch.ops.dflash.*`.

Importing this package registers the ops (it needs triton). One module per head:
`sample_rows`, `verify` (dflash_verify), `verify_argmax`; shared pieces in
`common` (Philox uniform, keys, owner layout), `sampling_rule` (the per-row rule),
`filtered` (top-k / top-p rows: lane-max bound, candidates, decision), `nucleus` (long
top-p lists, wide nuclei), `dense_collect` (whole-row collects), `split_walk` (those
collects shared out over the programs of dflash_verify's decision launch) and `launch` (block
sizes, scratch, input checks).
"""

import torch

from . import sample_rows, verify, verify_argmax

# Head name (SPEC.md) -> (fused op, supports(logits_dtype, vocab)). The lowering pass reads this.
OPS = {
    "sample_rows": (torch.ops.dflash.sample_rows.default, sample_rows.supports),
    "dflash_verify": (torch.ops.dflash.dflash_verify.default, verify.supports),
    "dflash_verify_argmax": (torch.ops.dflash.dflash_verify_argmax.default, verify_argmax.supports),
}
