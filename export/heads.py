"""The verify heads of SPEC.md as `nn.Module`s: the reference, and what CPU programs run.

One module per head, so the lowering pass can find each head's subgraph by its
`nn_module_stack` entry; while exporting, each head also marks its exact inputs and
outputs (`boundary.py`). `HEADS` is the one table of the heads: name, inputs and
outputs (SPEC.md's order, dtypes, sizes) and reference module. The exported methods,
the lowering pass's boundary check, the kernels' input checks and op table, and the
random cases all read it. Only ops of the portable CPU
kernels are used (no sort, cumprod, multinomial, rand, searchsorted or shifts).

Glossary (SPEC.md): an *owner* is one sequence; owner o owns packed rows
[offsets[o], offsets[o+1]); `tokens[a]` is its pending token and
`tokens[a+1..b-1]` its drafts; row a+j decides position start_position[o]+j+1.
*accepted* counts the leading drafts equal to the target's own token y_j;
*next_token* is y at the first miss (the correction) or after the last draft
(the bonus).
"""

from dataclasses import dataclass

import torch
from torch import nn

from . import owners, rng, sampling
from .boundary import mark


def _rows_per_pair(
    pairs: owners.Pairs,
    start_position: torch.Tensor,  # [O] int64
    temperature: torch.Tensor,  # [O] float32
    top_k: torch.Tensor,  # [O] int64
    top_p: torch.Tensor,  # [O] float32
    seed: torch.Tensor,  # [O] int64
):
    o = pairs.owner
    position = start_position[o] + pairs.j + 1
    return temperature[o], top_k[o], top_p[o], rng.uniform(seed[o], position, rng.SAMPLE)


class SearchBound(nn.Module):
    """`max_rows=None` runs the cut searches unrolled (eager, Inductor); an int, the
    program's row bound, runs them in one `scan` (compact ExecuTorch programs)."""

    def __init__(self, max_rows: int | None = None):
        super().__init__()
        self.max_rows = max_rows


class SampleRows(SearchBound):
    """`sample_rows`: the sampling rule on each row at its own position."""

    def forward(
        self,
        logits: torch.Tensor,  # [N, V]
        position: torch.Tensor,  # [N] int64
        temperature: torch.Tensor,  # [N] float32
        top_k: torch.Tensor,  # [N] int64
        top_p: torch.Tensor,  # [N] float32
        seed: torch.Tensor,  # [N] int64
    ) -> torch.Tensor:  # [N] int64
        logits, position, temperature, top_k, top_p, seed = mark(
            "sample_rows", "inputs", logits, position, temperature, top_k, top_p, seed)
        u = rng.uniform(seed, position, rng.SAMPLE)
        tokens = sampling.sample(logits, temperature, top_k, top_p, u, self.max_rows)
        return mark("sample_rows", "outputs", tokens)[0]


class DFlashVerify(SearchBound):
    """`dflash_verify`: every owner's drafts under that owner's sampling parameters."""

    def forward(
        self,
        logits: torch.Tensor,  # [R, V]
        tokens: torch.Tensor,  # [R] int64
        offsets: torch.Tensor,  # [O+1] int64
        start_position: torch.Tensor,  # [O] int64
        temperature: torch.Tensor,  # [O] float32
        top_k: torch.Tensor,  # [O] int64
        top_p: torch.Tensor,  # [O] float32
        seed: torch.Tensor,  # [O] int64
    ) -> tuple[torch.Tensor, torch.Tensor]:  # accepted [O], next_token [O]
        logits, tokens, offsets, start_position, temperature, top_k, top_p, seed = mark(
            "dflash_verify", "inputs", logits, tokens, offsets, start_position, temperature, top_k,
            top_p, seed)
        pairs = owners.pack_pairs(offsets, logits.shape[0])
        temp, k, p, u = _rows_per_pair(pairs, start_position, temperature, top_k, top_p, seed)
        y = sampling.sample(logits[pairs.row], temp, k, p, u, self.max_rows)
        return mark("dflash_verify", "outputs", *owners.accept(pairs, y, tokens, logits.shape[-1]))


class DFlashVerifyArgmax(nn.Module):
    """`dflash_verify_argmax`: `dflash_verify` with every owner greedy, no randomness."""

    def forward(
        self,
        logits: torch.Tensor,  # [R, V]
        tokens: torch.Tensor,  # [R] int64
        offsets: torch.Tensor,  # [O+1] int64
    ) -> tuple[torch.Tensor, torch.Tensor]:  # accepted [O], next_token [O]
        logits, tokens, offsets = mark("dflash_verify_argmax", "inputs", logits, tokens, offsets)
        pairs = owners.pack_pairs(offsets, logits.shape[0])
        # The argmax does not depend on the owner: one per packed row, then per pair.
        y = sampling.greedy(sampling.sanitize(logits))[pairs.row]
        return mark("dflash_verify_argmax", "outputs", *owners.accept(pairs, y, tokens, logits.shape[-1]))


@dataclass(frozen=True)
class Arg:
    """One input or output of a head: its SPEC.md name, dtype (None: the logits, a float
    dtype the program chooses) and sizes ("V" is the vocab; the others name dims)."""

    name: str
    dtype: torch.dtype | None
    sizes: tuple[str, ...]

    @property
    def rank(self) -> int:
        return len(self.sizes)


@dataclass(frozen=True)
class Head:
    name: str  # the method and `dflash::` op name
    module: type[nn.Module]  # the reference (and what CPU programs run)
    inputs: tuple[Arg, ...]
    outputs: tuple[Arg, ...]

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.inputs)


def _owner_params(dim: str) -> tuple[Arg, ...]:
    return (Arg("temperature", torch.float32, (dim,)), Arg("top_k", torch.int64, (dim,)),
            Arg("top_p", torch.float32, (dim,)), Arg("seed", torch.int64, (dim,)))


_PACKED = (Arg("logits", None, ("rows", "V")), Arg("tokens", torch.int64, ("rows",)),
           Arg("offsets", torch.int64, ("owners+1",)))
_VERDICT = (Arg("accepted", torch.int64, ("owners",)), Arg("next_token", torch.int64, ("owners",)))

HEADS: dict[str, Head] = {h.name: h for h in (
    Head("sample_rows", SampleRows,
         (Arg("logits", None, ("n", "V")), Arg("position", torch.int64, ("n",)), *_owner_params("n")),
         (Arg("tokens", torch.int64, ("n",)),)),
    Head("dflash_verify", DFlashVerify,
         (*_PACKED, Arg("start_position", torch.int64, ("owners",)), *_owner_params("owners")), _VERDICT),
    Head("dflash_verify_argmax", DFlashVerifyArgmax, _PACKED, _VERDICT),
)}
