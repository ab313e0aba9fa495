"""Fused Triton kernels of the verify heads, registered as `torch.ops.dflash.*`.

Importing this package registers the ops (it needs triton). One module per head:
`sample_rows`, `verify` (dflash_verify), `verify_argmax`; shared pieces in
`common` (Philox uniform, keys, owner layout), `sampling_rule` (the per-row rule),
`filtered` (top-k / top-p rows: lane-max bound, candidates, decision), `nucleus` (long
top-p lists, wide nuclei), `dense_collect` (whole-row collects), `split_walk` (those
collects shared out over the programs of dflash_verify's decision launch) and `launch` (block
sizes, scratch, input checks). Beside the heads: `cached_attention`, attention over each
row's own cells of a KV cache (issue #26; swapped in by `lowering.fused_attention`).
"""

import torch

from ..export.heads import HEADS
from . import cached_attention, sample_rows, verify, verify_argmax  # noqa: F401 (registers the ops)

_MODULES = {"sample_rows": sample_rows, "dflash_verify": verify, "dflash_verify_argmax": verify_argmax}
# Head name (export/heads.py: HEADS) -> (fused op `dflash::<name>`, supports(logits_dtype, vocab)).
# The lowering pass reads this.
OPS = {name: (getattr(torch.ops.dflash, name).default, _MODULES[name].supports) for name in HEADS}
