"""Packed owners: which rows each owner holds, as (owner, j) pairs.

Owner `o` owns rows [offsets[o], offsets[o+1]) of the packed step (SPEC.md). An
owner is *valid* when 0 <= a <= b <= R; invalid owners own no rows.

The heads evaluate one (owner, j) pair per row slot: pairs are laid out owner
after owner, `start[o] = sum of n over valid owners before o`, in a buffer of R
slots. With cu_seqlens-style offsets (nondecreasing) the valid rows number at
most R, so every owner fits. Ranges can only overlap when offsets decrease,
which makes an owner in between invalid; then the valid rows can exceed R, and
an owner whose pairs end past slot R is *not admitted*: it gives accepted = 0,
next_token = -1 like an invalid owner. Admission depends only on the owners
before it (the layout is a prefix sum), never on the ones after.
"""

from dataclasses import dataclass

import torch


@dataclass
class Pairs:
    """One (owner, j) pair per row slot p in [0, R)."""

    used: torch.Tensor  # [R] bool: slot p holds a pair of an admitted owner
    owner: torch.Tensor  # [R] int64 in [0, O): the pair's owner (clamped for unused slots)
    j: torch.Tensor  # [R] int64: the pair's row within its owner
    row: torch.Tensor  # [R] int64 in [0, R): the packed row it reads (0 for unused slots)
    last: torch.Tensor  # [R] bool: j == n - 1 (no draft follows this row)
    start: torch.Tensor  # [O] int64: first slot of each owner
    rows: torch.Tensor  # [O] int64: rows of each admitted owner, 0 otherwise


def pack_pairs(offsets: torch.Tensor, num_rows: int) -> Pairs:  # offsets [O+1] int64
    a = offsets[:-1]
    b = offsets[1:]
    num_owners = a.shape[0]
    valid = (a >= 0) & (b <= num_rows) & (b >= a)
    n = torch.where(valid, b - a, 0)
    end = torch.cumsum(n, dim=0)
    start = end - n
    n = torch.where(end <= num_rows, n, 0)  # admission: the owner's pairs fit in R slots

    slot = torch.arange(num_rows, dtype=torch.int64, device=offsets.device)
    # Owner of slot p: the number of owners ending at or before p (ends are nondecreasing).
    owner = (end.unsqueeze(0) <= slot.unsqueeze(1)).sum(dim=1)
    in_range = owner < num_owners
    owner = torch.clamp(owner, max=num_owners - 1)
    j = slot - start[owner]
    n_of = n[owner]
    used = in_range & (j < n_of)
    row = torch.where(used, a[owner] + j, 0)
    return Pairs(used=used, owner=owner, j=j, row=row, last=j == n_of - 1, start=start, rows=n)


def accept(
    pairs: Pairs,
    y: torch.Tensor,  # [R] int64: the target's token at each pair (SPEC.md y_j)
    tokens: torch.Tensor,  # [R] int64: packed [pending, drafts...] of every owner
    vocab: int,
) -> tuple[torch.Tensor, torch.Tensor]:  # accepted [O], next_token [O]
    """Leading matches of y_j against the following draft, then y at the first miss."""
    num_rows = tokens.shape[0]
    num_owners = pairs.rows.shape[0]
    draft = tokens[torch.clamp(pairs.row + 1, max=num_rows - 1)]
    match = pairs.used & ~pairs.last & (y == draft) & (draft >= 0) & (draft < vocab)
    # First miss of each owner: the smallest j among its unmatched pairs (the last
    # row never matches, so an owner with rows always has one).
    miss = pairs.used & ~match
    owner_ids = torch.arange(num_owners, dtype=torch.int64, device=tokens.device)
    mine = miss.unsqueeze(0) & (pairs.owner.unsqueeze(0) == owner_ids.unsqueeze(1))  # [O, R]
    first_miss = torch.amin(torch.where(mine, pairs.j.unsqueeze(0), num_rows), dim=1)
    has_rows = pairs.rows > 0
    accepted = torch.where(has_rows, first_miss, 0)
    slot = torch.clamp(pairs.start + accepted, max=num_rows - 1)
    next_token = torch.where(has_rows, y[slot], -1)
    return accepted, next_token
