"""Philox4x32-10 and the (seed, position, purpose) uniform of SPEC.md."""

import spec_oracle
import pytest
import torch

from dflash_et.export import rng

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
