"""Where each packed row lives: its owner, its absolute position and its KV-cache cell.

Every model method takes rows of several owners packed into one tensor. Owner
`o` holds rows `[start[o], start[o] + count[o])`; its first row sits at absolute
position `base[o]` and row `start[o] + j` at `base[o] + j`. The target methods
use cu_seqlens offsets (`start = offsets[:-1]`, `count = diff(offsets)`); the
drafter's context rows use the previous step's row starts and each owner's
committed count, so rejected rows and departed owners are simply not named.

A row is *writable* when it belongs to an owner, that owner's slot is in
`[0, slots)` and its position is in `[0, max_seq_len)`. Rows that are not go to
the scratch slot (index `slots`), which no valid owner ever reads: bad input
gives meaningless outputs for the offending owner, never an out-of-bounds
access and never a write into another owner's slot.
"""

from dataclasses import dataclass

import torch


@dataclass
class Placement:
    owner: torch.Tensor  # [R] int64 in [0, O): the row's owner (clamped when it has none)
    position: torch.Tensor  # [R] int64: absolute position (unclamped)
    rope_position: torch.Tensor  # [R] int64 in [0, T): for the RoPE table
    write_slot: torch.Tensor  # [R] int64 in [0, slots]: the row's slot, or scratch
    write_position: torch.Tensor  # [R] int64 in [0, T)
    read_slot: torch.Tensor  # [R] int64 in [0, slots]: the slot its queries read


def slot_or_scratch(slots: torch.Tensor, num_slots: int) -> torch.Tensor:  # [O] -> [O]
    """The owner's slot when it is in [0, num_slots), else the scratch slot."""
    return torch.where((slots >= 0) & (slots < num_slots), slots, num_slots)


def place_rows(
    num_rows: int,
    start: torch.Tensor,  # [O] int64: first row of each owner
    count: torch.Tensor,  # [O] int64: rows of each owner (<= 0: none)
    base: torch.Tensor,  # [O] int64: position of each owner's first row
    slots: torch.Tensor,  # [O] int64
    num_slots: int,
    max_seq_len: int,
) -> Placement:
    num_owners = start.shape[0]
    row = torch.arange(num_rows, dtype=torch.int64, device=start.device)
    mine = (row[None, :] >= start[:, None]) & (row[None, :] < (start + count)[:, None])  # [O, R]
    owner_ids = torch.arange(num_owners, dtype=torch.int64, device=start.device)
    owner = torch.amin(torch.where(mine, owner_ids[:, None], num_owners), dim=0)  # first owner
    owned = owner < num_owners
    owner = torch.clamp(owner, max=num_owners - 1)
    position = base[owner] + row - start[owner]
    slot = slot_or_scratch(slots, num_slots)[owner]
    readable = owned & (slot < num_slots)
    in_range = (position >= 0) & (position < max_seq_len)
    clamped = torch.clamp(position, 0, max_seq_len - 1)
    return Placement(
        owner=owner,
        position=position,
        rope_position=clamped,
        write_slot=torch.where(readable & in_range, slot, num_slots),
        write_position=clamped,
        read_slot=torch.where(readable, slot, num_slots),
    )


def offsets_to_ranges(offsets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # [O+1] -> [O], [O]
    return offsets[:-1], offsets[1:] - offsets[:-1]
