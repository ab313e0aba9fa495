"""Philox4x32-10 and the (seed, position, purpose) uniform of SPEC.md."""

import spec_oracle
import pytest
import torch

from dflash_et.export import rng, sampling

pytestmark = pytest.mark.quick  # scripts/test.sh --quick


def _words(values):
    return [torch.tensor([v], dtype=torch.int64) for v in values]


def test_philox_known_answers():
    # SPEC.md's vectors, from Random123's kat_vectors.
    zero = _words([0] * 6)
    assert [int(x) for x in rng.philox4x32_10(*zero)] == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]
    ones = _words([0xFFFFFFFF] * 6)
    assert [int(x) for x in rng.philox4x32_10(*ones)] == [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]


def test_philox_matches_python_ints_on_random_words():
    g = torch.Generator().manual_seed(3)
    words = torch.randint(0, 1 << 32, (6, 500), generator=g)
    got = rng.philox4x32_10(*words)
    for i in range(500):
        c = [int(w[i]) for w in words]
        want = spec_oracle.philox4x32_10(c[:4], c[4:])
        assert [int(x[i]) for x in got] == list(want)


def test_split_u32_is_twos_complement():
    x = torch.tensor([0, 1, -1, -(1 << 63), (1 << 63) - 1, -(1 << 32), 1 << 32, 0x1234_5678_9ABC_DEF0])
    lo, hi = rng.split_u32(x)
    for v, l, h in zip(x.tolist(), lo.tolist(), hi.tolist()):
        u = v & ((1 << 64) - 1)
        assert (l, h) == (u & 0xFFFFFFFF, u >> 32)


def test_uniform_matches_oracle_and_lies_inside_unit_interval():
    g = torch.Generator().manual_seed(4)
    seed = torch.cat([torch.randint(-(1 << 63), (1 << 63) - 1, (300,), generator=g), torch.tensor([0, -1, 1 << 40])])
    position = torch.cat([torch.randint(-(1 << 62), 1 << 62, (300,), generator=g), torch.tensor([0, 2**32 - 1, 2**32])])
    for purpose in (rng.SAMPLE, rng.DRAFT):
        u = rng.uniform(seed, position, purpose)
        assert u.dtype == torch.float32
        assert bool(((u > 0) & (u < 1)).all())
        for s, p, got in zip(seed.tolist(), position.tolist(), u.tolist()):
            assert got == spec_oracle.uniform(s, p, purpose)


def test_uniform_depends_on_every_part_of_the_key():
    base = rng.uniform(torch.tensor([7]), torch.tensor([100]), rng.SAMPLE)
    assert base != rng.uniform(torch.tensor([7 + (1 << 32)]), torch.tensor([100]), rng.SAMPLE)  # seed_hi
    assert base != rng.uniform(torch.tensor([7]), torch.tensor([100 + (1 << 32)]), rng.SAMPLE)  # position_hi
    assert base != rng.uniform(torch.tensor([7]), torch.tensor([100]), rng.DRAFT)  # purpose


def test_uniform_is_an_odd_multiple_of_two_to_the_minus_24():
    # u = (2 * (x0 >> 9) + 1) * 2^-24 exactly: no rounding happened on the way to float32.
    u = rng.uniform(torch.arange(2000), torch.arange(2000) * 7919, rng.SAMPLE).double() * 2.0**24
    assert bool((u == u.round()).all())
    assert bool((u.long() % 2 == 1).all())


def test_floor_div_pow2_is_integer_floor_division_over_the_search_range():
    """The searches' midpoints and key exponents: exact floor division, negative values
    and the ends of the key range included (it runs in float64, exact below 2^53)."""
    g = torch.Generator().manual_seed(14)
    lo, hi = 2 * (sampling.KEY_MIN - 1), 2 * sampling.KEY_MAX + 1  # (lo + hi + 1) of any search step
    x = torch.cat([torch.randint(lo, hi + 1, (4000,), generator=g),
                   torch.tensor([lo, hi, -3, -2, -1, 0, 1, 2, 3, (1 << 23) - 1, 1 << 23, -(1 << 23) - 1])])
    for power in (1, 23):
        got = rng.floor_div_pow2(x, power)
        assert got.dtype == torch.int64
        assert got.tolist() == [v // (1 << power) for v in x.tolist()], power


def test_floor_div_pow2_is_exact_for_the_philox_words():
    """Philox's uses: the 16-bit halves of 48-bit products (< 2^49), x0 >> 9, and
    `split_u32`'s multiples of 2^32 over the whole int64 range (exact in float64: at most
    31 significant bits)."""
    g = torch.Generator().manual_seed(15)
    small = torch.cat([torch.randint(0, 1 << 49, (4000,), generator=g), torch.tensor([0, 1, (1 << 49) - 1])])
    for power in (9, 16):
        assert rng.floor_div_pow2(small, power).tolist() == [v >> power for v in small.tolist()], power
    words = torch.cat([torch.randint(-(1 << 31), 1 << 31, (4000,), generator=g),
                       torch.tensor([-(1 << 31), (1 << 31) - 1, -1, 0])])
    assert rng.floor_div_pow2(words * (1 << 32), 32).tolist() == words.tolist()
