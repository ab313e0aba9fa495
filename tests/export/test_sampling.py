"""The sampling rule against SPEC.md's literal scalar oracle."""

import itertools

import pytest
import spec_oracle
import torch

from dflash_et.export import legal, rng, sampling

pytestmark = pytest.mark.quick  # scripts/test.sh --quick

NAN = float("nan")


def _compare(x, temperature, top_k, top_p, seed, position, rows=None):
    """Reference tokens vs oracle; returns how many rows were legally close."""
    u = rng.uniform(seed, position, rng.SAMPLE)
    got = sampling.sample(x, temperature, top_k, top_p, u, rows)
    flagged = legal.close_rows(x, temperature, top_k, top_p, u)
    close = 0
    for i in range(x.shape[0]):
        want = spec_oracle.sample_row(
            x[i].float().numpy(), temperature[i].item(), int(top_k[i]), top_p[i].item(),
            int(seed[i]), int(position[i]),
        )
        close += want.close
        assert bool(flagged[i]) == want.close, f"row {i}: legal-band detector disagrees with oracle"
        if not want.close:
            assert int(got[i]) == want.token, (
                f"row {i}: got {int(got[i])}, SPEC.md says {want.token} (T={temperature[i].item()}, "
                f"top_k={int(top_k[i])}, top_p={top_p[i].item()})"
            )
    return close


def _random_rows(g, n, vocab, dtype=torch.float32):
    scale = torch.tensor([0.3, 1.0, 4.0, 20.0])[torch.randint(0, 4, (n, 1), generator=g)]
    x = torch.randn(n, vocab, generator=g) * scale
    kind = torch.randint(0, 10, (n,), generator=g)
    x[kind == 0] = x[kind == 0].round()  # ties everywhere
    x[kind == 1, : vocab // 2] = float("-inf")
    x[kind == 2, ::3] = NAN
    x[kind == 3, -1] = float("inf")
    return x.to(dtype)


@pytest.mark.parametrize("vocab", [1, 7, 1000, 32000])
def test_random_rows_all_parameter_corners(vocab):
    g = torch.Generator().manual_seed(vocab)
    n = {1: 60, 7: 300, 1000: 120, 32000: 16}[vocab]
    x = _random_rows(g, n, vocab)
    temps = [0.0, -1.0, NAN, 1e-6, 0.5, 1.0, 1.7, 1e4]
    ks = [0, 1, vocab - 1, vocab, vocab + 5, -3, 2, 50]
    ps = [1.0, 0.0, 1e-9, 0.9, 0.5, NAN, 0.999, 3.0]
    pick = lambda vals, dt: torch.tensor(vals, dtype=dt)[torch.randint(0, len(vals), (n,), generator=g)]
    temperature, top_k, top_p = pick(temps, torch.float32), pick(ks, torch.int64), pick(ps, torch.float32)
    seed = torch.randint(-(1 << 63), (1 << 63) - 1, (n,), generator=g)
    position = torch.randint(0, 1 << 50, (n,), generator=g)
    close = _compare(x, temperature, top_k, top_p, seed, position)
    # Legal bands are narrow (about 2e-6 * V of a row lands in one); a flood would hide bugs.
    assert close <= n // 4 + 2


def test_every_corner_combination_on_one_tied_row():
    vocab = 9
    row = torch.tensor([1.0, 3.0, 3.0, -2.0, 3.0, float("-inf"), 0.5, NAN, 1.0])
    combos = list(itertools.product(
        [0.0, -1.0, NAN, 1e-3, 1.0, 50.0], [0, 1, 2, 3, vocab - 1, vocab, vocab + 1, -1],
        [1.0, 0.0, 1e-7, 0.4, 0.75, 0.9, NAN, 2.0],
    ))
    n = len(combos)
    x = row.expand(n, vocab).clone()
    temperature, top_k, top_p = (torch.tensor(c) for c in zip(*combos))
    seed = torch.arange(n) * 1_000_003
    _compare(x, temperature.float(), top_k.long(), top_p.float(), seed, torch.arange(n))


def test_degenerate_rows():
    x = torch.tensor([
        [NAN] * 4,
        [float("-inf")] * 4,
        [NAN, float("-inf"), NAN, float("-inf")],
        [float("inf"), float("inf"), 0.0, 1.0],  # +inf counts as FLT_MAX: a tie at the top
        [-3.4028234663852886e38, 3.4028234663852886e38, 0.0, 0.0],  # (x - max) overflows to -inf
        [0.0, -0.0, 0.0, -0.0],  # signed zeros are equal logits
        [1e-45, -1e-45, 0.0, 1e-45],  # subnormals
    ])
    n = x.shape[0]
    for t in (0.0, 1.0, 1e-30):
        for k, p in ((0, 1.0), (2, 0.5), (1, 1.0), (3, 0.0)):
            _compare(x, torch.full((n,), t), torch.full((n,), k), torch.full((n,), p),
                     torch.arange(n) + 11, torch.arange(n) * 3)
    u = rng.uniform(torch.arange(n), torch.arange(n), rng.SAMPLE)
    tokens = sampling.sample(x, torch.ones(n), torch.zeros(n, dtype=torch.int64), torch.ones(n), u)
    assert tokens[:3].tolist() == [-1, -1, -1]
    assert int(tokens[3]) in (0, 1)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_logits_are_widened_first(dtype):
    g = torch.Generator().manual_seed(11)
    x = _random_rows(g, 80, 300, dtype)
    n = x.shape[0]
    temperature = torch.tensor([0.0, 0.8])[torch.randint(0, 2, (n,), generator=g)]
    top_k = torch.tensor([0, 10])[torch.randint(0, 2, (n,), generator=g)]
    top_p = torch.tensor([1.0, 0.8])[torch.randint(0, 2, (n,), generator=g)]
    _compare(x, temperature, top_k, top_p, torch.arange(n), torch.arange(n) + 5)


def test_scan_search_equals_unrolled_search():
    g = torch.Generator().manual_seed(12)
    x = _random_rows(g, 40, 500)
    n = x.shape[0]
    temperature = torch.rand(n, generator=g) * 2
    top_k = torch.randint(-1, 600, (n,), generator=g)
    top_p = torch.rand(n, generator=g)
    u = rng.uniform(torch.arange(n), torch.arange(n), rng.SAMPLE)
    unrolled = sampling.sample(x, temperature, top_k, top_p, u)
    scanned = sampling.sample(x, temperature, top_k, top_p, u, rows=64)
    assert torch.equal(unrolled, scanned)


def test_key_to_value_is_the_float32_bit_pattern():
    import struct

    pow2 = sampling._pow2_table(torch.device("cpu"))
    g = torch.Generator().manual_seed(13)
    keys = torch.cat([
        torch.randint(sampling.KEY_MIN, sampling.KEY_MAX + 1, (2000,), generator=g),
        torch.tensor([sampling.KEY_MIN, sampling.KEY_MAX, 0, -1, 1, (1 << 23) - 1, 1 << 23]),
    ])
    values = sampling.key_to_value(keys, pow2).tolist()
    for k, v in zip(keys.tolist(), values):
        bits = k if k >= 0 else -k - 1
        want = struct.unpack("<f", struct.pack("<I", bits))[0]
        assert v == (want if k >= 0 else -want), k
    ends = sampling.key_to_value(torch.tensor([sampling.KEY_MIN - 1, sampling.KEY_MAX + 1]), pow2)
    assert ends.tolist() == [float("-inf"), float("inf")]
