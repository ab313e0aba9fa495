"""Launch-side helpers shared by the kernel modules: block sizes, scratch, validation.

Validation looks at shapes, dtypes and devices only: nothing here reads tensor
data, so the launches stay capturable in a CUDA graph (no host synchronisation).
"""

from dataclasses import dataclass, replace

import torch
import triton

from ..export.heads import HEADS
from .scratch import PREFIX_SPLITS, SELECT_SPLITS, Scratch, scratch_width

SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
LIGHT_BYTES = 8192  # logits bytes per loop step of the light rows (4096 bf16 / 2048 float32)
DECIDE_BYTES = 4096  # the same for dflash_verify's launch that decides greedy / temperature-only rows
FILTERED_BLOCK = 1024
CAP = 1024  # sizes a filtered row's list: BUF = CAP + block, a power of two (2048), the list 2 * BUF tokens

@dataclass(frozen=True)
class RowConfig:
    """Compile-time shape of one row-kernel instance."""

    block: int  # logits per loop step
    warps: int
    stages: int  # software-pipelining depth of the HBM pass
    cap: int  # sizes buf (filtered rows)
    buf: int  # >= cap + block, a power of two: a filtered row's list holds 2 * buf packed tokens


def launch_config(vocab: int, cap: int | None = None, block: int | None = None,
                  itemsize: int = 2) -> tuple[RowConfig, RowConfig]:
    """(light, filtered) row-kernel configs for rows of `vocab` logits of `itemsize` bytes.
    `cap` overrides the filtered instance's, `block` both instances' (tests shrink the lists,
    and force many online-max steps per row, with them).

    The light config reads a row once: `sample_rows`' chunks and its top-k / top-p rows
    (`dflash_verify` reads every row with `decide_config`): 8 KB steps (bytes, not
    logits: float32 steps of 4096 took 174 registers), per-lane accumulators (`lane_stats`:
    2 lanes per thread at 8 warps). The whole steps
    load without a mask, which keeps the pipeline's registers flat in its depth: 5 stages
    keep 4 steps (32 KB) in flight per program, 64 KB per SM (96 KB greedy), above what
    Little's law asks of the H200's HBM (masked steps cost registers and spilled). These
    passes are bound by the ALU pipe rather than by bytes in flight (benchmarks/HISTORY.md,
    sessions 13-22's tables: session 17).
    The filtered config decides top-k / top-p rows from their candidates (sorts in
    registers) and runs the sample select (`cut_select`); smaller blocks keep ptxas under 255
    registers without spills on sm_90.
    """
    pow2 = max(16, triton.next_power_of_2(vocab))
    cap = cap if cap is not None else min(CAP, pow2)
    light_block = pass_step(LIGHT_BYTES, vocab, block, itemsize)
    light = RowConfig(block=light_block, warps=8 if light_block >= 1024 else 4, stages=5, cap=16, buf=32)
    block = block if block is not None else min(FILTERED_BLOCK, pow2)
    buf = triton.next_power_of_2(cap + block)
    heavy = RowConfig(block=block, warps=8 if block >= 1024 else 4, stages=2, cap=cap, buf=buf)
    return light, heavy


def pass_step(nbytes: int, vocab: int, block: int | None, itemsize: int) -> int:
    """Logits per loop step of a pass over rows of `vocab` logits: `nbytes` of them, at most
    the row's power of two (>= 16); `block` (tests) overrides it, at least 16."""
    if block is not None:
        return max(16, block)
    return min(nbytes // itemsize, max(16, triton.next_power_of_2(vocab)))


def decide_config(vocab: int, block: int | None = None, itemsize: int = 2) -> RowConfig:
    """The config of `dflash_verify`'s first row launch, which reads every row (decides greedy
    and temperature-only rows, leaves the lanes of top-k / top-p rows for the FILTERED launch),
    and of its accept launch: 4 KB steps, 4 warps, 5 stages. Smaller programs than the light
    config's because this launch's programs wait at their barriers: with 4 warps they wait
    for fewer, and the registers leave several programs per SM (the FILTERED path is a launch
    of its own for the same reason). The other shapes tried (2 KB / 2 warps, 8 KB / 8 warps,
    3 stages, more warps per SM) were slower: benchmarks/HISTORY.md, sessions 13-22's tables:
    session 17. `block` as in `launch_config`."""
    block = pass_step(DECIDE_BYTES, vocab, block, itemsize)
    return RowConfig(block=block, warps=4 if block >= 512 else 2, stages=5, cap=16, buf=32)


def filtered_rows_config(decide: RowConfig) -> RowConfig:
    """The config of `dflash_verify`'s FILTERED row launch, which bounds, collects and decides
    top-k / top-p rows from the lanes the first launch (config `decide`) stored: that launch's
    step (its lane layout: derived from the config it ran with, never recomputed) at 8 warps
    (`filtered.collect`'s pairs per iteration)."""
    return replace(decide, warps=8)


SPLITS = 16  # chunks per row of the split light pass (at most)


def split_rows(vocab: int, block: int, splits: int = SPLITS) -> tuple[int, int]:
    """(chunk, splits): each light row is read by `splits` programs of `chunk` logits (a
    multiple of `block`, so at least one step each); `splits` is a power of two >= the chunks
    needed, the unused ones idle. A function of V only, never of the row count: that is a
    dynamic dim when the op is traced (torch.export / AOTInductor), and a launch shape
    derived from it would force a guard on it. 16 chunks give 64 rows ~1000 programs."""
    chunk = -(-vocab // splits)
    chunk = -(-chunk // block) * block
    return chunk, triton.next_power_of_2(-(-vocab // chunk))


def prefix_chunks(vocab: int, block: int) -> tuple[int, int]:
    """(chunk, splits) of `dflash_verify`'s temperature-only rows: the first row launch stores
    a row's prefix mass at each chunk end (a block reduction in its pass), the accept kernel's
    search reads one chunk. 8 chunks: fewer reductions in the pass for a slightly longer
    search, the best of the layouts timed (16 chunks, per-warp reductions, unreduced lane
    stores, a separate chunk launch: benchmarks/HISTORY.md, sessions 13-22's tables: session 18)."""
    return split_rows(vocab, block, PREFIX_SPLITS)


SELECT_WARPS = 4  # the sample select's pass and search launches (a lane of 16 bytes a thread)


def select_config(vocab: int, itemsize: int) -> tuple[int, int]:
    """(chunk, lanes) of the sample select's pass launch: a row's SELECT_SPLITS parts of `chunk`
    logits each (a multiple of its step, `lanes` lanes of 16 bytes: one a thread at
    SELECT_WARPS warps), an item a span of them (`cut_select.pass_span_bits`); the split fills the
    GPU with few rows (`sample_rows`) and keeps each program light. A function of V only (as
    `split_rows`)."""
    lanes = 32 * SELECT_WARPS
    step = lanes * (16 // itemsize)
    chunk = -(-vocab // SELECT_SPLITS.value)
    return -(-chunk // step) * step, lanes


def select_programs(device: torch.device) -> int:
    """Programs of the sample select's pass launch, each taking items in turn:
    what the GPU holds at once at SELECT_WARPS warps and up to ~113 registers (4 programs an SM),
    so that a launch with little to do costs one wave; 4 in the interpreter. A function of the
    device only, never of the row count (as `split_rows`)."""
    if device.type != "cuda":
        return 4
    return torch.cuda.get_device_properties(device).multi_processor_count * 4


def supports(logits_dtype: torch.dtype, vocab: int) -> bool:
    """The domain of every head kernel: float32 / bfloat16 / float16 logits, 1 <= V <= 2^30
    (indices are packed in 32 bits next to the 32-bit keys; the sample select's step 7 codes an
    index in 31 bits: `cut_select._index_search`)."""
    return logits_dtype in SUPPORTED_DTYPES and 1 <= vocab <= 2**30


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
    want = {a.name: a for a in HEADS[op].inputs} if named else {}  # (greedy_rows: logits only)
    for name, t in named.items():
        arg = want[name]
        if t.dtype != arg.dtype:
            raise ValueError(f"dflash::{op}: {name} must be {arg.dtype}, got {t.dtype}")
        if t.dim() != arg.rank:
            raise ValueError(f"dflash::{op}: {name} must be {arg.rank}-D, got shape {tuple(t.shape)}")
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


def scratch_for(logits: torch.Tensor, cap: int | None = None, block: int | None = None) -> Scratch:
    """A fresh scratch for `verify.launch` or `sample_rows.launch` on `logits` with these `cap` /
    `block`, to look inside afterwards (`kernels/scratch.py`: each row's stats, its passes)."""
    _, heavy = launch_config(logits.shape[1], cap, block, logits.element_size())
    return Scratch.of(logits.shape[0], heavy.buf, logits.device)


def checked_scratch(scratch: Scratch | None, logits: torch.Tensor, buf: int) -> Scratch:
    """`scratch` if it fits a launch on `logits` whose candidate buffer is `buf`, else a
    ValueError that names the fix; a fresh one for None."""
    rows, width = logits.shape[0], scratch_width(buf)
    if scratch is None:
        return Scratch.of(rows, buf, logits.device)
    if scratch.buf != buf or tuple(scratch.work.shape) != (rows, width):
        raise ValueError(f"scratch of {tuple(scratch.work.shape)} words, BUF {scratch.buf}: this launch needs "
                         f"({rows}, {width}), BUF {buf}; make it with launch.scratch_for(logits, cap, block)")
    return scratch
