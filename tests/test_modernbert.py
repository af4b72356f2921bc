"""ModernBERT and the "modernbert" head: what is particular to them. Both transformers config
layouts, the sliding window (in eval and under attention dropout), the masked-LM head never
filling another head, the head on BERT against transformers' ModernBertPredictionHead, head
options written back for transformers, and the loading report transformers itself gives. The
scenarios every family shares (row "modernbert" of tests/families.py) are in tests/test_family_*.py."""

from __future__ import annotations

import json
import shutil

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx
from safetensors.torch import load_file

import flaxheads
from families import MODERNBERT, MODERNBERT_SEQ_LEN, padded_batch
from family_parity import assert_close, assert_same_params, flax_inputs, torch_forward
from flaxheads.backbones import ModernBertConfig, attention

TINY_MODERNBERT = MODERNBERT.config
SEQ_LEN = MODERNBERT_SEQ_LEN


def modernbert(hf_checkpoint, architecture: str, **overrides):
    """(path, torch model) of the ModernBERT row's checkpoint (tests/families.py; eager attention)."""
    return hf_checkpoint(architecture, **overrides)


def token_batch(padding: str = "right", *, seed: int = 0):
    """Three sequences of lengths (13, 10, 2) padded on `padding`: longer than the sliding window."""
    return MODERNBERT.batch(padding, seed=seed)


# ---------------------------------------------------------------------------------------------
# Config


def test_config_reads_transformers_5_and_4_layouts_and_writes_both():
    hf5 = transformers.ModernBertConfig(**TINY_MODERNBERT).to_dict()
    legacy = {k: v for k, v in hf5.items() if k not in ("layer_types", "rope_parameters")}
    legacy.update(global_rope_theta=500.0, local_rope_theta=77.0)

    config = ModernBertConfig.from_hf_config(hf5)

    assert config == ModernBertConfig.from_hf_config(legacy)
    assert config.layer_types == ("full_attention", "sliding_attention", "sliding_attention", "full_attention")
    assert (config.global_rope_theta, config.local_rope_theta, config.sliding_window) == (500.0, 77.0, 2)
    written = config.to_hf_config()
    assert written["rope_parameters"]["sliding_attention"]["rope_theta"] == 77.0
    assert written["global_attn_every_n_layers"] == 3 and ModernBertConfig.from_hf_config(written) == config
    assert transformers.ModernBertConfig(**written).layer_types == list(config.layer_types)
    with pytest.raises(ValueError, match="head_dim=11 .* is odd"):
        ModernBertConfig(hidden_size=44, num_attention_heads=4)
    with pytest.raises(NotImplementedError, match="rope_type='yarn'"):
        ModernBertConfig.from_hf_config({**hf5, "rope_parameters": {"full_attention": {"rope_type": "yarn"}}})


# ---------------------------------------------------------------------------------------------
# The sliding window


@pytest.mark.slow  # runs the family beyond its canonical parity (the fast lane has that)
def test_a_window_shorter_than_the_sequence_changes_the_output(hf_checkpoint, tmp_path):
    path, _ = modernbert(hf_checkpoint, "ModernBertModel")
    batch = token_batch("right")
    config = json.loads((path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "local_attention": 2 * SEQ_LEN}))
    shutil.copy(path / "model.safetensors", tmp_path)
    windowed, _ = flaxheads.load_backbone(path)
    unwindowed, _ = flaxheads.load_backbone(tmp_path)

    difference = np.abs(np.asarray(windowed(**flax_inputs(batch)).last_hidden_state
                                   - unwindowed(**flax_inputs(batch)).last_hidden_state))

    # Row 0 (13 real tokens) sees farther than 2 positions without the window; row 2 (2 tokens) never does.
    assert difference[0].max() > 1e-3 and difference[2, :2].max() < 1e-5


@pytest.mark.slow  # train-mode attention dropout
def test_attention_dropout_in_training_keeps_the_sliding_window():
    rng = np.random.default_rng(0)
    query, key, value = (jnp.asarray(rng.normal(size=(1, 9, 2, 4)), jnp.float32) for _ in range(3))
    far_changed = value.at[:, 8].set(100.0)

    outputs = [attention.attend(query, key, v, None, local_window_size=2, dropout_rate=0.5, deterministic=False,
                             rngs=nnx.Rngs(dropout=0)) for v in (value, far_changed)]

    # Queries 0..5 are more than 2 positions from key 8: the materialised (dropout) path masks it too.
    np.testing.assert_array_equal(np.asarray(outputs[0][:, :6]), np.asarray(outputs[1][:, :6]))
    assert np.max(np.abs(np.asarray(outputs[0][:, 6:] - outputs[1][:, 6:]))) > 1.0


# ---------------------------------------------------------------------------------------------
# Every head on ModernBERT, the "modernbert" head on BERT


def test_masked_lm_prediction_head_never_fills_another_heads_parameters(hf_checkpoint):
    path, _ = modernbert(hf_checkpoint, "ModernBertForMaskedLM")

    _, info = flaxheads.from_pretrained(path, head="roberta", num_labels=3, seed=1, output_loading_info=True)

    # head.dense and head.norm are ModernBERT's prediction head's: the roberta head's are new.
    assert info.newly_initialized and all(name.startswith("flaxheads_head.") for name in info.newly_initialized)
    assert {"head.dense.weight", "head.norm.weight", "decoder.bias"} <= set(info.unused)


@pytest.mark.slow  # runs the family beyond its canonical parity (the fast lane has that)
def test_modernbert_head_on_bert_matches_modernbert_prediction_head(hf_checkpoint, tmp_path):
    pooling, padding = "mean", "left"
    checkpoint = hf_checkpoint("BertModel")
    batch = padded_batch(padding, seq_len=10, pad_id=0)
    model = flaxheads.from_pretrained(checkpoint.path, head="modernbert", num_labels=4, seed=3,
                                      head_options={"classifier_pooling": pooling, "classifier_bias": True})
    model.save_pretrained(tmp_path)
    exported = load_file(tmp_path / "model.safetensors")

    config = transformers.ModernBertConfig(hidden_size=32, num_attention_heads=4, classifier_bias=True)
    head = transformers.models.modernbert.modeling_modernbert.ModernBertPredictionHead(config).eval()
    classifier = torch.nn.Linear(32, 4)
    head.load_state_dict({k[len("head."):]: v for k, v in exported.items() if k.startswith("head.") and "classifier" not in k})
    classifier.load_state_dict({k[len("head.classifier."):]: v for k, v in exported.items() if k.startswith("head.classifier.")})
    last = torch_forward(checkpoint.model, batch).last_hidden_state
    mask = torch.as_tensor(batch["attention_mask"])[..., None].float()
    pooled = last[:, 0] if pooling == "cls" else (last * mask).sum(1) / mask.sum(1)
    with torch.no_grad():
        expected = classifier(head(pooled))
    assert sorted(k for k in exported if k.startswith("head.")) == [
        "head.classifier.bias", "head.classifier.weight", "head.dense.bias", "head.dense.weight", "head.norm.weight"
    ]
    assert_close(model(**flax_inputs(batch)), expected, f"modernbert head ({pooling}) on BERT, {padding} padding")
    again = flaxheads.from_pretrained(tmp_path)
    assert again.config.head == "modernbert" and dict(again.config.head_options)["classifier_pooling"] == pooling
    assert_same_params(again, model)


@pytest.mark.slow  # runs the family beyond its canonical parity (the fast lane has that)
def test_head_option_overrides_config_json_and_is_written_back_for_transformers(hf_checkpoint, tmp_path):
    path, _ = modernbert(hf_checkpoint, "ModernBertForSequenceClassification", num_labels=3)
    batch = token_batch("left")
    model = flaxheads.from_pretrained(path, head_options={"classifier_pooling": "mean"})
    model.save_pretrained(tmp_path)

    reloaded = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path, attn_implementation="eager")

    assert json.loads((tmp_path / "config.json").read_text())["classifier_pooling"] == "mean"
    assert reloaded.config.classifier_pooling == "mean"
    assert_close(model(**flax_inputs(batch)), torch_forward(reloaded.eval(), batch).logits, "mean pooling, written back")


def test_a_head_norm_option_other_than_the_backbones_is_refused_on_modernbert(hf_checkpoint):
    path, _ = modernbert(hf_checkpoint, "ModernBertForSequenceClassification", num_labels=3)

    with pytest.raises(ValueError, match="norm_eps.*leave norm_eps out of head_options"):
        flaxheads.from_pretrained(path, head_options={"norm_eps": 1e-3})


# ---------------------------------------------------------------------------------------------
# Loading report

@pytest.mark.parametrize("architecture", ["ModernBertModel", "ModernBertForMaskedLM"])
def test_every_layer_and_the_final_norm_are_loaded(hf_checkpoint, architecture):
    _, info = flaxheads.from_pretrained(modernbert(hf_checkpoint, architecture)[0], num_labels=2,
                                        output_loading_info=True)

    assert {"layers.3.attn.Wqkv.weight", "final_norm.weight"} <= {name.removeprefix("model.") for name in info.loaded}


def test_loading_report_matches_what_transformers_reports_for_a_masked_lm_checkpoint(hf_checkpoint):
    path, _ = modernbert(hf_checkpoint, "ModernBertForMaskedLM")

    _, info = flaxheads.from_pretrained(path, num_labels=2, output_loading_info=True)
    _, hf_info = transformers.ModernBertForSequenceClassification.from_pretrained(path, output_loading_info=True)

    assert set(info.newly_initialized) == hf_info["missing_keys"] and set(info.unused) == hf_info["unexpected_keys"]


