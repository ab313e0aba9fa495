"""SPEC.md, literally, in slow scalar Python: the oracle the tests judge against.

Nothing here is shared with the package: Philox is written on Python ints, the
order of step 3 is a real sort, every sum is a sequential float64 loop in the
order SPEC.md names. Each decision also reports whether it was *close*, i.e.
inside the band where SPEC.md allows implementations to differ (a top-p prefix
within 1e-6 * S_k of top_p * S_k, or an inverse-CDF prefix within 1e-6 * S of t).
"""

from dataclasses import dataclass

import numpy as np

M32 = 0xFFFFFFFF
FLT_MAX = float(np.finfo(np.float32).max)
LEGAL_BAND = 1e-6


def philox4x32_10(counter, key):
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for r in range(10):
        if r:
            k0 = (k0 + 0x9E3779B9) & M32
            k1 = (k1 + 0xBB67AE85) & M32
        p0 = 0xD2511F53 * c0
        p1 = 0xCD9E8D57 * c2
        c0, c1, c2, c3 = ((p1 >> 32) ^ c1 ^ k0, p1 & M32, (p0 >> 32) ^ c3 ^ k1, p0 & M32)
    return c0, c1, c2, c3


def uniform(seed: int, position: int, purpose: int = 1) -> float:
    s, p = seed & ((1 << 64) - 1), position & ((1 << 64) - 1)
    x0 = philox4x32_10((0, p & M32, purpose, p >> 32), (s & M32, s >> 32))[0]
    return (2 * (x0 >> 9) + 1) * 2.0**-24


@dataclass
class Decision:
    token: int
    close: bool  # SPEC.md allows another implementation to decide differently


def sample_row(logits, temperature, top_k, top_p, seed, position) -> Decision:
    x = np.asarray(logits).astype(np.float32)
    x = np.where(np.isnan(x), np.float32(-np.inf), x)
    x = np.where(x == np.inf, np.float32(FLT_MAX), x)
    vocab = len(x)
    finite = [v for v in range(vocab) if x[v] > -np.inf]
    if not finite:
        return Decision(-1, False)
    x_max = max(x[v] for v in finite)
    temperature = np.float32(temperature)
    if not temperature > 0:
        return Decision(min(v for v in finite if x[v] == x_max), False)

    order = sorted(finite, key=lambda v: (-float(x[v]), v))
    if 0 < top_k < vocab:
        order = order[:top_k]
    with np.errstate(over="ignore"):  # float32 overflow to -inf is part of the rule
        e = {v: float(np.exp((x[v] - x_max) / temperature, dtype=np.float32)) for v in order}
    close = False

    top_p = np.float32(top_p)
    if top_p < 1:  # NaN compares false
        s_k = 0.0
        for v in order:
            s_k += e[v]
        target = float(top_p) * s_k
        kept, c = [], 0.0
        for r, v in enumerate(order):
            if r > 0:
                close |= abs(c - target) <= LEGAL_BAND * s_k
            if r == 0 or c < target:
                kept.append(v)
            c += e[v]
        order = kept

    kept = sorted(order)
    total = 0.0
    for v in kept:
        total += e[v]
    t = uniform(seed, position) * total
    prefix, token = 0.0, None
    for v in kept:
        prefix += e[v]
        close |= abs(prefix - t) <= LEGAL_BAND * total
        if token is None and prefix > t:
            token = v
    if token is None:
        token = max(v for v in kept if e[v] > 0)
    return Decision(token, close)


def verify(logits, tokens, offsets, start_position, temperature, top_k, top_p, seed):
    """dflash_verify, owner by owner, with SPEC.md's pair admission (see owners.py)."""
    num_rows, vocab = len(tokens), np.asarray(logits).shape[-1]
    accepted, next_token, close = [], [], []
    used = 0
    for o in range(len(offsets) - 1):
        a, b = int(offsets[o]), int(offsets[o + 1])
        n = b - a if (a >= 0 and b <= num_rows and b >= a) else 0
        used += n
        if n == 0 or used > num_rows:
            accepted.append(0), next_token.append(-1), close.append(False)
            continue
        acc, owner_close = 0, False
        for j in range(n):
            d = sample_row(
                logits[a + j], temperature[o], int(top_k[o]), top_p[o], int(seed[o]),
                int(start_position[o]) + j + 1,
            )
            owner_close |= d.close
            draft = int(tokens[a + j + 1]) if j < n - 1 else None
            if draft is not None and 0 <= draft < vocab and d.token == draft:
                acc += 1
                continue
            accepted.append(acc), next_token.append(d.token)
            break
        close.append(owner_close)
    return accepted, next_token, close


def verify_argmax(logits, tokens, offsets):
    zeros = [0] * (len(offsets) - 1)
    return verify(logits, tokens, offsets, zeros, [0.0] * len(zeros), zeros, [1.0] * len(zeros), zeros)
