"""Fused Triton kernels of the verify heads, registered as `torch.ops.dflash.*`.

Importing this package registers the ops (it needs triton). One module per head:
`sample_rows`, `verify` (dflash_verify), `verify_argmax`; shared pieces in
`common` (Philox uniform, keys, owner layout), `sampling_rule` (the per-row rule),
`filtered` (top-k / top-p rows: lane-max bound, candidates, the small decision, ties at the max),
`cut_select` (the rows their candidates do not settle: the sample select, a bounded number of
passes over the row), `scratch` (each
row's scratch record: its layout, marks and accessors, and the host's view of it) and `launch`
(block sizes, input checks). Beside the heads: `cached_attention`, attention over each
row's own cells of a KV cache (issue #26; swapped in by `lowering.fused_attention`),
`greedy_rows`, the drafts' argmax (swapped in with the heads), and `delta_rows`, a Qwen3.5
hybrid target's linear-attention recurrence (issue #27; swapped in by every CUDA export).

One rule every kernel keeps, for AOTInductor: torch's mutation analysis of a kernel's TTIR
copies, before the launch, every input it finds written. It follows a store's address back
through the ops that computed it, and through a @triton.jit helper's result to every
argument of the call; only a `tl.load` stops it. So a value that picks a store's address
(a slot in a candidate list, the scratch row to decide) comes from a `tl.load` in the
function that stores, never from a helper that was given the logits: where a helper
computes it, it goes through scratch (stored, then loaded). `tests/mutation_analysis.py
--explain ARG` names the way when a launch counts ARG as written.
"""

import torch

from ..export.heads import HEADS
from . import cached_attention, delta_rows, greedy_rows, sample_rows, verify, verify_argmax  # noqa: F401 (registers)

_HEAD_MODULES = {"sample_rows": sample_rows, "dflash_verify": verify, "dflash_verify_argmax": verify_argmax,
                 "greedy_rows": greedy_rows}


def _head_support(module):
    def unsupported(inputs: list[torch.Tensor]) -> str | None:
        logits = inputs[0]
        return None if module.supports(logits.dtype, int(logits.shape[-1])) else (
            f"{logits.dtype} logits with V = {logits.shape[-1]}")
    return unsupported


def _attention_support(inputs: list[torch.Tensor]) -> str | None:
    q, k = inputs[0], inputs[1]
    return None if cached_attention.supports(q.dtype, int(q.shape[1]), int(k.shape[2]), int(q.shape[2])) else (
        f"{q.dtype} with {q.shape[1]} heads over {k.shape[2]} KV heads of {q.shape[2]} dims")


def _delta_support(inputs: list[torch.Tensor]) -> str | None:
    mixed, weight, states = inputs[1], inputs[4], inputs[8]
    ok = delta_rows.supports(mixed.dtype, int(mixed.shape[1]), int(weight.shape[1]), int(states.shape[1]),
                             int(states.shape[2]), int(states.shape[3]))
    return None if ok and states.dtype == torch.float32 else (
        f"{mixed.dtype} conv input of {mixed.shape[1]} channels, a conv of {weight.shape[1]} taps, {states.dtype} "
        f"states of {states.shape[1]} value heads x {states.shape[2]} x {states.shape[3]}")


# Region name (lowering/fuse_verify.py: REGIONS; the heads' names are export/heads.py's) ->
# (fused op `dflash::<name>`, unsupported(inputs): None, or why the kernel does not take these
# inputs). The lowering pass reads this.
OPS = {**{name: (getattr(torch.ops.dflash, name).default, _head_support(_HEAD_MODULES[name])) for name in HEADS},
       "cached_attention": (torch.ops.dflash.cached_attention.default, _attention_support),
       "greedy_rows": (torch.ops.dflash.greedy_rows.default, _head_support(greedy_rows)),
       "delta_rows": (torch.ops.dflash.delta_rows.default, _delta_support)}
