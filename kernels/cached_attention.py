"""`dflash::cached_attention`: each row's attention over the cells of its own KV slot that it
may see, and no others (issue #26).

Row r (query heads H, head dim D) attends to cells [lo[r], hi[r]) of slot `slot[r]` of the
caches `k_cache` / `v_cache` [S, T, KV, D]; query head h reads KV head h // G (G = H / KV,
HF's `repeat_kv` order). softmax(q k^T / sqrt(D)) v over those cells, accumulated in float32;
a row whose interval is empty gets zeros. The target's rows see [0, position + 1) of their
slot (`export/models/llama.py`).

Why: the models' reference gathers every row's whole slot ([R, T, KV, D]) and masks it, so a
step's cost grows with rows x `max_seq_len`. Here a program reads only its row's interval:
work and memory traffic follow sum(hi - lo).

Kernel: one program per (row, KV head). Its G query heads (padded to 16 rows for `tl.dot`)
stream the interval in blocks of BLOCK_N cells with an online softmax (running max and sum,
rescaled accumulator). Everything is computed in float32: float32 caches multiply in IEEE
float32; bfloat16 / float16 values are exact in TF32, so their products q k^T are exact and
only the probabilities are rounded to TF32 for the second product (flash attention rounds
them to the half type). The loads stay in the caches' type: the bytes read are the same.
Not yet done: the rows of one owner read the same cells, program by program (a block of an
owner's rows per program would read them once). `lowering.fused_attention` swaps the
target's `layers.CachedAttention` for this op (off by default: not yet run on a GPU).

Supported domain (`supports`): float32 / bfloat16 / float16, q and caches of one dtype,
H a multiple of KV, D <= 256. Reference: `reference` (`layers.CachedAttention`, the models'
gather + masked SDPA).
"""

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

from ..export.models import layers

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
MAX_HEAD_DIM = 256
BLOCK_N = 16  # cells per step (tests: lengths around it cover the block edges)


def supports(dtype: torch.dtype, heads: int, kv_heads: int, head_dim: int) -> bool:
    return dtype in DTYPES and kv_heads >= 1 and heads % kv_heads == 0 and 1 <= head_dim <= MAX_HEAD_DIM


def reference(q, k_cache, v_cache, slot, lo, hi):  # [R, H, D], [S, T, KV, D] x2, [R] x3 -> [R, H * D]
    """The models' way (the module this op replaces): each row gathers its whole slot and
    masks the cells outside [lo, hi)."""
    return layers.CachedAttention()(q, k_cache, v_cache, slot, lo, hi)


@triton.jit
def cached_attention_kernel(q_ptr, k_ptr, v_ptr, slot_ptr, lo_ptr, hi_ptr, out_ptr, cells, scale,
                            q_row, q_head, c_slot, c_cell, c_head,
                            GROUPS: tl.constexpr, BLOCK_G: tl.constexpr, HEAD_DIM: tl.constexpr,
                            BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    kv = tl.program_id(1)
    slot = tl.load(slot_ptr + row)
    lo = tl.maximum(tl.load(lo_ptr + row), 0)
    hi = tl.minimum(tl.load(hi_ptr + row), cells)
    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    heads = kv * GROUPS + g
    q_mask = (g < GROUPS)[:, None] & (d < HEAD_DIM)[None, :]
    q = tl.load(q_ptr + row * q_row + heads[:, None] * q_head + d[None, :], mask=q_mask, other=0.0).to(tl.float32)
    base = slot * c_slot + kv * c_head
    m = tl.full([BLOCK_G], float("-inf"), tl.float32)
    total = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    for start in range(lo, hi, BLOCK_N):
        n = start + tl.arange(0, BLOCK_N)
        live = n < hi
        at = base + n[:, None].to(tl.int64) * c_cell + d[None, :]
        kv_mask = live[:, None] & (d < HEAD_DIM)[None, :]
        k = tl.load(k_ptr + at, mask=kv_mask, other=0.0).to(tl.float32)
        v = tl.load(v_ptr + at, mask=kv_mask, other=0.0).to(tl.float32)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION)
        s = tl.where(live[None, :], s * scale, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))  # finite: every step holds a live cell
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new[:, None])
        total = total * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision=PRECISION)
        m = m_new
    out = tl.where(total[:, None] > 0, acc / tl.maximum(total, 1e-30)[:, None], 0.0)
    # out is [R, H * D]: a row's heads side by side, as q's are
    tl.store(out_ptr + row * q_row + heads[:, None] * q_head + d[None, :], out.to(out_ptr.dtype.element_ty),
             mask=q_mask)


def _check(q, k_cache, v_cache, slot, lo, hi) -> None:
    """Shapes, dtypes and devices only (no data read: capturable in a CUDA graph)."""
    op = "dflash::cached_attention"
    if q.dim() != 3 or k_cache.dim() != 4:
        raise ValueError(f"{op}: q must be [rows, heads, head_dim] and the caches [slots, cells, kv_heads, head_dim], "
                         f"got {tuple(q.shape)} and {tuple(k_cache.shape)}")
    if v_cache.shape != k_cache.shape:
        raise ValueError(f"{op}: v_cache has shape {tuple(v_cache.shape)}, k_cache {tuple(k_cache.shape)}: "
                         "give both caches of one layer")
    rows, heads, dim = q.shape
    kv_heads = k_cache.shape[2]
    if k_cache.shape[3] != dim:
        raise ValueError(f"{op}: q's head_dim {dim} differs from the caches' {k_cache.shape[3]}")
    if not (q.dtype == k_cache.dtype == v_cache.dtype):
        raise ValueError(f"{op}: q, k_cache and v_cache must share one dtype, got {q.dtype}, {k_cache.dtype}, "
                         f"{v_cache.dtype}")
    if not supports(q.dtype, heads, kv_heads, dim):
        raise ValueError(f"{op}: unsupported: dtype {q.dtype} (float32, bfloat16 or float16), {heads} heads over "
                         f"{kv_heads} KV heads (a multiple), head_dim {dim} (at most {MAX_HEAD_DIM})")
    for name, t in (("slot", slot), ("lo", lo), ("hi", hi)):
        if t.dtype != torch.int64 or t.dim() != 1:
            raise ValueError(f"{op}: {name} must be a 1-D int64 tensor, got {t.dtype} of shape {tuple(t.shape)}")
        torch._check(t.shape[0] == rows, lambda: f"{op}: {name} must have one entry per q row ({rows})")
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("slot", slot), ("lo", lo), ("hi", hi)):
        if not t.is_contiguous():
            raise ValueError(f"{op}: {name} must be contiguous; call .contiguous()")
        if t.device != q.device:
            raise ValueError(f"{op}: {name} is on {t.device}, q on {q.device}")


@triton_op("dflash::cached_attention", mutates_args={})
def cached_attention(
    q: torch.Tensor,  # [R, H, D]
    k_cache: torch.Tensor,  # [S, T, KV, D]
    v_cache: torch.Tensor,  # [S, T, KV, D]
    slot: torch.Tensor,  # [R] int64: the row's slot (in range: not checked on the device)
    lo: torch.Tensor,  # [R] int64: first cell the row sees
    hi: torch.Tensor,  # [R] int64: one past the last (clamped to T)
) -> torch.Tensor:  # [R, H * D]
    _check(q, k_cache, v_cache, slot, lo, hi)
    rows, heads, dim = q.shape
    kv_heads = k_cache.shape[2]
    groups = heads // kv_heads
    out = q.new_empty((rows, heads * dim))
    if rows == 0:
        return out
    wrap_triton(cached_attention_kernel)[(rows, kv_heads)](
        q, k_cache, v_cache, slot, lo, hi, out, k_cache.shape[1], dim ** -0.5,
        heads * dim, dim, k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        GROUPS=groups, BLOCK_G=max(16, triton.next_power_of_2(groups)), HEAD_DIM=dim,
        BLOCK_D=max(16, triton.next_power_of_2(dim)), BLOCK_N=BLOCK_N,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
    )
    return out


@cached_attention.register_fake
def _(q, k_cache, v_cache, slot, lo, hi):
    return q.new_empty((q.shape[0], q.shape[1] * q.shape[2]))
