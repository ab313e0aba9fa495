"""The fused Triton kernels against the reference heads (CPU: TRITON_INTERPRET=1).

Token ids must be identical except SPEC.md's legal differences, which `legal.py`
detects independently of both implementations. Small candidate caps and blocks (small
lists) send top-k / top-p rows through the sample select's passes (`kernels/cut_select.py`;
its own tests: test_cut_select.py) on small vocabularies.
"""

import dataclasses
import itertools

import gpu_min_max
import pytest
import torch
from conftest import DEVICE
from kernel_parity import check_samples, check_verify

from dflash_et import kernels  # noqa: F401  (registers torch.ops.dflash)
from dflash_et.export import cases
from dflash_et.export import owners as owners_layout
from dflash_et.kernels import launch
from dflash_et.kernels import sample_rows as sample_rows_kernel
from dflash_et.kernels import scratch as record
from dflash_et.kernels import verify as verify_kernel

VERIFY_KEYS = cases.VERIFY_INPUTS
SAMPLE_KEYS = cases.SAMPLE_INPUTS


def _to(inp):
    return {k: v.to(DEVICE) for k, v in inp.items()}


# (vocab, candidate cap, filtered block): small caps and blocks make the lists short, so that
# rows take the sample select's passes.
@pytest.mark.parametrize("vocab,cap,block", [(1, None, None), pytest.param(7, None, None, marks=pytest.mark.quick), (40, None, None),
                                             (200, 8, 16), (300, 16, 32)])
def test_sample_rows_matches_reference(vocab, cap, block):
    g = torch.Generator().manual_seed(vocab)
    close = rows = 0
    for _ in range(4):
        inp = _to(cases.sample_case(g, vocab, 24, torch.float32))
        got = sample_rows_kernel.launch(*[inp[k] for k in SAMPLE_KEYS], cap=cap, block=block)
        close += check_samples(inp, got)
        rows += got.shape[0]
    assert close <= rows // 4 + 2


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_sample_rows_half_precision(dtype):
    g = torch.Generator().manual_seed(3)
    inp = _to(cases.sample_case(g, 64, 24, dtype))
    check_samples(inp, torch.ops.dflash.sample_rows(*[inp[k] for k in SAMPLE_KEYS]))


@pytest.mark.parametrize("vocab,cap,block", [(5, None, None), (40, None, None),
                                             pytest.param(120, 8, 16, marks=pytest.mark.quick)])
def test_verify_matches_reference(vocab, cap, block):
    g = torch.Generator().manual_seed(100 + vocab)
    for _ in range(8):
        inp = _to(cases.verify_case(g, vocab, 40, 8, torch.float32))
        got = verify_kernel.launch(*[inp[k] for k in VERIFY_KEYS], cap=cap, block=block)
        check_verify(inp, got)


def test_temperature_rows_over_many_online_max_steps():
    """Temperature-only owners whose drafts are mostly the target's own samples, on rows
    read in many small steps: each lane's running max rises mid-row, so its mass and its
    mass below the draft must be rescaled exactly as SPEC.md's weights say."""
    g = torch.Generator().manual_seed(11)
    accepted = 0
    for _ in range(6):
        inp = cases.verify_case(g, 120, 40, 8, torch.float32)
        owners = inp["offsets"].shape[0] - 1
        inp.update(temperature=torch.full((owners,), 0.9), top_k=torch.zeros(owners, dtype=torch.int64),
                   top_p=torch.ones(owners))
        cases.plant_target_tokens(g, inp["logits"], inp["tokens"], inp["offsets"],
                                   {k: inp[k] for k in VERIFY_KEYS[3:]}, 120)
        inp = _to(inp)
        got = verify_kernel.launch(*[inp[k] for k in VERIFY_KEYS], block=16)
        check_verify(inp, got)
        accepted += int(got[0].sum())
    assert accepted >= 5  # planted drafts were accepted: the match test was exercised


def test_temperature_search_reads_the_chunk_its_prefix_masses_point_to():
    """A temperature-only row's token search reads one chunk, picked on the prefix masses its
    pass stored at each chunk end (kernels/verify.py). Rows of 8 chunks (block 16: chunks of
    32 logits) with pieces of 16 -inf logits (chunks half or wholly without mass: equal
    prefixes on both ends, never picked), drafts that mostly miss, so that most owners
    search: tokens must be the reference's, from every chunk. (It catches a chunk picked
    against t * 1.02 instead of t, or a search from 0.99 of the chunk's preceding mass.)"""
    g = torch.Generator().manual_seed(31)
    vocab, chunks = 250, set()
    for _ in range(10):
        inp = cases.verify_case(g, vocab, 64, 8, torch.float32)
        owners = inp["offsets"].shape[0] - 1
        inp.update(temperature=torch.rand(owners, generator=g) * 2 + 0.3,
                   top_k=torch.zeros(owners, dtype=torch.int64), top_p=torch.ones(owners))
        x = inp["logits"]
        for r in range(x.shape[0]):
            for c in torch.nonzero(torch.rand(vocab // 16 + 1, generator=g) < 0.3).flatten().tolist():
                x[r, 16 * c:16 * c + 16] = float("-inf")
        inp = _to(inp)
        got = verify_kernel.launch(*[inp[k] for k in VERIFY_KEYS], block=16)
        check_verify(inp, got)
        chunks |= set((got[1][got[1] >= 0] // 32).tolist())
    assert len(chunks) == 8


@pytest.mark.parametrize("block,min_max", [pytest.param(None, "numpy", marks=pytest.mark.quick), (16, "numpy"),
                                           (None, "sm_90")])
def test_a_single_nan_or_inf_logit_anywhere_in_a_row(block, min_max, monkeypatch):
    """The light pass skips NaN / +inf compares per logit: the GPU's max drops a NaN logit
    (and a NaN weight), and a row runs again, sanitized, where a lane ends with a NaN max or
    an infinite mass (kernels/sampling_rule.py). One NaN or +inf logit at a random place of a
    row (in a whole step or the masked last one), in greedy, temperature, top-k and top-p
    rows, must give the reference's tokens: with the interpreter's NaN-keeping min and max
    (numpy: the sanitized pass decides such rows), and with the GPU's (sm_90: a NaN row in one
    pass)."""
    if min_max == "sm_90":
        if DEVICE != "cpu":
            pytest.skip("the GPU's own min and max: the numpy case runs them")
        gpu_min_max.patch(monkeypatch)
    g = torch.Generator().manual_seed(23)
    vocab = 300
    for _ in range(3):
        inp = cases.verify_case(g, vocab, 40, 8, torch.float32)
        rows = inp["logits"].shape[0]
        where = torch.randint(0, vocab, (rows,), generator=g)
        kind = torch.randint(0, 4, (rows,), generator=g)  # 0: as is, 1: NaN, 2: +inf, 3: -inf
        for r in range(rows):
            if kind[r] > 0:
                inp["logits"][r, where[r]] = (float("nan"), float("inf"), float("-inf"))[int(kind[r]) - 1]
        inp = _to(inp)
        check_verify(inp, verify_kernel.launch(*[inp[k] for k in VERIFY_KEYS], block=block))
        sample = {"logits": inp["logits"], "position": torch.arange(rows, device=DEVICE)}
        owner_of_row = torch.bucketize(torch.arange(rows), inp["offsets"][1:].cpu(), right=True).clamp(
            max=inp["temperature"].shape[0] - 1).to(DEVICE)
        for key in ("temperature", "top_k", "top_p", "seed"):
            sample[key] = inp[key][owner_of_row]
        check_samples(sample, sample_rows_kernel.launch(*[sample[k] for k in SAMPLE_KEYS], block=block))


def test_temperature_rows_holding_nan_under_the_gpus_min_and_max(monkeypatch):
    """On the GPU a temperature-only row holding NaN is decided by the light pass alone: the
    max of each weight with 0 drops a NaN logit's NaN weight (`_fold_step`), so no lane's mass
    sends the row to the sanitizing pass. Here, with sm_90's min / max (tests/gpu_min_max.py), rows of
    several NaN logits each (and some -inf) under temperatures 0.5-2, in sample_rows and in
    dflash_verify (drafts planted), must give the reference's tokens."""
    if DEVICE != "cpu":
        pytest.skip("the GPU's own min and max: test_kernels_gpu.py runs such rows")
    gpu_min_max.patch(monkeypatch)
    g = torch.Generator().manual_seed(55)
    vocab, rows = 300, 48

    def holes(x):
        for r in range(x.shape[0]):
            at = torch.randint(0, vocab, (int(torch.randint(1, 6, (1,), generator=g)),), generator=g)
            x[r, at] = float("nan")
            x[r, torch.randint(0, vocab, (2,), generator=g)] = float("-inf")
        return x

    temperature = torch.tensor([0.5, 0.8, 1.0, 1.5, 2.0]).repeat(rows)[:rows]
    sample = _to({"logits": holes(cases.logits(g, rows, vocab, torch.float32)),
                  "position": torch.randint(0, 1 << 40, (rows,), generator=g), "temperature": temperature,
                  "top_k": torch.zeros(rows, dtype=torch.int64), "top_p": torch.ones(rows),
                  "seed": torch.randint(-(1 << 62), 1 << 62, (rows,), generator=g)})
    check_samples(sample, sample_rows_kernel.launch(*[sample[k] for k in SAMPLE_KEYS]))
    for _ in range(4):
        inp = cases.verify_case(g, vocab, 40, 8, torch.float32)
        owners = inp["temperature"].shape[0]
        inp["temperature"] = temperature[:owners]
        inp["top_k"] = torch.zeros(owners, dtype=torch.int64)
        inp["top_p"] = torch.ones(owners)
        inp["logits"] = holes(inp["logits"])
        inp = _to(inp)
        check_verify(inp, verify_kernel.launch(*[inp[k] for k in VERIFY_KEYS]))


@pytest.mark.parametrize("mark", [record.PASS_ROW.value, record.FILTERED_ROW.value])
def test_verify_leaves_no_stale_mark_in_its_scratch(mark):
    """The scratch is never cleared (a CUDA graph replays into the same memory), and the
    launches after the first trust its marks (they read a marked row's pair from there, out of
    bounds for a stale one). So the first launch writes every slot's results word: here the
    scratch starts full of one mark; after the call, every slot that holds no pair reads
    UNUSED_SLOT and the tokens are the reference's."""
    g = torch.Generator().manual_seed(41)
    unused = 0
    for _ in range(6):
        inp = _to(cases.verify_case(g, 40, 40, 8, torch.float32))
        owners = inp["offsets"].shape[0] - 1
        inp["top_k"] = torch.full((owners,), 5, dtype=torch.int64, device=DEVICE)  # filtered rows too
        scratch = launch.scratch_for(inp["logits"])
        scratch.work.fill_(mark)
        check_verify(inp, verify_kernel.launch(*[inp[k] for k in VERIFY_KEYS], scratch=scratch))
        first_word = scratch.results()[:, 0]
        used = owners_layout.pack_pairs(inp["offsets"].cpu(), inp["logits"].shape[0]).used
        assert bool((first_word[~used] == record.UNUSED_SLOT.value).all()), first_word.tolist()
        assert not bool((first_word[used] == mark).any()), first_word.tolist()
        unused += int((~used).sum())
    assert unused > 0  # the cases had slots that hold no pair


# (temperature, top_k, top_p): each keeps rank 0 alone (SPEC.md steps 4 and 6) at a sampling temperature
ONE_TOKEN_MODES = [(1.0, 1, 1.0), (2.5, 1, 0.9), (0.7, 0, 0.0), (1.0, 30, -0.5), (1.3, 1, float("nan")),
                   (float("inf"), 0, -0.0)]


def _first_argmax(x: torch.Tensor) -> torch.Tensor:
    """SPEC.md's greedy token of each row: the lowest index holding the maximum (NaN as -inf),
    -1 for a row with no finite logit; computed here, apart from the reference."""
    x = x.float().nan_to_num(nan=float("-inf"), posinf=torch.finfo(torch.float32).max, neginf=float("-inf"))
    top = x.max(-1, keepdim=True).values
    index = torch.arange(x.shape[-1]).expand_as(x)
    first = torch.where(x == top, index, x.shape[-1]).min(-1).values
    return torch.where(top.squeeze(-1) > float("-inf"), first, -1)


@pytest.mark.parametrize("temperature,top_k,top_p", ONE_TOKEN_MODES)
def test_rows_whose_filters_keep_one_token_are_greedy(temperature, top_k, top_p):
    """top-k 1 and top-p <= 0 keep rank 0 alone, and step 7 gives it (its weight 1 exceeds t = u < 1):
    the argmax at any temperature. Such rows take the greedy path of the first launch
    (`sampling_rule.decided_temperature`): no row is marked for the filtered launches, and every
    owner's tokens are the argmaxes (ties at the maximum: the lowest index; NaN / -inf rows; a row
    of -inf only gives -1), the reference's too."""
    g = torch.Generator().manual_seed(61)
    vocab, owners, rows = 48, 6, 4
    x = torch.cat([cases.kind_logits(g, kind, rows, vocab, torch.float32)
                   for kind in ("ties", "equal", "nan/-inf", "flat", "peaked", "ties")])
    x[5] = float("-inf")
    x[9, 7] = float("inf")
    want = _first_argmax(x)
    tokens = torch.randint(0, vocab, (owners * rows,))
    tokens[1:] = want[:-1]  # argmax drafts: accepted, up to a row without a finite logit
    tokens[14] = (want[13] + 1) % vocab  # one owner rejects at its second row
    inp = {"logits": x, "tokens": tokens, "offsets": torch.arange(owners + 1) * rows,
           "start_position": torch.randint(0, 1 << 40, (owners,), generator=g),
           "temperature": torch.full((owners,), temperature), "top_k": torch.full((owners,), top_k),
           "top_p": torch.full((owners,), top_p), "seed": torch.randint(-(1 << 62), 1 << 62, (owners,), generator=g)}
    inp = _to(inp)
    scratch = launch.scratch_for(inp["logits"])
    scratch.work.fill_(7777)  # (a top-k / top-p row's first launch writes its V_MISS word; a greedy row's, none)
    accepted, next_token = verify_kernel.launch(*[inp[k] for k in VERIFY_KEYS], scratch=scratch)
    check_verify(inp, (accepted, next_token))
    assert next_token.cpu().tolist() == [int(want[o * rows + a]) for o, a in enumerate(accepted.cpu().tolist())]
    assert accepted.cpu().tolist() == [3, 1, 3, 1, 3, 3]  # row 5 (owner 1) has no finite logit; draft 14 is wrong
    assert scratch.verify_words()[:, record.V_MISS.value].tolist() == [7777] * (owners * rows)
    assert bool((scratch.results()[:, record.R_TOKEN.value] >= -1).all())  # tokens, no mark
    sample = {"logits": inp["logits"], "position": torch.arange(owners * rows, device=DEVICE),
              **{k: inp[k].repeat_interleave(rows) for k in ("temperature", "top_k", "top_p", "seed")}}
    got = sample_rows_kernel.launch(*[sample[k] for k in SAMPLE_KEYS])
    check_samples(sample, got)
    assert got.cpu().tolist() == want.tolist()


def test_confident_top_p_rows_are_decided_by_their_first_pass():
    """A top-p-alone row whose argmax alone reaches p S (S from its first pass) keeps the argmax
    alone (SPEC.md step 6: rank 1 stays iff C(0) = 1 < p S): the first launch decides it, and
    leaves it no stats for the filtered launches (here: their words keep the fill), while the
    other rows take those launches. Drafts: the argmax, another token, or none."""
    g = torch.Generator().manual_seed(62)
    vocab, owners, rows = 64, 4, 5
    x = cases.kind_logits(g, "flat", owners * rows, vocab, torch.float32)
    r = torch.arange(owners * rows)
    confident = (r % rows == 0) | (r % rows == 3) | (r // rows == 1) | (r // rows == 3)  # owners 1 and 3: all
    hot = torch.randint(0, vocab, (owners * rows,), generator=g)
    x[confident, hot[confident]] = 12.0  # p S <= 1 at top-p 0.9: the other 63 weigh e^(x - 12) each, S - 1 ~ 1e-3
    want = _first_argmax(x)
    tokens = torch.randint(0, vocab, (owners * rows,), generator=g)
    tokens[1:] = want[:-1]
    tokens[8] = (want[7] + 1) % vocab  # owner 1 stops at its row 2
    inp = _to({"logits": x, "tokens": tokens, "offsets": torch.arange(owners + 1) * rows,
               "start_position": torch.randint(0, 1 << 40, (owners,), generator=g),
               "temperature": torch.full((owners,), 1.0), "top_k": torch.zeros(owners, dtype=torch.int64),
               "top_p": torch.full((owners,), 0.9), "seed": torch.randint(-(1 << 62), 1 << 62, (owners,), generator=g)})
    scratch = launch.scratch_for(inp["logits"])
    scratch.work.fill_(7777)
    accepted, next_token = verify_kernel.launch(*[inp[k] for k in VERIFY_KEYS], scratch=scratch)
    check_verify(inp, (accepted, next_token))
    stats = torch.tensor([scratch.stats(r)["count"] for r in range(owners * rows)])
    assert bool((stats[confident] == 7777).all()) and bool((stats[~confident] != 7777).all()), stats.tolist()
    assert accepted.cpu()[[1, 3]].tolist() == [2, rows - 1]
    assert next_token.cpu()[[1, 3]].tolist() == [int(want[7]), int(want[4 * rows - 1])]


def test_verify_with_more_owners_than_one_layout_step(monkeypatch):
    """The owner-layout walk goes BLOCK_O owners per step, carrying the slot count: 40 owners
    of 0-2 rows under a BLOCK_O of 16 (three steps; the interpreter walks 256-owner steps too
    slowly to run enough of them); then a decreasing offset (an invalid owner, and owners near
    the end whose pairs end past R: not admitted) and a range past R."""
    monkeypatch.setattr(verify_kernel, "BLOCK_O", 16)
    g = torch.Generator().manual_seed(29)
    vocab, owners = 16, 40
    assert owners > 2 * verify_kernel.BLOCK_O
    for case in range(2):
        n = torch.randint(0, 3, (owners,), generator=g)
        offsets = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(n, 0)])
        num_rows = int(offsets[-1]) + 2 * (1 - case)  # case 0: two unused slots
        if case == 1:  # owner 29 invalid, owner 30 takes 6 rows more: the slots run out
            offsets[30] -= 6
            offsets[-1] = num_rows + 1  # the last owner's range ends past R: invalid
        inp = {"logits": cases.logits(g, num_rows, vocab, torch.float32),
               "tokens": torch.randint(0, vocab, (num_rows,), generator=g), "offsets": offsets,
               **cases.owner_params(g, owners, vocab)}
        inp = _to(inp)
        check_verify(inp, verify_kernel.launch(*[inp[k] for k in VERIFY_KEYS]))
        check_verify(inp, torch.ops.dflash.dflash_verify_argmax(*[inp[k] for k in VERIFY_KEYS[:3]]), greedy=True)
        if case == 1:  # (the case holds what it says: owners with rows that are not admitted)
            assert bool(((n[31:] > 0) & (owners_layout.pack_pairs(offsets, num_rows).rows[31:] == 0)).any())


@pytest.mark.quick
def test_verify_argmax_matches_reference():
    g = torch.Generator().manual_seed(7)
    for dtype in (torch.float32, torch.bfloat16):
        for _ in range(10):
            inp = _to(cases.verify_case(g, 33, 40, 8, dtype, greedy_only=True))
            got = torch.ops.dflash.dflash_verify_argmax(inp["logits"], inp["tokens"], inp["offsets"])
            check_verify(inp, got, greedy=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_flat_and_tied_rows_cut_inside_their_ties(dtype):
    # Near-equal logits: the top-p cut lies far past the candidates, so the select's passes
    # decide; all-tied rows put every cut inside one tie group (ties at the cut in index
    # order: a region of one key, split by index). top_p values keep p * S_k away from whole
    # multiples of the tied weights, so no row sits in a legal band and every row is judged
    # exactly.
    g = torch.Generator().manual_seed(9)
    n, vocab = 12, 150
    logits = torch.randn(n, vocab, generator=g) * 0.05
    logits[:4] = 0.25  # all tied
    logits[6:8] = -0.25  # all tied below zero (half precision keys: low bits all ones)
    inp = _to({
        "logits": logits.to(dtype), "position": torch.arange(n) * 11, "temperature": torch.full((n,), 1.0),
        "top_k": torch.tensor([0, 100, 5, 37, 140, 0, 0, 37, 0, 0, 149, 0]),
        "top_p": torch.tensor([0.9033, 0.7071, 1.0, 0.5123, 1.0, 0.3, 0.99, 0.8, 0.6, 1e-3, 0.75, 0.5]),
        "seed": torch.arange(n) + 5,
    })
    assert check_samples(inp, sample_rows_kernel.launch(*[inp[k] for k in SAMPLE_KEYS], cap=8, block=16)) == 0


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_sanitized_inf_is_cut_apart_from_the_largest_half_precision_value(dtype):
    """+inf logits count as FLT_MAX (SPEC.md step 1), which no bfloat16 / float16 holds: the
    cuts must still fall at FLT_MAX. 10 +inf and 15 of the dtype's largest finite logits
    (weight 0 next to FLT_MAX), top-k 20 (no lane bound at block 16: the select decides),
    top-p 0.55: 6 +inf tokens kept."""
    g = torch.Generator().manual_seed(8)
    n, vocab = 6, 120
    logits = torch.randn(n, vocab, generator=g)
    for r in range(n):
        at = torch.randperm(vocab, generator=g)
        logits[r, at[:10]] = float("inf")
        logits[r, at[10:25]] = torch.finfo(dtype).max
    inp = _to({"logits": logits.to(dtype), "position": torch.arange(n) * 3, "temperature": torch.full((n,), 0.8),
               "top_k": torch.full((n,), 20), "top_p": torch.tensor([0.55, 0.55, 0.35, 0.75, 0.55, 0.97]),
               "seed": torch.arange(n) + 9})
    assert check_samples(inp, sample_rows_kernel.launch(*[inp[k] for k in SAMPLE_KEYS], cap=8, block=16)) == 0


def test_top_k_sets_hold_exactly_the_best_tokens():
    # With a near-flat temperature every member of the top-k set is about equally
    # likely: a wrong member (a cut one token off) shows at once.
    g = torch.Generator().manual_seed(12)
    n, vocab = 48, 200
    logits = torch.randn(n, vocab, generator=g)
    logits[::4] = torch.randn(n // 4, vocab, generator=g).sort(dim=-1).values  # best tokens come last
    inp = _to({"logits": logits, "position": torch.arange(n) * 7, "temperature": torch.full((n,), 1e3),
               "top_k": torch.tensor([1, 2, 3, 5, 8, 7])[torch.arange(n) % 6],
               "top_p": torch.ones(n), "seed": torch.arange(n)})
    assert check_samples(inp, sample_rows_kernel.launch(*[inp[k] for k in SAMPLE_KEYS], cap=8, block=16)) == 0


def test_filtered_rows_with_and_without_a_lane_bound():
    """Each way a top-k / top-p row can go (kernels/filtered.py), at the default blocks
    (V = 1000 float32: 256 lanes, 250 of them live): a bound from the lane maxima with few
    candidates (top-k <= live lanes, peaked top-p), with more than 256 (1000 tied); then
    the sample select for rows with no bound (top-k 256 > live lanes, 257, 300, 999), with
    candidates whose top-p mass falls short of the target (flat rows: ~800 collected) and
    with more candidates than the list holds (3000 ties). Peaked rows keep their mass on
    a few boosted tokens."""
    g = torch.Generator().manual_seed(21)
    n, vocab = 16, 1000
    logits = torch.randn(n, vocab, generator=g)
    boost = torch.randint(0, vocab, (n, 6), generator=g)
    logits.scatter_add_(1, boost, 4.0 + 4.0 * torch.rand(n, 6, generator=g))
    logits[8:10] = torch.randn(2, vocab, generator=g) * 0.05  # flat: the top-p candidates fall short
    logits[10] = 0.3  # all tied: 1000 candidates at the bound
    top_k = torch.tensor([50, 50, 7, 256, 257, 300, 0, 0, 0, 0, 20, 5, 0, 0, 999, 1])
    top_p = torch.tensor([1.0, 0.9, 1.0, 1.0, 1.0, 0.8, 0.9, 0.5, 0.9, 0.95, 1.0, 0.6, 0.0, 0.99, 1.0, 1.0])
    inp = _to({"logits": logits, "position": torch.arange(n) * 13, "temperature": torch.full((n,), 0.9),
               "top_k": top_k, "top_p": top_p, "seed": torch.arange(n) + 40})
    assert check_samples(inp, torch.ops.dflash.sample_rows(*[inp[k] for k in SAMPLE_KEYS])) <= 1
    # More tied candidates than the list holds (2 * BUF = 4096 at the default cap: the sample).
    tied = _to({"logits": torch.zeros(2, 5000), "position": torch.tensor([3, 4]), "temperature": torch.ones(2),
                "top_k": torch.tensor([10, 4999]), "top_p": torch.tensor([1.0, 0.5]), "seed": torch.tensor([1, 2])})
    assert check_samples(tied, torch.ops.dflash.sample_rows(*[tied[k] for k in SAMPLE_KEYS])) == 0


def _long_list_rows(g, n, vocab, high, lanes, floor):
    """Rows where `high` tokens sit on four tied values (5.0 .. 6.5) and the rest at `floor`
    (below 5.0); lane 0 (of `lanes` lanes of 4 fp32 logits, steps of 4 * lanes) holds only
    5.0s, so the lowest lane maximum is 5.0 and a top-p row collects exactly the `high` tokens."""
    logits = torch.full((n, vocab), floor)
    for r in range(n):
        at = torch.randperm(vocab, generator=g)[:high]
        value = 5.0 + 0.5 * torch.randint(0, 4, (high,), generator=g).float()
        logits[r, at] = torch.where(at % (4 * lanes) < 4, 5.0, value)
        logits[r, 0] = 5.0
    return logits


def test_long_top_p_lists():
    """top-p rows of 41 to 63 high tokens on four tied values (cap 8, block 16: a list of 64, 4
    lanes, most of them hot: no list, the select's passes decide). Tied values put the cut
    inside tie groups. In the second half the other tokens (at 3.0) hold ~5 % of the mass: at
    top-p >= 0.97 the cut falls among them."""
    g = torch.Generator().manual_seed(31)
    n, vocab = 24, 200
    logits = torch.cat([_long_list_rows(g, n // 2, vocab, 62, 4, -30.0), _long_list_rows(g, n // 2, vocab, 40, 4, 3.0)])
    top_p = torch.tensor([0.05, 0.3, 0.5123, 0.71, 0.9, 0.97, 0.999, 0.99999, 0.25, 0.61, 0.83, 0.9931])
    inp = _to({"logits": logits, "position": torch.arange(n) * 5, "temperature": torch.full((n,), 0.7),
               "top_k": torch.zeros(n, dtype=torch.int64), "top_p": top_p.repeat(2), "seed": torch.arange(n) + 70})
    assert check_samples(inp, sample_rows_kernel.launch(*[inp[k] for k in SAMPLE_KEYS], cap=8, block=16)) == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_wide_top_p_nuclei(dtype):
    """A top-p row whose nucleus reaches below every lane maximum (its lanes' candidates fall
    short of the target) is decided by the select's passes. Cap 8, block 16: a list of 64, 4
    lanes (float32) or 2 (bfloat16). Rows of 20 to 50 tokens spread over about one unit of
    x / T (their lane maxima bound a few of them), the rest far below, through sample_rows
    and through dflash_verify (one owner per row: verify_filtered decides them); then flat
    rows, whose nucleus is wider than the list."""
    g = torch.Generator().manual_seed(37)
    n, vocab = 16, 300
    logits = torch.full((n, vocab), -40.0)
    for r in range(n):
        high = 20 + 2 * r
        logits[r, torch.randperm(vocab, generator=g)[:high]] = 5.0 + 0.8 * torch.rand(high, generator=g)
    top_p = torch.tensor([0.5, 0.8, 0.9, 0.95, 0.99, 0.7, 0.85, 0.9999]).repeat(2)
    inp = _to({"logits": logits.to(dtype), "position": torch.arange(n) * 7, "temperature": torch.full((n,), 0.9),
               "top_k": torch.zeros(n, dtype=torch.int64), "top_p": top_p, "seed": torch.arange(n) + 110})
    owners = _to({"logits": logits.to(dtype), "tokens": torch.randint(0, vocab, (n,), generator=g),
                  "offsets": torch.arange(n + 1), "start_position": torch.arange(n) * 7, "temperature": inp["temperature"],
                  "top_k": inp["top_k"], "top_p": top_p, "seed": inp["seed"]})
    assert check_samples(inp, sample_rows_kernel.launch(*[inp[k] for k in SAMPLE_KEYS], cap=8, block=16)) == 0
    check_verify(owners, verify_kernel.launch(*[owners[k] for k in VERIFY_KEYS], cap=8, block=16))
    flat = dict(inp, logits=(torch.randn(n, vocab, generator=g) * 0.05).to(dtype).to(DEVICE))
    assert check_samples(flat, sample_rows_kernel.launch(*[flat[k] for k in SAMPLE_KEYS], cap=8, block=16)) == 0


def _spread_rows(g, rows, vocab, lanes_of):
    """Rows with one high token (5.0 .. 5.5) in every group of `lanes_of` logits, the rest at
    -30: every lane of `dflash_verify`'s pass holds one, so a top-p bound takes most lanes and
    `filtered.collect` leaves the row without a list (count -1)."""
    out = torch.full((rows, vocab), -30.0)
    for r in range(rows):
        at = torch.arange(0, vocab, lanes_of) + torch.randint(0, lanes_of, (-(-vocab // lanes_of),), generator=g)
        at = at[at < vocab]
        out[r, at] = 5.0 + 0.5 * torch.rand(at.numel(), generator=g)
    return out


def _spy_on_launches(monkeypatch, seen):
    """Call seen(kernel, args, kwargs) at each kernel launch of `verify.launch`, then launch."""
    real_wrap = verify_kernel.wrap_triton

    def spy(kernel):
        launcher = real_wrap(kernel)

        class Grid:
            def __getitem__(self, grid):
                def run(*args, **kw):
                    seen(kernel, args, kw)
                    return launcher[grid](*args, **kw)
                return run
        return Grid()

    monkeypatch.setattr(verify_kernel, "wrap_triton", spy)


def test_rows_whose_bound_takes_most_lanes_get_no_list():
    """A top-p row whose bound takes most lanes is not collected (the walk of its lanes would
    be one of the whole row, in the launch every row waits for): its count is -1 and the select
    decides it in the next launch. V = 1000 float32 at the default blocks (250 live lanes of 4
    logits): two spread rows (one high token per lane) among temperature-only and top-k 5
    rows, one row per owner; then 24 spread rows and 8 long-list rows at cap 8, block 16
    (bfloat16), among temperature-only rows."""
    g = torch.Generator().manual_seed(41)
    n, vocab = 64, 1000
    spread = [5, 40]
    logits = torch.randn(n, vocab, generator=g)
    logits.scatter_add_(1, torch.randint(0, vocab, (n, 4), generator=g), 6.0 + 4.0 * torch.rand(n, 4, generator=g))
    logits[spread] = _spread_rows(g, 2, vocab, 4)
    top_k = torch.tensor([0, 5]).repeat(n // 2)
    top_p = torch.ones(n)
    top_k[spread] = 0
    top_p[spread] = torch.tensor([0.9, 0.6])
    inp = _to({"logits": logits, "tokens": torch.randint(0, vocab, (n,), generator=g), "offsets": torch.arange(n + 1),
               "start_position": torch.arange(n) * 11, "temperature": torch.full((n,), 0.8), "top_k": top_k,
               "top_p": top_p, "seed": torch.arange(n) + 130})
    scratch = launch.scratch_for(inp["logits"])
    check_verify(inp, verify_kernel.launch(*[inp[k] for k in VERIFY_KEYS], scratch=scratch))
    for r in spread:
        assert scratch.stats(r)["count"] == -1 and scratch.stats(r)["passes"] > 0
    g = torch.Generator().manual_seed(43)
    n, vocab = 64, 300
    logits = torch.cat([_spread_rows(g, 24, vocab, 4), _long_list_rows(g, 8, vocab, 40, 4, 3.0),
                        torch.randn(32, vocab, generator=g) * 3.0])
    top_p = torch.cat([torch.tensor([0.3, 0.6, 0.9, 0.99]).repeat(8), torch.ones(32)])
    inp = _to({"logits": logits.to(torch.bfloat16), "tokens": torch.randint(0, vocab, (n,), generator=g),
               "offsets": torch.arange(n + 1), "start_position": torch.arange(n) * 3,
               "temperature": torch.full((n,), 0.9), "top_k": torch.zeros(n, dtype=torch.int64), "top_p": top_p,
               "seed": torch.arange(n) + 150})
    check_verify(inp, verify_kernel.launch(*[inp[k] for k in VERIFY_KEYS], cap=8, block=16))


@pytest.mark.parametrize("step", [16, 32])
def test_verify_bounds_top_p_rows_from_the_lanes_its_first_launch_stored(step, monkeypatch):
    """dflash_verify reads every row in its first launch and leaves a top-p row's lanes in
    scratch; the FILTERED launch bounds and collects from them, in that launch's lane layout.
    The long-list rows above, one owner each (cap 8, block 16: 4 float32 lanes), go the same
    ways there (the small decision, the select), and some owners take top-k. step 32: the first
    launch runs another config (as `benchmarks/sweep_rows.py` swaps it): the FILTERED launch
    must follow its step (8 lanes), not recompute one from V. (Lanes read in another layout did
    not change these rows' tokens, checked: a bound whose candidates do not settle a row sends
    it to the select; so the test checks the two launches' steps too.)"""
    real = verify_kernel.decide_config
    monkeypatch.setattr(verify_kernel, "decide_config",
                        lambda vocab, block=None, itemsize=2: dataclasses.replace(real(vocab, block, itemsize),
                                                                                  block=step))
    g = torch.Generator().manual_seed(33)
    n, vocab = 24, 200
    logits = torch.cat([_long_list_rows(g, n // 2, vocab, 62, 4, -30.0), _long_list_rows(g, n // 2, vocab, 40, 4, 3.0)])
    top_p = torch.tensor([0.05, 0.3, 0.5123, 0.71, 0.9, 0.97, 0.999, 0.99999, 0.25, 0.61, 0.83, 0.9931])
    inp = _to({"logits": logits, "tokens": torch.randint(0, vocab, (n,), generator=g),
               "offsets": torch.arange(n + 1), "start_position": torch.arange(n) * 5,
               "temperature": torch.full((n,), 0.7), "top_k": torch.tensor([0, 0, 3, 0, 2, 3] * 4),
               "top_p": top_p.repeat(2), "seed": torch.arange(n) + 70})
    steps = {}  # the BLOCK of each verify_rows_kernel launch, by FILTERED

    def seen(kernel, args, kw):
        if kernel is verify_kernel.verify_rows_kernel:
            steps[kw["FILTERED"]] = kw["BLOCK"]

    _spy_on_launches(monkeypatch, seen)
    check_verify(inp, verify_kernel.launch(*[inp[k] for k in VERIFY_KEYS], cap=8, block=16))
    assert steps == {False: step, True: step}


@pytest.mark.quick
def test_overlapping_and_invalid_owners():
    g = torch.Generator().manual_seed(10)
    logits = torch.randn(8, 20, generator=g)
    tokens = torch.cat([torch.tensor([0]), logits.argmax(-1)[:-1]])
    for offsets in ([0, 5, 2, 6], [0, 3, 1, 3], [2, 6, 0, 3], [-1, 4, 9], [0, 0, 0], [3, 3, 8]):
        o = len(offsets) - 1
        inp = _to({"logits": logits, "tokens": tokens, "offsets": torch.tensor(offsets),
                   "start_position": torch.arange(o), "temperature": torch.tensor([0.0, 0.9, 1.1, 0.5][:o]),
                   "top_k": torch.tensor([0, 3, 0, 5][:o]), "top_p": torch.tensor([1.0, 0.8, 0.9, 1.0][:o]),
                   "seed": torch.arange(o) + 1})
        check_verify(inp, torch.ops.dflash.dflash_verify(*[inp[k] for k in VERIFY_KEYS]))
        check_verify(inp, torch.ops.dflash.dflash_verify_argmax(*[inp[k] for k in VERIFY_KEYS[:3]]), greedy=True)


def test_kernel_against_the_oracle_directly():
    import spec_oracle

    g = torch.Generator().manual_seed(11)
    inp = cases.verify_case(g, 30, 30, 6, torch.float32)
    got = torch.ops.dflash.dflash_verify(*[_to(inp)[k] for k in VERIFY_KEYS])
    acc, nxt, close = spec_oracle.verify(inp["logits"].numpy(), inp["tokens"].tolist(), inp["offsets"].tolist(),
                                         inp["start_position"].tolist(), inp["temperature"].tolist(),
                                         inp["top_k"].tolist(), inp["top_p"].tolist(), inp["seed"].tolist())
    for o in range(len(acc)):
        if not close[o]:
            assert (int(got[0][o]), int(got[1][o])) == (acc[o], nxt[o])


def test_bad_inputs_name_the_input_and_the_fix():
    x = torch.randn(4, 10, device=DEVICE)
    i64 = torch.zeros(4, dtype=torch.int64, device=DEVICE)
    f32 = torch.ones(4, device=DEVICE)
    with pytest.raises(ValueError, match="temperature must be torch.float32"):
        torch.ops.dflash.sample_rows(x, i64, i64, i64, f32, i64)
    with pytest.raises(ValueError, match="logits dtype torch.float64 is not supported"):
        torch.ops.dflash.sample_rows(x.double(), i64, f32, i64, f32, i64)
    with pytest.raises(ValueError, match=r"logits must be \[rows, V\]"):
        torch.ops.dflash.dflash_verify_argmax(x[0], i64, i64[:2])
    with pytest.raises(RuntimeError, match="tokens must have R"):
        torch.ops.dflash.dflash_verify_argmax(x, i64[:3], i64[:2])
    with pytest.raises(ValueError, match="contiguous"):
        torch.ops.dflash.dflash_verify_argmax(x.t().contiguous().t(), i64, i64[:2])


def test_ops_trace_as_single_nodes_with_their_fake_shapes():
    class Head(torch.nn.Module):
        def forward(self, logits, tokens, offsets):
            return torch.ops.dflash.dflash_verify_argmax(logits, tokens, offsets)

    logits, tokens, offsets = torch.randn(5, 9), torch.zeros(5, dtype=torch.int64), torch.tensor([0, 2, 5])
    rows, owners = torch.export.Dim("rows", min=1, max=64), torch.export.Dim("owners", min=1, max=8)
    ep = torch.export.export(Head(), (logits, tokens, offsets),
                             dynamic_shapes=({0: rows}, {0: rows}, {0: owners + 1}))
    calls = [n for n in ep.graph.nodes if n.op == "call_function"]
    assert [n.target for n in calls if "dflash" in str(n.target)] == [torch.ops.dflash.dflash_verify_argmax.default]
    out = ep.module()(torch.randn(7, 9), torch.zeros(7, dtype=torch.int64), torch.tensor([0, 3, 4, 7]))
    assert out[0].shape == (3,) and out[1].shape == (3,)


def test_a_scratch_made_for_other_logits_is_refused():
    inp = _to(cases.verify_case(torch.Generator().manual_seed(12), 40, 12, 4, torch.float32))
    other = launch.scratch_for(inp["logits"][:6])
    with pytest.raises(ValueError, match=r"scratch of \(6, \d+\) words.*make it with launch.scratch_for"):
        verify_kernel.launch(*[inp[k] for k in VERIFY_KEYS], scratch=other)


KIND_VOCAB = 64  # every row kind under every mode is 78 rows: small V keeps the interpreter's walk short


def _kinds_case(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    pairs = list(itertools.product(cases.ROW_KINDS, cases.kind_modes(KIND_VOCAB)))
    return _to(cases.kinds_case(g, KIND_VOCAB, torch.bfloat16, pairs, rows_per_owner=1))


def test_verify_decides_every_row_kind_under_every_mode():
    """Issue #25's row kinds (LLM-like, power-law, flat, equal, tied, NaN / -inf) under its
    modes (temperature only, top-p 0.9-0.99, top-k 1 to V, top-k + top-p, greedy), one owner
    each, bfloat16: the reference's tokens, apart from SPEC.md's legal bands."""
    inp = _kinds_case(51)
    check_verify(inp, torch.ops.dflash.dflash_verify(*[inp[k] for k in VERIFY_KEYS]))
    check_verify(inp, torch.ops.dflash.dflash_verify_argmax(*[inp[k] for k in VERIFY_KEYS[:3]]), greedy=True)


def test_sample_rows_decides_every_row_kind_under_every_mode():
    inp = _kinds_case(52)
    sample = {"logits": inp["logits"], "position": inp["start_position"] + 1, **{
        k: inp[k] for k in ("temperature", "top_k", "top_p", "seed")}}
    check_samples(sample, torch.ops.dflash.sample_rows(*[sample[k] for k in SAMPLE_KEYS]))
