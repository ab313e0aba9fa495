"""Host-side views of `dflash_verify`'s scratch: its layout named once, here, for tests and
diagnostics that look inside a launch (`verify.launch(..., scratch=Scratch.of(...))`).

A launch's scratch is `work`, one int64 row per logits row (`launch.scratch_width`):
- words [0, 2 BUF): a row's packed candidate list, up to 2 BUF entries as int32: keys
  (unsigned key - 2^31) in int32 words [0, 2 BUF), vocab indices in [2 BUF, 4 BUF);
- [2 BUF, + HOT_WORDS): hot lanes, or a queued split walk's words: chunks finished in the
  current phase first (`split_walk`);
- then RESULTS words of the row's decision, STATS words of a filtered row's stats
  (`filtered.store_stats`; `STAT_NAMES`), then the chunk-end prefix masses;
and `queue` (`split_walk.queue_words`): [rows queued, tickets taken, the queued rows].
"""

from dataclasses import dataclass

import torch

from .filtered import HOT_WORDS, RESULTS, STATS
from .split_walk import queue_words

# The STATS words of a filtered row, in order (`filtered.store_stats` and the bins of a split walk).
STAT_NAMES = ("count", "x_max_bits", "arg", "finite_lanes", "mass_bits", "walk_bound", "bins", "wide_lo", "wide_hi",
              "wide_short")
assert len(STAT_NAMES) == STATS.value


@dataclass
class Scratch:
    """One `dflash_verify` launch's scratch: `work` [rows, width] int64, `queue`, and the BUF
    of its decision launch (a row's candidate list holds up to 2 BUF entries, in 2 BUF int64
    words)."""
    work: torch.Tensor
    queue: torch.Tensor
    buf: int

    @classmethod
    def of(cls, num_rows: int, width: int, buf: int, device) -> "Scratch":
        return cls(torch.empty(num_rows, width, dtype=torch.int64, device=device),
                   torch.empty(queue_words(num_rows), dtype=torch.int64, device=device), buf)

    def queued_rows(self) -> list[int]:
        """The rows whose whole-row walk was queued for the decision launch, in queue order."""
        q = self.queue.cpu()
        return q[2:2 + int(q[0])].tolist()

    def tickets_taken(self) -> int:
        return int(self.queue[1])

    def results(self) -> torch.Tensor:
        """[rows, RESULTS]: each row's decision words (the first: its token, or a mark)."""
        start = 2 * self.buf + HOT_WORDS.value
        return self.work[:, start:start + RESULTS.value].cpu()

    def stats(self, row: int) -> dict[str, int]:
        """A filtered row's stats by name (`STAT_NAMES`)."""
        start = 2 * self.buf + HOT_WORDS.value + RESULTS.value
        return dict(zip(STAT_NAMES, self.work[row, start:start + STATS.value].tolist()))

    def chunks_finished(self, row: int) -> int:
        """A queued row's chunks finished in its current walk phase (its first hot word)."""
        return int(self.work[row, 2 * self.buf])

    def packed_list(self, row: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The first `count` entries of a row's packed candidate list: vocab indices and
        unsigned float32 keys (int64, in index order as `collect` packs them)."""
        words = self.work[row].cpu().view(torch.int32)
        indices = words[2 * self.buf:2 * self.buf + count].long()
        keys = words[:count].long() + 2**31
        return indices, keys
