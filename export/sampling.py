"""The sampling rule of SPEC.md, row-wise, in plain PyTorch.

One row, SPEC.md "The sampling rule":

1. NaN counts as -inf, +inf as FLT_MAX; a row with nothing above -inf gives -1.
2. Greedy (temperature <= 0 or NaN): lowest index of the maximum.
3. Order finite tokens by logit descending, ties by index ascending.
4. top-k (0 < k < V) keeps the first k of that order.
5. e_v = exp((x_v - x_max) / T) in float32, widened to float64.
6. top-p (p < 1): rank r stays iff C(r-1) < p * S_k; rank 0 always stays.
7. Inverse CDF in index order over the kept set with t = u * S.

Everything here runs on the portable CPU kernels, which have no sort, so steps 3,
4 and 6 never order the row. Both cuts are prefixes of the order, found by a
32-step binary search over the ordered float32 key space (one count, or one
float64 mass, per step), then ties at the cut are resolved by index with a
cumulative count. Search midpoints are decoded from key to float value with
exact float64 arithmetic, so every comparison is between float32 values and no
bit-cast op is needed.
"""

import torch

from .rng import floor_div_pow2

FLT_MAX = 3.4028234663852886e38

# Ordered keys: k >= 0 is the float32 with bit pattern k, k < 0 the negation of
# bit pattern (-k - 1). Finite floats span [KEY_MIN, KEY_MAX]; the searches run
# over (KEY_MIN - 1, KEY_MAX], fewer than 2^32 keys, so SEARCH_STEPS halvings
# reach a single key. KEY_MIN - 1 and KEY_MAX + 1 decode to -inf and +inf.
KEY_MIN = -0x7F800000  # -FLT_MAX
KEY_MAX = 0x7F7FFFFF  # +FLT_MAX
SEARCH_STEPS = 32


def sanitize(logits: torch.Tensor) -> torch.Tensor:  # [N, V] any float -> [N, V] float32
    """Step 1: float32, NaN -> -inf, +inf -> FLT_MAX."""
    x = logits.to(torch.float32)
    x = torch.where(x != x, float("-inf"), x)
    return torch.clamp(x, max=FLT_MAX)


def _pow2_table(device: torch.device) -> torch.Tensor:  # [255] float64
    # 2^(d - 149): the scale of biased exponent max(E, 1) is entry E - 1 (all exact).
    return torch.tensor([2.0 ** (d - 149) for d in range(255)], dtype=torch.float64, device=device)


def key_to_value(key: torch.Tensor, pow2: torch.Tensor) -> torch.Tensor:  # [N] int64 -> [N] float32
    """Exact float32 value of an ordered key (sign, exponent, mantissa by arithmetic)."""
    neg = key < 0
    bits = torch.where(neg, -key - 1, key)
    exponent = floor_div_pow2(bits, 23)
    mantissa = torch.bitwise_and(bits, (1 << 23) - 1)
    mantissa = torch.where(exponent > 0, mantissa + (1 << 23), mantissa).to(torch.float64)
    value = mantissa * pow2[torch.clamp(exponent - 1, min=0)]  # exact; 2^128 rounds to inf
    return torch.where(neg, -value, value).to(torch.float32)


def greedy(x: torch.Tensor) -> torch.Tensor:  # [N, V] sanitized -> [N] int64
    """Lowest index holding the maximum; -1 for a row with no finite logit. (argmax takes the
    first maximum in eager, in ExecuTorch's portable kernel and in Inductor; x has no NaN.
    Both reductions read x itself, so a compiler can do them in one pass over the row: the
    drafts of draft_forward are this over rows x vocab logits.)"""
    top = torch.amax(x, dim=-1)
    return torch.where(top > float("-inf"), torch.argmax(x, dim=-1), -1)


def _largest_true(pred, lo: torch.Tensor, hi: torch.Tensor, rows: int | None) -> torch.Tensor:
    """Per row, the largest key in (lo, hi] where `pred` holds (lo when none does).

    `pred` maps [N] int64 keys to [N] bool and must hold on a prefix of the keys.
    `rows=None` unrolls the SEARCH_STEPS steps (plain ops: eager, Inductor). An
    int uses one `scan` whose body is traced once, which keeps exported CPU
    programs small; its carry is padded to `rows` slots because the ExecuTorch
    emitter plans scan carries at their upper bound.
    """
    if rows is None:
        for _ in range(SEARCH_STEPS):
            lo, hi = _bisect(pred, lo, hi)
        return lo

    from torch._higher_order_ops.scan import scan

    n = lo.shape[0]
    anchor = lo  # read inside the body for the live row count

    def body(carry, _):
        lo, hi = carry
        live = anchor.shape[0]
        mid = floor_div_pow2(lo + hi + 1, 1)
        ok = pred(mid[:live]).to(torch.int64)
        ok = torch.nn.functional.pad(ok, (0, rows - live)) > 0
        return (torch.where(ok, mid, lo), torch.where(ok, hi, mid - 1)), ok.sum()

    padded = (torch.nn.functional.pad(lo, (0, rows - n)), torch.nn.functional.pad(hi, (0, rows - n)))
    steps = torch.zeros(SEARCH_STEPS, 1, device=lo.device)
    (lo, _), _ = scan(body, padded, steps)
    return lo[:n]


def _bisect(pred, lo, hi):
    mid = floor_div_pow2(lo + hi + 1, 1)
    ok = pred(mid)
    return torch.where(ok, mid, lo), torch.where(ok, hi, mid - 1)


def _ties_before(tie: torch.Tensor) -> torch.Tensor:  # [N, V] bool -> [N, V] int64
    """For each tied token, how many tied tokens sit at a lower index."""
    t = tie.to(torch.int64)
    return torch.cumsum(t, dim=-1) - t


def sample(
    logits: torch.Tensor,  # [N, V] float32 / bfloat16 / float16
    temperature: torch.Tensor,  # [N] float32
    top_k: torch.Tensor,  # [N] int64
    top_p: torch.Tensor,  # [N] float32
    u: torch.Tensor,  # [N] float32 in (0, 1)
    rows: int | None = None,
) -> torch.Tensor:  # [N] int64, -1 for a row with no finite logit
    """The sampling rule of SPEC.md on every row, with that row's parameters.

    `rows`: None unrolls the cut searches; an upper bound on N runs them in a
    `scan` (see `_largest_true`). Both give the same tokens.
    """
    x = sanitize(logits)
    vocab = x.shape[-1]
    argmax = greedy(x)
    is_greedy = ~(temperature > 0)  # NaN compares false: greedy
    finite = x > float("-inf")
    index = torch.arange(vocab, dtype=torch.int64, device=x.device)

    # Step 4: top-k as a prefix of the order; k = V keeps every finite token.
    pow2 = _pow2_table(x.device)
    lowest = torch.full_like(top_k, KEY_MIN)
    highest = torch.full_like(top_k, KEY_MAX)
    k = torch.where((top_k > 0) & (top_k < vocab), top_k, vocab)

    def enough_above(key):  # count(x >= value) >= k; holds for keys up to the k-th largest
        return (x >= key_to_value(key, pow2).unsqueeze(-1)).sum(dim=-1) >= k

    # The k-th largest value, or -FLT_MAX (keep every finite token) when fewer are finite.
    cut_k = key_to_value(_largest_true(enough_above, lowest, highest, rows), pow2).unsqueeze(-1)
    above_k = x > cut_k
    tie_k = x == cut_k
    room = (k - above_k.sum(dim=-1)).unsqueeze(-1)
    kept = above_k | (tie_k & (_ties_before(tie_k) < room))

    # Step 5: weights of the kept tokens; 0 elsewhere.
    x_max = torch.amax(x, dim=-1, keepdim=True)
    x_max = torch.where(x_max > float("-inf"), x_max, 0.0)
    temp = torch.where(is_greedy, 1.0, temperature).unsqueeze(-1)
    e = torch.where(kept, torch.exp((x - x_max) / temp), 0.0).to(torch.float64)
    total_k = e.sum(dim=-1)

    # Step 6: top-p as a prefix of the order. Tokens above the cut have C(r-1)
    # below the target; tokens at the cut share one weight, so C(r-1) for the
    # m-th of them is mass_above + m * e_cut.
    use_p = top_p < 1.0  # NaN compares false: disabled
    target = top_p.to(torch.float64) * total_k

    def mass_reaches(key):  # sum(e where x > value) >= target; holds for a prefix of keys
        return torch.where(x > key_to_value(key, pow2).unsqueeze(-1), e, 0.0).sum(dim=-1) >= target

    # The smallest value whose mass strictly above stays under the target (+inf if none).
    cut_p = _largest_true(mass_reaches, lowest - 1, highest, rows) + 1
    cut_p = key_to_value(cut_p, pow2).unsqueeze(-1)
    above_p = kept & (x > cut_p)
    tie_p = kept & (x == cut_p)
    mass_above = torch.where(above_p, e, 0.0).sum(dim=-1, keepdim=True)
    e_cut = torch.amax(torch.where(tie_p, e, 0.0), dim=-1, keepdim=True)
    prefix_at_tie = mass_above + _ties_before(tie_p).to(torch.float64) * e_cut
    kept_p = above_p | (tie_p & (prefix_at_tie < target.unsqueeze(-1)))
    kept_p = kept_p | (index == argmax.unsqueeze(-1))  # rank 0 always stays
    kept = torch.where(use_p.unsqueeze(-1), kept_p, kept)

    # Step 7: inverse CDF in index order.
    e = torch.where(kept, e, 0.0)
    prefix = torch.cumsum(e, dim=-1)
    t = u.to(torch.float64) * prefix[:, -1]
    drawn = (prefix <= t.unsqueeze(-1)).sum(dim=-1)
    last_positive = torch.amax(torch.where(e > 0, index, -1), dim=-1)
    drawn = torch.where(drawn < vocab, drawn, last_positive)

    token = torch.where(is_greedy, argmax, drawn)
    return torch.where(finite.any(dim=-1), token, -1)
