"""Benchmark the verify heads on a CUDA GPU (not a test).

One run measures the copy-bandwidth floor, then times (median, CUDA events via
triton.testing.do_bench) each head at owners {1, 8, 64} x 16 rows, V in
{151936, 202048}, bfloat16 and float32, modes {greedy, temperature 0.8, + top-k 50,
+ top-p 0.9, top-k 50 + top-p 0.9}, against the eager PyTorch reference
(export/heads.py), a sort-based PyTorch pipeline (what a user would write) and
their torch.compile versions. Prints a markdown table and writes it to --out.

    python benchmarks/bench_verify.py --out benchmarks/RESULTS.md [--quick] [--breakdown]
    python benchmarks/bench_verify.py --kinds [--quick] --out kinds.md   (scripts/gpu-checks.sh bench --kinds)

--kinds times issue #25's table instead: dflash_verify at 64 owners x 16 rows, V = 151936,
on every row kind of `export/cases.py` (LLM-like, power-law, flat, equal, ties, NaN / -inf)
under every mode (temperature 0.7-1.5, top-p 0.9-0.99, top-k 1 to V, top-k + top-p, greedy),
x floor, the worst kind per mode; sample_rows on 64 rows of each against one torch.amax read;
the worst cases against the issue's targets (--quick: bfloat16 only). --drafts accepted: every
draft the target's own token (no moot rows: the select decides every top-k / top-p row).

Fused times are CUDA-graph replays (`graph_ms`: no Python launch overhead, as a runtime
launches them); the baselines are timed as called from Python (0.3 ms and up: the
overhead is a small part of them). Floor: one read of the logits at the measured device-to-device
copy bandwidth (bytes read + written over time). Each case rotates among >= 4 distinct
inputs (rows that are rare but slow count at their rate), more for inputs smaller than ~4x
the L2, so that the timings measure HBM, not the cache. --breakdown adds
each fused op's per-kernel times (torch.profiler, over the same rotating inputs) at 64 owners,
V = 151936; --per-input times each rotating input of the headline sampling cases alone (a
launch waits for its slowest row: which input holds it). --once MODE only calls the op on
that case (a target for ncu / nsys). --empty-launches times an all-greedy dflash_verify call with
each launch that has nothing to do in it dropped in turn (`empty_launches`).
"""

import argparse
import itertools
import math
import platform
import sys
import time

import torch
import triton
from triton.testing import do_bench

from dflash_et import kernels  # noqa: F401  (registers torch.ops.dflash)
from dflash_et.export import cases, heads, rng
from roofline import copy_bandwidth  # (benchmarks/, beside this script)

MODES = {  # name -> (temperature, top_k, top_p)
    "greedy": (0.0, 0, 1.0),
    "temp 0.8": (0.8, 0, 1.0),
    "+top-k 50": (0.8, 50, 1.0),
    "+top-p 0.9": (0.8, 0, 0.9),
    "top-k 50 + top-p 0.9": (0.8, 50, 0.9),
}
ROWS_PER_OWNER = 16
ROTATE_BYTES = 256 << 20
MIN_COPIES = 4  # distinct inputs per case at least: 4096 rows at 64 x 16, so that a rare row (a top-p nucleus
# of ~1400 tokens, ~1 in 2048 of these rows) weighs in as often as it comes, not as one input's luck


def realistic_logits(g, rows, vocab, dtype):
    """LLM-like rows: a Gaussian body plus a few dozen strongly preferred tokens."""
    x = torch.randn(rows, vocab, generator=g, device="cuda") * 2.0
    head = torch.randint(0, vocab, (rows, 24), generator=g, device="cuda")
    boost = 6.0 + 8.0 * torch.rand(rows, 24, generator=g, device="cuda")
    x.scatter_add_(1, head, boost)
    return x.to(dtype)


def make_inputs(g, owners, vocab, dtype, mode, flat=False):
    rows = owners * ROWS_PER_OWNER
    x = (torch.randn(rows, vocab, generator=g, device="cuda") * 1.0).to(dtype) if flat else \
        realistic_logits(g, rows, vocab, dtype)
    return verify_inputs(g, x, owners, MODES[mode])


def verify_inputs(g, x, owners, params, drafts="argmax"):
    """dflash_verify's inputs on logits `x` of `owners` owners of equal row counts, every
    owner with `params` (temperature, top_k, top_p). drafts 'argmax': each row's argmax is the
    next row's draft (right for greedy owners, often right for sampling ones on peaked rows,
    seldom on wide ones: an owner's rows after its first miss are moot); 'accepted': each
    row's draft is the target's own token there (`sample_rows`: every draft accepted, every
    row decided: the most work a call can hold)."""
    t, k, p = params
    device = x.device
    draft = x.float().nan_to_num(nan=float("-inf")).argmax(-1)
    inp = {
        "logits": x, "tokens": torch.cat([torch.zeros(1, dtype=torch.int64, device=device), draft[:-1]]),
        "offsets": torch.arange(owners + 1, device=device) * (x.shape[0] // owners),
        "start_position": torch.randint(0, 4096, (owners,), generator=g, device=device),
        "temperature": torch.full((owners,), t, device=device),
        "top_k": torch.full((owners,), k, dtype=torch.int64, device=device),
        "top_p": torch.full((owners,), p, device=device),
        "seed": torch.arange(owners, device=device) + 1234,
    }
    if drafts == "accepted":
        owner, j, _ = owner_rows(inp["offsets"], x.shape[0])
        own = torch.ops.dflash.sample_rows(x, inp["start_position"][owner] + j + 1, inp["temperature"][owner],
                                           inp["top_k"][owner], inp["top_p"][owner], inp["seed"][owner])
        inp["tokens"] = torch.cat([inp["tokens"][:1], own[:-1]])
    elif drafts != "argmax":
        raise ValueError(f"drafts {drafts!r}: use 'argmax' or 'accepted'")
    return inp


KEYS = cases.VERIFY_INPUTS


def owner_rows(offsets, num_rows):
    """Each row's owner and index j in it, and each owner's row count n, from `offsets`."""
    n = offsets[1:] - offsets[:-1]
    owner = torch.repeat_interleave(torch.arange(n.numel(), device=offsets.device), n, output_size=num_rows)
    return owner, torch.arange(num_rows, device=offsets.device) - offsets[:-1][owner], n


def sort_pipeline(logits, tokens, offsets, start_position, temperature, top_k, top_p, seed):
    """What a user would write: sort, mask top-k / top-p, softmax, inverse CDF, compare."""
    num_rows, vocab = logits.shape
    owner, j, n = owner_rows(offsets, num_rows)
    temp, k, p = temperature[owner], top_k[owner], top_p[owner]
    x = logits.float() / temp.clamp_min(1e-5).unsqueeze(1)
    values, index = x.sort(dim=-1, descending=True)
    ranks = torch.arange(vocab, device=logits.device)
    values = values.masked_fill((k.unsqueeze(1) > 0) & (ranks >= k.unsqueeze(1)), float("-inf"))
    probs = values.softmax(-1)
    before = probs.cumsum(-1) - probs
    probs = probs.masked_fill((before >= p.unsqueeze(1)) & (ranks > 0), 0.0)
    cdf = probs.cumsum(-1)
    u = rng.uniform(seed[owner], start_position[owner] + j + 1, rng.SAMPLE).unsqueeze(1) * cdf[:, -1:]
    pick = torch.searchsorted(cdf, u).clamp_max(vocab - 1)
    y = index.gather(1, pick).squeeze(1)
    y = torch.where(temp > 0, y, logits.argmax(-1))
    return _accept(y, tokens, offsets, owner, j, n)


def argmax_pipeline(logits, tokens, offsets, *unused):
    owner, j, n = owner_rows(offsets, logits.shape[0])
    return _accept(logits.argmax(-1), tokens, offsets, owner, j, n)


def _accept(y, tokens, offsets, owner, j, n):
    num_rows = y.shape[0]
    draft = torch.roll(tokens, -1)
    miss = (y != draft) | (j >= n[owner] - 1)
    first = torch.full_like(n, num_rows).scatter_reduce(0, owner, torch.where(miss, j, num_rows), "amin")
    return first, y[offsets[:-1] + first]


def rotating(fn, copies):
    state = itertools.cycle(copies)
    return lambda: fn(*next(state))


def time_ms(fn) -> float:
    return do_bench(fn, warmup=25, rep=100, return_mode="median")


GRAPH_CALLS = 4  # calls per captured graph at least


def graph_ms(fn, argsets) -> float:
    """GPU time of one call, launched as a runtime does (AOTInductor / ExecuTorch's CUDA
    delegate launch from C++, or a captured CUDA graph): one graph holds a call on each
    rotating input, GRAPH_CALLS calls at least (cycling the inputs; a 311 MB input is too
    large for the L2 to keep any of it), so that the graph's own launch (~5 us, measured
    on the H200: one call per graph timed greedy at 100.3 us, two at 94.3 us) is shared
    as in a runtime's step, which holds many kernels; its replay's median time over the
    number of calls. Python launch overhead (~10-40 us per op) is not in it; small cases
    would otherwise measure that."""
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for a in argsets:  # warm-up outside the graph (Triton compiles, caches fill)
            fn(*a)
    torch.cuda.current_stream().wait_stream(side)
    calls = [argsets[i % len(argsets)] for i in range(max(GRAPH_CALLS, len(argsets)))]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for a in calls:
            fn(*a)
    return do_bench(graph.replay, warmup=25, rep=100, return_mode="median") / len(calls)


# A kernel launched several times a call, by its place among them (the launch order of `kernels/verify.py`
# and `kernels/sample_rows.py`): its launches share one name, so the profiler alone would lump them.
SELECT_STAGES = ("select pass", "select rounds", "select pass 2", "select rounds 2", "select search")  # (session 70:
# the pass and rounds twice, the second rounds reading any further pass itself)
LAUNCH_STAGES = {"verify_rows_kernel": ("rows", "filtered rows"),
                 "verify_filtered_kernel": ("select begin", *SELECT_STAGES),
                 "sample_rows_kernel": ("rows", "filtered rows"),
                 "sample_select_kernel": SELECT_STAGES}


def by_launch(kernels: list[tuple[str, float, float]], calls: int) -> list[tuple[str, float]]:
    """(launch, us per call), slowest first, from (kernel name, start, us) events of `calls` calls that
    each make the same launches in the same order: a kernel launched n times a call is told apart by
    its place among them (`LAUNCH_STAGES`' words where it names n, else "#i"); a kernel whose count
    is not a multiple of the calls keeps its name alone (its launches summed)."""
    counts: dict[str, int] = {}
    for name, _, _ in kernels:
        counts[name] = counts.get(name, 0) + 1
    seen: dict[str, int] = {}
    totals: dict[str, float] = {}
    for name, _, us in sorted(kernels, key=lambda k: k[1]):
        per_call = counts[name] // calls if counts[name] % calls == 0 else 1
        place = seen.get(name, 0) % per_call
        seen[name] = seen.get(name, 0) + 1
        words = LAUNCH_STAGES.get(name, ())
        label = (name if per_call == 1 else f"{name} {words[place]}" if len(words) == per_call
                 else f"{name} #{place + 1}")
        totals[label] = totals.get(label, 0.0) + us
    return sorted(((label, us / calls) for label, us in totals.items()), key=lambda r: -r[1])


def breakdown(fn, argsets, rounds: int = 4) -> list[tuple[str, float]]:
    """(launch, us per call) of the fused op's launches, from the CUDA profiler, over every
    rotating input (a rare slow row counts as often as in the timed graph); the launches of one
    kernel told apart by their order (`by_launch`)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    for a in argsets:
        fn(*a)
    torch.cuda.synchronize()
    calls = rounds * len(argsets)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(rounds):
            for a in argsets:
                fn(*a)
        torch.cuda.synchronize()
    kernels = [(e.name, e.time_range.start, e.self_device_time_total) for e in prof.events()
               if e.device_type == DeviceType.CUDA and e.self_device_time_total > 0]
    return by_launch(kernels, calls)


def fused_op(mode: str):
    """The fused head a mode times: the argmax op for greedy, else dflash_verify (same arguments)."""
    if mode == "greedy":
        return lambda *a: torch.ops.dflash.dflash_verify_argmax(*a[:3])
    return torch.ops.dflash.dflash_verify


KINDS_SHAPE = (64, 151936)  # owners (of ROWS_PER_OWNER rows), V: issue #25's shape
DEVICE = "cuda"  # (tests/benchmarks runs the table's plumbing on the CPU)
TARGETS = {"bf16": 4.0, "fp32": 5.0, "greedy": 1.15, "temperature": 1.5, "sample_rows": 2.0}  # issue #25
MIXED = (1, 8)  # a mixed batch's sampling owners (T 1, top-p 0.95: a common production setting), the rest greedy


def mixed(c: dict, n: int) -> dict:
    """`c`, greedy owners' inputs, with its first n owners sampling at T 1 with top-p 0.95 (a mixed batch)."""
    c["temperature"][:n], c["top_p"][:n] = 1.0, 0.95
    return c


def kinds_table(say, bw: float, dtypes, per_kernel: bool = False, drafts: str = "argmax") -> None:
    """dflash_verify at 64 owners x 16 rows, V = 151936, on every row kind of `cases.ROW_KINDS`
    under every mode of `cases.kind_modes` (every owner of a case in that mode; greedy too
    through dflash_verify, as a mixed batch runs it), and in mixed batches (MIXED: the first
    few owners top-p 0.95, the others greedy): x floor per cell, the worst kind per mode; then
    sample_rows on 64 rows of each kind against one torch.amax read of the same rows; then the
    worst cases against issue #25's targets. per_kernel (--breakdown): each mode's worst cell's
    launches timed one by one (torch.profiler), after each table (sample_rows' too). drafts:
    `verify_inputs`' (sample_rows has none)."""
    owners, vocab = KINDS_SHAPE
    rows = owners * ROWS_PER_OWNER
    modes = cases.kind_modes(vocab)
    kinds = list(cases.ROW_KINDS)
    g = torch.Generator(device=DEVICE).manual_seed(25)
    worst = {}  # (what, dtype) -> (x, mode, kind)

    def note(key, x, mode, kind):
        if x > worst.get(key, (0.0,))[0]:
            worst[key] = (x, mode, kind)

    def inputs(kind, n, dtype, mode):  # n rows of `kind`, owners of ROWS_PER_OWNER rows in `mode`
        return verify_inputs(g, cases.kind_logits(g, kind, n, vocab, dtype), n // ROWS_PER_OWNER, modes[mode],
                             drafts)

    for dtype in dtypes:
        name = str(dtype).split(".")[-1]
        nbytes = rows * vocab * dtype.itemsize
        floor_ms = nbytes / bw * 1e3
        copies = max(MIN_COPIES, math.ceil(ROTATE_BYTES / nbytes))
        say()
        say(f"dflash_verify, {owners} x {ROWS_PER_OWNER} rows, V = {vocab}, {name}, drafts {drafts}: x floor "
            f"({floor_ms * 1e3:.0f} us) per row kind")
        say()
        say("| mode | " + " | ".join(kinds) + " | worst |")
        say("|---" * (len(kinds) + 2) + "|")
        slowest = {}  # mode -> its worst kind
        for mode in modes:
            cells = {}
            for kind in kinds:
                argsets = [[c[k] for k in KEYS] for c in (inputs(kind, rows, dtype, mode) for _ in range(copies))]
                cells[kind] = graph_ms(torch.ops.dflash.dflash_verify, argsets) / floor_ms
                del argsets
                note((name, name), cells[kind], mode, kind)  # the worst over every mode
                if mode == "greedy" or mode.startswith("temperature"):
                    note((mode.split()[0], name), cells[kind], mode, kind)
            top = max(cells, key=cells.get)
            say(f"| {mode} | " + " | ".join(f"{cells[k]:.2f}" for k in kinds) + f" | {cells[top]:.2f} ({top}) |")
            slowest[mode] = top
        for n in (n for n in MIXED if n < owners):  # the first n owners sample, the others are greedy
            mode, cells = f"mixed: {n} of {owners} owners top-p 0.95", {}
            for kind in kinds:
                argsets = []
                for _ in range(copies):
                    c = mixed(inputs(kind, rows, dtype, "greedy"), n)
                    argsets.append([c[k] for k in KEYS])
                cells[kind] = graph_ms(torch.ops.dflash.dflash_verify, argsets) / floor_ms
                del argsets
                note((name, name), cells[kind], mode, kind)
            top = max(cells, key=cells.get)
            say(f"| {mode} | " + " | ".join(f"{cells[k]:.2f}" for k in kinds) + f" | {cells[top]:.2f} ({top}) |")
        if per_kernel:
            say()
            say(f"Per-kernel CUDA time of each mode's worst cell, {name} (torch.profiler), us per call:")
            say()
            for mode, kind in slowest.items():
                argsets = [[c[k] for k in KEYS] for c in (inputs(kind, rows, dtype, mode) for _ in range(copies))]
                times = breakdown(torch.ops.dflash.dflash_verify, argsets)
                say(f"- {mode}, {kind}: " + ", ".join(f"{k[:40]} {us:.1f}" for k, us in times))
                del argsets

    say()
    say("sample_rows, 64 rows, V = 151936, bfloat16: time / one torch.amax read of the same rows (graph-captured)")
    say()
    say("| mode | " + " | ".join(kinds) + " | worst |")
    say("|---" * (len(kinds) + 2) + "|")
    def sample_argsets(kind, mode):  # 64 rows of `kind` in `mode`, rotating copies: (logits, sample_rows' argsets)
        n = ROWS_PER_OWNER  # owners of 16 rows: the per-row parameters repeat per owner
        copies = max(MIN_COPIES, ROTATE_BYTES // (64 * vocab * 2))
        made = [inputs(kind, 64, torch.bfloat16, mode) for _ in range(copies)]
        return [c["logits"] for c in made], [
            [c["logits"], c["start_position"].repeat_interleave(n), c["temperature"].repeat_interleave(n),
             c["top_k"].repeat_interleave(n), c["top_p"].repeat_interleave(n), c["seed"].repeat_interleave(n)]
            for c in made]

    amax, slowest = {}, {}
    for mode in modes:
        cells = {}
        for kind in kinds:
            logits, argsets = sample_argsets(kind, mode)
            if kind not in amax:
                amax[kind] = graph_ms(lambda x: torch.amax(x, -1), [[x] for x in logits])
            cells[kind] = graph_ms(torch.ops.dflash.sample_rows, argsets) / amax[kind]
            note(("sample_rows", "bfloat16"), cells[kind], mode, kind)
            del logits, argsets
        top = max(cells, key=cells.get)
        say(f"| {mode} | " + " | ".join(f"{cells[k]:.2f}" for k in kinds) + f" | {cells[top]:.2f} ({top}) |")
        slowest[mode] = top
    if per_kernel:
        say()
        say("Per-kernel CUDA time of each mode's worst cell, sample_rows (torch.profiler), us per call:")
        say()
        for mode, kind in slowest.items():
            times = breakdown(torch.ops.dflash.sample_rows, sample_argsets(kind, mode)[1])
            say(f"- {mode}, {kind}: " + ", ".join(f"{k[:40]} {us:.1f}" for k, us in times))

    say()
    say("Worst cases against issue #25's targets:")
    say()
    say("| what | worst | mode, kind | target |")
    say("|---|---|---|---|")
    for (group, name), (x, mode, kind) in sorted(worst.items()):
        target = TARGETS["bf16" if name == "bfloat16" else "fp32"] if group == name else TARGETS[group]
        what = f"dflash_verify {name}, {'every mode' if group == name else group}"
        if group == "sample_rows":
            what = "sample_rows bfloat16 (x one amax read)"
        say(f"| {what} | {x:.2f}x | {mode}, {kind} | <= {target}x {'met' if x <= target else 'NOT met'} |")


def launcher_with(wrap, edit):
    """A `verify.wrap_triton` over `wrap` whose launches go through edit(kernel, options): the
    launch options to run with, or None to skip the launch (the benchmarks' patched launchers)."""
    def wrapped(kernel):
        grids = wrap(kernel)

        class Grid:
            def __getitem__(self, grid):
                run = grids[grid]

                def call(*args, **options):
                    options = edit(kernel, options)
                    return None if options is None else run(*args, **options)
                return call
        return Grid()
    return wrapped


def empty_launches(say, bw: float) -> dict:
    """An all-greedy dflash_verify call at KINDS_SHAPE (peaked bf16 rows), then the same with the
    launches that have nothing to do in it (the FILTERED row launch, the select's six) dropped
    in turn and all together, by a patched launcher (graph-captured); the argmax op and one
    torch.amax read beside them: what the top-k / top-p path costs a batch without such rows
    (issue #25's greedy target). Returns {case: us}."""
    from dflash_et.kernels import verify
    from dflash_et.kernels.cut_select import SELECT_BEGIN, SELECT_PASS, SELECT_ROUNDS, SELECT_SEARCH

    owners, vocab = KINDS_SHAPE
    rows = owners * ROWS_PER_OWNER
    floor_ms = rows * vocab * 2 / bw * 1e3
    copies = max(MIN_COPIES, math.ceil(ROTATE_BYTES / (rows * vocab * 2)))
    g = torch.Generator(device=DEVICE).manual_seed(57)
    greedy = cases.kind_modes(vocab)["greedy"]
    argsets = [[c[k] for k in KEYS] for c in (verify_inputs(
        g, cases.kind_logits(g, "peaked", rows, vocab, torch.bfloat16), owners, greedy) for _ in range(copies))]

    def stage(value):
        return lambda kernel, options: kernel is verify.verify_filtered_kernel and options.get("STAGE") == value

    def filtered(kernel, options):
        return kernel is verify.verify_rows_kernel and options.get("FILTERED") is True

    drops = {"the FILTERED row launch": filtered, "the select's begin": stage(SELECT_BEGIN.value),
             "the select's pass": stage(SELECT_PASS.value), "the select's rounds": stage(SELECT_ROUNDS.value),
             "the select's search": stage(SELECT_SEARCH.value),
             "the select's six": lambda kernel, options: kernel is verify.verify_filtered_kernel,
             "all seven": lambda kernel, options: filtered(kernel, options) or kernel is verify.verify_filtered_kernel}
    say()
    say(f"dflash_verify on {owners} x {ROWS_PER_OWNER} greedy rows (peaked, V = {vocab}, bfloat16), each launch with "
        f"nothing to do dropped (x floor, {floor_ms * 1e3:.0f} us)")
    say()
    say("| launches | us | x floor |")
    say("|---|---|---|")
    got = {}
    wrap = verify.wrap_triton
    try:
        for name, drop in [("every launch", None), *((f"without {k}", d) for k, d in drops.items())]:
            verify.wrap_triton = wrap if drop is None else launcher_with(
                wrap, lambda kernel, options, drop=drop: None if drop(kernel, options) else options)
            got[name] = graph_ms(torch.ops.dflash.dflash_verify, argsets) * 1e3
    finally:
        verify.wrap_triton = wrap
    got["dflash_verify_argmax"] = graph_ms(lambda *a: torch.ops.dflash.dflash_verify_argmax(*a[:3]), argsets) * 1e3
    got["one torch.amax read"] = graph_ms(lambda *a: torch.amax(a[0], -1), argsets) * 1e3
    for name, us in got.items():
        say(f"| {name} | {us:.1f} | {us / (floor_ms * 1e3):.2f} |")
    return got


def call_once(mode: str, owners: int = 64, flat: bool = False, calls: int = 5) -> int:
    """--once: the headline case of one mode (64 owners x 16 rows, V = 151936, bf16), called
    a few times and nothing else: a target for ncu / nsys."""
    g = torch.Generator(device="cuda").manual_seed(0)
    c = make_inputs(g, owners, 151936, torch.bfloat16, mode, flat=flat)
    op = fused_op(mode)
    for _ in range(calls):
        op(*[c[k] for k in KEYS])
    torch.cuda.synchronize()
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None, help="write the markdown report here")
    ap.add_argument("--quick", action="store_true", help="headline shapes only (64 owners, V=151936)")
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile baselines")
    ap.add_argument("--breakdown", action="store_true",
                    help="per-kernel CUDA times of the fused heads at 64 owners x 16 rows, V=151936 (with --kinds: "
                         "of each mode's worst cell)")
    ap.add_argument("--compile-reference", action="store_true",
                    help="also torch.compile the unrolled reference (slow to compile)")
    ap.add_argument("--once", metavar="MODE", choices=list(MODES),
                    help="only call the op a few times on the headline case of MODE (for ncu / nsys)")
    ap.add_argument("--owners", type=int, default=64, help="--once: owners of 16 rows (default 64)")
    ap.add_argument("--flat", action="store_true", help="--once: flat rows (top-p by the select's passes)")
    ap.add_argument("--fused-only", action="store_true", help="time the fused heads only (no baselines)")
    ap.add_argument("--kinds", action="store_true",
                    help="only the row-kind table (issue #25): dflash_verify and sample_rows on every row kind under "
                         "every mode, the worst case per mode, against the targets")
    ap.add_argument("--dtype", choices=["bfloat16", "float32"], default=None,
                    help="--kinds: this dtype's tables only (default: bfloat16 with --quick, else both)")
    ap.add_argument("--drafts", choices=["argmax", "accepted"], default="argmax",
                    help="--kinds: each row's draft its argmax (default), or the target's own token there (every "
                         "draft accepted: no moot rows)")
    ap.add_argument("--empty-launches", action="store_true",
                    help="only the all-greedy dflash_verify call with each launch that has nothing to do dropped "
                         "in turn (what the top-k / top-p path costs a batch without such rows)")
    ap.add_argument("--per-input", action="store_true",
                    help="also time each rotating input of the headline sampling cases alone, with its per-kernel "
                         "times (a launch waits for its slowest row: which input holds it)")
    args = ap.parse_args(argv)
    assert torch.cuda.is_available(), "the benchmark needs a CUDA GPU"
    if args.once:
        return call_once(args.once, args.owners, args.flat)

    lines = []

    def say(s=""):
        print(s, flush=True)
        lines.append(s)

    props = torch.cuda.get_device_properties(0)
    bw = copy_bandwidth()
    say("# Verify-head benchmark")
    say()
    say(f"- device: {props.name}, {props.multi_processor_count} SMs, {props.total_memory / 2**30:.0f} GiB")
    say(f"- versions: torch {torch.__version__}, triton {triton.__version__}, python {platform.python_version()}")
    say(f"- copy bandwidth (read + write) measured in this run: {bw / 1e12:.2f} TB/s; floor = logits bytes / that")
    say(f"- median of do_bench (warmup 25 ms, rep 100 ms); inputs rotate over >= {ROTATE_BYTES >> 20} MB and "
        f">= {MIN_COPIES} distinct inputs")
    say("- logits: Gaussian body (std 2) plus 24 boosted tokens per row (LLM-like); 'flat' rows: std 1, no boost")
    say("- drafts: each row's argmax (so greedy owners accept all, sampling owners some)" if args.drafts == "argmax"
        else "- drafts (--kinds): the target's own tokens (every draft accepted, every row decided)")
    say()
    say("- fused us: GPU time per call with the launches captured in a CUDA graph (as a runtime drives")
    say(f"  them, no Python launch overhead; >= {GRAPH_CALLS} calls per graph, which shares the graph's own")
    say("  launch among them); launched us: the same op called from Python (do_bench)")
    say()
    if args.empty_launches:
        empty_launches(say, bw)
        if args.out:
            with open(args.out, "w") as fh:
                fh.write("\n".join(lines) + "\n")
        return 0
    if args.kinds:
        dtypes = [getattr(torch, args.dtype)] if args.dtype else [torch.bfloat16] if args.quick else [torch.bfloat16,
                                                                                                      torch.float32]
        kinds_table(say, bw, dtypes, args.breakdown, args.drafts)
        if args.out:
            with open(args.out, "w") as fh:
                fh.write("\n".join(lines) + "\n")
        return 0
    say("| head | owners x rows | V | dtype | mode | fused us | x floor | launched us | sort eager us | "
        "sort compiled us | ref eager us | ref compiled us | vs sort eager | vs best baseline |")
    say("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")

    owner_counts = [64] if args.quick else [1, 8, 64]
    vocabs = [151936] if args.quick else [151936, 202048]
    dtypes = [torch.bfloat16] if args.quick else [torch.bfloat16, torch.float32]
    compiled = {}
    parts = []
    per_input = []
    g = torch.Generator(device="cuda").manual_seed(0)
    for vocab, dtype, owners in itertools.product(vocabs, dtypes, owner_counts):
        rows = owners * ROWS_PER_OWNER
        nbytes = rows * vocab * dtype.itemsize
        floor_ms = nbytes / bw * 1e3
        n_copies = max(MIN_COPIES, math.ceil(ROTATE_BYTES / nbytes))
        for mode in MODES:
            greedy = mode == "greedy"
            copies = [make_inputs(g, owners, vocab, dtype, mode) for _ in range(n_copies)]
            argsets = [[c[k] for k in KEYS] for c in copies]
            fused_fn = fused_op(mode)
            pipe = argmax_pipeline if greedy else sort_pipeline
            ref = (lambda *a: heads.DFlashVerifyArgmax()(*a[:3])) if greedy else heads.DFlashVerify()
            fused = graph_ms(fused_fn, argsets)
            launched = time_ms(rotating(fused_fn, argsets))
            if args.breakdown and owners == 64 and vocab == 151936:
                parts.append((f"{mode}, {str(dtype).split('.')[-1]}", breakdown(fused_fn, argsets)))
            if args.per_input and owners == 64 and vocab == 151936 and dtype == torch.bfloat16 and not greedy:
                for i, a in enumerate(argsets):
                    per_input.append((mode, i, graph_ms(fused_fn, [a]), breakdown(fused_fn, [a], rounds=2)))
            sort_eager = time_ms(rotating(pipe, argsets)) if not args.fused_only else float("nan")
            ref_eager = time_ms(rotating(ref, argsets)) if (owners == 64 or args.quick) and not args.fused_only \
                else float("nan")
            sort_comp = ref_comp = float("nan")
            if not args.no_compile and not args.fused_only:
                key = ("sort", greedy, vocab, dtype, rows)
                if key not in compiled:
                    compiled[key] = torch.compile(pipe, dynamic=False)
                sort_comp = time_ms(rotating(compiled[key], argsets))
                if args.compile_reference and owners == 64 and vocab == 151936 and dtype == torch.bfloat16:
                    rkey = ("ref", greedy)
                    if rkey not in compiled:
                        compiled[rkey] = torch.compile(ref, dynamic=False)
                    t0 = time.time()
                    ref_comp = time_ms(rotating(compiled[rkey], argsets))
                    print(f"  (reference compile + bench {time.time() - t0:.0f}s)", file=sys.stderr)
            best = min((v for v in (sort_eager, sort_comp, ref_eager, ref_comp) if not math.isnan(v)), default=math.nan)
            f = lambda v: "n/a" if math.isnan(v) else f"{v * 1e3:.0f}"
            ratio = lambda base, t: "n/a" if math.isnan(base) else f"{base / t:.1f}x"
            say(f"| dflash_verify{'_argmax' if greedy else ''} | {owners} x {ROWS_PER_OWNER} | {vocab} | "
                f"{str(dtype).split('.')[-1]} | {mode} | {fused * 1e3:.1f} | {fused / floor_ms:.2f} | "
                f"{launched * 1e3:.1f} | {f(sort_eager)} | {f(sort_comp)} | {f(ref_eager)} | {f(ref_comp)} | "
                f"{ratio(sort_eager, fused)} | {ratio(best, fused)} |")

    # sample_rows at 64 rows, and the flat-row stress case of top-p (the select's passes).
    say()
    say("| head | rows | V | dtype | mode | fused us | x floor |")
    say("|---|---|---|---|---|---|---|")
    for vocab in vocabs:
        nbytes = 64 * vocab * 2
        floor_ms = nbytes / bw * 1e3
        n_copies = max(MIN_COPIES, math.ceil(ROTATE_BYTES / nbytes))
        for mode in MODES:
            copies = [make_inputs(g, 4, vocab, torch.bfloat16, mode) for _ in range(n_copies)]
            argsets = [[c["logits"], c["start_position"].repeat_interleave(16), c["temperature"].repeat_interleave(16),
                        c["top_k"].repeat_interleave(16), c["top_p"].repeat_interleave(16),
                        c["seed"].repeat_interleave(16)] for c in copies]
            ms = graph_ms(torch.ops.dflash.sample_rows, argsets)
            if args.breakdown and vocab == 151936:
                parts.append((f"sample_rows 64 rows, {mode}", breakdown(torch.ops.dflash.sample_rows, argsets)))
            say(f"| sample_rows | 64 | {vocab} | bfloat16 | {mode} | {ms * 1e3:.1f} | {ms / floor_ms:.2f} |")
    for mode in ("+top-p 0.9", "top-k 50 + top-p 0.9"):
        vocab, owners = 151936, 64
        nbytes = owners * ROWS_PER_OWNER * vocab * 2
        c = make_inputs(g, owners, vocab, torch.bfloat16, mode, flat=True)
        ms = graph_ms(torch.ops.dflash.dflash_verify, [[c[k] for k in KEYS]])
        say(f"| dflash_verify, flat rows | {owners * ROWS_PER_OWNER} | {vocab} | bfloat16 | {mode} | "
            f"{ms * 1e3:.1f} | {ms / (nbytes / bw * 1e3):.2f} |")

    # What one read of the same logits costs torch's own reduction kernel: the floor a launch
    # of that size reaches in practice (at 64 rows the bandwidth floor is a few us, where the
    # ramp-up and tail of a single launch weigh in).
    say()
    say("One read of the logits by torch (`torch.amax(logits, -1)`, one reduction kernel, graph-captured):")
    say()
    say("| rows | V | dtype | us | x floor |")
    say("|---|---|---|---|---|")
    for vocab, rows in itertools.product(vocabs, (64 * ROWS_PER_OWNER, 64)):
        nbytes = rows * vocab * 2
        n_copies = max(MIN_COPIES, math.ceil(ROTATE_BYTES / nbytes))
        argsets = [[realistic_logits(g, rows, vocab, torch.bfloat16)] for _ in range(n_copies)]
        ms = graph_ms(lambda x: torch.amax(x, -1), argsets)
        say(f"| {rows} | {vocab} | bfloat16 | {ms * 1e3:.1f} | {ms / (nbytes / bw * 1e3):.2f} |")

    if parts:
        say()
        say("Per-kernel CUDA time (torch.profiler), us per call:")
        say()
        say("| case | kernel | us |")
        say("|---|---|---|")
        for case, rows in parts:
            for name, us in rows:
                say(f"| {case} | {name[:60]} | {us:.1f} |")
    if per_input:
        say()
        say("Each rotating input alone (64 x 16, V = 151936 bf16; graph-captured us per call, then per kernel):")
        say()
        say("| mode | input | fused us | per kernel, us |")
        say("|---|---|---|---|")
        for mode, i, ms, rows in per_input:
            say(f"| {mode} | {i} | {ms * 1e3:.1f} | " + ", ".join(f"{name[:40]} {us:.1f}" for name, us in rows) + " |")
    if args.out:
        with open(args.out, "w") as fh:
            fh.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
