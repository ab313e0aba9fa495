"""The head kernels' per-row scratch record: where each piece of a row's state lives, named
once, here. The device side (word indices, marks, `@triton.jit` accessors) is what the
kernels use; `Scratch` is the host's view, for tests and diagnostics that look inside a
launch (`verify.launch(..., scratch=verify.scratch_for(...))`).

A launch's scratch is `work`, one int64 row of `scratch_width(BUF)` words per logits row
(`dflash_verify`: per pair slot), and `queue` (`queue_words`) for split walks. A row:
- [0, 2 BUF): its candidate list (`keys_of`): up to 2 BUF int32 keys (`common.ordered_key`)
  in int32 words [0, 2 BUF), their vocab indices in int32 words [2 BUF, 4 BUF).
  `sampling_rule.scan_row` keeps BUF packed int64 entries there instead, and
  `filtered.store_lanes` a filtered row's lanes until its bound is known.
- HOT_WORDS (`hot_of`): `filtered.collect`'s hot lanes, or a queued row's split walk (W_*).
- RESULTS (`results_of`): the row's decision (R_TOKEN, R_MATCH, R_X_MAX, R_MASS), or its mark
  and pair on the way to a later launch (R_TOKEN, R_PAIR, R_ROW, R_DRAFT).
- STATS (`stats_of`): a filtered row's stats (S_*; `STAT_NAMES`).
- 2 words per chunk of a temperature-only row (`prefixes_of`): its prefix mass at each chunk
  end (`sampling_rule.store_prefix`).
`queue`: [rows queued, tickets taken, the queued rows' pair slots].

Floats are stored as their bits: float32 in the low 32 bits of a word (`f32_word`;
`word_f32`, `load_f32` read it), float64 as the whole word (`f64_word`; `word_f64`,
`load_f64`). `sampling_rule`'s chunk partials use the same words.
"""

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

HOT_WORDS = tl.constexpr(256)  # 512 int32 lanes: `launch.LIGHT_BYTES` * 8 / `sampling_rule.LANE_BITS`
RESULTS = tl.constexpr(4)
STATS = tl.constexpr(10)
PREFIX_SPLITS = 8  # chunks of a temperature-only row whose end prefix masses it keeps (`launch.prefix_chunks`)
SPLIT = tl.constexpr(32)  # chunks per queued row of a split walk (`split_walk`)

# RESULTS words of a decided row (`store_results`) ...
R_TOKEN = tl.constexpr(0)  # the token, or a mark below
R_MATCH = tl.constexpr(1)  # 1 iff the token is the row's draft
R_X_MAX = tl.constexpr(2)  # the row's max (float32), for the accept kernel's search (SEARCH_LATER)
R_MASS = tl.constexpr(3)  # the row's mass S (float64), for the same
# ... and of a marked row (`store_pair`)
R_PAIR = tl.constexpr(1)  # owner << 32 | j
R_ROW = tl.constexpr(2)  # the packed row
R_DRAFT = tl.constexpr(3)  # the draft token after it (-1: none)

# R_TOKEN marks and token codes (a token is >= -1: -1 for a row with no finite logit)
SEARCH_LATER = tl.constexpr(-2)  # a temperature-only row whose draft does not match: the accept kernel searches
UNDECIDED = tl.constexpr(-4)  # a top-k / top-p row that a decision step could not settle
FILTERED_ROW = tl.constexpr(-5)  # a top-k / top-p row until verify_filtered_kernel decides it
PASS_ROW = tl.constexpr(-6)  # a top-k / top-p row until the FILTERED row launch reads it
UNUSED_SLOT = tl.constexpr(-7)  # a slot that holds no admitted (owner, j) pair
QUEUED_ROW = tl.constexpr(-8)  # a FILTERED_ROW whose whole-row walk is queued (`split_walk`)

# STATS words of a filtered row (`store_stats`; the bins' words from a split walk, `split_walk`)
S_COUNT = tl.constexpr(0)  # its candidates, -1 without a bound, or WALK_ROW
S_X_MAX = tl.constexpr(1)  # float32
S_ARG = tl.constexpr(2)
S_FINITE = tl.constexpr(3)  # lanes holding a finite logit (> 0 iff the row has one)
S_MASS = tl.constexpr(4)  # float64 mass S (top-p alone)
S_WALK_BOUND = tl.constexpr(5)  # the bound of the walk a WALK_ROW row is left to
S_BINS = tl.constexpr(6)  # NO_BINS, BINS_LIST or BINS_NO_LIST
S_WIDE_LO = tl.constexpr(7)  # `nucleus.wide_list`'s bracket of the top-p cut, from the bins ...
S_WIDE_HI = tl.constexpr(8)
S_WIDE_SHORT = tl.constexpr(9)  # ... and whether the CAP best tokens surely fall short of the target
STAT_NAMES = ("count", "x_max_bits", "arg", "finite_lanes", "mass_bits", "walk_bound", "bins", "wide_lo", "wide_hi",
              "wide_short")
assert len(STAT_NAMES) == STATS.value

WALK_ROW = tl.constexpr(-3)  # S_COUNT of a row whose collect is left to a whole-row walk
NO_BINS = tl.constexpr(0)  # no bins counted for the row: a short list gets `wide_list`
BINS_LIST = tl.constexpr(1)  # the list is the one `wide_list` would collect (at the bins' bound)
BINS_NO_LIST = tl.constexpr(2)  # the bins hold no bound for a list (`wide_list` gives -1)

# HOT_WORDS of a queued row (`split_walk`): chunks finished in the current phase, SPLIT chunk
# counts, SPLIT chunk starts, the phase-2 state, then `dense_collect.WIDE_BINS` int32 bins.
W_FINISHED = tl.constexpr(0)
W_COUNTS = tl.constexpr(1)
W_STARTS = tl.constexpr(W_COUNTS.value + SPLIT.value)
W_STATE = tl.constexpr(W_STARTS.value + SPLIT.value)  # NOT_READY until phase 1 ends, then DONE or phase 2's bound
W_BINS = tl.constexpr(W_STATE.value + 1)
NOT_READY = tl.constexpr(-2)
DONE = tl.constexpr(-1)


@triton.jit
def keys_of(buf_ptr):
    """The candidate list's keys (int32); its indices follow 2 * BUF int32 words later."""
    return buf_ptr.to(tl.pointer_type(tl.int32))


@triton.jit
def hot_of(work, BUF: tl.constexpr):
    """A row's HOT_WORDS, after its candidate list."""
    return work + 2 * BUF


@triton.jit
def results_of(work, BUF: tl.constexpr):
    """A row's RESULTS words, after its hot words."""
    return work + 2 * BUF + HOT_WORDS


@triton.jit
def stats_of(work, BUF: tl.constexpr):
    """A filtered row's STATS words, after its RESULTS."""
    return results_of(work, BUF) + RESULTS


@triton.jit
def prefixes_of(work, BUF: tl.constexpr):
    """A temperature-only row's chunk-end prefix masses (2 words per chunk), after its STATS."""
    return results_of(work, BUF) + RESULTS + STATS


@triton.jit
def f32_word(x):
    return x.to(tl.int32, bitcast=True).to(tl.int64)


@triton.jit
def f64_word(x):
    return x.to(tl.float64).to(tl.int64, bitcast=True)


@triton.jit
def word_f32(word):
    """The float32 of an `f32_word` (loaded)."""
    return word.to(tl.int32).to(tl.float32, bitcast=True)


@triton.jit
def word_f64(word):
    """The float64 of an `f64_word` (loaded)."""
    return word.to(tl.float64, bitcast=True)


@triton.jit
def load_f32(ptr):
    """A float32 stored by `f32_word`."""
    return word_f32(tl.load(ptr))


@triton.jit
def load_f64(ptr):
    """A float64 stored by `f64_word`."""
    return word_f64(tl.load(ptr))


@triton.jit
def store_results(results, token, match, x_max, mass):
    """A row's decision for the accept kernel: token (or SEARCH_LATER), match, x_max, mass."""
    tl.store(results + R_TOKEN, token)
    tl.store(results + R_MATCH, match.to(tl.int64))
    tl.store(results + R_X_MAX, f32_word(x_max))
    tl.store(results + R_MASS, f64_word(mass))


@triton.jit
def store_pair(results, owner, j, row, draft):
    """A top-k / top-p row's mark for `dflash_verify`'s FILTERED row launch, with what it needs
    of the layout walk (owner and j < 2^31)."""
    tl.store(results + R_TOKEN, PASS_ROW)
    tl.store(results + R_PAIR, owner * 4294967296 + j)
    tl.store(results + R_ROW, row)
    tl.store(results + R_DRAFT, draft)


@triton.jit
def stored_pair(results, logits_ptr, stride):
    """`store_pair`'s (owner, j, row pointer, draft)."""
    pair = tl.load(results + R_PAIR)
    row_ptr = logits_ptr + tl.load(results + R_ROW) * stride
    return pair // 4294967296, pair % 4294967296, row_ptr, tl.load(results + R_DRAFT)


@triton.jit
def store_stats(stats_ptr, count, x_max, arg, finite, mass):
    """A filtered row's stats after its pass and collect; no bins (NO_BINS)."""
    tl.store(stats_ptr + S_BINS, NO_BINS)
    tl.store(stats_ptr + S_COUNT, count)
    tl.store(stats_ptr + S_X_MAX, f32_word(x_max))
    tl.store(stats_ptr + S_ARG, arg.to(tl.int64))
    tl.store(stats_ptr + S_FINITE, finite.to(tl.int64))
    tl.store(stats_ptr + S_MASS, f64_word(mass))


def scratch_width(buf: int) -> int:
    """int64 words per scratch row (the module docstring's layout)."""
    return 2 * buf + HOT_WORDS.value + RESULTS.value + STATS.value + 2 * PREFIX_SPLITS


def queue_words(num_rows):
    """int64 words of the queue: [rows queued, tickets taken, the queued rows' pair slots]."""
    return 2 + num_rows


@dataclass
class Scratch:
    """One `dflash_verify` launch's scratch: `work` [rows, width] int64, `queue`, and the BUF
    of its decision launch (a row's candidate list holds up to 2 BUF entries, in 2 BUF int64
    words)."""
    work: torch.Tensor
    queue: torch.Tensor
    buf: int

    @classmethod
    def of(cls, num_rows: int, buf: int, device) -> "Scratch":
        return cls(torch.empty(num_rows, scratch_width(buf), dtype=torch.int64, device=device),
                   torch.empty(queue_words(num_rows), dtype=torch.int64, device=device), buf)

    def queued_rows(self) -> list[int]:
        """The rows whose whole-row walk was queued for the decision launch, in queue order."""
        q = self.queue.cpu()
        return q[2:2 + int(q[0])].tolist()

    def tickets_taken(self) -> int:
        return int(self.queue[1])

    def results(self) -> torch.Tensor:
        """[rows, RESULTS]: each row's decision words (R_TOKEN first: its token, or a mark)."""
        start = 2 * self.buf + HOT_WORDS.value
        return self.work[:, start:start + RESULTS.value].cpu()

    def stats(self, row: int) -> dict[str, int]:
        """A filtered row's stats by name (`STAT_NAMES`)."""
        start = 2 * self.buf + HOT_WORDS.value + RESULTS.value
        return dict(zip(STAT_NAMES, self.work[row, start:start + STATS.value].tolist()))

    def chunks_finished(self, row: int) -> int:
        """A queued row's chunks finished in its current walk phase (W_FINISHED)."""
        return int(self.work[row, 2 * self.buf + W_FINISHED.value])

    def packed_list(self, row: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The first `count` entries of a row's candidate list: vocab indices and unsigned
        float32 keys (int64, in index order as `filtered.collect` packs them)."""
        words = self.work[row].cpu().view(torch.int32)
        indices = words[2 * self.buf:2 * self.buf + count].long()
        keys = words[:count].long() + 2**31
        return indices, keys
