"""Decoder LLMs (Llama, Mistral, Qwen2, Qwen3, Gemma, Gemma2, Gemma3 text): what is particular to
them. bfloat16 weights against transformers' bfloat16 model, explicit positions, the sliding
window, configs in both config.json dialects (and Ministral's layer_types), what they refuse, and
the backbone registry with each tokenizer's padding side. Tiny random models: vocab 99 (pad 0), 32
wide, 4 query heads, 3 layers, sequences of 12 with sliding windows of 4-5, every weight (norms
and biases included) drawn at random. The scenarios every family shares (the decoder rows of
tests/families.py) are in tests/test_family_*.py.
"""

from __future__ import annotations

import json

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

import flaxheads
from families import DECODERS, FAMILIES, TINY_CONFIG, randomize_
from family_parity import assert_close, assert_state_dicts_identical, flax_inputs, state_dict, torch_logits
from flaxheads.backbones.decoder_config import FAMILIES as DECODER_FAMILIES, DecoderConfig

TINY = dict(TINY_CONFIG, num_hidden_layers=3, pad_token_id=0, bos_token_id=1, eos_token_id=2)
CASES = [pytest.param(row, id=row.name) for row in DECODERS]
BF16_TOLERANCE = 0.06
"""bfloat16 logits (weights and compute) against transformers' bfloat16 logits, absolute: both
round differently at every op (8 bits of mantissa). Logits are O(1); measured 0.006 (Gemma) to
0.031 (Gemma3 text), so twice the worst case; a wrong tensor or mask is off by O(1)."""


def decoder(hf_checkpoint, row, kind: str = "ForSequenceClassification", **overrides):
    """(path, torch model) of the row's `kind` checkpoint (tests/families.py; eager attention)."""
    architecture = {"ForSequenceClassification": row.classifier, "Model": row.base, "ForCausalLM": row.pretrained}[kind]
    return hf_checkpoint(architecture, family=row.name, **overrides)


def batch(padding: str) -> dict[str, np.ndarray]:
    """Lengths (12, 9, 2), padded with 0 on `padding`'s side."""
    return DECODERS[0].batch(padding)


# ---------------------------------------------------------------------------------------------
# Parity with transformers


@pytest.mark.parametrize("row", CASES)
@pytest.mark.slow  # runs the family beyond its canonical parity (the fast lane has that)
def test_bfloat16_logits_match_transformers_bfloat16_within_the_stated_tolerance(hf_checkpoint, row):
    case = row.name
    path, reference = decoder(hf_checkpoint, row, num_labels=3, torch_dtype="bfloat16")
    model = flaxheads.from_pretrained(path, dtype="bfloat16", param_dtype="auto")

    logits = model(**flax_inputs(batch("left")))

    assert model.head.score.kernel[...].dtype == jnp.bfloat16
    assert_close(logits, torch_logits(reference, batch("left")), f"{case} bfloat16", atol=BF16_TOLERANCE, rtol=0)


@pytest.mark.slow  # runs the family beyond its canonical parity (the fast lane has that)
def test_explicit_position_ids_match_transformers(hf_checkpoint):
    path, reference = decoder(hf_checkpoint, FAMILIES["gemma3_text"], num_labels=3)
    inputs = batch("left")
    # Positions counted from each row's first real token in steps of 2: RoPE is relative, so only
    # ids that are not a shift of 0..T-1 change the logits.
    inputs["position_ids"] = 2 * np.maximum(np.cumsum(inputs["attention_mask"], axis=1) - 1, 0)
    model = flaxheads.from_pretrained(path)

    logits = model(**flax_inputs(inputs))

    assert_close(logits, torch_logits(reference, inputs), "gemma3_text explicit position_ids")
    assert np.abs(np.asarray(logits) - np.asarray(model(**flax_inputs(batch("left"))))).max() > 1e-3


@pytest.mark.slow  # runs the family beyond its canonical parity (the fast lane has that)
def test_a_token_affects_only_later_positions_within_the_sliding_window(hf_checkpoint):
    path, _ = decoder(hf_checkpoint, FAMILIES["mistral"], "Model", num_hidden_layers=1)  # sliding_window=5: keys 0-4 back
    backbone, _ = flaxheads.load_backbone(path)
    ids = batch("right")["input_ids"][:1]
    changed = ids.copy()
    changed[0, 3] = changed[0, 3] % 90 + 3

    before, after = (np.asarray(backbone(jnp.asarray(x)).last_hidden_state)[0] for x in (ids, changed))

    differs = np.abs(before - after).max(axis=-1) > 0
    np.testing.assert_array_equal(differs, [False] * 3 + [True] * 5 + [False] * 4)


# ---------------------------------------------------------------------------------------------
# Configs


@pytest.mark.parametrize("row", CASES)
def test_config_json_of_either_transformers_dialect_reads_the_same_and_round_trips(hf_checkpoint, row):
    path, reference = decoder(hf_checkpoint, row, num_labels=3)
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


@pytest.mark.slow  # runs the family beyond its canonical parity (the fast lane has that)
def test_mistral_config_with_layer_types_matches_transformers_ministral_and_exports_them(tmp_path):
    # Ministral-8B ships as model_type "mistral" with layer_types; transformers' AutoConfig then
    # builds Ministral (sliding windows on the named layers only).
    layer_types = ["sliding_attention", "full_attention", "sliding_attention"]
    config = transformers.MinistralConfig(**{**TINY, "num_key_value_heads": 2, "head_dim": 8, "sliding_window": 5,
                                             "layer_types": layer_types, "num_labels": 3})
    torch.manual_seed(0)
    source = transformers.MinistralForSequenceClassification(config).eval()
    randomize_(source, 14, norm_scales="norm")
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


def test_token_type_ids_are_refused_with_the_fix(hf_checkpoint):
    path, _ = decoder(hf_checkpoint, FAMILIES["llama"], num_labels=3)
    model = flaxheads.from_pretrained(path)
    inputs = flax_inputs(batch("right"))

    with pytest.raises(ValueError, match="pass token_type_ids=None"):
        model(**inputs, token_type_ids=jnp.zeros_like(inputs["input_ids"]))


# ---------------------------------------------------------------------------------------------
# Loading reports, the backbone registry


@pytest.mark.parametrize("row", [pytest.param(FAMILIES[name], id=name) for name in ("llama", "gemma")])
def test_causal_lm_checkpoint_loads_its_model_backbone_and_nothing_else(hf_checkpoint, row):
    path, _ = decoder(hf_checkpoint, row, "ForCausalLM")

    _, info = flaxheads.from_pretrained(path, num_labels=1, output_loading_info=True)

    assert all(name.startswith("model.") for name in info.loaded)


def test_every_family_is_registered_with_its_tokenizers_padding_side():
    from flaxheads.backbones import BACKBONES
    from flaxheads.conversion import TABLES

    assert set(DECODER_FAMILIES) <= set(BACKBONES) and set(DECODER_FAMILIES) <= set(TABLES)
    sides = {t: BACKBONES[t].padding_side for t in DECODER_FAMILIES}
    assert sides == {"llama": "left", "mistral": "left", "gemma": "left", "gemma2": "left", "gemma3_text": "left",
                     "qwen2": "right", "qwen3": "right"}


