"""The target and the drafter against a per-owner reference (tests/dflash_reference.py),
and the speculative loop on the eager modules (no export: fast)."""

import dflash_reference as ref
import pytest
import torch
from small_models import SLOTS, T, small_drafter, small_target

from dflash_et.export import builder, config, driver
from dflash_et.export.config import ExportConfig, LimitsConfig, ModelConfig
from dflash_et.export.dflash_program import DraftForward, DraftPrefill
from dflash_et.export.models import Drafter, layers, packing, presets



pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.quick]  # conftest.py; scripts/test.sh --quick


def sequences(seed=0, lengths=(20, 13, 9)):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 61, (n,), generator=g).tolist() for n in lengths]


def call_target(model, pieces, taps=(0, 2)):
    """pieces: (tokens, start_position, slot) per owner, packed in one call -> logits and taps per owner."""
    counts = [len(t) for t, _, _ in pieces]
    offsets = torch.tensor([0] + torch.tensor(counts).cumsum(0).tolist())
    tokens = torch.tensor([x for t, _, _ in pieces for x in t])
    with torch.no_grad():
        h, tapped = model(tokens, offsets, torch.tensor([p for _, p, _ in pieces]),
                          torch.tensor([s for _, _, s in pieces]), taps)
        logits = model.logits(h)
    return [(logits[a:b], tapped[a:b]) for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist())]


@pytest.mark.parametrize("family,tie,bias", [("qwen3", True, False), ("qwen3", False, False), ("llama", False, True)])
def test_packed_target_equals_each_owner_alone(family, tie, bias):
    model = small_target(family, tie, bias)
    a, b, c = sequences()
    want = {k: ref.target_forward(model, s) for k, s in zip("abc", (a, b, c))}
    got = {k: [] for k in "abc"}
    # Prefill chunks of several owners in one call, in slots 2, 0, 1.
    for piece, keys in (
        ([(a[:7], 0, 2), (b[:5], 0, 0)], "ab"),
        ([(a[7:12], 7, 2), (b[5:13], 5, 0), (c[:4], 0, 1)], "abc"),
    ):
        for k, out in zip(keys, call_target(model, piece)):
            got[k].append(out)
    # A verify-like step with wrong drafts: positions 13.. of `a` and 6 of `c` are written
    # with junk, then rewritten by the next call; only committed tokens may be read later.
    out = call_target(model, [(a[12:13] + [1, 2, 3], 12, 2), (c[4:6] + [5], 4, 1)])
    got["a"].append((out[0][0][:1], out[0][1][:1]))
    got["c"].append((out[1][0][:2], out[1][1][:2]))
    for k, out in zip("ac", call_target(model, [(a[13:20], 13, 2), (c[6:9], 6, 1)])):
        got[k].append(out)
    for k in "abc":
        logits = torch.cat([x[0] for x in got[k]])
        want_logits, outputs = want[k]
        n = logits.shape[0]
        torch.testing.assert_close(logits.double(), want_logits[:n], atol=2e-4, rtol=1e-4)
    # taps of the prefill: raw outputs of layers 0 and 2 (the last one, so normed)
    tapped = torch.cat([x[1] for x in got["b"]])
    torch.testing.assert_close(tapped.double(), ref.taps(want["b"][1], (0, 2)), atol=2e-4, rtol=1e-4)


def test_a_reused_slot_never_reads_the_previous_owner():
    model = small_target()
    long, short = sequences(3, (30, 6))
    call_target(model, [(long, 0, 1)])  # slot 1 now holds 30 positions of another owner
    logits = call_target(model, [(short, 0, 1)])[0][0]
    torch.testing.assert_close(logits.double(), ref.target_forward(model, short)[0], atol=2e-4, rtol=1e-4)


def test_bad_owners_are_contained():
    model = small_target()
    a, b = sequences(4, (6, 6))
    good = call_target(model, [(a, 0, 0)])[0][0]
    caches = [(m.self_attn.k_cache.clone(), m.self_attn.v_cache.clone()) for m in model.model.layers]
    # the same owner again, next to owners with a slot out of range, positions running
    # past max_seq_len and a negative start: their rows go to the scratch slot
    out = call_target(model, [(b, 0, 7), (a, 0, 0), (b, T - 2, 2), (b[:2], -5, 1)])
    torch.testing.assert_close(out[1][0], good)
    for m, (k, v) in zip(model.model.layers, caches):
        for new, old in ((m.self_attn.k_cache, k), (m.self_attn.v_cache, v)):
            torch.testing.assert_close(new[0], old[0])  # rewritten with the same values
            assert torch.equal(new[1], old[1])  # untouched
            assert torch.equal(new[2, : T - 2], old[2, : T - 2])  # only its own 2 valid positions written
            assert not torch.equal(new[2, T - 2:], old[2, T - 2:])


def test_placement_of_rows():
    place = packing.place_rows(
        7, start=torch.tensor([0, 3, 9]), count=torch.tensor([3, 2, 1]), base=torch.tensor([10, 0, 0]),
        slots=torch.tensor([1, 4, 0]), num_slots=4, max_seq_len=12,
    )
    assert place.owner.tolist()[:5] == [0, 0, 0, 1, 1]
    assert place.position.tolist()[:5] == [10, 11, 12, 0, 1]
    # position 12 >= max_seq_len and slot 4 (out of range) go to the scratch slot 4; rows 5, 6 have no owner
    assert place.write_slot.tolist() == [1, 1, 4, 4, 4, 4, 4]
    assert place.read_slot.tolist() == [1, 1, 1, 4, 4, 4, 4]
    assert place.rope_position.max() == 11


def _context_rows(target, drafter, seq, upto):
    return ref.taps(ref.target_forward(target, seq[:upto])[1], drafter.cfg.target_layer_ids).float()


SLIDING_FULL = ("sliding_attention", "full_attention")
ATTENTION = {  # drafter layer kinds (z-lab's semantics: tests/dflash_reference.py zlab_visible)
    "full": {},
    "sliding causal": {"layer_types": SLIDING_FULL, "sliding_window": 3},  # the window cuts context and block
    "sliding non-causal": {"layer_types": SLIDING_FULL, "sliding_window": 3, "is_causal": False},
    "sliding unwindowed": {"layer_types": SLIDING_FULL},  # causal, no window (use_sliding_window unset)
    "all causal": {"is_causal": True},
}


@pytest.mark.parametrize("attention", list(ATTENTION))
def test_drafter_with_context_cache_equals_zlab_forward(attention):
    target, drafter = small_target(tie=True), small_drafter(**ATTENTION[attention])
    a, b = sequences(5, (17, 11))
    ctx_a, ctx_b = _context_rows(target, drafter, a, 17), _context_rows(target, drafter, b, 11)
    prefill, forward = DraftPrefill(drafter), DraftForward(drafter, target)
    with torch.no_grad():
        # prompt context: a[0:9] in slot 2 and b[0:6] in slot 0, then a late piece of a
        prefill(torch.cat([ctx_a[:9], ctx_b[:6]]), torch.tensor([0, 9, 15]), torch.tensor([0, 0]),
                torch.tensor([2, 0]))
        # a step: rows of the previous "verify" (a: 4 rows, 3 committed; b: 2 rows, 2 committed),
        # with junk in the uncommitted row; then the block at P = 12 (a) and 8 (b)
        junk = torch.randn(1, ctx_a.shape[1])
        hidden = torch.cat([ctx_b[6:8], ctx_a[9:12], junk])
        drafts = forward(hidden, torch.tensor([2, 0]), torch.tensor([3, 2]), torch.tensor([a[12], b[8]]),
                         torch.tensor([12, 8]), torch.tensor([2, 0]))
    for o, (seq, ctx, start) in enumerate(((a, ctx_a, 12), (b, ctx_b, 8))):
        logits = ref.drafter_logits(drafter, target, ctx[:start], seq[start], start)
        assert drafts[o].tolist() == logits.argmax(-1).tolist()
        # and the states, not only their argmax
        with torch.no_grad():
            noise = target.model.embed_tokens(torch.tensor([[seq[start]] + [60] * 3]))
            states = drafter.block(noise, torch.tensor([start]), torch.tensor([2 if o == 0 else 0]))
        got = states[0, 1:] @ target.output_weight.T
        torch.testing.assert_close(got.double(), logits, atol=2e-4, rtol=1e-4)


def test_drafter_ignores_context_past_the_block():
    target, drafter = small_target(), small_drafter()
    (a,) = sequences(6, (15,))
    ctx = _context_rows(target, drafter, a, 15)
    with torch.no_grad():
        DraftPrefill(drafter)(ctx, torch.tensor([0, 15]), torch.tensor([0]), torch.tensor([1]))  # all 15 rows
        noise = target.model.embed_tokens(torch.tensor([[a[10]] + [60] * 3]))
        states = drafter.block(noise, torch.tensor([10]), torch.tensor([1]))  # must see only 0..9
    want = ref.drafter_logits(drafter, target, ctx[:10], a[10], 10)
    torch.testing.assert_close((states[0, 1:] @ target.output_weight.T).double(), want, atol=2e-4, rtol=1e-4)


def test_a_block_that_runs_off_the_slots_end_keeps_its_own_keys():
    """The block writes its K/V at cells P .. P + L - 1 before it attends; past max_seq_len
    they go to the caches' L - 1 extra cells, not onto one another. A causal drafter at
    P = T - 2: its block rows at positions <= T - 1 (RoPE unclamped) equal those of the same
    drafter with room to spare."""
    short = small_drafter(is_causal=True)
    long = presets.init_drafter(Drafter(short.cfg, SLOTS, 2 * T), 1)  # small_drafter's weights
    target = small_target()
    (a,) = sequences(7, (T,))
    ctx = _context_rows(target, short, a, T - 2)
    states = []
    with torch.no_grad():
        for drafter in (short, long):
            DraftPrefill(drafter)(ctx, torch.tensor([0, T - 2]), torch.tensor([0]), torch.tensor([1]))
            noise = target.model.embed_tokens(torch.tensor([[a[T - 2]] + [60] * 3]))
            states.append(drafter.block(noise, torch.tensor([T - 2]), torch.tensor([1])))
    torch.testing.assert_close(states[0][0, :2], states[1][0, :2], rtol=1e-5, atol=1e-5)
    assert torch.isfinite(states[0]).all()


def test_llama3_rope_scaling():
    rope = layers.Rope(theta=500_000.0, kind="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                       original_max_position=64)
    plain = layers.Rope(theta=500_000.0).inv_freq(16)
    scaled = rope.inv_freq(16)
    wavelen = 2 * torch.pi / plain
    assert torch.equal(scaled[wavelen < 16], plain[wavelen < 16])  # high frequencies kept
    torch.testing.assert_close(scaled[wavelen > 64], plain[wavelen > 64] / 8)  # low ones divided
    model = small_target("llama", rope=rope)
    (a,) = sequences(7, (40,))
    logits = call_target(model, [(a, 0, 0)])[0][0]
    torch.testing.assert_close(logits.double(), ref.target_forward(model, a)[0], atol=2e-4, rtol=1e-4)


def _tiny(variant, **limits) -> ExportConfig:
    return ExportConfig(program="dflash", variant=variant, model=ModelConfig("tiny", "tiny-dflash"),
                        limits=LimitsConfig(**{"max_rows": 24, "max_owners": 4, "max_seq_len": 64, **limits}))


@pytest.mark.parametrize("variant", ["greedy", "sampling"])
def test_eager_speculative_loop_equals_target_only(variant):
    program = driver.Program.eager(builder.build(_tiny(variant)))
    owners = driver.scenario(program, seed=3, owners=4)
    assert any(len(o.prompt) > 24 for o in owners)  # chunked prefill
    reference = driver.generate(program, [o.fresh(join=0, leave=None) for o in owners], mode="target_only")
    run = driver.generate(program, owners)
    assert all(ok for _, ok, _ in driver.compare(run, reference)), driver.compare(run, reference)
    assert all(len(reference.tokens[o.name]) == o.max_new for o in owners)
    oracle = driver.generate(program, owners, oracle=reference.tokens)
    assert all(ok for _, ok, _ in driver.compare(oracle, reference))
    steps = [(a, n) for s in oracle.steps for a, n in zip(s.acceptance, s.rows)]
    assert all(a == n for a, n in steps) and max(n for _, n in steps) == 4
    assert oracle.acceptance_length() > 2.5


def test_the_loop_check_catches_a_target_that_reads_stale_cache(monkeypatch):
    # Sabotage: attention ignores its mask, so cache cells past a row's position (rejected
    # drafts of earlier steps, a slot's previous owner) leak into the result. Speculative
    # decoding must then stop matching target-only decoding.
    real = layers.attend
    monkeypatch.setattr(layers, "attend", lambda q, k, v, allowed: real(q, k, v, torch.ones_like(allowed)))
    program = driver.Program.eager(builder.build(_tiny("greedy")))
    owners = driver.scenario(program, seed=3, owners=3)
    reference = driver.generate(program, [o.fresh(join=0, leave=None) for o in owners], mode="target_only")
    run = driver.generate(program, owners)
    assert not all(ok for _, ok, _ in driver.compare(run, reference))


def test_presets_are_deterministic_and_seeded():
    cfg = _tiny("greedy")
    a, b = builder.build(cfg), builder.build(cfg)
    c = builder.build(config.from_dict({**cfg.to_dict(), "model": {**cfg.to_dict()["model"], "seed": 1}}))
    wa, wb, wc = (s.methods[0].module.target.model.embed_tokens.weight for s in (a, b, c))
    assert torch.equal(wa, wb) and not torch.equal(wa, wc)


def test_every_builtin_config_loads_and_pairs_its_models():
    """Every YAML in configs/ parses, and a DFlash config's target and drafter fit each other
    and its limits (checked from the architectures, without building any weights)."""
    from dflash_et.export import models

    names = sorted(p.stem for p in config.BUILTIN_DIR.glob("*.yaml"))
    assert "qwen3-smoke-sampling-cuda" in names and len(names) >= 9
    for name in names:
        cfg = config.load(name)
        if cfg.program == "dflash":
            target, _ = models.target_config(cfg.model)
            drafter, _ = models.drafter_config(cfg.model)
            models.check_pair(target, drafter, cfg.limits)
