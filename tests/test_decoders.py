"""Decoder LLMs (Llama, Mistral, Qwen2, Qwen3, Gemma, Gemma2, Gemma3 text) against transformers
PyTorch with eager attention: logits of `*ForSequenceClassification` (the "last_token" head) on
both padding sides, every hidden state, bfloat16, configs in both config.json dialects, the
loading report of `*ForCausalLM` checkpoints, exports transformers loads, the bit-identical
round trip, sharding on fake devices, and the command line on a tiny Llama with a tokenizer.

Tiny random models: vocab 99 (pad 0), 32 wide, 4 query heads, 3 layers, sequences of 12 with
sliding windows of 4-5, every weight (norms and biases included) drawn at random.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import os
import subprocess
import sys
import textwrap
import zlib

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from safetensors.torch import load_file

import flaxheads
from flaxheads.backbones.decoder_config import FAMILIES, DecoderConfig
from family_parity import (
    assert_close,
    assert_same_params,
    assert_state_dicts_identical,
    flax_inputs,
    padded_batch,
    state_dict,
    torch_forward,
    torch_logits,
)

TINY = dict(vocab_size=99, hidden_size=32, num_attention_heads=4, intermediate_size=37, num_hidden_layers=3,
            max_position_embeddings=64, initializer_range=0.1, pad_token_id=0, bos_token_id=1, eos_token_id=2)
SEQ_LEN = 12
LLAMA3_ROPE = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                   original_max_position_embeddings=8)

# name -> (transformers class prefix, config overrides): together they exercise every switch.
CASES = {
    "llama": ("Llama", dict(num_key_value_heads=2, head_dim=12, attention_bias=True, mlp_bias=True,
                            rope_scaling=LLAMA3_ROPE, rope_theta=500.0)),
    "llama_linear_rope": ("Llama", dict(num_key_value_heads=1, rope_scaling=dict(rope_type="linear", factor=2.0))),
    "mistral": ("Mistral", dict(num_key_value_heads=2, sliding_window=5)),
    "qwen2": ("Qwen2", dict(num_key_value_heads=2, use_sliding_window=True, sliding_window=4, max_window_layers=1)),
    "qwen3": ("Qwen3", dict(num_key_value_heads=2, head_dim=12, attention_bias=True, use_sliding_window=True,
                            sliding_window=4, max_window_layers=1)),
    "gemma": ("Gemma", dict(num_key_value_heads=1, head_dim=12)),
    "gemma2": ("Gemma2", dict(num_key_value_heads=2, head_dim=12, sliding_window=4, query_pre_attn_scalar=10,
                              attn_logit_softcapping=2.0)),
    "gemma3_text": ("Gemma3Text", dict(num_key_value_heads=2, head_dim=12, sliding_window=4, query_pre_attn_scalar=10,
                                       rope_local_base_freq=100.0, sliding_window_pattern=2,
                                       rope_scaling=dict(rope_type="linear", factor=2.0))),
}
BF16_TOLERANCE = 0.06
"""bfloat16 logits (weights and compute) against transformers' bfloat16 logits, absolute: both
round differently at every op (8 bits of mantissa). Logits are O(1); measured 0.006 (Gemma) to
0.031 (Gemma3 text), so twice the worst case; a wrong tensor or mask is off by O(1)."""


def _randomize_(model: torch.nn.Module, seed: int, gemma: bool) -> None:
    """Every parameter drawn afresh: RMSNorm scales around 1 (Gemma stores w of (1 + w) around 0),
    biases non-zero, so a swapped or dropped tensor cannot go unnoticed."""
    generator = torch.Generator().manual_seed(seed)
    std = model.config.initializer_range
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = std * torch.randn(param.shape, generator=generator)
            is_norm_scale = "norm" in name and not gemma
            param.copy_(1.0 + noise if is_norm_scale else noise)


@pytest.fixture(scope="module")
def decoder(tmp_path_factory):
    """`decoder("llama", "ForSequenceClassification", num_labels=3)` -> (path, torch model), cached;
    treat both as read-only. `torch_dtype` casts the model before saving."""
    cache = {}

    def build(case: str, kind: str = "ForSequenceClassification", *, torch_dtype: str = "float32", **overrides):
        key = (case, kind, torch_dtype, tuple(sorted(overrides.items())))
        if key not in cache:
            prefix, family_overrides = CASES[case]
            # Gemma3's text-only causal LM is Gemma3ForCausalLM (Gemma3ForSequenceClassification is multimodal).
            name = "Gemma3ForCausalLM" if (prefix, kind) == ("Gemma3Text", "ForCausalLM") else prefix + kind
            model_cls = getattr(transformers, name)
            config = model_cls.config_class(**{**TINY, **family_overrides, **overrides})
            config._attn_implementation = "eager"
            torch.manual_seed(0)
            model = model_cls(config).eval()
            _randomize_(model, zlib.crc32(repr(key).encode()), gemma=prefix.startswith("Gemma"))
            model = model.to(getattr(torch, torch_dtype))
            path = tmp_path_factory.mktemp(f"{case}{kind}")
            model.save_pretrained(path)
            cache[key] = (path, model)
        return cache[key]

    return build


def batch(padding: str) -> dict[str, np.ndarray]:
    """Lengths (12, 9, 2), padded with 0 on `padding`'s side."""
    return padded_batch(padding, seq_len=SEQ_LEN, token_types=False)


# ---------------------------------------------------------------------------------------------
# Parity with transformers


@pytest.mark.parametrize("case", CASES)
def test_last_token_logits_match_transformers_on_both_padding_sides(decoder, case):
    # num_labels=1 (reward models) is compared with transformers by the export test below.
    num_labels = 3
    path, reference = decoder(case, num_labels=num_labels)
    model = flaxheads.from_pretrained(path)

    assert model.config.head == "last_token"
    for padding in ("right", "left"):
        logits = model(**flax_inputs(batch(padding)))
        assert logits.shape == (3, num_labels) and logits.dtype == jnp.float32
        assert_close(logits, torch_logits(reference, batch(padding)), f"{case} num_labels={num_labels} {padding}")


@pytest.mark.parametrize("case", ["llama", "qwen3", "gemma2", "gemma3_text"])
def test_every_hidden_state_matches_the_base_model_padding_included(decoder, case):
    path, reference = decoder(case, num_labels=3)
    backbone, info = flaxheads.load_backbone(path)

    out = backbone(**flax_inputs(batch("left")))

    expected = torch_forward(reference.model, batch("left"), output_hidden_states=True).hidden_states
    assert info.unused == ["score.weight"] and info.newly_initialized == []
    assert len(out.hidden_states) == len(expected) == TINY["num_hidden_layers"] + 1
    for layer, (ours, theirs) in enumerate(zip(out.hidden_states, expected)):
        assert_close(ours, theirs, f"{case} hidden state {layer}")
    np.testing.assert_array_equal(np.asarray(out.last_hidden_state), np.asarray(out.hidden_states[-1]))


@pytest.mark.parametrize("case", CASES)
def test_bfloat16_logits_match_transformers_bfloat16_within_the_stated_tolerance(decoder, case):
    path, reference = decoder(case, num_labels=3, torch_dtype="bfloat16")
    model = flaxheads.from_pretrained(path, dtype="bfloat16", param_dtype="auto")

    logits = model(**flax_inputs(batch("left")))

    assert model.head.score.kernel[...].dtype == jnp.bfloat16
    assert_close(logits, torch_logits(reference, batch("left")), f"{case} bfloat16", atol=BF16_TOLERANCE, rtol=0)


def test_explicit_position_ids_match_transformers(decoder):
    path, reference = decoder("gemma3_text", num_labels=3)
    inputs = batch("left")
    # Positions counted from each row's first real token in steps of 2: RoPE is relative, so only
    # ids that are not a shift of 0..T-1 change the logits.
    inputs["position_ids"] = 2 * np.maximum(np.cumsum(inputs["attention_mask"], axis=1) - 1, 0)
    model = flaxheads.from_pretrained(path)

    logits = model(**flax_inputs(inputs))

    assert_close(logits, torch_logits(reference, inputs), "gemma3_text explicit position_ids")
    assert np.abs(np.asarray(logits) - np.asarray(model(**flax_inputs(batch("left"))))).max() > 1e-3


def test_a_token_affects_only_later_positions_within_the_sliding_window(decoder):
    path, _ = decoder("mistral", "Model", num_hidden_layers=1)  # sliding_window=5: keys 0-4 back
    backbone, _ = flaxheads.load_backbone(path)
    ids = batch("right")["input_ids"][:1]
    changed = ids.copy()
    changed[0, 3] = changed[0, 3] % 90 + 3

    before, after = (np.asarray(backbone(jnp.asarray(x)).last_hidden_state)[0] for x in (ids, changed))

    differs = np.abs(before - after).max(axis=-1) > 0
    np.testing.assert_array_equal(differs, [False] * 3 + [True] * 5 + [False] * 4)


# ---------------------------------------------------------------------------------------------
# Configs


@pytest.mark.parametrize("case", CASES)
def test_config_json_of_either_transformers_dialect_reads_the_same_and_round_trips(decoder, case):
    path, reference = decoder(case, num_labels=3)
    written = json.loads((path / "config.json").read_text())  # transformers 5: rope_parameters

    config = DecoderConfig.from_hf_config(written)

    assert DecoderConfig.from_hf_config(config.to_hf_config()) == config
    attention = reference.model.layers[0].self_attn
    assert config.head_dim == attention.head_dim and config.attention_scale == attention.scaling
    # Mistral's attention reads the window from its config; the others keep it per layer.
    windows = [getattr(layer.self_attn, "sliding_window", getattr(reference.config, "sliding_window", None))
               for layer in reference.model.layers]
    assert [config.is_sliding(i) for i in range(3)] == [w is not None for w in windows]
    assert {w for w in windows} - {None} <= {config.effective_sliding_window}


def test_mistral_config_with_layer_types_matches_transformers_ministral_and_exports_them(tmp_path):
    # Ministral-8B ships as model_type "mistral" with layer_types; transformers' AutoConfig then
    # builds Ministral (sliding windows on the named layers only).
    layer_types = ["sliding_attention", "full_attention", "sliding_attention"]
    config = transformers.MinistralConfig(**{**TINY, "num_key_value_heads": 2, "head_dim": 8, "sliding_window": 5,
                                             "layer_types": layer_types, "num_labels": 3})
    torch.manual_seed(0)
    source = transformers.MinistralForSequenceClassification(config).eval()
    _randomize_(source, 14, gemma=False)
    source.save_pretrained(tmp_path / "source")
    written = json.loads((tmp_path / "source" / "config.json").read_text())
    (tmp_path / "source" / "config.json").write_text(json.dumps({**written, "model_type": "mistral"}))
    reference = transformers.AutoModelForSequenceClassification.from_pretrained(
        tmp_path / "source", attn_implementation="eager").eval()

    model = flaxheads.from_pretrained(tmp_path / "source")

    assert type(reference).__name__ == "MinistralForSequenceClassification"
    assert [model.config.backbone.is_sliding(i) for i in range(3)] == [True, False, True]
    for padding in ("right", "left"):
        assert_close(model(**flax_inputs(batch(padding))), torch_logits(reference, batch(padding)),
                     f"mistral with layer_types {padding}")
    model.save_pretrained(tmp_path / "export")
    exported = json.loads((tmp_path / "export" / "config.json").read_text())
    assert exported["model_type"] == "mistral" and exported["layer_types"] == layer_types
    assert_state_dicts_identical(state_dict(tmp_path / "export"), state_dict(tmp_path / "source"))


def test_plain_mistral_config_exports_without_layer_types_so_transformers_keeps_it_mistral():
    config = DecoderConfig.from_hf_config({"model_type": "mistral", **TINY, "sliding_window": 5})

    assert "layer_types" not in config.to_hf_config()
    assert DecoderConfig.from_hf_config(config.to_hf_config()) == config


def test_legacy_gemma3_config_with_pattern_and_local_base_reads_as_transformers():
    legacy = {"model_type": "gemma3_text", **TINY, "head_dim": 8, "rope_theta": 5000.0, "rope_local_base_freq": 50.0,
              "sliding_window_pattern": 3, "rope_scaling": {"rope_type": "linear", "factor": 4.0}}
    reference = transformers.Gemma3TextConfig(**{k: v for k, v in legacy.items() if k != "model_type"})

    config = DecoderConfig.from_hf_config(legacy)

    assert config.layer_types == tuple(reference.layer_types)
    assert (config.rope.theta, config.rope.rope_type, config.rope.factor) == (5000.0, "linear", 4.0)
    assert config.local_rope.theta == reference.rope_parameters["sliding_attention"]["rope_theta"] == 50.0


def test_legacy_gemma_gelu_means_the_tanh_approximation_as_in_transformers():
    config = DecoderConfig.from_hf_config({"model_type": "gemma", **TINY, "hidden_act": "gelu"})

    assert config.hidden_act == transformers.GemmaConfig(hidden_act="gelu").hidden_act == "gelu_pytorch_tanh"


def test_qwen2_sliding_window_without_use_sliding_window_is_ignored_as_in_transformers():
    config = DecoderConfig.from_hf_config({"model_type": "qwen2", **TINY, "sliding_window": 4})

    assert config.effective_sliding_window is None and not any(config.is_sliding(i) for i in range(3))


@pytest.mark.parametrize(("change", "message"), [
    ({"rope_scaling": {"rope_type": "yarn", "factor": 2.0}}, r"rope type 'yarn'"),
    ({"use_bidirectional_attention": True}, r"use_bidirectional_attention"),
])
def test_features_flaxheads_does_not_implement_are_refused_by_name(change, message):
    with pytest.raises(NotImplementedError, match=message):
        DecoderConfig.from_hf_config({"model_type": "gemma3_text", **TINY, **change})


def test_token_type_ids_are_refused_with_the_fix(decoder):
    path, _ = decoder("llama", num_labels=3)
    model = flaxheads.from_pretrained(path)
    inputs = flax_inputs(batch("right"))

    with pytest.raises(ValueError, match="pass token_type_ids=None"):
        model(**inputs, token_type_ids=jnp.zeros_like(inputs["input_ids"]))


# ---------------------------------------------------------------------------------------------
# Loading reports, exports, round trips


@pytest.mark.parametrize(("case", "tied"), [("llama", False), ("gemma", True)])
def test_causal_lm_checkpoint_reports_lm_head_unused_and_score_new(decoder, case, tied):
    path, _ = decoder(case, "ForCausalLM", tie_word_embeddings=tied)

    _, info = flaxheads.from_pretrained(path, num_labels=1, output_loading_info=True)

    assert info.newly_initialized == ["score.weight"] and info.mismatched == []
    # A tied lm_head is the embedding matrix: transformers does not write it.
    assert info.unused == ([] if tied else ["lm_head.weight"])
    assert all(name.startswith("model.") for name in info.loaded)


@pytest.mark.parametrize("case", CASES)
def test_new_reward_model_export_loads_in_transformers_with_no_missing_or_unexpected_keys(decoder, case, tmp_path):
    path, _ = decoder(case, "ForCausalLM")
    model = flaxheads.from_pretrained(path, num_labels=1, seed=3)
    model.save_pretrained(tmp_path)

    loaded, info = transformers.AutoModelForSequenceClassification.from_pretrained(
        tmp_path, output_loading_info=True, attn_implementation="eager")

    assert type(loaded).__name__ == f"{CASES[case][0]}ForSequenceClassification"
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    assert loaded.config.num_labels == 1
    assert_close(model(**flax_inputs(batch("left"))), torch_logits(loaded.eval(), batch("left")), f"{case} export")


@pytest.mark.parametrize("case", CASES)
def test_pytorch_flaxheads_pytorch_round_trip_is_bit_identical(decoder, case, tmp_path):
    path, _ = decoder(case, num_labels=3)

    flaxheads.from_pretrained(path, param_dtype="auto").save_pretrained(tmp_path)

    assert_state_dicts_identical(state_dict(tmp_path), state_dict(path))


def test_bfloat16_round_trip_is_bit_identical_and_flax_format_round_trip_exact(decoder, tmp_path):
    path, _ = decoder("gemma2", num_labels=3, torch_dtype="bfloat16")
    model = flaxheads.from_pretrained(path, param_dtype="auto")

    model.save_pretrained(tmp_path / "pt")
    model.save_pretrained(tmp_path / "flax", format="flaxheads")
    again, info = flaxheads.from_pretrained(tmp_path / "flax", param_dtype="auto", output_loading_info=True)

    assert_state_dicts_identical(state_dict(tmp_path / "pt"), state_dict(path))
    assert info.fully_pretrained and again.config == model.config
    assert_same_params(again, model)


@pytest.mark.parametrize("padding", ["right", "left"])
def test_mean_head_on_qwen2_matches_a_torch_reference_and_round_trips(decoder, tmp_path, padding):
    path, reference = decoder("qwen2", "Model")
    model = flaxheads.from_pretrained(path, head="mean", num_labels=3, seed=1)

    model.save_pretrained(tmp_path)
    again = flaxheads.from_pretrained(tmp_path)

    exported = load_file(tmp_path / "model.safetensors")
    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == ["Qwen2Model"]
    assert_same_params(again, model)
    hidden = torch_forward(reference, batch(padding)).last_hidden_state
    mask = torch.from_numpy(batch(padding)["attention_mask"])[..., None].float()
    pooled = (hidden * mask).sum(1) / mask.sum(1)
    expected = torch.nn.functional.linear(pooled, exported["head.classifier.weight"], exported["head.classifier.bias"])
    assert_close(again(**flax_inputs(batch(padding))), expected, f"mean head on qwen2, {padding} padding")


def test_every_family_is_registered_with_its_tokenizers_padding_side():
    from flaxheads.backbones import BACKBONES
    from flaxheads.conversion import TABLES

    assert set(FAMILIES) <= set(BACKBONES) and set(FAMILIES) <= set(TABLES)
    sides = {t: BACKBONES[t].padding_side for t in FAMILIES}
    assert sides == {"llama": "left", "mistral": "left", "gemma": "left", "gemma2": "left", "gemma3_text": "left",
                     "qwen2": "right", "qwen3": "right"}


# ---------------------------------------------------------------------------------------------
# Sharding on fake devices

_SHARDED_FORWARD = textwrap.dedent(
    """
    import sys, jax, jax.numpy as jnp, numpy as np
    import flaxheads
    from flaxheads.conversion.loading import flat_variables
    from flaxheads.training.sharding import Layout
    ids = jnp.asarray(np.random.RandomState(0).randint(3, 99, size=(4, 9)))
    expected = flaxheads.from_pretrained(sys.argv[1])(ids)
    model = flaxheads.from_pretrained(sys.argv[1], placement=Layout.create("fsdp=4").param_sharding)
    split = sorted(name for name, (_, var) in flat_variables(model).items()
                   if not var[...].sharding.is_fully_replicated)
    print("SPLIT", " ".join(split))
    print("DIFF", float(jnp.abs(model(ids) - expected).max()))
    """
)


def test_fsdp_rules_split_decoder_kernels_and_embeddings_on_four_fake_devices(decoder):
    path, _ = decoder("gemma3_text", num_labels=4)
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=4"}

    proc = subprocess.run([sys.executable, "-c", _SHARDED_FORWARD, str(path)], env=env,
                          capture_output=True, text=True, check=True)

    lines = dict(line.split(" ", 1) for line in proc.stdout.splitlines() if line.startswith(("SPLIT", "DIFF")))
    split = set(lines["SPLIT"].split())
    # A dimension the 4 devices do not divide stays whole (vocab 99, intermediate 37).
    assert {"backbone.layers.0.attention.query.kernel", "backbone.layers.1.attention.output.kernel",
            "backbone.layers.2.mlp.up.kernel", "head.score.kernel"} <= split
    assert not any(name.endswith("scale") for name in split)
    assert float(lines["DIFF"]) < 1e-5


# ---------------------------------------------------------------------------------------------
# The command line on a tiny Llama with a tokenizer (no pad token, as Llama's)


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    from tokenizers import ByteLevelBPETokenizer

    texts = ["a gorgeous, moving film", "tedious and dull", "what a great story", "the worst plot ever"] * 20
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(texts, vocab_size=300, special_tokens=["<s>", "</s>"], show_progress=False)
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<s>", eos_token="</s>")
    path = tmp_path_factory.mktemp("tiny_llama")
    config = transformers.LlamaConfig(**{**TINY, "vocab_size": len(tokenizer), "pad_token_id": None,
                                         "bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
                                         "num_key_value_heads": 2})
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def review_csv(tmp_path_factory):
    folder = tmp_path_factory.mktemp("reviews")
    rows = [("a gorgeous, moving film", "positive"), ("the worst plot ever, so dull", "negative"),
            ("what a great story", "positive"), ("tedious and dull", "negative")] * 4
    for split in ("train", "validation"):
        (folder / f"{split}.csv").write_text("sentence,label\n" + "\n".join(f'"{t}",{label}' for t, label in rows))
    return folder


def test_train_evaluate_predict_inspect_and_convert_commands_work_on_llama(tiny_llama, review_csv, tmp_path, capsys):
    from flaxheads.cli import main

    run = tmp_path / "run"
    data = ["--train_file", str(review_csv / "train.csv"), "--validation_file", str(review_csv / "validation.csv"),
            "--text_column", "sentence", "--max_seq_length", "16"]
    assert main(["train", "--model_name_or_path", str(tiny_llama), "--output_dir", str(run), *data,
                 "--per_device_train_batch_size", "4", "--max_steps", "2", "--logging_steps", "1",
                 "--save_steps", "2", "--disable_tqdm"]) == 0
    exported = json.loads((run / "config.json").read_text())
    assert exported["model_type"] == "llama" and exported["architectures"] == ["LlamaForSequenceClassification"]
    assert exported["pad_token_id"] == exported["eos_token_id"]  # Llama has no pad token: eos pads
    capsys.readouterr()

    assert main(["evaluate", "--model_name_or_path", str(run), *data, "--split", "validation"]) == 0
    assert "accuracy" in json.loads(capsys.readouterr().out)

    texts = ["what a great story", "so dull"]
    assert main(["predict", "--model_name_or_path", str(run), *texts]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    reference = transformers.AutoModelForSequenceClassification.from_pretrained(run, attn_implementation="eager").eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(run)
    tokenizer.pad_token_id, tokenizer.padding_side = exported["pad_token_id"], "left"
    enc = tokenizer(texts, padding=True, return_tensors="np")
    expected = torch.softmax(torch.as_tensor(torch_logits(reference, dict(enc))), -1).numpy()
    assert [r["text"] for r in rows] == texts
    for row, p in zip(rows, expected):
        np.testing.assert_allclose(list(row["probabilities"].values()), p, atol=1e-5)

    # An empty text gives no tokens (this tokenizer adds no BOS): refused, as transformers refuses it.
    assert main(["predict", "--model_name_or_path", str(run), "so dull", ""]) == 2
    assert "give no tokens at all" in capsys.readouterr().err
    with pytest.raises(ValueError, match="give no tokens at all"):
        flaxheads.pipeline(model=str(run))("")
    # A tokenizer saved to return token types (Llama has none) is read without them.
    typed = tmp_path / "typed"
    shutil.copytree(run, typed)
    tokenizer_config = json.loads((typed / "tokenizer_config.json").read_text())
    tokenizer_config["model_input_names"] = ["input_ids", "token_type_ids", "attention_mask"]
    (typed / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    assert main(["predict", "--model_name_or_path", str(typed), *texts]) == 0
    assert [json.loads(line) for line in capsys.readouterr().out.splitlines()] == rows

    assert main(["inspect", str(tiny_llama), "--num_labels", "3"]) == 0
    out = capsys.readouterr().out
    assert "model_type: llama" in out and "score.weight" in out and "lm_head.weight" in out

    assert main(["convert", str(run), str(tmp_path / "flax"), "--to", "flaxheads"]) == 0
    assert main(["convert", str(tmp_path / "flax"), str(tmp_path / "back"), "--to", "pytorch"]) == 0
    assert_state_dicts_identical(state_dict(tmp_path / "back"), state_dict(run))


def test_every_head_gives_finite_logits_on_decoder_hidden_states():
    from flax import nnx

    from flaxheads.heads import HEAD_NAMES, HeadInputs, build_head

    config = flaxheads.ClassifierConfig(
        backbone=DecoderConfig.from_hf_config({"model_type": "gemma2", **TINY, "num_hidden_layers": 4, "head_dim": 8}),
        head="last_token", num_labels=3)
    model = flaxheads.SequenceClassifier(config, rngs=nnx.Rngs(0))
    model.eval()
    inputs = flax_inputs(batch("left"))
    hidden = model.backbone(**inputs).hidden_states
    for name in HEAD_NAMES:
        head_config = dataclasses.replace(config, head=name).head_config()
        head = build_head(head_config, dtype=jnp.float32, param_dtype=jnp.float32, rngs=nnx.Rngs(1))
        head.eval()

        logits = head(HeadInputs(hidden, inputs["attention_mask"], inputs["input_ids"], None))

        assert logits.shape == (3, 3) and bool(jnp.isfinite(logits).all()), name
