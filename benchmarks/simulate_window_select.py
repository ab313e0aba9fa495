"""Simulate issue #25's window select on every row kind and mode (CPU; not a test).

A design for the top-k / top-p cuts, worked out before its kernel (the house rule: reference
first); issue #25 wants a number of passes over a row that the design bounds. SPEC.md's cuts
are places in the row's order (logit descending, index ascending): top-k the k-th token,
top-p the last token whose prefix mass before it stays under top_p * S_k. Probe searches
(`simulate_cut_search.py`) cost 160-340 ALU operations per logit in the worst case. Here each
pass over the row narrows a *window* of the order that holds the cut, with counts only:

- A window is a range of weight codes (1.0's float32 bits minus the weight's: the code rises
  as the float32 weight of SPEC.md step 5 falls, so a range of codes is a stretch of the
  order, and a bin of codes bounds its weights exactly), or, once one code holds the cut and
  several keys (T so large that weights round alike), a range of ordered keys.
- A histogram pass splits the window into NB bins (`tl.histogram` of NB + 2 bins: the window's,
  one above it and one below) and sums exactly the mass and count above the window. Counts
  per bin are exact; a bin's mass lies between its count times its edges' weights. With the
  exact mass above the window and the row's exact mass (S from the first pass; S_k from
  top-k's list) those bounds bracket a top-p cut within a few bins.
- The codes known to hold the cut only narrow; the next window is that bracket. Where no
  bound narrows it, the next window is the first bin that can hold the cut, alone; a pass
  whose exact mass above shows the cut above its window, or whose list shows it below,
  narrows the bracket instead (no pass is wasted: each narrows it by a bin at least).
- Once the window holds at most LIST tokens, the pass stores them (key, index) with the exact
  mass and count above them, and the cut is exact from the list. Where the tokens above the
  window fit too, the list takes the whole prefix (top-k <= LIST, a narrow nucleus: both cuts
  from one list). A window of a single key needs no list: its ties share one weight.
- The first window holds weights down to 2^-30 (FIRST_OCTAVES), one bin per octave at
  NB = 30.

The bound: each pass narrows the bracket by one bin at least, and a bin of width 1 (one
code, or one key) ends the search, so at most NB passes per level of ceil(24 / log2 NB)
levels of weight codes and ceil(32 / log2 NB) of keys, per cut; not reached on any kind (the
table: the passes taken). After the cuts, step 7 (the token, t = u * S_K in index order)
reads the row once more with them (half a pass on average: it stops at the token).

For each (kind, mode, dtype) this prints passes over the row after the first (mean / max;
histograms + list + step 7), the largest list, and ALU operations per logit over those
passes (assumed per pass: histogram 28 (its 32-bin `tl.histogram` ~12 warp instructions per
32 logits, the rest load, d, bin, window test, exact mass above), list 20, step 7 16), and
checks every cut against a sort (`simulate_cut_search.sorted_cuts`); it fails otherwise.

    python benchmarks/simulate_window_select.py [--rows 4] [--vocab 151936] [--list 4096] [--bins 30]

(benchmarks/HISTORY.md, session 46, has a run and what it says of the design.)
"""

import math
import sys
from dataclasses import dataclass, field

import torch

from simulate_cut_search import (cells_parser, checked_cells, keys, largest, mean_max,  # (benchmarks/, beside
                                 passes, value_of_key, worst_rows)  # this script)

HIST_OPS, LIST_OPS, SEARCH_OPS = 28, 20, 16  # ALU operations per logit of each pass (the docstring)
OCTAVE = 1 << 23  # the codes of one octave of weights (a float32 exponent step)
FIRST_OCTAVES = 30  # the first window: weights down to 2^-30, one bin per octave (bins of NB: as many as fit)
ONE_BITS = 0x3F800000  # the bits of float32 1.0, the largest weight
NOT_FINITE = ONE_BITS + 1  # (a -inf logit's code: past every weight's, 0 included)
MARGIN = 1e-5  # relative slack on a key bin's weight bounds (its edges' weights are computed in float64)
ROUNDS_CAP = 100  # (a simulation that loops is a bug in it)


@dataclass
class Row:
    """One sanitized row's keys, weights and weight codes, as a kernel computes them."""
    x: torch.Tensor  # float32, NaN as -inf, +inf as FLT_MAX
    dtype: torch.dtype
    temperature: float
    x_max: float = field(init=False)
    key: torch.Tensor = field(init=False)
    e: torch.Tensor = field(init=False)
    c: torch.Tensor = field(init=False)  # ONE_BITS - the float32 weight's bits: rises as the weight falls

    def __post_init__(self):
        finite = self.x > float("-inf")
        x_max = self.x[finite].max()
        self.x_max = float(x_max)
        self.key = torch.where(finite, keys(self.x, self.dtype), torch.iinfo(torch.int64).min)
        e32 = torch.where(finite, torch.exp((self.x - x_max) / self.temperature), 0.0)
        self.e = e32.double()
        self.c = torch.where(finite, ONE_BITS - e32.view(torch.int32).long(), NOT_FINITE)


@dataclass
class Window:
    """The tokens whose code lies in [lo, hi]: the weight's code `Row.c` (by_weight), else
    minus the ordered key. Either code rises along SPEC.md's order (ties aside), so a window
    is a stretch of the order, and the tokens above it are those of lower code."""
    by_weight: bool
    lo: int
    hi: int

    def code(self, row: Row) -> torch.Tensor:
        return row.c if self.by_weight else torch.where(row.c < NOT_FINITE, -row.key, NOT_FINITE)

    def holds(self, row: Row) -> torch.Tensor:
        code = self.code(row)
        return (code >= self.lo) & (code <= self.hi) & (row.c < NOT_FINITE)

    def above(self, row: Row) -> torch.Tensor:
        return self.code(row) < self.lo


def _weight_of_code(row: Row, code: int, by_weight: bool) -> float:
    if by_weight:
        bits = max(ONE_BITS - code, 0)
        return torch.tensor([bits], dtype=torch.int32).view(torch.float32).item()
    return math.exp((value_of_key(-code, row.dtype) - row.x_max) / row.temperature)


def _bins(row: Row, w: Window, nb: int):
    """A histogram pass over window w: (bin of each token, -1 outside; each bin's [lo, hi]
    codes; weight bounds per bin: exact for weight codes, float32 rounding margins for keys)."""
    shift = max(0, math.ceil(math.log2((w.hi - w.lo + 1) / nb)))
    b = torch.where(w.holds(row), (w.code(row) - w.lo) >> shift, -1)
    edges = [(w.lo + (i << shift), min(w.lo + ((i + 1) << shift) - 1, w.hi)) for i in range(nb)]
    margin = 0.0 if w.by_weight else MARGIN
    e_hi = torch.tensor([_weight_of_code(row, a, w.by_weight) for a, _ in edges], dtype=torch.float64)
    e_lo = torch.tensor([_weight_of_code(row, z, w.by_weight) for _, z in edges], dtype=torch.float64)
    return b, edges, e_lo * (1 - margin), e_hi * (1 + margin)


def find_cut(row: Row, among: torch.Tensor, goal: float, by_mass: bool, nb: int, list_size: int, stats: dict):
    """The key of the token where the prefix count (>= goal) or mass (the last token whose
    mass before it is < goal) of the order, restricted to `among`, ends, and whether its
    list held the whole prefix (a top-p cut inside it needs no pass). Counts each pass.
    (The mass of `among` is known exactly: S from the first pass, S_k from top-k's list.)"""
    total = float(row.e[among].sum())
    lo_cut, hi_cut = 0, ONE_BITS  # codes known to hold the cut: they only narrow
    w = Window(True, 0, FIRST_OCTAVES * OCTAVE - 1)
    size = int(among.sum())
    for _ in range(ROUNDS_CAP):
        above = w.above(row) & among
        inside = w.holds(row) & among
        below = among & ~above & ~inside
        n_above, m_above = int(above.sum()), float(row.e[above].sum())  # exact, from this pass
        prefix = n_above + int(inside.sum())
        stats["passes"] += 1
        if (m_above >= goal and n_above > 0) if by_mass else n_above >= goal:  # the cut lies above the window
            stats["alu"] += HIST_OPS
            hi_cut = w.lo - 1
            w = Window(w.by_weight, lo_cut, hi_cut)
            continue
        single = bool(inside.any()) and int(row.key[inside].max()) == int(row.key[inside].min())
        if size <= list_size or prefix <= list_size or single:  # this pass stores the list (or none: ties)
            stats["alu"] += LIST_OPS
            if single and prefix > list_size:  # one key: its ties share one weight, no list
                kept_all = (m_above + (prefix - n_above) * float(row.e[inside][0]) < goal) if by_mass else prefix < goal
                if kept_all and bool(below.any()):  # the cut lies below the window
                    lo_cut = w.hi + 1
                    w = Window(w.by_weight, lo_cut, hi_cut)
                    continue
                return int(row.key[inside][0]), False
            listed = (above | inside) if prefix <= list_size else inside
            stats["list"] = max(stats["list"], int(listed.sum()))
            count, mass = (0, 0.0) if prefix <= list_size else (n_above, m_above)
            last = None
            for i in sorted(listed.nonzero().flatten().tolist(), key=lambda i: (-int(row.key[i]), i)):
                if (mass >= goal and count > 0) if by_mass else count >= goal:  # not kept: the cut is before it
                    break
                count, mass, last = count + 1, mass + float(row.e[i]), int(row.key[i])
            else:  # every listed token kept: the cut lies below the list if a token below it is kept too
                if (count < goal if not by_mass else mass < goal) and bool(below.any()):
                    lo_cut = w.hi + 1
                    w = Window(w.by_weight, lo_cut, hi_cut)
                    continue
            return last, prefix <= list_size
        stats["alu"] += HIST_OPS
        b, edges, e_lo, e_hi = _bins(row, w, nb)
        counts = torch.bincount(b[inside], minlength=nb).double()
        if by_mass:  # prefix mass through bin j: bounds (the mass above the window is exact); at least the
            # total less what the later bins and the tokens below the window can hold at most
            most_below = (size - prefix) * _weight_of_code(row, w.hi + 1, w.by_weight)
            later_most = torch.cumsum((counts * e_hi).flip(0), 0).flip(0) - counts * e_hi
            least = torch.maximum(m_above + torch.cumsum(counts * e_lo, 0),
                                  total - later_most - most_below * (1 + MARGIN))
            reach = (m_above + torch.cumsum(counts * e_hi, 0) >= goal).nonzero().flatten()
            sure = (least >= goal).nonzero().flatten()
        else:
            reach = sure = (n_above + torch.cumsum(counts, 0) >= goal).nonzero().flatten()
        if len(reach) == 0:  # the cut lies below the window
            lo_cut = w.hi + 1
            w = Window(w.by_weight, lo_cut, hi_cut)
            continue
        first = int(reach[0])
        lo_cut = max(lo_cut, edges[first][0])
        if len(sure):
            hi_cut = min(hi_cut, edges[int(sure[0])][1])
        if w.by_weight and lo_cut == hi_cut:  # one weight, several keys (T so large that weights round alike)
            chosen = among & (row.c == lo_cut)
            lo_cut, hi_cut = -int(row.key[chosen].max()), -int(row.key[chosen].min())
            w = Window(False, lo_cut, hi_cut)
        elif (lo_cut, hi_cut) == (w.lo, w.hi):  # no bound narrows it: try the first bin that can hold the cut
            w = Window(w.by_weight, lo_cut, edges[first][1])
        else:
            w = Window(w.by_weight, lo_cut, hi_cut)
    raise AssertionError(f"no cut after {ROUNDS_CAP} passes: the windows do not narrow")


def simulate(x: torch.Tensor, dtype, temperature, top_k, top_p, nb: int, list_size: int):
    """(cut_k or None, cut_p or None, stats) of one sanitized row."""
    row = Row(x, dtype, temperature)
    finite = row.c < NOT_FINITE
    n = int(finite.sum())
    stats = {"passes": 0, "alu": 0.0, "list": 0}
    cut_k = None
    kept = finite
    listed = False
    if 0 < top_k < n:
        cut_k, listed = find_cut(row, finite, top_k, False, nb, list_size, stats)
        above = row.key > cut_k
        tie = ((row.key == cut_k) & finite).nonzero().flatten()[:top_k - int((above & finite).sum())]
        kept = above & finite
        kept[tie] = True
    cut_p = None
    if top_p < 1.0:  # (from the top-k search's list when it held the whole top-k set: no pass)
        into = {"passes": 0, "alu": 0.0, "list": 0} if listed else stats
        cut_p, _ = find_cut(row, kept, top_p * float(row.e[kept].sum()), True, nb, list_size, into)
    if cut_k is not None or cut_p is not None:
        stats["passes"] += 1  # step 7, with the exact cuts
        stats["alu"] += SEARCH_OPS
    return cut_k, cut_p, stats


def main(argv=None) -> int:
    ap = cells_parser(__doc__)
    ap.add_argument("--bins", type=int, default=30, help="window bins per histogram pass")
    args = ap.parse_args(argv)
    print(f"V = {args.vocab}, {args.rows} rows per cell, {args.bins} bins a pass, list {args.list}; passes "
          "after the first: mean / max; the largest list; ALU ops per logit over them: max")
    cells = checked_cells(args, lambda x, *rule: simulate(x, *rule, args.bins, args.list))
    return worst_rows(cells, {"passes": (passes, mean_max), "list": (largest("list"), str),
                              "ALU / logit": (largest("alu"), "{:.0f}".format)})


if __name__ == "__main__":
    sys.exit(main())
