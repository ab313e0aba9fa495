"""Counter-based randomness: one uniform per (seed, position, purpose).

SPEC.md, "Randomness": Philox4x32-10 (Random123, Salmon et al., SC'11) with

    key     = (seed_lo, seed_hi)
    counter = (0, position_lo, purpose, position_hi)
    u       = (2 * (x0 >> 9) + 1) * 2^-24            # float32, inside (0, 1)

Written for export to the portable CPU kernels: uint32 arithmetic is emulated in
int64 with explicit masks, the 32x32 -> 64 bit products are split into 16-bit
halves so no intermediate reaches 2^63 (no reliance on signed overflow), and
right shifts are exact float64 floor divisions by powers of two (`floor_div_pow2`:
the portable kernels and the core ATen opset have no `>>` on a scalar, and Inductor
compiled the integer floor division through float32).
"""

import torch

# Purposes (SPEC.md): the third counter word.
SAMPLE = 1  # the uniform that decides the target's token at a position
DRAFT = 2  # reserved for a drafter that samples its own tokens

PHILOX_M0 = 0xD2511F53
PHILOX_M1 = 0xCD9E8D57
PHILOX_W0 = 0x9E3779B9
PHILOX_W1 = 0xBB67AE85
PHILOX_ROUNDS = 10

_MASK32 = 0xFFFFFFFF
_TWO16 = 1 << 16


def floor_div_pow2(x: torch.Tensor, power: int) -> torch.Tensor:  # [N] int64 -> [N] int64
    """floor(x / 2^power) in float64, exact where x has at most 53 significant bits
    (|x| < 2^53, or any multiple of 2^32 in int64 range, as `split_u32` divides). torch
    2.11's Inductor (AOTInductor, `lowering.fused_verify: false`) compiled the integer
    `torch.div(..., rounding_mode="floor")` through float32: 24 bits for 32-bit words
    (wrong Philox words, wrong search keys) and a float32 index into the sampling
    reference's scale table that failed the export ("indices must be int64"). The
    portable kernels have no `>>` for a shift."""
    return torch.floor(x.to(torch.float64) * 2.0 ** -power).to(torch.int64)


def _mulhilo(m: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(hi, lo) 32-bit halves of the 64-bit product m * x, m and x in [0, 2^32)."""
    m_hi, m_lo = m >> 16, m & 0xFFFF
    p1 = x * m_hi  # < 2^48
    p0 = x * m_lo  # < 2^48
    hi = floor_div_pow2(p1 + floor_div_pow2(p0, 16), 16)  # floor((p1 * 2^16 + p0) / 2^32), < 2^49 inside
    lo = torch.bitwise_and(torch.bitwise_and(p1, 0xFFFF) * _TWO16 + p0, _MASK32)
    return hi, lo


def split_u32(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Two's-complement (lo, hi) 32-bit words of int64 values, each in [0, 2^32)."""
    lo = torch.bitwise_and(x, _MASK32)
    # (x - lo) is a multiple of 2^32; the floor division is exact for negatives too.
    hi = torch.bitwise_and(floor_div_pow2(x - lo, 32), _MASK32)
    return lo, hi


def philox4x32_10(
    c0: torch.Tensor, c1: torch.Tensor, c2: torch.Tensor, c3: torch.Tensor,  # [N] int64 in [0, 2^32)
    k0: torch.Tensor, k1: torch.Tensor,  # [N] int64 in [0, 2^32)
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Philox4x32-10 on int64 tensors holding uint32 words; returns (x0, x1, x2, x3)."""
    for r in range(PHILOX_ROUNDS):
        if r > 0:
            k0 = torch.bitwise_and(k0 + PHILOX_W0, _MASK32)
            k1 = torch.bitwise_and(k1 + PHILOX_W1, _MASK32)
        hi0, lo0 = _mulhilo(PHILOX_M0, c0)
        hi1, lo1 = _mulhilo(PHILOX_M1, c2)
        c0, c1, c2, c3 = (
            torch.bitwise_xor(torch.bitwise_xor(hi1, c1), k0),
            lo1,
            torch.bitwise_xor(torch.bitwise_xor(hi0, c3), k1),
            lo0,
        )
    return c0, c1, c2, c3


def uniform(
    seed: torch.Tensor,  # [N] int64
    position: torch.Tensor,  # [N] int64
    purpose: int,
) -> torch.Tensor:  # [N] float32 in (0, 1)
    """The uniform of SPEC.md for each (seed, position, purpose)."""
    seed_lo, seed_hi = split_u32(seed)
    pos_lo, pos_hi = split_u32(position)
    zero = torch.zeros_like(pos_lo)
    x0, _, _, _ = philox4x32_10(zero, pos_lo, zero + purpose, pos_hi, seed_lo, seed_hi)
    # (x0 >> 9) < 2^23, so 2 * (x0 >> 9) + 1 < 2^24 converts to float32 exactly.
    return (floor_div_pow2(x0, 9) * 2 + 1).to(torch.float32) * (2.0**-24)
