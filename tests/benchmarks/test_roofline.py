"""`benchmarks/roofline.py`'s terms on a model small enough to count by hand."""

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import roofline  # noqa: E402

pytestmark = pytest.mark.quick  # scripts/test.sh --quick

SHAPE = dict(hidden_size=4, intermediate_size=8, num_heads=2, num_kv_heads=1, head_dim=2, num_layers=1)
TARGET = SimpleNamespace(vocab_size=10, **SHAPE)
DRAFTER = SimpleNamespace(block_size=2, target_layer_ids=(0,), **SHAPE)


def test_one_owner_counted_by_hand():
    # a layer: q and o 4 x 4 each, k and v 4 x 2 each, MLP 3 x 4 x 8: 144 weights; lm_head 40
    assert roofline.layer_weights(TARGET) == 144
    terms = roofline.step_terms(TARGET, DRAFTER, owners=1, rows_per_owner=2, cells=[3])
    verify, draft = terms["target_verify"], terms["draft_forward"]
    # rows see 4 and 5 cells: 9 (row, cell) pairs x 4 x 2 heads x 2 dims
    assert verify.flops == 2 * 2 * (144 + 40) + 4 * 2 * 2 * 9
    # weights + KV (k and v of 1 head x 2 dims for 3 + 2 cells) + logits written and read, 2 bytes each
    assert verify.bytes == 2 * (144 + 40) + 2 * 2 * (3 + 2) * 2 + 2 * 2 * 2 * 10
    # block of 2 rows through the layer, 1 draft row through the lm_head, 1 committed row through fc (4 x 4);
    # each block query sees 3 context cells and the 2 block cells
    assert draft.flops == 2 * (2 * 144 + 1 * 40 + 1 * 16) + 4 * 2 * 2 * (3 + 2) * 2
    assert draft.bytes == 2 * (144 + 40 + 16) + 2 * 2 * (3 + 2) * 2 + 2 * 2 * 1 * 10
    memory, compute = verify.seconds(copy_bytes_per_s=488.0, flops_per_s=880.0)
    assert (memory, compute) == (1.0, 1.0)
    # the attention's part: its 144 FLOPs and the 40 bytes of KV; one after the other, the floor is
    # max(40 / 488, 144 / 880) + max(448 / 488, 736 / 880)
    assert (verify.attention_flops, verify.attention_bytes) == (144, 40)
    assert verify.sequential(488.0, 880.0) == pytest.approx(144 / 880 + 448 / 488)
    assert (draft.attention_flops, draft.attention_bytes) == (4 * 2 * 2 * 10, 2 * 2 * 5 * 2)


def test_cells_must_name_every_owner():
    with pytest.raises(ValueError, match="cells has 1 entries for 2 owners"):
        roofline.step_terms(TARGET, DRAFTER, owners=2, rows_per_owner=2, cells=[3])


def test_the_runner_benchmark_prints_each_call_against_its_roofline(monkeypatch):
    """bench_cuda_runner's table from given timings (the rates stubbed: they are measured on a GPU)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
    import bench_cuda_runner

    from dflash_et.export import config

    monkeypatch.setattr(bench_cuda_runner, "measure_rates", lambda rows, hidden, vocab: (4.0e12, 600.0e12))
    cfg = config.load("qwen3-smoke-sampling-cuda")
    timings = {"speculative": {"target_verify": 9000.0, "draft_forward": 4500.0, "step": 14000.0},
               "target-only": {"target_verify": 1000.0, "step": 1050.0}}
    lines = bench_cuda_runner.roofline_lines(cfg, 64, [40.0] * 64, timings)
    rows = {line.split("|")[1].strip(): line.split("|") for line in lines if line.startswith("| target") or
            line.startswith("| draft")}
    assert set(rows) == {"target_verify (speculative)", "draft_forward (speculative)", "target_verify (target-only)"}
    verify = rows["target_verify (speculative)"]
    assert verify[2].strip() == "1024"
    # ~1.05 TFLOP at 600 TFLOP/s is the larger term: 1752 us, so 9000 us is ~5.1x
    assert 1700 < float(verify[6]) < 1800 and 5.0 < float(verify[8]) < 5.3, verify
    # at 40 cells the attention is small: the sequential floor is about the roofline
    assert float(verify[6]) <= float(verify[9]) < 1.1 * float(verify[6]) and 4.6 < float(verify[10]) < 5.3, verify
    assert rows["target_verify (target-only)"][2].strip() == "64"
