"""Checkpoints: HF Qwen3 / Llama targets and z-lab DFlash drafters written and read back
through the real loader, and the loader's errors."""

import json

import pytest
import torch
import yaml

from dflash_et import cli
from dflash_et.export import builder, config, models
from dflash_et.export.config import ConfigError, LimitsConfig, ModelConfig
from dflash_et.export.models import checkpoint, layers, presets
from dflash_et.export.models.checkpoint import CheckpointError

import checkpoint_writer
from small_models import SLOTS, T, small_drafter, small_target

pytestmark = pytest.mark.quick  # scripts/test.sh --quick



def _same_model(a: torch.nn.Module, b: torch.nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sorted(sa) == sorted(sb)
    for name in sa:
        assert torch.equal(sa[name], sb[name]), name


@pytest.mark.parametrize("family,tie,bias,rope", [
    ("qwen3", True, False, None),
    ("qwen3", False, False, None),
    ("llama", False, True, layers.Rope(theta=500_000.0, kind="llama3", factor=8.0, original_max_position=32)),
])
def test_target_round_trip(tmp_path, family, tie, bias, rope):
    model = small_target(family, tie, bias, rope, seed=11)
    checkpoint_writer.save_target(model, tmp_path)
    data = json.loads((tmp_path / "config.json").read_text())
    assert data["model_type"] == family and data["tie_word_embeddings"] is tie
    assert ("lm_head.weight" in checkpoint.tensor_index(tmp_path)) is not tie
    loaded = checkpoint.load_target(tmp_path, SLOTS, T, torch.float32)
    assert loaded.cfg == model.cfg
    _same_model(model, loaded)


def test_drafter_round_trip_in_zlab_layout(tmp_path):
    model = small_drafter(block_size=5, taps=(2, 0), seed=12)
    checkpoint_writer.save_drafter(model, tmp_path)
    data = json.loads((tmp_path / "config.json").read_text())
    assert data["architectures"] == ["DFlashDraftModel"] and data["block_size"] == 5
    assert data["dflash_config"] == {"mask_token_id": 60, "target_layer_ids": [2, 0]}
    names = set(checkpoint.tensor_index(tmp_path))
    assert {"fc.weight", "hidden_norm.weight", "norm.weight", "layers.1.self_attn.k_norm.weight"} <= names
    assert not any("embed" in n or "lm_head" in n for n in names)  # shares the target's
    loaded = checkpoint.load_drafter(tmp_path, SLOTS, T, torch.float32)
    assert loaded.cfg == model.cfg
    _same_model(model, loaded)


@pytest.mark.parametrize("attention", [
    {"layer_types": ("sliding_attention", "full_attention"), "sliding_window": 3},
    {"layer_types": ("sliding_attention", "full_attention"), "sliding_window": 3, "is_causal": False},
    {"is_causal": True},
])
def test_sliding_window_drafter_round_trip(tmp_path, attention):
    model = small_drafter(seed=14, **attention)
    checkpoint_writer.save_drafter(model, tmp_path)
    loaded = checkpoint.load_drafter(tmp_path, SLOTS, T, torch.float32)
    assert loaded.cfg == model.cfg
    _same_model(model, loaded)


@pytest.mark.parametrize("edit,want", [
    # transformers' Qwen3Config: no use_sliding_window, no window (the sliding layers stay causal)
    (lambda d: d.update(sliding_window=7), {"sliding_window": None}),
    # layer_types derived from max_window_layers when windowed
    (lambda d: d.pop("layer_types") and d.update(use_sliding_window=True, sliding_window=7, max_window_layers=1),
     {"layer_types": ("full_attention", "sliding_attention"), "sliding_window": 7}),
    (lambda d: d.pop("layer_types") and d.update(use_sliding_window=True, sliding_window=7), {"layer_types": None}),
    # is_causal where vLLM reads it
    (lambda d: d["dflash_config"].update(causal=False), {"is_causal": False}),
    (lambda d: d["dflash_config"].update(is_causal=True, causal=False), {"is_causal": True}),
    (lambda d: d.update(is_causal=False) or d["dflash_config"].update(is_causal=True), {"is_causal": False}),
])
def test_drafter_attention_keys_are_read_as_transformers_and_vllm_do(saved_drafter, edit, want):
    path = saved_drafter / "config.json"
    data = json.loads(path.read_text())
    data["layer_types"] = ["sliding_attention", "full_attention"]
    edit(data)
    path.write_text(json.dumps(data))
    cfg = checkpoint.drafter_config(saved_drafter)
    assert {k: getattr(cfg, k) for k in want} == want


def test_drafter_config_spellings(tmp_path):
    model = small_drafter(seed=13)
    checkpoint_writer.save_drafter(model, tmp_path)
    data = json.loads((tmp_path / "config.json").read_text())
    # transformers-v5 style: block_size inside dflash_config, rope_parameters; a `model.` prefix
    data["dflash_config"]["block_size"] = data.pop("block_size")
    data["rope_parameters"] = {"rope_theta": data.pop("rope_theta"), "rope_type": "default"}
    data.pop("rope_scaling")
    (tmp_path / "config.json").write_text(json.dumps(data))
    tensors = checkpoint.read_file(tmp_path / "model.safetensors")
    checkpoint_writer.write_file(tmp_path / "model.safetensors", {f"model.{k}": v for k, v in tensors.items()})
    loaded = checkpoint.load_drafter(tmp_path, SLOTS, T, torch.float32)
    assert loaded.cfg == model.cfg
    _same_model(model, loaded)
    # no target_layer_ids: z-lab's default from num_target_layers
    del data["dflash_config"]["target_layer_ids"]
    data["num_target_layers"] = 36
    data["num_hidden_layers"] = 5
    data.pop("layer_types")  # (written for 2 layers)
    (tmp_path / "config.json").write_text(json.dumps(data))
    assert checkpoint.drafter_config(tmp_path).target_layer_ids == (1, 9, 17, 25, 33)


def test_safetensors_files_agree_with_the_safetensors_library(tmp_path):
    st = pytest.importorskip("safetensors.torch")
    tensors = {
        "a": torch.randn(3, 5), "b.bf16": torch.randn(7).to(torch.bfloat16), "c": torch.arange(6).view(2, 3),
        "d.f16": torch.randn(2, 2, 2).half(), "empty": torch.zeros(0, 4),
    }
    ours, theirs = tmp_path / "ours.safetensors", tmp_path / "theirs.safetensors"
    checkpoint_writer.write_file(ours, tensors)
    st.save_file(tensors, str(theirs))
    for path in (ours, theirs):
        for reader in (checkpoint.read_file, lambda p: st.load_file(str(p))):
            got = reader(path)
            assert sorted(got) == sorted(tensors)
            for k, v in tensors.items():
                assert got[k].dtype == v.dtype and torch.equal(got[k], v), (path.name, k)


def test_sharded_checkpoint_with_index(tmp_path):
    model = small_target("llama", seed=14)
    checkpoint_writer.save_target(model, tmp_path)
    tensors = checkpoint.read_file(tmp_path / "model.safetensors")
    (tmp_path / "model.safetensors").unlink()
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for file, part in shards.items():
        checkpoint_writer.write_file(tmp_path / file, {n: tensors[n] for n in part})
    index = {"weight_map": {n: f for f, part in shards.items() for n in part}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    _same_model(model, checkpoint.load_target(tmp_path, SLOTS, T, torch.float32))
    # a bfloat16 model from the same files
    bf16 = checkpoint.load_target(tmp_path, SLOTS, T, torch.bfloat16)
    assert bf16.model.embed_tokens.weight.dtype == torch.bfloat16


@pytest.fixture
def saved_target(tmp_path):
    directory = tmp_path / "target"
    checkpoint_writer.save_target(small_target("qwen3", seed=15), directory)
    return directory


def _edit_tensors(directory, edit):
    path = directory / "model.safetensors"
    tensors = checkpoint.read_file(path)
    edit(tensors)
    checkpoint_writer.write_file(path, tensors)
    return path


def _load(directory):
    return checkpoint.load_target(directory, SLOTS, T, torch.float32)


def test_missing_tensor_is_named(saved_target):
    _edit_tensors(saved_target, lambda t: t.pop("model.layers.1.self_attn.k_norm.weight"))
    with pytest.raises(CheckpointError, match=r"tensor model\.layers\.1\.self_attn\.k_norm\.weight is missing from "
                                              r".*target \(model\.safetensors\)"):
        _load(saved_target)


def test_unexpected_tensor_is_named_with_its_file(saved_target):
    path = _edit_tensors(saved_target, lambda t: t.update({"model.layers.3.mlp.up_proj.weight": torch.zeros(2)}))
    with pytest.raises(CheckpointError, match=rf"unexpected tensor model\.layers\.3\.mlp\.up_proj\.weight in {path}"):
        _load(saved_target)


def test_misshaped_tensor_is_named_with_both_shapes(saved_target):
    path = _edit_tensors(
        saved_target, lambda t: t.update({"model.layers.0.self_attn.q_proj.weight": torch.zeros(32, 31)})
    )
    with pytest.raises(CheckpointError, match=rf"tensor model\.layers\.0\.self_attn\.q_proj\.weight in {path} has "
                                              r"shape \[32, 31\], expected \[32, 32\]"):
        _load(saved_target)


def test_lm_head_in_a_tied_checkpoint_is_unexpected(tmp_path):
    checkpoint_writer.save_target(small_target("qwen3", tie=True), tmp_path)
    _edit_tensors(tmp_path, lambda t: t.update({"lm_head.weight": torch.zeros(61, 32)}))
    with pytest.raises(CheckpointError, match=r"unexpected tensor lm_head\.weight .*tie_word_embeddings"):
        _load(tmp_path)


def test_inv_freq_of_old_checkpoints_is_skipped(saved_target):
    _edit_tensors(saved_target, lambda t: t.update({"model.layers.0.self_attn.rotary_emb.inv_freq": torch.ones(4)}))
    _load(saved_target)


@pytest.mark.parametrize("change,message", [
    ({"model_type": "mistral", "architectures": ["MistralForCausalLM"]},
     r"model_type 'mistral' \(architectures \['MistralForCausalLM'\]\) is not a supported target; supported: "
     r"qwen3 \(Qwen3ForCausalLM\), llama \(LlamaForCausalLM\)"),
    ({"architectures": ["DFlashDraftModel"]}, r"describes a DFlash drafter .* use it as model\.drafter"),
    ({"hidden_act": "gelu"}, r"hidden_act 'gelu' is not supported for the target"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, r"rope type 'yarn' is not supported"),
    ({"use_sliding_window": True}, r"sliding-window layers"),
    ({"num_hidden_layers": None}, r"has no num_hidden_layers; it is required"),
    ({"hidden_size": "64"}, r"hidden_size must be an integer, got '64'"),
    ({"num_key_value_heads": 3}, r"num_attention_heads \(4\) must be a multiple of num_key_value_heads \(3\)"),
    ({"head_dim": None}, r"has no head_dim: transformers' Qwen3Config would take its own class default"),
    ({"num_key_value_heads": None}, r"has no num_key_value_heads: transformers' Qwen3Config"),
    ({"rope_theta": None}, r"has no rope_theta: transformers' Qwen3Config"),
])
def test_config_json_errors_name_the_key(saved_target, change, message):
    path = saved_target / "config.json"
    data = json.loads(path.read_text())
    for k, v in change.items():
        if v is None:
            data.pop(k)
        else:
            data[k] = v
    path.write_text(json.dumps(data))
    with pytest.raises(CheckpointError, match=message) as e:
        _load(saved_target)
    assert str(path) in str(e.value)


def test_a_llama_config_derives_what_transformers_derives(tmp_path):
    """LlamaConfig derives a missing num_key_value_heads (= num_attention_heads) and head_dim
    (= hidden_size / num_attention_heads) and defaults rope_theta to 10000; so do we."""
    directory = checkpoint_writer.save_target(small_target("llama", seed=4), tmp_path / "llama")
    path = directory / "config.json"
    data = json.loads(path.read_text())
    for key in ("num_key_value_heads", "head_dim", "rope_theta"):
        data.pop(key)
    path.write_text(json.dumps(data))
    cfg = checkpoint.target_config(directory)
    assert (cfg.num_kv_heads, cfg.head_dim, cfg.rope.theta) == (4, 8, 10_000.0)


def test_broken_files_are_named(tmp_path, saved_target):
    with pytest.raises(CheckpointError, match=r"has no config\.json"):
        _load(tmp_path)
    weights = saved_target / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=rf"{weights}: tensor .* truncated or corrupt"):
        _load(saved_target)
    weights.write_bytes(b"\x05\x00")
    with pytest.raises(CheckpointError, match=rf"{weights} is not a safetensors file"):
        _load(saved_target)
    weights.unlink()
    with pytest.raises(CheckpointError, match=r"has no \*\.safetensors files"):
        _load(saved_target)


def test_a_tensor_in_two_shards_is_refused(saved_target):
    tensors = checkpoint.read_file(saved_target / "model.safetensors")
    checkpoint_writer.write_file(saved_target / "extra.safetensors", {"model.norm.weight": tensors["model.norm.weight"]})
    with pytest.raises(CheckpointError, match=r"tensor model\.norm\.weight is in both"):
        _load(saved_target)


@pytest.fixture
def saved_drafter(tmp_path):
    directory = tmp_path / "drafter"
    checkpoint_writer.save_drafter(small_drafter(), directory)
    return directory


@pytest.mark.parametrize("edit,message", [
    (lambda d: d["dflash_config"].pop("mask_token_id"), r"has no integer dflash_config\.mask_token_id"),
    (lambda d: d.update(architectures=["Qwen3ForCausalLM"], dflash_config={}, block_size=None) or d.pop("block_size"),
     r"is not a DFlash drafter"),
    (lambda d: d["dflash_config"].update(target_layer_ids="1,2"), r"target_layer_ids must be a list of integers"),
    (lambda d: d.update(final_logit_softcapping=30.0), r"final_logit_softcapping = 30\.0 is not supported"),
    (lambda d: d.update(layer_types=["sliding_attention"]), r"drafter layer_types has 1 entries for 2 layers"),
    (lambda d: d.update(layer_types=["full_attention"] * 3), r"drafter layer_types has 3 entries for 2 layers"),
    (lambda d: d.update(layer_types=["linear_attention", "full_attention"]),
     r"drafter layer_types \['linear_attention'\] are not supported"),
    (lambda d: d.update(layer_types="sliding_attention"), r"layer_types must be a list, got .sliding_attention."),
    (lambda d: d.update(layer_types=[1, 2]), r"layer_types must be a list of strings, got \[1, 2\]"),
    (lambda d: d.update(use_sliding_window=True, sliding_window=0, layer_types=["sliding_attention"] * 2),
     r"drafter sliding_window must be a positive integer or absent, got 0"),
    (lambda d: d.update(is_causal="yes"), r"is_causal must be true or false, got 'yes'"),
    (lambda d: d.update(block_size=1), r"block_size must be in \[2, 64\], got 1"),
    (lambda d: d.pop("block_size"), r"has no block_size \(nor dflash_config\.block_size\); it is required"),
    (lambda d: d.pop("head_dim"), r"has no head_dim: transformers' Qwen3Config"),
    (lambda d: d.pop("num_key_value_heads"), r"has no num_key_value_heads: transformers' Qwen3Config"),
    (lambda d: d.pop("rope_theta"), r"has no rope_theta: transformers' Qwen3Config"),
])
def test_drafter_config_errors(saved_drafter, edit, message):
    path = saved_drafter / "config.json"
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))
    with pytest.raises(CheckpointError, match=message):
        checkpoint.load_drafter(saved_drafter, SLOTS, T, torch.float32)


def _drafter_cfg(**changes):
    return models.DrafterConfig(**{**presets.DRAFTERS["tiny-dflash"].__dict__, **changes})


@pytest.mark.parametrize("changes,message", [
    ({"hidden_size": 32}, r"drafter hidden_size \(32\) does not match the target's \(64\)"),
    ({"target_layer_ids": (1, 4)},
     r"drafter target_layer_ids \[1, 4\] name layers \[4\] outside the target's 4 layers"),
    ({"num_target_layers": 36},
     r"drafter num_target_layers \(36\) does not match the target's num_hidden_layers \(4\)"),
    ({"vocab_size": 300}, r"drafter vocab_size \(300\) does not match the target's \(256\)"),
    ({"mask_token_id": 256}, r"mask_token_id 256 is outside the target's vocab \[0, 256\)"),
    ({"block_size": 40}, r"limits\.max_rows \(32\) must hold at least one verify block of block_size 40"),
])
def test_a_drafter_that_does_not_fit_the_target(changes, message):
    with pytest.raises(ConfigError, match=message):
        models.check_pair(presets.TARGETS["tiny"], _drafter_cfg(**changes), LimitsConfig(max_rows=32, max_owners=4))


def test_model_names_that_are_neither_preset_nor_directory(tmp_path):
    limits = LimitsConfig()
    with pytest.raises(ConfigError, match=r"model\.target 'tinny' is neither a preset \(tiny, qwen3-smoke\) nor a "
                                          r"checkpoint directory \(tinny does not exist\)"):
        models.load(ModelConfig("tinny", "tiny-dflash"), limits)
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match=r"model\.drafter .* is not a directory"):
        models.load(ModelConfig("tiny", str(tmp_path / "file")), limits)


def test_cli_reports_a_bad_checkpoint_without_a_traceback(tmp_path, saved_target, capsys):
    _edit_tensors(saved_target, lambda t: t.pop("model.norm.weight"))
    checkpoint_writer.save_drafter(small_drafter(), tmp_path / "drafter")
    cfg = {"program": "dflash", "variant": "greedy",
           "model": {"target": str(saved_target), "drafter": str(tmp_path / "drafter")},
           "limits": {"max_rows": 16, "max_owners": 2, "max_seq_len": 32}}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(cfg))
    code = cli.main(["export", "--config", str(path), "--output-dir", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and "tensor model.norm.weight is missing from" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_checkpoint_config_builds_the_same_program_as_the_models(tmp_path):
    target, drafter = small_target("llama", seed=16), small_drafter(seed=17)
    checkpoint_writer.save_target(target, tmp_path / "t")
    checkpoint_writer.save_drafter(drafter, tmp_path / "d")
    cfg = config.from_dict({"program": "dflash", "variant": "greedy",
                            "model": {"target": str(tmp_path / "t"), "drafter": str(tmp_path / "d")},
                            "limits": {"max_rows": 16, "max_owners": 2, "max_seq_len": 32}})
    spec = builder.build(cfg)
    assert spec.constants["target_layer_ids"] == [0, 2] and spec.constants["mask_token_id"] == 60
    _same_model(spec.methods[0].module.target, target)
    _same_model(spec.methods[3].module.drafter, drafter)
