"""The kernels' outputs against the reference heads, with SPEC.md's legal differences flagged
by `export/legal.py` (independently of both): the judge of tests/kernels' CPU tests."""

import torch

from dflash_et.export import cases, heads, legal, rng


def check_samples(inp: dict, got: torch.Tensor) -> int:
    """Assert sample_rows' tokens `got` equal the reference's on `inp` (SPEC.md's bands apart);
    returns the rows inside a band."""
    want = heads.SampleRows()(*[inp[k].cpu() for k in cases.SAMPLE_INPUTS])
    u = rng.uniform(inp["seed"].cpu(), inp["position"].cpu(), rng.SAMPLE)
    close = legal.close_rows(inp["logits"].cpu(), inp["temperature"].cpu(), inp["top_k"].cpu(),
                             inp["top_p"].cpu(), u)
    differ = got.cpu() != want
    assert not bool((differ & ~close).any()), (
        f"rows {torch.nonzero(differ & ~close).flatten().tolist()}: kernel {got.cpu()[differ & ~close].tolist()}, "
        f"reference {want[differ & ~close].tolist()}")
    return int(close.sum())


def check_verify(inp: dict, got, greedy: bool = False) -> int:
    """Assert dflash_verify's (accepted, next_token) `got` (dflash_verify_argmax's with greedy)
    equal the reference's on `inp` (SPEC.md's bands apart); returns the owners inside a band."""
    args = [inp[k].cpu() for k in cases.VERIFY_INPUTS]
    want = heads.DFlashVerifyArgmax()(*args[:3]) if greedy else heads.DFlashVerify()(*args)
    close = torch.zeros_like(want[0], dtype=torch.bool) if greedy else legal.close_owners(*args)
    differ = (got[0].cpu() != want[0]) | (got[1].cpu() != want[1])
    assert not bool((differ & ~close).any()), (
        f"owners {torch.nonzero(differ & ~close).flatten().tolist()} offsets {args[2].tolist()}: "
        f"kernel {got[0].tolist()} {got[1].tolist()}, reference {want[0].tolist()} {want[1].tolist()}")
    return int(close.sum())
