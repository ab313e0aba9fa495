"""`dflash::delta_rows`: the Gated DeltaNet recurrence of a Qwen3.5 hybrid target over rows
in packed order, each row advancing its own slot's state (issue #27).

Row r (slot `slot[r]`) takes its conv input `mixed[r]` [C] and its `a[r]`, `b[r]` [Hv]. Per
row, in order, for its slot s (`export/models/qwen3_5.py`, `DeltaRows`, is the reference):
- the causal depthwise conv over the slot's last K - 1 inputs and this one (weight [C, K],
  silu), in the model dtype; the window then holds the last K - 1 inputs;
- q, k, v split from it (q, k: Hk heads of dk, value head h reading key head h // (Hv / Hk);
  v: Hv heads of dv), q and k L2-normalised, q / sqrt(dk); `beta = sigmoid(b)` (in the model
  dtype), `g = -exp(A_log) * softplus(a + dt_bias)`;
- per value head the state S [dk, dv] (float32): `S *= exp(g)`, `S += k (x) beta (v - S^T k)`,
  the row's output `S^T q` [dv] (float32).
Returns (windows, states after every row, outputs [N, Hv, dv]); the inputs stay as they were.

Why: the reference is a `scan` whose carry is every slot's windows and states, copied for each
row, and ExecuTorch's CUDA partitioner cannot take a scan at all. A CUDA export swaps every
`DeltaRows` region for this op (lowering/fuse_verify.py), always: a hybrid target has no
plain CUDA lowering.

Kernel: one program per (slot, value head, block of BV value dims). It keeps its slot's state
block [dk, BV] and the conv windows of its channels (q and k of its key head, its v dims) in
registers (read from the inputs: other programs write the outputs meanwhile), walks the rows
in order and takes those of its slot, so rows of one slot advance in order and slots run side
by side. The windows are a ring of K - 1 inputs (the oldest at
`head`). At the end a program that took rows stores its state block and v window; the first
program of each key head (value head h % (Hv / Hk) == 0, first block) stores the q / k
window. The outputs start as copies of the inputs, so slots without rows keep theirs.

Numerics: float32 models follow the reference up to float32 reassociation (the conv's K
products, the dk sums); bfloat16 / float16 ones round where the reference's model-dtype ops
round (each conv product, the conv sum, silu, sigmoid(b)).

Supported domain (`supports`): mixed / a / b / weights / windows of one float dtype (float32,
bfloat16, float16), float32 states, K >= 2, Hv a multiple of Hk, dk and dv <= 256.
"""

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
MAX_HEAD_DIM = 256
BLOCK_V = 32  # value dims per program


def supports(dtype: torch.dtype, conv_dim: int, kernel: int, value_heads: int, key_dim: int,
             value_dim: int) -> bool:
    """`kernel`: K; `key_dim`: dk; `value_dim`: dv; `conv_dim`: C = 2 Hk dk + Hv dv."""
    keys = conv_dim - value_heads * value_dim
    key_heads = keys // (2 * key_dim) if key_dim else 0
    return (dtype in DTYPES and kernel >= 2 and key_heads >= 1 and keys == 2 * key_heads * key_dim
            and value_heads % key_heads == 0 and 1 <= key_dim <= MAX_HEAD_DIM and 1 <= value_dim <= MAX_HEAD_DIM)


@triton.jit
def delta_rows_kernel(slot_ptr, mixed_ptr, a_ptr, b_ptr, weight_ptr, a_log_ptr, dt_bias_ptr, windows_ptr,
                      states_ptr, windows_out_ptr, states_out_ptr, core_ptr, rows, conv_dim, key_channels, value_heads,
                      group, scale,
                      K: tl.constexpr, RING: tl.constexpr, DK: tl.constexpr, DKP: tl.constexpr, DV: tl.constexpr,
                      BV: tl.constexpr):
    s = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    vb = tl.program_id(2)
    DT: tl.constexpr = mixed_ptr.dtype.element_ty
    key_head = h // group
    d = tl.arange(0, DKP)
    d_ok = d < DK
    v = vb * BV + tl.arange(0, BV)
    v_ok = v < DV
    q_ch = key_head * DK + d
    k_ch = key_channels + key_head * DK + d
    v_ch = 2 * key_channels + h * DV + v
    j = tl.arange(0, RING)[:, None]  # ring slots (K - 1 used)
    j_ok = j < K - 1
    window = windows_ptr + s * (K - 1) * conv_dim + j * conv_dim
    ring_q = tl.load(window + q_ch[None, :], mask=j_ok & d_ok[None, :], other=0.0).to(tl.float32)
    ring_k = tl.load(window + k_ch[None, :], mask=j_ok & d_ok[None, :], other=0.0).to(tl.float32)
    ring_v = tl.load(window + v_ch[None, :], mask=j_ok & v_ok[None, :], other=0.0).to(tl.float32)
    state_at = ((s * value_heads + h) * DK + d[:, None]) * DV + v[None, :]
    state_ok = d_ok[:, None] & v_ok[None, :]
    state = tl.load(states_ptr + state_at, mask=state_ok, other=0.0)
    decay_rate = tl.exp(tl.load(a_log_ptr + h).to(tl.float32))
    dt_bias = tl.load(dt_bias_ptr + h).to(tl.float32)
    head = tl.zeros((), dtype=tl.int32)  # the ring slot of the oldest input
    taken = tl.zeros((), dtype=tl.int32)
    for r in range(rows):
        if tl.load(slot_ptr + r) == s:
            age = (j + (K - 1) - head) % (K - 1)  # 0 = oldest; the new input is K - 1
            x = mixed_ptr + r * conv_dim
            conv_q = _conv(ring_q, x, q_ch, d_ok, weight_ptr, age, j_ok, K, DT)
            conv_k = _conv(ring_k, x, k_ch, d_ok, weight_ptr, age, j_ok, K, DT)
            conv_v = _conv(ring_v, x, v_ch, v_ok, weight_ptr, age, j_ok, K, DT)
            new = j == head
            ring_q = tl.where(new, tl.load(x + q_ch, mask=d_ok, other=0.0).to(tl.float32)[None, :], ring_q)
            ring_k = tl.where(new, tl.load(x + k_ch, mask=d_ok, other=0.0).to(tl.float32)[None, :], ring_k)
            ring_v = tl.where(new, tl.load(x + v_ch, mask=v_ok, other=0.0).to(tl.float32)[None, :], ring_v)
            head = (head + 1) % (K - 1)
            q = conv_q * (1.0 / tl.sqrt_rn(tl.sum(conv_q * conv_q, 0) + 1e-6)) / scale
            k = conv_k * (1.0 / tl.sqrt_rn(tl.sum(conv_k * conv_k, 0) + 1e-6))
            b = tl.load(b_ptr + r * value_heads + h).to(tl.float32)
            beta = (1.0 / (1.0 + tl.exp(-b))).to(DT).to(tl.float32)
            a = tl.load(a_ptr + r * value_heads + h).to(tl.float32) + dt_bias
            e = tl.exp(tl.minimum(a, 20.0))  # softplus as torch's (threshold 20), log1p's accuracy below -15
            softplus = tl.where(a > 20.0, a, tl.where(a < -15.0, e, tl.log(1.0 + e)))
            state = state * tl.exp(-decay_rate * softplus)
            delta = (conv_v - tl.sum(state * k[:, None], 0)) * beta
            state = state + k[:, None] * delta[None, :]
            out = tl.sum(state * q[:, None], 0)
            tl.store(core_ptr + (r * value_heads + h) * DV + v, out, mask=v_ok)
            taken += 1
    if taken > 0:
        tl.store(states_out_ptr + state_at, state, mask=state_ok)
        age = (j + (K - 1) - head) % (K - 1)  # the window's rows oldest first
        at = windows_out_ptr + s * (K - 1) * conv_dim + age * conv_dim
        tl.store(at + v_ch[None, :], ring_v.to(DT), mask=j_ok & v_ok[None, :])
        if (h % group == 0) & (vb == 0):
            tl.store(at + q_ch[None, :], ring_q.to(DT), mask=j_ok & d_ok[None, :])
            tl.store(at + k_ch[None, :], ring_k.to(DT), mask=j_ok & d_ok[None, :])


@triton.jit
def _conv(ring, x, channels, ok, weight_ptr, age, j_ok, K: tl.constexpr, DT: tl.constexpr):
    """silu of the depthwise conv of `channels` over the ring (`age`: each slot's tap) and the new
    input at `x`, rounded as the model dtype `DT` rounds (each product, the sum, silu)."""
    taps = tl.load(weight_ptr + channels[None, :] * K + age, mask=j_ok & ok[None, :], other=0.0).to(tl.float32)
    last = tl.load(weight_ptr + channels * K + (K - 1), mask=ok, other=0.0).to(tl.float32)
    new = tl.load(x + channels, mask=ok, other=0.0).to(tl.float32)
    total = tl.sum((ring * taps).to(DT).to(tl.float32), 0) + (new * last).to(DT).to(tl.float32)
    total = total.to(DT).to(tl.float32)
    return (total / (1.0 + tl.exp(-total))).to(DT).to(tl.float32)


def _check(slot, mixed, a, b, weight, a_log, dt_bias, windows, states) -> None:
    op = "dflash::delta_rows"
    rows, conv_dim = mixed.shape
    value_heads, value_dim, key_dim = states.shape[1], states.shape[3], states.shape[2]
    kernel = weight.shape[1]
    shapes = {"slot": (slot, (rows,)), "a": (a, (rows, value_heads)), "b": (b, (rows, value_heads)),
              "weight": (weight, (conv_dim, kernel)), "A_log": (a_log, (value_heads,)),
              "dt_bias": (dt_bias, (value_heads,)), "windows": (windows, (windows.shape[0], kernel - 1, conv_dim))}
    for name, (t, shape) in shapes.items():
        if t.dim() != len(shape) or any(x != y for x, y in zip(t.shape, shape)):
            raise ValueError(f"{op}: {name} must have shape {shape} (from mixed {tuple(mixed.shape)}, states "
                             f"{tuple(states.shape)}, weight {tuple(weight.shape)}), got {tuple(t.shape)}")
    if slot.dtype != torch.int64:
        raise ValueError(f"{op}: slot must be int64, got {slot.dtype}")
    if states.dtype != torch.float32 or windows.shape[0] != states.shape[0]:
        raise ValueError(f"{op}: states must be float32 [slots, Hv, dk, dv] with the windows' slots "
                         f"({windows.shape[0]}), got {states.dtype} {tuple(states.shape)}")
    if any(t.dtype != mixed.dtype for t in (a, b, weight, a_log, dt_bias, windows)):
        raise ValueError(f"{op}: mixed, a, b, weight, A_log, dt_bias and windows must share one dtype, got "
                         f"{[t.dtype for t in (mixed, a, b, weight, a_log, dt_bias, windows)]}")
    if not supports(mixed.dtype, conv_dim, kernel, value_heads, key_dim, value_dim):
        raise ValueError(f"{op}: unsupported: dtype {mixed.dtype} (float32, bfloat16 or float16), conv kernel "
                         f"{kernel} (>= 2), {conv_dim} conv channels for {value_heads} value heads of {value_dim} "
                         f"and key heads of {key_dim} (2 Hk dk + Hv dv, Hv a multiple of Hk, dims <= {MAX_HEAD_DIM})")
    for name, t in (("slot", slot), ("mixed", mixed), ("a", a), ("b", b), ("weight", weight), ("A_log", a_log),
                    ("dt_bias", dt_bias), ("windows", windows), ("states", states)):
        if t.device != mixed.device:
            raise ValueError(f"{op}: {name} is on {t.device}, mixed on {mixed.device}")


@triton_op("dflash::delta_rows", mutates_args={})
def delta_rows(
    slot: torch.Tensor,  # [N] int64: each row's slot (in range: not checked on the device)
    mixed: torch.Tensor,  # [N, C]: the conv input
    a: torch.Tensor,  # [N, Hv]
    b: torch.Tensor,  # [N, Hv]
    weight: torch.Tensor,  # [C, K]: the depthwise conv
    a_log: torch.Tensor,  # [Hv]
    dt_bias: torch.Tensor,  # [Hv]
    windows: torch.Tensor,  # [S, K - 1, C]: each slot's last K - 1 conv inputs, oldest first
    states: torch.Tensor,  # [S, Hv, dk, dv] float32
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # windows, states after the rows, outputs [N, Hv, dv]
    _check(slot, mixed, a, b, weight, a_log, dt_bias, windows, states)
    # (strided views, e.g. a commit's a / b, are read as contiguous copies)
    slot, mixed, a, b, weight, a_log, dt_bias = (t.contiguous() for t in (slot, mixed, a, b, weight, a_log, dt_bias))
    windows, states = windows.contiguous(), states.contiguous()
    rows, conv_dim = mixed.shape
    slots, value_heads, key_dim, value_dim = states.shape
    kernel = weight.shape[1]
    key_channels = (conv_dim - value_heads * value_dim) // 2
    windows_out, states_out = windows.clone(), states.clone()
    core = mixed.new_empty((rows, value_heads, value_dim), dtype=torch.float32)
    if rows > 0:
        bv = min(BLOCK_V, triton.next_power_of_2(value_dim))
        wrap_triton(delta_rows_kernel)[(slots, value_heads, triton.cdiv(value_dim, bv))](
            slot, mixed, a, b, weight, a_log, dt_bias, windows, states, windows_out, states_out, core, rows, conv_dim,
            key_channels, value_heads, value_heads // (key_channels // key_dim), float(key_dim) ** 0.5, K=kernel,
            RING=triton.next_power_of_2(kernel - 1), DK=key_dim, DKP=triton.next_power_of_2(key_dim), DV=value_dim,
            BV=bv, num_warps=4)
    return windows_out, states_out, core


@delta_rows.register_fake
def _(slot, mixed, a, b, weight, a_log, dt_bias, windows, states):
    return (torch.empty_like(windows), torch.empty_like(states),
            mixed.new_empty((mixed.shape[0], states.shape[1], states.shape[3]), dtype=torch.float32))
