"""Pieces every verify-head kernel shares: the Philox uniform, logit sanitising,
order-preserving keys, and the (owner, j) pair layout of packed owners.

All `@triton.jit` helpers; they follow `export/rng.py`, `export/sampling.py` and
`export/owners.py` (the plain-PyTorch reference) bit for bit.
"""

import triton
import triton.language as tl

FLT_MAX = tl.constexpr(3.4028234663852886e38)
FLT_MIN = tl.constexpr(1.1754943508222875e-38)  # the smallest normal float32
SAMPLE = tl.constexpr(1)  # SPEC.md purpose of the uniform that decides the target's token


@triton.jit
def uniform(seed, position):
    """SPEC.md: u = (2 * (x0 >> 9) + 1) * 2^-24 of Philox4x32-10(key = seed,
    counter = (0, position_lo, SAMPLE, position_hi)). Scalars in, fp32 scalar out."""
    zero = tl.zeros((), dtype=tl.uint32)
    pos_lo = (position & 0xFFFFFFFF).to(tl.uint32)
    pos_hi = ((position >> 32) & 0xFFFFFFFF).to(tl.uint32)
    x0, _, _, _ = tl.philox(seed, zero, pos_lo, zero + SAMPLE, pos_hi, n_rounds=10)
    return ((x0 >> 9).to(tl.int32) * 2 + 1).to(tl.float32) * (2.0**-24)


@triton.jit
def sanitize(x):
    """Step 1 of the rule: float32, NaN -> -inf, +inf -> FLT_MAX; -0 -> +0 so that
    equal logits get equal keys."""
    x = x.to(tl.float32)
    x = tl.where(x != x, float("-inf"), x)
    x = tl.minimum(x, FLT_MAX)
    return tl.where(x == 0.0, 0.0, x)


@triton.jit
def ordered_key(x):
    """fp32 -> int32 whose signed order is the float order (sanitized input)."""
    bits = x.to(tl.int32, bitcast=True)
    return bits ^ ((bits >> 31) & 0x7FFFFFFF)


@triton.jit
def key_value(key):
    """Inverse of `ordered_key`."""
    bits = key ^ ((key >> 31) & 0x7FFFFFFF)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def unsigned_key(x):
    """fp32 -> int64 in [0, 2^32): the ordered key as an unsigned radix key."""
    return ordered_key(x).to(tl.int64) + 2147483648


@triton.jit
def weight(x, x_max, temperature):
    """SPEC.md step 5 in float32: exp((x - x_max) / T), as exp2((x - x_max) * (log2(e) / T)).
    `tl.exp` is itself ex2.approx of a product with log2(e): folding 1 / T into that factor
    (hoisted out of loops) trades the IEEE division, ~10 instructions per logit, for the
    same kind of ulp-level difference (SPEC.md's legal differences: float32 `exp` ulps).
    The factor is kept in [FLT_MIN, FLT_MAX]: a subnormal T keeps x == x_max at weight 1, and
    T = +inf keeps -inf logits at weight 0 (no NaN from -inf * 0), every finite one at 1."""
    return scaled_weight(x, x_max, weight_scale(temperature))


@triton.jit
def weight_scale(temperature):
    """`weight`'s factor log2(e) / T, kept in [FLT_MIN, FLT_MAX]: computed once, out of a
    loop (the compiler does not hoist the division, ~15 instructions, out of the light pass)."""
    return tl.minimum(tl.maximum(1.4426950408889634 / temperature, FLT_MIN), FLT_MAX)


@triton.jit
def scaled_weight(x, x_max, scale):
    """`weight` with its factor from `weight_scale`."""
    return tl.exp2((x - x_max) * scale)


@triton.jit
def _owner_block(offsets_ptr, base, num_owners, num_rows, carry, BLOCK_O: tl.constexpr):
    """Owners base .. base + BLOCK_O: (ids, live, first rows, valid rows, slot ends)."""
    o = base + tl.arange(0, BLOCK_O)
    live = o < num_owners
    a = tl.load(offsets_ptr + o, mask=live, other=0)
    b = tl.load(offsets_ptr + o + 1, mask=live, other=0)
    n = tl.where(live & (a >= 0) & (b <= num_rows) & (b >= a), b - a, 0)
    return o, live, a, n, carry + tl.cumsum(n, 0)


@triton.jit
def _find_owner(offsets_ptr, num_owners, num_rows, key, BY_SLOT: tl.constexpr, BLOCK_O: tl.constexpr):
    """One walk over the owners for the owner `key` (BY_SLOT: the owner whose slots
    [end - n, end) hold slot `key`; at most one, as the slot ranges of the owners with rows
    are disjoint and those of the others empty): (owner, start slot, admitted rows, first
    packed row); all 0 when no owner holds the slot."""
    carry = tl.zeros((), dtype=tl.int64)
    owner = tl.zeros((), dtype=tl.int64)
    end = tl.zeros((), dtype=tl.int64)
    n_own = tl.zeros((), dtype=tl.int64)
    a_own = tl.zeros((), dtype=tl.int64)
    for base in range(0, num_owners, BLOCK_O):
        o, live, a, n, ends = _owner_block(offsets_ptr, base, num_owners, num_rows, carry, BLOCK_O)
        if BY_SLOT:
            mine = live & (ends - n <= key) & (key < ends)
            owner += tl.sum(tl.where(mine, o, 0))
        else:
            mine = o == key
        end += tl.sum(tl.where(mine, ends, 0))
        n_own += tl.sum(tl.where(mine, n, 0))
        a_own += tl.sum(tl.where(mine, a, 0))
        carry += tl.sum(n)
    admitted = tl.where(end <= num_rows, n_own, 0)  # (not admitted: its slots end past num_rows)
    return owner, end - n_own, admitted, a_own


@triton.jit
def owner_layout(offsets_ptr, num_owners, num_rows, owner, BLOCK_O: tl.constexpr):
    """(start slot, admitted rows, first packed row) of `owner` (see export/owners.py):
    valid owners' rows laid out owner after owner; an owner whose slots end past
    `num_rows` is not admitted (0 rows)."""
    _, start, rows, first_row = _find_owner(offsets_ptr, num_owners, num_rows, owner, False, BLOCK_O)
    return start, rows, first_row


@triton.jit
def pair_of_slot(offsets_ptr, num_owners, num_rows, slot, BLOCK_O: tl.constexpr):
    """The (owner, j) pair at `slot`: (used, owner, j, packed row, rows of the owner), from
    one walk over the owners."""
    owner, start, rows, first_row = _find_owner(offsets_ptr, num_owners, num_rows, slot, True, BLOCK_O)
    j = slot - start  # (>= 0; when no owner holds the slot, start and rows are 0)
    used = j < rows
    return used, owner, j, tl.where(used, first_row + j, 0), rows
