"""XLNet and the "summary" head: what is particular to them. Token types or none, every summary
option, backbone switches, cls_index, dropout, the padding side (and transformers' right-padding
bug flaxheads avoids), head options written where transformers reads them, the loading report's
notes, the "summary" head on BERT against transformers' XLNetSequenceSummary, and the errors.
Tiny random models; XLNet's sentencepiece tokenizer is not needed (random ids). The scenarios every
family shares (row "xlnet" of tests/families.py) are in tests/test_family_*.py."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx
from safetensors.numpy import load_file as load_numpy, save_file as save_numpy
from safetensors.torch import load_file

import flaxheads
from families import xlnet_batch
from family_parity import assert_close, assert_state_dicts_identical, flax_inputs, torch_forward
from flaxheads.convert import convert
from flaxheads.heads.summary import SUMMARY_DEFAULTS


def xlnet_checkpoint(hf_checkpoint, architecture: str, **overrides):
    """(path, torch model) of the XLNet row's checkpoint (tests/families.py)."""
    return hf_checkpoint(architecture, **overrides)


# ---------------------------------------------------------------------------------------------
# Parity: XLNetForSequenceClassification logits


@pytest.mark.parametrize("padding", ["none", "left"])
@pytest.mark.slow  # runs the family beyond its canonical parity (the fast lane has that)
def test_logits_match_transformers_without_token_type_ids(hf_checkpoint, padding):
    path, reference = xlnet_checkpoint(hf_checkpoint, "XLNetForSequenceClassification", num_labels=3)
    batch = xlnet_batch(padding, token_types=False)
    model = flaxheads.from_pretrained(path)

    assert_close(model(**flax_inputs(batch)), torch_forward(reference, batch).logits, f"no token types, {padding}")


@pytest.mark.slow  # runs the family beyond its canonical parity (the fast lane has that)
def test_token_type_ids_reach_the_logits_as_in_transformers(hf_checkpoint):
    path, reference = xlnet_checkpoint(hf_checkpoint, "XLNetForSequenceClassification", num_labels=3)
    batch = xlnet_batch("none")
    model = flaxheads.from_pretrained(path)
    zeros = {**batch, "token_type_ids": np.zeros_like(batch["token_type_ids"])}

    with_types, all_zero = model(**flax_inputs(batch)), model(**flax_inputs(zeros))
    without = model(**flax_inputs({k: v for k, v in batch.items() if k != "token_type_ids"}))

    assert_close(all_zero, torch_forward(reference, zeros).logits, "all-zero token types")
    # Segment scores are small with these random weights; differences stay far above float noise (1e-7).
    assert np.max(np.abs(np.asarray(with_types - all_zero))) > 1e-4
    # No token types means no segment score; with one segment the score is the same for every key,
    # which the softmax cancels: both equal transformers' logits.
    assert_close(without, torch_forward(reference, {k: v for k, v in batch.items() if k != "token_type_ids"}).logits, "none")
    assert_close(without, all_zero, "no token types vs all zeros")


@pytest.mark.parametrize(
    "options",
    [
        dict(summary_use_proj=False),
        dict(summary_activation=""),  # transformers 5's spelling of "none" (its config refuses None)
        dict(summary_activation="relu", summary_first_dropout=0.3, summary_last_dropout=0.0),
        dict(summary_activation="gelu", summary_type="mean", summary_use_proj=False),
        dict(summary_proj_to_labels=True, num_labels=32),  # works in transformers only if num_labels == d_model
    ],
    ids=["no_proj", "no_activation", "relu_first_dropout", "gelu_mean_no_proj", "proj_to_labels"],
)
@pytest.mark.slow  # runs the family beyond its canonical parity (the fast lane has that)
def test_every_summary_option_matches_transformers(hf_checkpoint, options):
    options = {"num_labels": 3, **options}
    path, reference = xlnet_checkpoint(hf_checkpoint, "XLNetForSequenceClassification", **options)
    batch = xlnet_batch("left")
    model, info = flaxheads.from_pretrained(path, output_loading_info=True)

    assert info.fully_pretrained and info.unused == []
    assert (model.head.summary is None) == (options.get("summary_use_proj") is False)
    assert_close(model(**flax_inputs(batch)), torch_forward(reference, batch).logits, f"options {options}")


@pytest.mark.parametrize("backbone_options", [dict(clamp_len=3, ff_activation="relu"), dict(n_layer=4, ff_activation="gelu_new")])
@pytest.mark.slow  # runs the family beyond its canonical parity (the fast lane has that)
def test_backbone_variants_match_transformers(hf_checkpoint, backbone_options):
    path, reference = xlnet_checkpoint(hf_checkpoint, "XLNetForSequenceClassification", num_labels=2, **backbone_options)
    batch = xlnet_batch("left", seq_len=12)
    model = flaxheads.from_pretrained(path)

    assert_close(model(**flax_inputs(batch)), torch_forward(reference, batch).logits, f"backbone {backbone_options}")


@pytest.mark.slow  # runs the family beyond its canonical parity (the fast lane has that)
def test_cls_index_input_matches_xlnet_sequence_summary(hf_checkpoint):
    # XLNetForSequenceClassification never passes cls_index; its summary module takes one.
    path, reference = xlnet_checkpoint(hf_checkpoint, "XLNetForSequenceClassification", num_labels=3, summary_type="cls_index")
    batch = xlnet_batch("right")
    cls_index = batch["attention_mask"].sum(axis=1) - 1  # the last real token of right-padded rows
    cls_index[0] = 4
    model = flaxheads.from_pretrained(path)

    logits = model(**flax_inputs(batch), cls_index=jnp.asarray(cls_index))

    hidden = torch_forward(reference.transformer, batch).last_hidden_state
    with torch.no_grad():
        expected = reference.logits_proj(reference.sequence_summary(hidden, torch.from_numpy(cls_index)))
    assert_close(logits, expected, "cls_index given")
    jitted = jax.jit(lambda m, inputs, index: m(**inputs, cls_index=index))
    assert_close(jitted(model, flax_inputs(batch), jnp.asarray(cls_index)), expected, "cls_index given, under jit")


@pytest.mark.slow  # compiles the gradient of a train-mode model
def test_dropout_is_active_only_in_train_mode_and_gradients_flow(hf_checkpoint):
    path, _ = xlnet_checkpoint(hf_checkpoint, "XLNetForSequenceClassification", num_labels=3, summary_first_dropout=0.2)
    batch = flax_inputs(xlnet_batch("left"))
    model = flaxheads.from_pretrained(path)

    def loss_and_logits(m):
        logits = m(**batch, rngs=nnx.Rngs(dropout=1))
        return m.loss(logits, jnp.array([0, 1, 2])), logits

    deterministic = [np.asarray(model(**batch)) for _ in range(2)]
    model.train()
    # One compilation: random-bit generation makes dropout programs slow to compile on CPU.
    (_, with_dropout), grads = nnx.jit(nnx.value_and_grad(loss_and_logits, has_aux=True))(model)

    np.testing.assert_array_equal(deterministic[0], deterministic[1])
    assert np.max(np.abs(np.asarray(with_dropout) - deterministic[0])) > 1e-4
    assert np.all(np.isfinite(np.asarray(grads.backbone.layers[0].attention.r_w_bias[...])))
    assert np.any(np.asarray(grads.backbone.layers[0].attention.r_w_bias[...]) != 0)
    # mask_emb is the pretraining query stream's input: classification never reads it.
    assert not np.any(np.asarray(grads.backbone.mask_emb[...]))


# ---------------------------------------------------------------------------------------------
# Padding side


@pytest.mark.slow  # compiles a program per row length
def test_left_padded_rows_give_the_logits_of_the_unpadded_sequences(hf_checkpoint):
    path, _ = xlnet_checkpoint(hf_checkpoint, "XLNetForSequenceClassification", num_labels=3)
    batch = xlnet_batch("left")
    model = flaxheads.from_pretrained(path)

    forward = nnx.jit(lambda m, inputs: m(**inputs))

    padded = np.asarray(forward(model, flax_inputs(batch)))

    for row in range(3):
        real = batch["attention_mask"][row] == 1
        alone = {k: v[row : row + 1, real] for k, v in batch.items()}
        assert_close(padded[row : row + 1], forward(model, flax_inputs(alone)), f"row {row} alone vs left-padded")


@pytest.mark.parametrize("summary_type", ["last", "cls_index"])
@pytest.mark.slow  # runs the family beyond its canonical parity (the fast lane has that)
def test_last_summary_reads_the_last_real_token_of_right_padded_rows(hf_checkpoint, summary_type):
    """transformers reads position -1, a pad token, and returns wrong logits (transformers #1882);
    flaxheads reads the last real token, so right padding classifies like left padding."""
    path, reference = xlnet_checkpoint(hf_checkpoint, "XLNetForSequenceClassification", num_labels=3, summary_type=summary_type)
    left, right = xlnet_batch("left"), xlnet_batch("right")
    model = flaxheads.from_pretrained(path)

    from_right = model(**flax_inputs(right))

    expected = torch_forward(reference, left).logits
    assert_close(from_right, expected, f"{summary_type}: right padding vs transformers on left padding")
    transformers_on_right = torch_forward(reference, right).logits.numpy()
    assert np.max(np.abs(transformers_on_right[1:] - expected.numpy()[1:])) > 1e-3  # the bug we avoid


@pytest.mark.slow  # runs the family beyond its canonical parity (the fast lane has that)
def test_mean_summary_averages_padding_as_transformers_does_unlike_the_mean_head(hf_checkpoint):
    path, reference = xlnet_checkpoint(hf_checkpoint, "XLNetForSequenceClassification", num_labels=3, summary_type="mean")
    batch = xlnet_batch("left")
    model = flaxheads.from_pretrained(path)
    pads_changed = {**batch, "input_ids": np.where(batch["attention_mask"] == 1, batch["input_ids"], 17)}

    summary_logits = np.asarray(model(**flax_inputs(pads_changed)))
    masked_mean = flaxheads.from_pretrained(path, head="mean")

    assert_close(summary_logits, torch_forward(reference, pads_changed).logits, "mean summary, other pad ids")
    assert np.max(np.abs(summary_logits[1:] - np.asarray(model(**flax_inputs(batch)))[1:])) > 1e-4
    np.testing.assert_allclose(
        np.asarray(masked_mean(**flax_inputs(batch))), np.asarray(masked_mean(**flax_inputs(pads_changed))), atol=1e-6
    )


# ---------------------------------------------------------------------------------------------
# Conversion


def test_convert_without_a_summary_projection_keeps_the_relative_biases_and_converts_back_bit_identically(
    hf_checkpoint, tmp_path
):
    path, _ = xlnet_checkpoint(hf_checkpoint, "XLNetForSequenceClassification", num_labels=3, summary_use_proj=False)

    convert(path, tmp_path / "flax")
    convert(tmp_path / "flax", tmp_path / "pytorch")

    assert "backbone.layers.0.attention.r_w_bias" in load_numpy(tmp_path / "flax" / "flaxheads_model.safetensors")
    assert_state_dicts_identical(load_file(tmp_path / "pytorch" / "model.safetensors"), load_file(path / "model.safetensors"))


@pytest.mark.slow  # runs the family beyond its canonical parity (the fast lane has that)
def test_export_with_summary_options_loads_in_transformers_with_them_and_the_same_logits(hf_checkpoint, tmp_path):
    options = dict(summary_type="mean", summary_use_proj=False, summary_activation="")
    path, _ = xlnet_checkpoint(hf_checkpoint, "XLNetForSequenceClassification", num_labels=3, **options)
    batch = xlnet_batch("left")
    model = flaxheads.from_pretrained(path)
    model.save_pretrained(tmp_path)

    reloaded, info = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path, output_loading_info=True)

    assert type(reloaded).__name__ == "XLNetForSequenceClassification"
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    for key, value in options.items():
        assert getattr(reloaded.config, key) == value
    assert_close(model(**flax_inputs(batch)), torch_forward(reloaded.eval(), batch).logits, f"export {options}")


@pytest.mark.slow  # runs the family beyond its canonical parity (the fast lane has that)
def test_head_options_given_at_load_are_written_where_transformers_reads_them(hf_checkpoint, tmp_path):
    path, _ = xlnet_checkpoint(hf_checkpoint, "XLNetModel")
    batch = xlnet_batch("left")
    model = flaxheads.from_pretrained(
        path, num_labels=2, head_options={"summary_type": "first", "summary_activation": None}
    )
    model.save_pretrained(tmp_path)

    reloaded, info = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path, output_loading_info=True)
    again = flaxheads.from_pretrained(tmp_path)

    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert (reloaded.config.summary_type, reloaded.config.summary_activation) == ("first", "")  # "": none
    assert again.head.summary_type == "first"
    assert_close(model(**flax_inputs(batch)), torch_forward(reloaded.eval(), batch).logits, "summary_type=first export")
    assert_close(again(**flax_inputs(batch)), model(**flax_inputs(batch)), "reloaded export", atol=0, rtol=0)


def test_xlnet_model_checkpoint_loads_the_query_streams_mask_embedding(hf_checkpoint):
    path, _ = xlnet_checkpoint(hf_checkpoint, "XLNetModel")

    _, info = flaxheads.from_pretrained(path, num_labels=4, output_loading_info=True)

    assert "mask_emb" in info.loaded


def test_lm_head_checkpoint_loading_info_names_the_unused_lm_head_and_the_kept_query_stream(hf_checkpoint):
    path, _ = xlnet_checkpoint(hf_checkpoint, "XLNetLMHeadModel")

    model, info = flaxheads.from_pretrained(path, num_labels=2, output_loading_info=True)

    assert "transformer.mask_emb" in info.loaded and all(name.startswith("transformer.") for name in info.loaded)
    assert any("mask_emb" in note and "query stream" in note for note in info.notes)
    text = str(info)
    assert "lm_loss.bias" in text and "mask_emb" in text and "must be trained" in text


# ---------------------------------------------------------------------------------------------
# The "summary" head on another backbone


@pytest.mark.parametrize("options", [{}, {"summary_type": "mean", "summary_use_proj": False}, {"summary_type": "first"}])
@pytest.mark.slow  # runs the family beyond its canonical parity (the fast lane has that)
def test_summary_head_on_bert_matches_transformers_sequence_summary(hf_checkpoint, tmp_path, options):
    path, bert = hf_checkpoint("BertModel")
    batch = {k: v for k, v in xlnet_batch("left", token_types=False).items()}
    batch["input_ids"] = np.where(batch["attention_mask"] == 1, batch["input_ids"], 0)
    model = flaxheads.from_pretrained(path, head="summary", num_labels=3, head_options=options, seed=3)
    model.save_pretrained(tmp_path)
    exported = load_file(tmp_path / "model.safetensors")

    logits = model(**flax_inputs(batch))

    summary_config = transformers.XLNetConfig(d_model=32, n_head=4, **{**SUMMARY_DEFAULTS, **options})
    summary = transformers.models.xlnet.modeling_xlnet.XLNetSequenceSummary(summary_config).eval()
    if summary_config.summary_use_proj:
        summary.summary.load_state_dict({"weight": exported["head.summary.weight"], "bias": exported["head.summary.bias"]})
    hidden = torch_forward(bert, batch).last_hidden_state
    with torch.no_grad():
        pooled = summary(hidden)
        expected = torch.nn.functional.linear(pooled, exported["head.logits_proj.weight"], exported["head.logits_proj.bias"])
    assert_close(logits, expected, f"summary {options} on BERT")
    again = flaxheads.from_pretrained(tmp_path)
    assert again.config.head == "summary" and dict(again.config.head_options) == options
    assert_close(again(**flax_inputs(batch)), logits, "summary on BERT, reloaded", atol=0, rtol=0)


# ---------------------------------------------------------------------------------------------
# Errors


def test_wrong_shape_backbone_tensor_names_key_and_both_shapes(hf_checkpoint, tmp_path):
    path, _ = xlnet_checkpoint(hf_checkpoint, "XLNetForSequenceClassification", num_labels=3)
    tensors = load_numpy(path / "model.safetensors")
    tensors["transformer.layer.1.rel_attn.r_w_bias"] = np.zeros((4, 7), np.float32)
    save_numpy(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    (tmp_path / "config.json").write_text((path / "config.json").read_text())

    with pytest.raises(flaxheads.ShapeMismatch, match=r"transformer\.layer\.1\.rel_attn\.r_w_bias.*\(4, 7\).*\(4, 8\)"):
        flaxheads.from_pretrained(tmp_path)


def test_classifier_of_another_size_says_num_labels(hf_checkpoint):
    path, _ = xlnet_checkpoint(hf_checkpoint, "XLNetForSequenceClassification", num_labels=3)

    with pytest.raises(flaxheads.ShapeMismatch, match=r"logits_proj.*num_labels"):
        flaxheads.from_pretrained(path, num_labels=5)
    _, info = flaxheads.from_pretrained(path, num_labels=5, ignore_mismatched_sizes=True, output_loading_info=True)
    assert sorted(name for name, *_ in info.mismatched) == ["logits_proj.bias", "logits_proj.weight"]


@pytest.mark.parametrize(
    ("cls_index", "message"),
    [
        (np.array([1, 2]), r"cls_index must be integer positions of shape \(3,\)"),
        (np.array([[1], [2], [3]]), r"shape \(3,\)"),
        (np.array([1.0, 2.0, 3.0]), r"integer"),
        (np.array([1, 10, 3]), r"cls_index 10 is outside \[0, 10\)"),
    ],
    ids=["short", "2d", "float", "out_of_range"],
)
def test_bad_cls_index_is_refused_with_the_expected_shape(hf_checkpoint, cls_index, message):
    path, _ = xlnet_checkpoint(hf_checkpoint, "XLNetForSequenceClassification", num_labels=3, summary_type="cls_index")
    model = flaxheads.from_pretrained(path)

    with pytest.raises(ValueError, match=message):
        model(**flax_inputs(xlnet_batch("left")), cls_index=jnp.asarray(cls_index))


def test_position_ids_are_refused_because_xlnet_positions_are_relative(hf_checkpoint):
    path, _ = xlnet_checkpoint(hf_checkpoint, "XLNetForSequenceClassification", num_labels=3)
    model = flaxheads.from_pretrained(path)
    batch = flax_inputs(xlnet_batch("none"))

    with pytest.raises(ValueError, match="relative"):
        model(**batch, position_ids=jnp.broadcast_to(jnp.arange(10), (3, 10)))


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"summary_proj_to_labels": True}, ValueError, r"num_labels=3.*hidden_size=32.*summary_proj_to_labels=False"),
        ({"summary_type": "attn"}, NotImplementedError, "attn"),
        ({"summary_type": "max"}, ValueError, r"summary_type='max'; choose one of"),
        ({"summary_typ": "mean"}, ValueError, r"no option\(s\) \['summary_typ'\]"),
        ({"summary_activation": "softplus"}, ValueError, "unsupported activation 'softplus'"),
    ],
    ids=["proj_to_labels", "attn", "unknown_type", "unknown_key", "unknown_activation"],
)
def test_bad_summary_options_are_refused_by_name(hf_checkpoint, options, error, message):
    path, _ = xlnet_checkpoint(hf_checkpoint, "XLNetModel")

    with pytest.raises(error, match=message):
        flaxheads.from_pretrained(path, num_labels=3, head_options=options)


@pytest.mark.parametrize(
    ("change", "message"),
    [({"attn_type": "uni"}, "attn_type='uni'"), ({"bi_data": True}, "bi_data=True"), ({"d_head": 16}, "d_head=16")],
)
def test_unsupported_xlnet_configs_say_what_to_change(hf_checkpoint, tmp_path, change, message):
    path, _ = xlnet_checkpoint(hf_checkpoint, "XLNetModel")
    config = {**json.loads((path / "config.json").read_text()), **change}
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "model.safetensors").write_bytes((path / "model.safetensors").read_bytes())

    with pytest.raises((ValueError, NotImplementedError), match=message):
        flaxheads.from_pretrained(tmp_path)


@pytest.mark.slow  # runs the family beyond its canonical parity (the fast lane has that)
def test_untie_r_false_keeps_per_layer_biases_as_transformers_does(hf_checkpoint, tmp_path):
    path, reference = xlnet_checkpoint(hf_checkpoint, "XLNetForSequenceClassification", num_labels=2, untie_r=False)
    batch = xlnet_batch("left")
    model = flaxheads.from_pretrained(path)
    model.save_pretrained(tmp_path)

    assert model.config.backbone.untie_r is False
    assert json.loads((tmp_path / "config.json").read_text())["untie_r"] is False
    assert_close(model(**flax_inputs(batch)), torch_forward(reference, batch).logits, "untie_r=False")
