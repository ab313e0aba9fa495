"""The head kernels' per-row scratch record: where each piece of a row's state lives, named
once, here. The device side (word indices, marks, `@triton.jit` accessors) is what the
kernels use; `Scratch` is the host's view, for tests and diagnostics that look inside a
launch (`verify.launch` or `sample_rows.launch` with `scratch=launch.scratch_for(...)`).

A launch's scratch is `work`, one int64 row of `scratch_width(BUF)` words per logits row
(`dflash_verify`: per pair slot). A row:
- [0, 2 BUF): its list of up to 2 BUF packed tokens (`sampling_rule.pack`): `filtered.collect`'s
  candidates, then `cut_select`'s sample and the tokens its passes list. `filtered.store_lanes`
  keeps a filtered row's lanes (and element maxima) there until its bound is known.
- HOT_WORDS (`hot_of`): `filtered.collect`'s hot lanes.
- RESULTS (`results_of`): the row's decision (R_TOKEN, R_MATCH, R_X_MAX, R_MASS), or its mark
  and pair on the way to a later launch (R_TOKEN, R_PAIR, R_ROW, R_DRAFT).
- STATS (`stats_of`): a filtered row's stats (S_*; `STAT_NAMES`), and the thresholds of
  `cut_select`'s last pass (S_THRESHOLDS: 4 words).
- 2 words per chunk of a temperature-only row (`prefixes_of`): its prefix mass at each chunk
  end (`sampling_rule.store_prefix`).
- PART_WORDS per program of a pass of the sample select (`parts_of`): what it counted.
- VERIFY_WORDS (`verify_of`, `dflash_verify` only): whether the row's token certainly is not its
  draft (V_MISS), and the select's queue of rows (V_QUEUE: the queue's entry at this row's
  index; V_QUEUED, in the first row's words only: the queue's length).

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
STATS = tl.constexpr(38)
PREFIX_SPLITS = 8  # chunks of a temperature-only row whose end prefix masses it keeps (`launch.prefix_chunks`)
PREFIX_WORDS = tl.constexpr(2 * PREFIX_SPLITS)

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
MOOT_ROW = tl.constexpr(-8)  # a top-k / top-p row after an earlier row of its owner that certainly missed its
# draft (V_MISS): its decision cannot change the owner's result, so nothing decides it
PASS_ROW = tl.constexpr(-6)  # a top-k / top-p row until the FILTERED row launch reads it
UNUSED_SLOT = tl.constexpr(-7)  # a slot that holds no admitted (owner, j) pair

# STATS words of a filtered row (`store_stats`, `filtered.bound_and_collect`, `cut_select`)
S_COUNT = tl.constexpr(0)  # its candidates (`filtered.collect`), -1 without a list (no bound, or most lanes hot)
S_X_MAX = tl.constexpr(1)  # float32
S_ARG = tl.constexpr(2)
S_FINITE = tl.constexpr(3)  # lanes holding a finite logit (> 0 iff the row has one)
S_MASS = tl.constexpr(4)  # float64 mass S (top-p alone)
S_BOUND = tl.constexpr(5)  # the unsigned key bound of the candidates: every finite token with key >= it
S_PASSES = tl.constexpr(6)  # `cut_select`'s passes over the row (after the row's first)
S_THRESHOLDS = tl.constexpr(7)  # 4 words: the packed thresholds of `cut_select`'s last pass
# `cut_select`'s state between its rounds and launches
S_LIST_N = tl.constexpr(11)  # the list (`store_list`): its slots in use, holding every token of (lo, hi] ...
S_LIST_LO = tl.constexpr(12)
S_LIST_HI = tl.constexpr(13)
S_LIST_C_HI = tl.constexpr(14)  # ... the count and mass above hi and above lo (count -1: not counted)
S_LIST_M_HI = tl.constexpr(15)  # float64
S_LIST_C_LO = tl.constexpr(16)
S_LIST_M_LO = tl.constexpr(17)  # float64
S_CUT = tl.constexpr(18)  # the last cut found (`store_cut`): packed, ...
S_CUT_MASS = tl.constexpr(19)  # ... the kept set's mass (float64), ...
S_CUT_LISTED = tl.constexpr(20)  # ... whether the list holds the whole set
S_TOP = tl.constexpr(21)  # the region (bot, top] that holds the cut (`store_region`) ...
S_TOP_N = tl.constexpr(22)  # ... the count and mass above each end
S_TOP_M = tl.constexpr(23)  # float64
S_BOT = tl.constexpr(24)
S_BOT_N = tl.constexpr(25)  # (an upper bound until S_BOT_EXACT)
S_BOT_M = tl.constexpr(26)  # float64
S_BOT_EXACT = tl.constexpr(27)
S_GOAL = tl.constexpr(28)  # the cut searched (`store_goal`): k, or top_p * S_k (float64), ...
S_BY_MASS = tl.constexpr(29)  # ... 1 for a top-p cut
S_HAVE_LIST = tl.constexpr(30)  # 1: the list holds the cut's region (a list round next), 0: a pass round
S_BRACKETS = tl.constexpr(31)  # bracket passes so far
S_FINITE_N = tl.constexpr(32)  # the row's finite tokens (V, an upper bound, until a pass has counted them)
S_FILL = tl.constexpr(33)  # the entries a pass has listed so far (its lanes' atomic adds)
S_PHASE = tl.constexpr(34)  # where a row is in `cut_select`'s launches: a PH_* below (0: not in the select)
S_LIST_PARTS = tl.constexpr(35)  # the last pass's span where it was split (the first part of each span of
# `parts_of` holds its mass above the list: `cut_select.pass_span_bits`), 0 where the rounds read it whole
S_SEARCH_LO = tl.constexpr(36)  # where step 7's pass starts (the part where the prefix crosses t) ...
S_SEARCH_PREFIX = tl.constexpr(37)  # ... and the kept mass before it (float64)
STAT_NAMES = ("count", "x_max_bits", "arg", "finite_lanes", "mass_bits", "bound", "passes", "threshold_0",
              "threshold_1", "threshold_2", "threshold_3", "list_n", "list_lo", "list_hi", "list_above_hi",
              "list_mass_above_hi_bits", "list_above_lo", "list_mass_above_lo_bits", "cut", "cut_mass_bits",
              "cut_listed", "top", "top_n", "top_mass_bits", "bot", "bot_n", "bot_mass_bits", "bot_exact",
              "goal_bits", "by_mass", "have_list", "brackets", "finite_n", "fill", "phase", "list_parts",
              "search_lo", "search_prefix_bits")
assert len(STAT_NAMES) == STATS.value

# S_PHASE: a row in the sample select, between its launches (`cut_select`)
PH_ROUNDS = tl.constexpr(1)  # its rounds go on in the next rounds launch
PH_PASS = tl.constexpr(2)  # it wants a pass (S_THRESHOLDS): the next pass launch's programs each read a part
PH_SEARCH = tl.constexpr(3)  # its cut is found: the search launch finds its token (step 7)

# A select row's pass parts (`parts_of`): the pass launch's items of a row each store PART_WORDS in the
# first part of their span (`store_part`, `load_parts`)
SELECT_SPLITS = tl.constexpr(16)
P_ABOVE_N = tl.constexpr(0)  # 4 words: the count above each of the pass's thresholds ...
P_ABOVE_M = tl.constexpr(4)  # ... 4 words: the mass above each (float64)
P_LOWEST = tl.constexpr(8)  # at or below every finite token of the part (`cut_select._threshold_pass`)
P_FINITE_N = tl.constexpr(9)  # the part's finite tokens ...
P_FINITE_M = tl.constexpr(10)  # ... and their mass (float64)
PART_WORDS = tl.constexpr(11)
assert PART_WORDS.value <= 16  # (`clear_parts` writes a part as 16 words, masked)

# `dflash_verify`'s words of a pair slot (`verify_of`)
V_MISS = tl.constexpr(0)  # 1: the row's token is certainly not its draft (`sampling_rule.certain_miss`), so
# the owner's later rows are moot: written by the first row launch for every top-k / top-p row
V_QUEUE = tl.constexpr(1)  # the select's queue entry at this slot's index: a FILTERED_ROW's slot
V_QUEUED = tl.constexpr(2)  # the queue's length (the first slot's words only; zeroed by the first row launch)
VERIFY_WORDS = tl.constexpr(4)


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
def parts_of(work, BUF: tl.constexpr):
    """A select row's pass parts (SELECT_SPLITS x PART_WORDS words), after its prefix masses."""
    return prefixes_of(work, BUF) + PREFIX_WORDS


@triton.jit
def verify_of(work, BUF: tl.constexpr):
    """A pair slot's VERIFY_WORDS (`dflash_verify`), after its pass parts."""
    return parts_of(work, BUF) + SELECT_SPLITS * PART_WORDS


@triton.jit
def part_of(parts, c):
    """Part c's words among a row's `parts_of`."""
    return parts + c * PART_WORDS


@triton.jit
def store_part(part, above_n, above_m, lowest, n_finite, m_finite):
    """What a pass program counted over its part: [4] counts and masses above the thresholds,
    the lowest token, the finite count and mass."""
    q = tl.arange(0, 4)
    tl.store(part + P_ABOVE_N + q, above_n)
    tl.store(part + P_ABOVE_M + q, above_m.to(tl.int64, bitcast=True))
    tl.store(part + P_LOWEST, lowest)
    tl.store(part + P_FINITE_N, n_finite)
    tl.store(part + P_FINITE_M, f64_word(m_finite))


@triton.jit
def clear_parts(parts, first, last):
    """Parts first to last - 1 as parts with no token (counts and masses 0, lowest INT64_MAX):
    a pass item that read them with part first - 1 stored its counts there (`store_part`)."""
    c = tl.arange(0, SELECT_SPLITS)[:, None]
    w = tl.arange(0, 16)[None, :]
    tl.store(parts + c * PART_WORDS + w, tl.where(w == P_LOWEST, 9223372036854775807, 0),
             mask=(c >= first) & (c < last) & (w < PART_WORDS))


@triton.jit
def load_parts(parts, live):
    """`store_part`'s words of the live parts ([SELECT_SPLITS] flags) summed over them (lowest: the
    least): (above_n [4], above_m [4], lowest, n_finite, m_finite). Every part loaded at once (one
    load latency, not one a part); the sums' order is fixed by the reduction, whichever program
    stored which part first."""
    part = parts + tl.arange(0, SELECT_SPLITS) * PART_WORDS
    q = tl.arange(0, 4)
    above_n = tl.zeros((4,), dtype=tl.int64)
    above_m = tl.zeros((4,), dtype=tl.float64)
    for k in tl.static_range(4):  # (threshold k of every part)
        above_n += tl.where(q == k, tl.sum(tl.load(part + P_ABOVE_N + k, mask=live, other=0), 0), 0)
        above_m += tl.where(q == k, tl.sum(tl.load(part + P_ABOVE_M + k, mask=live, other=0).to(tl.float64,
                                                                                                bitcast=True), 0), 0.0)
    lowest = tl.min(tl.load(part + P_LOWEST, mask=live, other=9223372036854775807), 0)
    n_finite = tl.sum(tl.load(part + P_FINITE_N, mask=live, other=0), 0)
    m_finite = tl.sum(tl.load(part + P_FINITE_M, mask=live, other=0).to(tl.float64, bitcast=True), 0)
    return above_n, above_m, lowest, n_finite, m_finite


@triton.jit
def load_parts_mass_above(parts, k, live):
    """The mass above threshold k of each part (a [SELECT_SPLITS] vector; 0 where not live)."""
    c = tl.arange(0, SELECT_SPLITS)
    return tl.load(parts + c * PART_WORDS + P_ABOVE_M + k, mask=live, other=0).to(tl.float64, bitcast=True)


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
def store_moot(results):
    """A moot row's mark (MOOT_ROW), not a match (the accept kernel's first miss is earlier)."""
    tl.store(results + R_TOKEN, MOOT_ROW)
    tl.store(results + R_MATCH, 0)


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
    """A filtered row's stats after its pass and collect (`cut_select` passes: none yet)."""
    tl.store(stats_ptr + S_PASSES, 0)
    tl.store(stats_ptr + S_PHASE, 0)
    tl.store(stats_ptr + S_COUNT, count)
    tl.store(stats_ptr + S_X_MAX, f32_word(x_max))
    tl.store(stats_ptr + S_ARG, arg.to(tl.int64))
    tl.store(stats_ptr + S_FINITE, finite.to(tl.int64))
    tl.store(stats_ptr + S_MASS, f64_word(mass))


@triton.jit
def store_list(stats_ptr, n, lo, hi, c_hi, m_hi, c_lo, m_lo):
    """`cut_select`'s list: its first n slots, in no order, hold every token of (lo, hi] (and maybe
    tokens outside it: readers keep (lo, hi] only); c_hi / m_hi the count and mass above hi, c_lo /
    m_lo above lo (c_lo -1: not counted)."""
    tl.store(stats_ptr + S_LIST_N, n)
    tl.store(stats_ptr + S_LIST_LO, lo)
    tl.store(stats_ptr + S_LIST_HI, hi)
    tl.store(stats_ptr + S_LIST_C_HI, c_hi)
    tl.store(stats_ptr + S_LIST_M_HI, f64_word(m_hi))
    tl.store(stats_ptr + S_LIST_C_LO, c_lo)
    tl.store(stats_ptr + S_LIST_M_LO, f64_word(m_lo))


@triton.jit
def load_list(stats_ptr):
    """`store_list`'s (n, lo, hi, c_hi, m_hi, c_lo, m_lo)."""
    tl.debug_barrier()  # (stored by other threads)
    return (tl.load(stats_ptr + S_LIST_N), tl.load(stats_ptr + S_LIST_LO), tl.load(stats_ptr + S_LIST_HI),
            tl.load(stats_ptr + S_LIST_C_HI), load_f64(stats_ptr + S_LIST_M_HI), tl.load(stats_ptr + S_LIST_C_LO),
            load_f64(stats_ptr + S_LIST_M_LO))


@triton.jit
def store_cut(stats_ptr, cut, mass, listed):
    """`cut_select`'s cut: the packed cut, the kept set's mass, whether the list holds the set."""
    tl.store(stats_ptr + S_CUT, cut)
    tl.store(stats_ptr + S_CUT_MASS, f64_word(mass))
    tl.store(stats_ptr + S_CUT_LISTED, listed.to(tl.int64))


@triton.jit
def load_cut(stats_ptr):
    """`store_cut`'s (cut, mass, listed)."""
    tl.debug_barrier()  # (stored by other threads)
    return tl.load(stats_ptr + S_CUT), load_f64(stats_ptr + S_CUT_MASS), tl.load(stats_ptr + S_CUT_LISTED) != 0


@triton.jit
def store_region(stats_ptr, top, c_top, m_top, bot, c_bot, m_bot, exact):
    """`cut_select`'s region (bot, top] and the count and mass above each end."""
    tl.store(stats_ptr + S_TOP, top)
    tl.store(stats_ptr + S_TOP_N, c_top)
    tl.store(stats_ptr + S_TOP_M, f64_word(m_top))
    tl.store(stats_ptr + S_BOT, bot)
    tl.store(stats_ptr + S_BOT_N, c_bot)
    tl.store(stats_ptr + S_BOT_M, f64_word(m_bot))
    tl.store(stats_ptr + S_BOT_EXACT, exact.to(tl.int64))


@triton.jit
def load_region(stats_ptr):
    """`store_region`'s (top, c_top, m_top, bot, c_bot, m_bot, exact)."""
    tl.debug_barrier()  # (stored by other threads)
    return (tl.load(stats_ptr + S_TOP), tl.load(stats_ptr + S_TOP_N), load_f64(stats_ptr + S_TOP_M),
            tl.load(stats_ptr + S_BOT), tl.load(stats_ptr + S_BOT_N), load_f64(stats_ptr + S_BOT_M),
            tl.load(stats_ptr + S_BOT_EXACT) != 0)


@triton.jit
def store_goal(stats_ptr, goal, by_mass):
    """The cut `cut_select` searches: k (by count) or top_p * S_k (by mass)."""
    tl.store(stats_ptr + S_GOAL, f64_word(goal))
    tl.store(stats_ptr + S_BY_MASS, by_mass.to(tl.int64))


@triton.jit
def load_goal(stats_ptr):
    """`store_goal`'s (goal, by_mass)."""
    tl.debug_barrier()  # (stored by other threads)
    return load_f64(stats_ptr + S_GOAL), tl.load(stats_ptr + S_BY_MASS) != 0


def scratch_width(buf: int) -> int:
    """int64 words per scratch row (the module docstring's layout)."""
    return (2 * buf + HOT_WORDS.value + RESULTS.value + STATS.value + 2 * PREFIX_SPLITS
            + SELECT_SPLITS.value * PART_WORDS.value + VERIFY_WORDS.value)


@dataclass
class Scratch:
    """One `dflash_verify` launch's scratch: `work` [rows, width] int64 and the BUF of its
    decision launch (a row's candidate list holds up to 2 BUF entries, in 2 BUF int64 words)."""
    work: torch.Tensor
    buf: int

    @classmethod
    def of(cls, num_rows: int, buf: int, device) -> "Scratch":
        return cls(torch.empty(num_rows, scratch_width(buf), dtype=torch.int64, device=device), buf)

    def results(self) -> torch.Tensor:
        """[rows, RESULTS]: each row's decision words (R_TOKEN first: its token, or a mark)."""
        start = 2 * self.buf + HOT_WORDS.value
        return self.work[:, start:start + RESULTS.value].cpu()

    def verify_words(self) -> torch.Tensor:
        """[rows, VERIFY_WORDS]: each pair slot's `verify_of` words (`dflash_verify`)."""
        start = self.work.shape[1] - VERIFY_WORDS.value
        return self.work[:, start:].cpu()

    def stats(self, row: int) -> dict[str, int]:
        """A filtered row's stats by name (`STAT_NAMES`)."""
        start = 2 * self.buf + HOT_WORDS.value + RESULTS.value
        return dict(zip(STAT_NAMES, self.work[row, start:start + STATS.value].tolist()))

    def part_masses(self, row: int, parts: int) -> torch.Tensor:
        """[parts, 4] float64: the mass above each threshold that each of the first `parts` parts
        of the row's last split pass summed (`cut_select.select_pass_part`: the parts inside the
        row, `launch.select_config`'s chunk; 0 where its pass weighs nothing)."""
        start = 2 * self.buf + HOT_WORDS.value + RESULTS.value + STATS.value + PREFIX_WORDS.value
        words = self.work[row, start:start + parts * PART_WORDS.value].cpu().view(parts, PART_WORDS.value)
        return words[:, P_ABOVE_M.value:P_ABOVE_M.value + 4].contiguous().view(torch.float64)

    def packed_list(self, row: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The first `count` entries of a row's list: vocab indices and unsigned float32 keys
        (`common.unsigned_key`; int64, in the list's order)."""
        packed = self.work[row, :count].cpu()
        return (packed & 0xFFFFFFFF) ^ 0xFFFFFFFF, (packed >> 32) + 2**31
