"""bench_verify.py --kinds (issue #25's worst-case table) end to end on the CPU, with the
timing replaced by a stand-in (the benchmark itself needs a GPU): every row kind is timed
under every mode, the table has a cell per (mode, kind), and the worst cases are set
against the targets. A crash here would otherwise cost a GPU call."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_verify  # noqa: E402

from dflash_et.export import cases  # noqa: E402


def _on_the_cpu(monkeypatch, fake_graph_ms):
    """The benchmark's tables at 2 owners x 16 rows of V = 64 on the CPU, timed by fake_graph_ms."""
    monkeypatch.setattr(bench_verify, "DEVICE", "cpu")
    monkeypatch.setattr(bench_verify, "KINDS_SHAPE", (2, 64))
    monkeypatch.setattr(bench_verify, "ROTATE_BYTES", 0)
    monkeypatch.setattr(bench_verify, "graph_ms", fake_graph_ms)


def test_kinds_table_times_every_kind_under_every_mode(monkeypatch):
    timed, made = [], []
    real_kind_logits = cases.kind_logits

    def kind_logits(g, kind, *args):
        made.append(kind)
        return real_kind_logits(g, kind, *args)

    def fake_graph_ms(fn, argsets):  # 1 ms, 3 ms for top-p 0.99 on flat rows: the worst case
        params = (argsets[0][4].tolist(), argsets[0][6].tolist()) if len(argsets[0]) == 8 else ()  # (T, top_p)
        timed.append((fn, argsets[0][0].shape, *params))
        slow = made[-1] == "flat" and fn is torch.ops.dflash.dflash_verify and bool((argsets[0][6] == 0.99).all())
        return 3.0 if slow else 1.0

    monkeypatch.setattr(cases, "kind_logits", kind_logits)
    _on_the_cpu(monkeypatch, fake_graph_ms)
    lines = []
    bench_verify.kinds_table(lambda text="": lines.append(text), bw=64 * 32 * 2 / 1e-3, dtypes=[torch.bfloat16])  # floor: 1 ms
    modes, kinds = cases.kind_modes(64), list(cases.ROW_KINDS)
    verify = [t for t in timed if t[0] is torch.ops.dflash.dflash_verify]
    assert [n for n in bench_verify.MIXED if n < 2] == [1]  # (2 owners here: one mixed batch, 1 sampling owner)
    assert len(verify) == (len(modes) + 1) * len(kinds) and all(t[1] == (32, 64) for t in verify)
    # the mixed batch: owner 0 at T 1 and top-p 0.95, owner 1 greedy
    assert all(t[2:] == ([1.0, 0.0], pytest.approx([0.95, 1.0])) for t in verify[-len(kinds):])
    row = [x for x in lines if x.startswith("| mixed: 1 of 2 owners top-p 0.95 |")]
    assert len(row) == 1 and row[0].count(" 1.00 ") == len(kinds) + 1, row
    table = [x for x in lines if x.startswith("| top-p 0.99 |")][0]
    assert table.endswith("| 3.00 (flat) |"), table
    worst = {x.split(" | ")[0]: x for x in lines if x.startswith("| dflash_verify") or x.startswith("| sample_rows")}
    assert worst["| dflash_verify bfloat16, every mode"].endswith("| 3.00x | top-p 0.99, flat | <= 4.0x met |")
    assert worst["| dflash_verify bfloat16, greedy"].endswith("| 1.00x | greedy, peaked | <= 1.15x met |")
    assert worst["| sample_rows bfloat16 (x one amax read)"].endswith("| <= 2.0x met |")


def test_kinds_table_breaks_down_each_modes_worst_cell(monkeypatch):
    """--breakdown: dflash_verify's worst cell per mode, then sample_rows' (their own worst kinds)."""
    def fake_graph_ms(fn, argsets):  # top-p 0.99 the slowest of its mode: power-law rows, sample_rows' on ties
        if fn is torch.ops.dflash.sample_rows:
            return 2.0 if made[-1] == "ties" and bool((argsets[0][4] == 0.99).all()) else 1.0
        verify = fn is torch.ops.dflash.dflash_verify
        return 2.0 if verify and made[-1] == "power-law" and bool((argsets[0][6] == 0.99).all()) else 1.0

    made, broken_down, sampled = [], [], []
    real_kind_logits = cases.kind_logits

    def kind_logits(g, kind, *args):
        made.append(kind)
        return real_kind_logits(g, kind, *args)

    def fake_breakdown(fn, argsets):
        if fn is torch.ops.dflash.sample_rows:  # (logits, position, temperature, top_k, top_p, seed)
            sampled.append((made[-1], round(float(argsets[0][4][0]), 4)))
            return [("sample_rows_kernel rows", 7.5)]
        broken_down.append((made[-1], round(float(argsets[0][6][0]), 4)))
        return [("verify_filtered_kernel", 12.5), ("verify_rows_kernel", 3.0)]

    monkeypatch.setattr(cases, "kind_logits", kind_logits)
    _on_the_cpu(monkeypatch, fake_graph_ms)
    monkeypatch.setattr(bench_verify, "breakdown", fake_breakdown)
    lines = []
    bench_verify.kinds_table(lambda text="": lines.append(text), bw=64 * 32 * 2 / 1e-3, dtypes=[torch.bfloat16],
                             per_kernel=True)
    assert len(broken_down) == len(sampled) == len(cases.kind_modes(64))  # one cell a mode: its worst kind
    assert ("power-law", 0.99) in broken_down and ("ties", 0.99) in sampled
    assert "- top-p 0.99, power-law: verify_filtered_kernel 12.5, verify_rows_kernel 3.0" in lines
    heading = [i for i, x in enumerate(lines) if x.startswith("Per-kernel CUDA time") and "sample_rows" in x]
    assert len(heading) == 1 and lines.index("- top-p 0.99, ties: sample_rows_kernel rows 7.5") > heading[0]


def test_breakdown_tells_apart_the_launches_of_one_kernel_by_their_order():
    """`by_launch`: two calls of dflash_verify's nine launches (events out of order): each launch of
    verify_filtered_kernel under its stage, verify_rows_kernel's two apart, accept alone; a kernel
    whose count does not divide by the calls keeps its name with its launches summed."""
    launches = [("verify_rows_kernel", 10.0), ("verify_rows_kernel", 2.0), ("verify_filtered_kernel", 1.0),
                ("verify_filtered_kernel", 40.0), ("verify_filtered_kernel", 20.0), ("verify_filtered_kernel", 8.0),
                ("verify_filtered_kernel", 6.0), ("verify_filtered_kernel", 3.0), ("verify_accept_kernel", 0.5)]
    events = [(name, call * 100.0 + i, us * (call + 1)) for call in range(2) for i, (name, us) in enumerate(launches)]
    events.append(("memcpy", 150.0, 6.0))
    got = dict(bench_verify.by_launch(events[::-1], calls=2))
    assert got == {"verify_rows_kernel rows": 15.0, "verify_rows_kernel filtered rows": 3.0,
                   "verify_filtered_kernel select begin": 1.5, "verify_filtered_kernel select pass": 60.0,
                   "verify_filtered_kernel select rounds": 30.0, "verify_filtered_kernel select pass 2": 12.0,
                   "verify_filtered_kernel select rounds 2": 9.0, "verify_filtered_kernel select search": 4.5,
                   "verify_accept_kernel": 0.75, "memcpy": 3.0}
    assert bench_verify.by_launch([("k", 0.0, 1.0), ("k", 1.0, 2.0), ("k", 2.0, 4.0), ("k", 3.0, 8.0)], 2) == [
        ("k #2", 5.0), ("k #1", 2.5)]


def test_empty_launches_drops_each_launch_with_nothing_to_do_and_no_token_changes(monkeypatch):
    """bench_verify.py --empty-launches on the CPU (timing replaced): each variant drops exactly the
    launches it names, the rest run, and the all-greedy call's tokens are the same without them (the
    launches had nothing to do); the table has a row per variant and the two references."""
    from dflash_et.kernels import verify

    launched, results = [], {}
    real_wrap = verify.wrap_triton

    def counting(kernel, options):  # (under the benchmark's patch: records the launches it lets through)
        launched[-1].append((kernel.__name__, options.get("FILTERED"), options.get("STAGE")))
        return options

    def fake_graph_ms(fn, argsets):
        launched.append([])
        out = fn(*argsets[0])
        results[len(launched)] = [t.tolist() for t in out] if isinstance(out, tuple) else out.tolist()
        return 1.0

    counted = bench_verify.launcher_with(real_wrap, counting)
    monkeypatch.setattr(verify, "wrap_triton", counted)
    _on_the_cpu(monkeypatch, fake_graph_ms)
    lines = []
    got = bench_verify.empty_launches(lambda text="": lines.append(text), bw=64 * 32 * 2 / 1e-3)  # floor: 1 ms
    assert verify.wrap_triton is counted  # (restored)
    every = {("verify_rows_kernel", False, None), ("verify_rows_kernel", True, None),
             ("verify_accept_kernel", None, None), *(("verify_filtered_kernel", None, s) for s in range(4))}
    assert set(launched[0]) == every and len(launched[0]) == 9  # (the select's pass and rounds twice)
    for name, words in bench_verify.LAUNCH_STAGES.items():  # (the breakdown's labels: one a launch)
        if name.startswith("verify"):
            assert sum(k == name for k, _, _ in launched[0]) == len(words), name
    dropped = [every - set(calls) for calls in launched[1:8]]
    assert dropped == [{("verify_rows_kernel", True, None)}, *({("verify_filtered_kernel", None, s)} for s in
                                                                (0, 2, 1, 3)),
                       {("verify_filtered_kernel", None, s) for s in range(4)},
                       {("verify_rows_kernel", True, None), *(("verify_filtered_kernel", None, s) for s in range(4))}]
    assert all(results[i] == results[1] for i in range(2, 9))  # (the same accepted counts and tokens)
    assert list(got) == ["every launch", "without the FILTERED row launch", "without the select's begin",
                         "without the select's pass", "without the select's rounds", "without the select's search",
                         "without the select's six", "without all seven", "dflash_verify_argmax",
                         "one torch.amax read"]
    assert [x for x in lines if x.startswith("| without all seven |")] == ["| without all seven | 1000.0 | 1.00 |"]


def test_accepted_drafts_are_the_targets_own_tokens():
    """--drafts accepted: each row's draft is the target's token there, so every owner accepts
    all its drafts (no row is moot: the case that makes the select decide every row)."""
    g = torch.Generator().manual_seed(3)
    x = cases.kind_logits(g, "flat", 2 * bench_verify.ROWS_PER_OWNER, 64, torch.float32)
    inp = bench_verify.verify_inputs(g, x, 2, (1.0, 0, 0.9), drafts="accepted")
    accepted, _ = torch.ops.dflash.dflash_verify(*[inp[k] for k in bench_verify.KEYS])
    assert accepted.tolist() == [bench_verify.ROWS_PER_OWNER - 1] * 2
    argmax = bench_verify.verify_inputs(g, x, 2, (1.0, 0, 0.9))
    assert not torch.equal(argmax["tokens"], inp["tokens"])  # (flat rows: the argmax is seldom the sample)
    with pytest.raises(ValueError, match="drafts 'own'"):
        bench_verify.verify_inputs(g, x, 2, (1.0, 0, 0.9), drafts="own")
