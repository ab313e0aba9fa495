"""Where a row's time goes in the sample select (`kernels/cut_select.py`), on the GPU: each step
of its rounds timed per row by the kernel itself (not a test; a diagnostic, as `ncu` stall sampling
is heavy and names SASS lines, not steps).

The script copies the package to a temporary folder and patches the copy (`patch_package`): a
barrier then `clock64` before and after each step of `select_rounds` (the list round, the
thresholds with the sample's gather and the estimate inside, a pass read in the rounds launch, the
narrowing, step 7 from the list, the search start, the folding of a split pass), of the search
launch and of each split pass part, the cycles summed into 15 extra words of each row's stats
(`scratch.STATS` + 15). The barriers and the timers' registers cost a little (the patched rounds
launch keeps a small stack frame); the totals are the steps' own, not the launches' (a launch's
programs run rows side by side). Then it runs `dflash_verify` once on
each case below from the copy (64 owners x 16 rows, V = 151936, bf16) and prints, over the
rows that entered the select, each step's mean and max cycles per row, and the one call's time.

    python benchmarks/select_phases.py [--out PHASES.md]   (scripts/gpu-checks.sh phases)

The patch finds each step by its call's text: a change to those lines makes it fail loudly
(`tests/benchmarks/test_select_phases.py` applies it on the CPU).
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile

STEPS = ("list_round", "thresholds", "sample", "estimate", "inline_pass", "narrow", "index_search", "search_start",
         "fold", "rounds", "begin_total", "rounds_total", "search_total", "pass_total",
         "select_rows")  # (cycles, except the counts: rounds; select_rows: 1 for a row that entered; the
# thresholds' time holds the sample's and the estimate's; begin_total: the rounds of every launch but the last,
# the first rounds launch's too, rounds_total: the last's)
FIRST = 38  # the unpatched scratch's STATS: the words the patch adds start here
COUNTS = ("rounds", "select_rows")
CASES = (("flat", "top-p 0.9"), ("peaked", "top-p 0.9"), ("power-law", "top-p 0.95"), ("flat", "top-k 1000"),
         ("nan/-inf", "top-k 1000 + top-p 0.95"), ("equal", "top-k 40 + top-p 0.9"), ("ties", "top-p 0.99"))

_TIMERS = '''

@triton.jit
def _tick():  # (select_phases.py) the cycle counter, after every thread got here
    tl.debug_barrier()
    return tl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)


@triton.jit
def _add(stats_ptr, w, n):  # (select_phases.py) stats word w += n
    tl.debug_barrier()
    old = tl.load(stats_ptr + w)
    tl.debug_barrier()
    tl.store(stats_ptr + w, old + n)


@triton.jit
def _tock(stats_ptr, w, t0):  # (select_phases.py) stats word w += the cycles since t0
    _add(stats_ptr, w, _tick() - t0)
'''


def _word(step: str) -> int:
    return FIRST + STEPS.index(step)


def _timed(indent: str, call: str, step: str) -> str:
    """`call` (one or more lines, each at `indent`) between a tick and a tock into `step`'s word."""
    return f"{indent}_t = _tick()\n{call}{indent}_tock(stats_ptr, {_word(step)}, _t)\n"


def _edits() -> dict[str, list[tuple[str, str]]]:
    """file -> [(text, replacement)]: each text must occur exactly once."""
    i8, i12, i16, i20 = " " * 8, " " * 12, " " * 16, " " * 20
    i24 = " " * 24
    index = (f"{i24}token = _index_search(list_ptr, tl.load(stats_ptr + S_LIST_N), cut, x_max, scale, u, draft,\n"
             f"{i24}                      LIST)\n")
    list_round = f"{i16}if _list_round(list_ptr, stats_ptr, use_p, top_p, x_max, scale, LIST, KEY_SHIFT):\n"
    thresholds = f"{i16}_thresholds(row_ptr, vocab, list_ptr, stats_ptr, x_max, scale, LIST, KEY_SHIFT)\n"
    estimate = (f"{i16}t = _estimate(list_ptr, pts, n_pts, top, c_top, m_top, bot, c_bot, m_bot, exact, goal, by_mass, "
                f"x_max,\n{i16}              scale, (tl.zeros((), dtype=tl.int64) + vocab).to(tl.float64) / LIST, "
                "LIST, KEY_SHIFT)\n")
    inline_pass = (f"{i20}above_n, above_m, lowest, n_finite, m_finite = _row_pass(\n"
                   f"{i20}    row_ptr, 0, vocab, x_max, scale, stats_ptr, list_ptr, LIST, PASS_LANES, 2, False)\n")
    narrow = f"{i20}_narrow(stats_ptr, above_n, above_m, lowest, n_finite, m_finite, LIST)\n"
    search_start = (f"{i12}_search_start(list_ptr, stats_ptr, parts_ptr, vocab, chunk, cut, x_max, scale, "
                    f"u.to(tl.float64) * s_kept,\n{i12}              LIST)\n")
    fold = f"{i8}_fold_parts(stats_ptr, parts_ptr, vocab, chunk, LIST)\n"
    sample = f"{i12}_store_sample(row_ptr, vocab, list_ptr, LIST)\n"
    anchor = "FLT_MAX_KEY = tl.constexpr(2139095039)  # ordered_key(FLT_MAX): 0x7F7FFFFF\n"
    rounds_start = ("    token = tl.zeros((), dtype=tl.int64) + UNDECIDED\n    tl.debug_barrier()  # (stored by other "
                    "threads)\n    phase = tl.load(stats_ptr + S_PHASE)\n")
    rounds_end = "        tl.store(stats_ptr + S_PHASE, phase)\n    return token\n"
    part_start = "    if (tl.load(stats_ptr + S_PHASE) == PH_PASS) & (c * chunk < vocab):\n        lo = c * chunk\n"
    part_end = "        store_part(part_of(parts_ptr, c), above_n, above_m, lowest, n_finite, m_finite)\n"
    search_begin = "    if tl.load(stats_ptr + S_PHASE) == PH_SEARCH:\n        cut, s_kept, _ = load_cut(stats_ptr)\n"
    search_end = "        tl.store(stats_ptr + S_PHASE, 0)\n    return token\n"
    begin = "    store_goal(stats_ptr, tl.where(use_k, top_k.to(tl.float64), top_p.to(tl.float64) * mass), ~use_k)\n"
    return {
        "kernels/scratch.py": [
            (f"STATS = tl.constexpr({FIRST})", f"STATS = tl.constexpr({FIRST + len(STEPS)})"),
            ('"search_lo", "search_prefix_bits")',
             '"search_lo", "search_prefix_bits", ' + ", ".join(f'"t_{s}"' for s in STEPS) + ")"),
        ],
        "kernels/cut_select.py": [
            (anchor, anchor + _TIMERS),
            (index, _timed(i24, index, "index_search")),
            (estimate, _timed(i16, estimate, "estimate")),
            (list_round, _timed(i16, list_round.replace("if _list_round", "_lr = _list_round").replace("):", ")"),
                                "list_round") + f"{i16}if _lr:\n"),
            (thresholds, _timed(i16, thresholds, "thresholds")),
            (inline_pass, _timed(i20, inline_pass, "inline_pass")),
            (narrow, _timed(i20, narrow, "narrow")),
            (search_start, _timed(i12, search_start, "search_start")),
            (fold, _timed(i8, fold, "fold")),
            (sample, _timed(i12, sample, "sample")),
            (rounds_start, rounds_start.replace("    tl.debug_barrier()",
                                                "    _t_all = _tick()\n    tl.debug_barrier()")),
            (rounds_end, f"{i8}_add(stats_ptr, {_word('rounds')}, rounds)\n" + rounds_end.replace(
                "    return token", f"    _tock(stats_ptr, tl.where(INLINE, {_word('rounds_total')}, "
                                   f"{_word('begin_total')}), _t_all)\n    return token")),
            (part_start, part_start.replace("        lo = c * chunk", "        _t = _tick()\n        lo = c * chunk")),
            (part_end, part_end + f"{i8}tl.atomic_add(stats_ptr + {_word('pass_total')}, _tick() - _t, "
                                  "sem='relaxed')\n"),
            (search_begin, search_begin.replace("        cut, s_kept", "        _t = _tick()\n        cut, s_kept")),
            (search_end, search_end.replace("    return token", f"{i8}_tock(stats_ptr, {_word('search_total')}, _t)\n"
                                                              "    return token")),
            (begin, begin + f"    _add(stats_ptr, {_word('select_rows')}, 1)\n"),
        ],
    }


def patch_package(root: str, dst: str) -> str:
    """A copy of the package at `root` (the repo root: the package maps it to dflash_et) under
    dst/dflash_et, patched to time the select's steps; returns dst. Raises ValueError naming the
    text that is not exactly once in its file (the kernels changed: update `_edits`)."""
    pkg = os.path.join(dst, "dflash_et")
    shutil.copytree(root, pkg, ignore=shutil.ignore_patterns(".git", ".venv", ".whl", ".et-src", "exp", "out", "tests",
                                                             "docs", "examples", "benchmarks", "__pycache__"))
    for rel, edits in _edits().items():
        path = os.path.join(pkg, rel)
        with open(path) as f:
            text = f.read()
        for old, new in edits:
            if text.count(old) != 1:
                raise ValueError(f"select_phases.py: {rel} holds {text.count(old)} copies of {old!r}, not 1: "
                                 "update select_phases._edits to the kernel's current text")
            text = text.replace(old, new)
        with open(path, "w") as f:
            f.write(text)
    return dst


def run_cases(say) -> None:
    """In a process whose dflash_et is the patched copy: each case once, the steps' cycles per select row."""
    import torch

    import bench_verify
    from dflash_et.export import cases
    from dflash_et.kernels import launch, verify
    from dflash_et.kernels.scratch import HOT_WORDS, RESULTS, STAT_NAMES

    vocab, rows = 151936, 1024
    modes = cases.kind_modes(vocab)
    props = torch.cuda.get_device_properties(0)
    say(f"- device: {props.name}, {props.multi_processor_count} SMs; torch {torch.__version__}")
    say(f"- {rows} rows (64 owners x 16), V = {vocab}, bf16; cycles (clock64) per row that entered the select, "
        "mean / max; the call's time from CUDA events (one call, the patched kernels)")
    g = torch.Generator(device="cuda").manual_seed(25)
    first = STAT_NAMES.index(f"t_{STEPS[0]}")
    for kind, mode in CASES:
        x = cases.kind_logits(g, kind, rows, vocab, torch.bfloat16)
        inp = bench_verify.verify_inputs(g, x, rows // 16, modes[mode])
        args = [inp[k] for k in bench_verify.KEYS]
        verify.launch(*args)  # (compiles)
        scratch = launch.scratch_for(x)
        scratch.work.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        verify.launch(*args, scratch=scratch)
        end.record()
        torch.cuda.synchronize()
        at = 2 * scratch.buf + HOT_WORDS.value + RESULTS.value
        words = scratch.work[:, at + first:at + first + len(STEPS)].cpu().double()
        entered = words[:, STEPS.index("select_rows")] > 0
        n = int(entered.sum())
        say()
        say(f"## {kind}, {mode}: {start.elapsed_time(end) * 1e3:.0f} us; {n} rows in the select")
        if n:
            say()
            say("| step | mean | max |")
            say("|---|---|---|")
            mean, top = words[entered].mean(0), words[entered].max(0).values
            for i, step in enumerate(STEPS[:-1]):
                say(f"| {step}{' (count)' if step in COUNTS else ''} | {mean[i]:.0f} | {top[i]:.0f} |")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="also write the report here (markdown)")
    ap.add_argument("--patched", action="store_true", help=argparse.SUPPRESS)  # (the child process)
    args = ap.parse_args(argv)
    if not args.patched:
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        with tempfile.TemporaryDirectory() as tmp:
            patch_package(root, tmp)
            here = os.path.dirname(os.path.abspath(__file__))
            env = {**os.environ, "PYTHONPATH": os.pathsep.join([tmp, here, os.environ.get("PYTHONPATH", "")])}
            cmd = [sys.executable, os.path.abspath(__file__), "--patched"] + (["--out", args.out] if args.out else [])
            return subprocess.run(cmd, env=env).returncode
    lines = []

    def say(text=""):
        print(text, flush=True)
        lines.append(text)

    say("# The sample select's steps per row (benchmarks/select_phases.py)")
    say()
    run_cases(say)
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
