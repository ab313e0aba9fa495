"""Launch-side helpers shared by the kernel modules: block sizes, scratch, validation.

Validation looks at shapes, dtypes and devices only: nothing here reads tensor
data, so the launches stay capturable in a CUDA graph (no host synchronisation).
"""

import torch
import triton

SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
MAX_BLOCK = 4096
WORK_SLOTS = 4  # per row: token, match, x_max bits, mass bits (after the candidates)

INT64 = torch.int64
F32 = torch.float32


def row_block(vocab: int) -> tuple[int, int]:
    """(BLOCK, num_warps) for a row of `vocab` logits."""
    block = min(MAX_BLOCK, max(16, triton.next_power_of_2(vocab)))
    return block, 8 if block >= 2048 else 4


def candidate_cap(vocab: int, cap: int | None, default: int) -> int:
    """Candidates per top-k / top-p row: `default`, but no more than the row can hold."""
    return cap if cap is not None else min(default, max(16, triton.next_power_of_2(vocab)))


def scratch_width(cap: int) -> int:
    return cap + WORK_SLOTS


def check_inputs(op: str, logits: torch.Tensor, **named: torch.Tensor) -> None:
    """Shape/dtype/device checks with errors that name the input and the fix."""
    if logits.dim() != 2:
        raise ValueError(f"dflash::{op}: logits must be [rows, V], got shape {tuple(logits.shape)}")
    if logits.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"dflash::{op}: logits dtype {logits.dtype} is not supported; use float32, "
                         "bfloat16 or float16")
    if logits.stride(-1) != 1:
        raise ValueError(f"dflash::{op}: logits rows must be contiguous (stride(-1) == 1); "
                         "call .contiguous()")
    want = {"temperature": F32, "top_p": F32}
    for name, t in named.items():
        dtype = want.get(name, INT64)
        if t.dtype != dtype:
            raise ValueError(f"dflash::{op}: {name} must be {dtype}, got {t.dtype}")
        if t.dim() != 1:
            raise ValueError(f"dflash::{op}: {name} must be 1-D, got shape {tuple(t.shape)}")
        if t.device != logits.device:
            raise ValueError(f"dflash::{op}: {name} is on {t.device}, logits on {logits.device}")
        if not t.is_contiguous():
            raise ValueError(f"dflash::{op}: {name} must be contiguous")


def check_length(op: str, name: str, t: torch.Tensor, size, dim_name: str) -> None:
    """`t` has `size` entries (symbolic sizes welcome: a runtime assert, no guard on data)."""
    torch._check(
        t.shape[0] == size,
        lambda: f"dflash::{op}: {name} must have {dim_name} = {size} entries, got {t.shape[0]}",
    )
