"""DeBERTa-v2/v3 and the "deberta" head: what is particular to them. The config's spellings and
what it refuses, transformers' relative-position buckets, token types and position ids on v2 and
their absence on v3, dropout and the gradients of the position table, the head on BERT against
transformers' ContextPooler, head options, the hub's v3 discriminator files, and weights that do
not fit the config. The scenarios every family shares (rows "deberta-v3" and "deberta-v2" of
tests/families.py) are in tests/test_family_*.py."""

from __future__ import annotations

import json
import shutil

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx
from safetensors.numpy import load_file as load_numpy, save_file as save_numpy
from safetensors.torch import load_file
from transformers.models.deberta_v2 import modeling_deberta_v2

import flaxheads
from families import DEBERTA_SEQ_LEN, DEBERTA_V2, DEBERTA_V3, padded_batch
from family_parity import assert_close, assert_same_params, flax_inputs, torch_forward
from flaxheads.backbones.deberta import DebertaV2Config, relative_positions

SEQ_LEN = DEBERTA_SEQ_LEN
ROWS = {"v3": DEBERTA_V3, "v2": DEBERTA_V2}
V3 = DEBERTA_V3.config


def deberta(hf_checkpoint, architecture: str, variant: str = "v3", **overrides):
    """(path, torch model) of the row ("v3" or "v2") checkpoint (tests/families.py)."""
    return hf_checkpoint(architecture, family=ROWS[variant].name, **overrides)


def batch_for(variant: str, padding: str = "right", *, seed: int = 0):
    """Three sequences of lengths (40, 37, 2) padded with 0 on `padding`; token types on v2."""
    return ROWS[variant].batch(padding, seed=seed)


# ---------------------------------------------------------------------------------------------
# Config and relative positions


def test_config_reads_transformers_spellings_and_writes_back_what_it_read():
    hf = transformers.DebertaV2Config(**V3).to_dict()
    config = DebertaV2Config.from_hf_config(hf)

    assert config.pos_att_type == ("p2c", "c2p") and config.attention_span == 8 and config.score_scale == pytest.approx(27 ** -0.5)  # head_dim 9, three score types
    assert DebertaV2Config.from_hf_config(config.to_hf_config()) == config
    assert transformers.DebertaV2Config(**config.to_hf_config()).pos_att_type == ["p2c", "c2p"]
    assert config.max_sequence_length is None and config.default_classifier_dropout == hf["hidden_dropout_prob"]
    defaults = DebertaV2Config.from_hf_config({"model_type": "deberta-v2"})
    assert (defaults.layer_norm_eps, defaults.type_vocab_size, defaults.pos_att_type) == (1e-7, 0, ())
    unbucketed = {**hf, "position_buckets": -1, "max_relative_positions": -1}
    assert DebertaV2Config.from_hf_config(unbucketed).attention_span == 64  # max_position_embeddings


@pytest.mark.parametrize(
    ("change", "message"),
    [({"conv_kernel_size": 4}, "must be odd"), ({"attention_head_size": 8}, "heads \\* head size"),
     ({"pooler_hidden_size": 40}, "pooler_hidden_size=40"), ({"pos_att_type": "c2c"}, "pos_att_type")],
)
def test_unsupported_configs_say_what_is_wrong(change, message):
    with pytest.raises((ValueError, NotImplementedError), match=message):
        DebertaV2Config.from_hf_config({**transformers.DebertaV2Config(**V3).to_dict(), **change})


@pytest.mark.parametrize(("buckets", "max_position"), [(256, 512), (8, 16), (10, 40), (64, 128), (-1, 16)])
def test_relative_positions_match_transformers_build_relative_position(buckets, max_position):
    states = torch.zeros(1, 300, 4)

    expected = modeling_deberta_v2.build_relative_position(states, states, bucket_size=buckets, max_position=max_position)

    np.testing.assert_array_equal(relative_positions(300, buckets, max_position), expected[0].numpy())


# ---------------------------------------------------------------------------------------------
# Parity


@pytest.mark.slow  # runs the family beyond its canonical parity (the fast lane has that)
def test_token_types_and_position_ids_reach_v2_logits_as_in_transformers(hf_checkpoint):
    path, reference = deberta(hf_checkpoint, "DebertaV2ForSequenceClassification", "v2", num_labels=3)
    batch = batch_for("v2", "right")
    model = flaxheads.from_pretrained(path)
    no_types = {k: v for k, v in batch.items() if k != "token_type_ids"}
    shifted = {**batch, "position_ids": np.broadcast_to(np.arange(3, 3 + SEQ_LEN), (3, SEQ_LEN)).copy()}

    with_types = model(**flax_inputs(batch))

    assert_close(model(**flax_inputs(no_types)), torch_forward(reference, no_types).logits, "no token types")
    assert_close(model(**flax_inputs(shifted)), torch_forward(reference, shifted).logits, "explicit position ids")
    assert np.max(np.abs(np.asarray(with_types) - np.asarray(model(**flax_inputs(no_types))))) > 1e-3


@pytest.mark.slow  # runs the family beyond its canonical parity (the fast lane has that)
def test_v3_ignores_token_types_and_absolute_positions_as_it_has_neither(hf_checkpoint):
    path, _ = deberta(hf_checkpoint, "DebertaV2ForSequenceClassification", "v3", num_labels=3)
    batch = batch_for("v3", "right")
    model = flaxheads.from_pretrained(path)
    extra = {**batch, "token_type_ids": np.ones_like(batch["input_ids"]),
             "position_ids": np.broadcast_to(np.arange(5, 5 + SEQ_LEN), (3, SEQ_LEN)).copy()}

    assert model.backbone.embeddings.token_type_embeddings is None
    assert model.backbone.embeddings.position_embeddings is None
    assert_close(model(**flax_inputs(extra)), model(**flax_inputs(batch)), "v3 with types and positions", atol=0, rtol=0)


@pytest.mark.slow  # compiles the gradient of a train-mode model
def test_dropout_acts_only_in_train_mode_and_gradients_reach_the_position_table(hf_checkpoint):
    path, _ = deberta(hf_checkpoint, "DebertaV2ForSequenceClassification", "v2", num_labels=3)
    batch = flax_inputs(batch_for("v2", "right"))
    model = flaxheads.from_pretrained(path)

    def loss_and_logits(m):
        logits = m(**batch, rngs=nnx.Rngs(dropout=1))
        return m.loss(logits, jnp.array([0, 1, 2])), logits

    deterministic = np.asarray(model(**batch))
    model.train()
    (_, with_dropout), grads = nnx.jit(nnx.value_and_grad(loss_and_logits, has_aux=True))(model)

    assert np.max(np.abs(np.asarray(with_dropout) - deterministic)) > 1e-4
    for name in ("rel_embeddings.embedding", "conv.conv.kernel", "layers.1.attention.pos_query.kernel"):
        node = grads.backbone
        for part in name.split("."):
            node = node[int(part)] if part.isdigit() else getattr(node, part)
        assert np.any(np.asarray(node[...]) != 0), name


@pytest.mark.parametrize("padding", ["right", "left"])
@pytest.mark.slow  # runs the family beyond its canonical parity (the fast lane has that)
def test_deberta_head_on_bert_matches_context_pooler_and_classifier(hf_checkpoint, tmp_path, padding):
    checkpoint = hf_checkpoint("BertModel")
    batch = padded_batch(padding, seq_len=10)
    model = flaxheads.from_pretrained(checkpoint.path, head="deberta", num_labels=4, seed=3,
                                      head_options={"pooler_hidden_act": "tanh"})
    model.save_pretrained(tmp_path)
    exported = load_file(tmp_path / "model.safetensors")

    config = transformers.DebertaV2Config(hidden_size=32, pooler_hidden_act="tanh")
    pooler = modeling_deberta_v2.ContextPooler(config).eval()
    classifier = torch.nn.Linear(32, 4)
    pooler.dense.load_state_dict({"weight": exported["head.dense.weight"], "bias": exported["head.dense.bias"]})
    classifier.load_state_dict({"weight": exported["head.classifier.weight"], "bias": exported["head.classifier.bias"]})
    with torch.no_grad():
        expected = classifier(pooler(torch_forward(checkpoint.model, batch).last_hidden_state))
    assert sorted(k for k in exported if k.startswith("head.")) == [
        "head.classifier.bias", "head.classifier.weight", "head.dense.bias", "head.dense.weight"
    ]
    assert_close(model(**flax_inputs(batch)), expected, f"deberta head on BERT, {padding} padding")
    again = flaxheads.from_pretrained(tmp_path)
    assert again.config.head == "deberta" and dict(again.config.head_options) == {"pooler_hidden_act": "tanh"}
    assert_same_params(again, model)


@pytest.mark.slow  # runs the family beyond its canonical parity (the fast lane has that)
def test_head_options_default_to_config_json_and_head_options_override_them(hf_checkpoint, tmp_path):
    path, reference = deberta(hf_checkpoint, "DebertaV2ForSequenceClassification", "v2", num_labels=3)
    batch = batch_for("v2", "right")

    model = flaxheads.from_pretrained(path)
    gelu = flaxheads.from_pretrained(path, head_options={"pooler_hidden_act": "gelu"})
    gelu.save_pretrained(tmp_path)

    assert model.config.head_options_in_effect()["pooler_hidden_act"] == "tanh"
    assert model.head.cfg.dropout_rate == 0.3  # cls_dropout, not hidden_dropout_prob
    assert np.max(np.abs(np.asarray(gelu(**flax_inputs(batch)) - model(**flax_inputs(batch))))) > 1e-3
    assert json.loads((tmp_path / "config.json").read_text())["pooler_hidden_act"] == "gelu"
    reloaded = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path).eval()
    assert_close(gelu(**flax_inputs(batch)), torch_forward(reloaded, batch).logits, "gelu pooler in transformers")


# ---------------------------------------------------------------------------------------------
# Loading report

_HEAD = ["classifier.bias", "classifier.weight", "pooler.dense.bias", "pooler.dense.weight"]
_MLM = ["lm_predictions.lm_head.LayerNorm.bias", "lm_predictions.lm_head.LayerNorm.weight",
        "lm_predictions.lm_head.bias", "lm_predictions.lm_head.dense.bias", "lm_predictions.lm_head.dense.weight"]


@pytest.mark.parametrize("architecture", ["DebertaV2Model", "DebertaV2ForMaskedLM"])
def test_relative_position_table_and_encoder_norm_are_loaded(hf_checkpoint, architecture):
    _, info = flaxheads.from_pretrained(deberta(hf_checkpoint, architecture)[0], num_labels=2,
                                        output_loading_info=True)

    loaded = {name.removeprefix("deberta.") for name in info.loaded}
    assert {"encoder.rel_embeddings.weight", "encoder.LayerNorm.weight"} <= loaded


def test_v3_discriminator_checkpoint_reports_mask_predictions_and_unused_position_embeddings(hf_checkpoint, tmp_path):
    """The hub's DeBERTa-v3 files come from ELECTRA-style pretraining: beside the MLM head they carry
    the replaced-token detector (`mask_predictions.*`), and some an absolute position table that
    position_biased_input=False leaves unused (transformers ignores it on load)."""
    path, _ = deberta(hf_checkpoint, "DebertaV2ForMaskedLM", "v3", legacy=False)
    tensors = load_numpy(path / "model.safetensors")
    rng = np.random.default_rng(0)
    extra = {"mask_predictions.dense.weight": (36, 36), "mask_predictions.dense.bias": (36,),
             "mask_predictions.LayerNorm.weight": (36,), "mask_predictions.LayerNorm.bias": (36,),
             "mask_predictions.classifier.weight": (1, 36), "mask_predictions.classifier.bias": (1,),
             "deberta.embeddings.position_embeddings.weight": (64, 36)}
    tensors.update({name: rng.standard_normal(shape).astype(np.float32) for name, shape in extra.items()})
    save_numpy(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    shutil.copy(path / "config.json", tmp_path)

    model, info = flaxheads.from_pretrained(tmp_path, num_labels=2, output_loading_info=True)

    assert info.unused == sorted([*extra, *_MLM]) and info.newly_initialized == _HEAD
    assert_same_params(flaxheads.from_pretrained(path, num_labels=2), model)


def test_weights_of_more_layers_than_config_json_says_are_refused(hf_checkpoint, tmp_path):
    path, _ = deberta(hf_checkpoint, "DebertaV2ForSequenceClassification", "v3", num_labels=3)
    config = {**json.loads((path / "config.json").read_text()), "num_hidden_layers": 1}
    (tmp_path / "config.json").write_text(json.dumps(config))
    shutil.copy(path / "model.safetensors", tmp_path)

    with pytest.raises(flaxheads.CheckpointError, match="num_hidden_layers=1"):
        flaxheads.from_pretrained(tmp_path)


def test_position_table_of_another_size_is_refused_naming_the_tensor(hf_checkpoint, tmp_path):
    path, _ = deberta(hf_checkpoint, "DebertaV2ForSequenceClassification", "v3", num_labels=3)
    config = {**json.loads((path / "config.json").read_text()), "position_buckets": 16}
    (tmp_path / "config.json").write_text(json.dumps(config))
    shutil.copy(path / "model.safetensors", tmp_path)

    with pytest.raises(flaxheads.ShapeMismatch, match=r"encoder\.rel_embeddings\.weight.*\(16, 36\).*\(32, 36\)"):
        flaxheads.from_pretrained(tmp_path)


