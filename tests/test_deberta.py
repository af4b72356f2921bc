"""DeBERTa-v2/v3 and the "deberta" head: parity with transformers (PyTorch, eager, eval mode) on
a v3-like config (shared keys, 8 log buckets over 16 positions on 40-token inputs, LayerNorm on
the position table, no absolute positions, no token types) and a v2-like one (ConvLayer with
groups, absolute positions, token types, separate position projections, embed_proj, no buckets),
both padding sides, hidden states padding included; every head on DeBERTa and the "deberta" head
on BERT; conversion both ways (safetensors, sharded, .bin); the loading report of each DeBERTa
checkpoint type; sharding on fake devices; the command line on a tiny checkpoint."""

from __future__ import annotations

import json
import shutil
import zlib

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from conftest import TOKENIZER_FILES, _randomize_
from flax import nnx
from safetensors.numpy import load_file as load_numpy, save_file as save_numpy
from safetensors.torch import load_file
from transformers.models.deberta_v2 import modeling_deberta_v2

import flaxheads
from family_parity import (
    assert_close, assert_same_params, assert_state_dicts_identical, check_cli_lifecycle, flat_params, flax_inputs,
    fsdp_on_fake_devices, padded_batch, torch_forward,
)
from flaxheads.backbones import backbone_spec
from flaxheads.backbones.deberta import DebertaV2Config, relative_positions
from flaxheads.convert import convert
from flaxheads.heads import HEAD_NAMES, HeadInputs

BF16_ATOL = BF16_RTOL = 1e-2
"""bfloat16 compute (float32 parameters) against transformers in float32: measured max 3.3e-3 (v3)
and 3.1e-3 (v2) on logits of order 1."""
SEQ_LEN = 40
"""Longer than max_relative_positions (16) and the 8 buckets: clipping and log buckets both act."""
_TINY = dict(
    vocab_size=99, hidden_size=36, num_attention_heads=4, intermediate_size=37, num_hidden_layers=2,
    max_position_embeddings=64, initializer_range=0.1, pad_token_id=0, relative_attention=True,
)
V3 = dict(  # what DeBERTa-v3 checkpoints set, at toy size
    **_TINY, position_buckets=8, max_relative_positions=16, share_att_key=True, norm_rel_ebd="layer_norm",
    pos_att_type="p2c|c2p", type_vocab_size=0, position_biased_input=False,
)
V2 = dict(  # DeBERTa-v2 xlarge's switches, plus a factorised embedding and a non-default pooler
    **_TINY, max_relative_positions=16, pos_att_type=["c2p", "p2c"], conv_kernel_size=3, conv_groups=2,
    conv_act="gelu", type_vocab_size=2, position_biased_input=True, embedding_size=20,
    pooler_hidden_act="tanh", cls_dropout=0.3,
)
C2P_ONLY = dict(  # max_relative_positions unset (-> max_position_embeddings), c2p alone, separate key projection
    **_TINY, pos_att_type="c2p", type_vocab_size=0, position_biased_input=True,
)
CONFIGS = {"v3": V3, "v2": V2, "c2p_only": C2P_ONLY}


@pytest.fixture(scope="session")
def deberta(tmp_path_factory):
    """`deberta("DebertaV2ForSequenceClassification", "v3", num_labels=3)` -> (directory written by
    transformers, the torch model in eval mode). Cached: treat both as read-only."""
    cache = {}

    def build(architecture: str, variant: str = "v3", *, torch_dtype: str = "float32", **overrides):
        key = (architecture, variant, torch_dtype, tuple(sorted(overrides.items())))
        if key not in cache:
            torch.manual_seed(0)
            config = transformers.DebertaV2Config(**{**CONFIGS[variant], **overrides}, attn_implementation="eager")
            model = getattr(transformers, architecture)(config).eval()
            _randomize_(model, seed=zlib.crc32(repr(key).encode()))
            model = model.to(getattr(torch, torch_dtype))
            path = tmp_path_factory.mktemp(architecture)
            model.save_pretrained(path)
            cache[key] = (path, model)
        return cache[key]

    return build


def batch_for(variant: str, padding: str = "right", *, seed: int = 0):
    """Three sequences of lengths (40, 37, 2) padded with 0 on `padding`; token types on v2."""
    return padded_batch(padding, seq_len=SEQ_LEN, seed=seed, token_types=CONFIGS[variant].get("type_vocab_size", 0) > 0)


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


@pytest.mark.parametrize("padding", ["right", "left"])
@pytest.mark.parametrize(("variant", "num_labels"), [("v3", 3), ("v2", 2), ("c2p_only", 1)])
def test_deberta_head_logits_match_transformers(deberta, variant, num_labels, padding):
    path, reference = deberta("DebertaV2ForSequenceClassification", variant, num_labels=num_labels)
    batch = batch_for(variant, padding)
    model = flaxheads.from_pretrained(path)

    logits = model(**flax_inputs(batch))

    assert model.config.head == "deberta" and logits.shape == (3, num_labels) and logits.dtype == jnp.float32
    assert_close(logits, torch_forward(reference, batch).logits, f"deberta {variant} num_labels={num_labels} {padding}")


@pytest.mark.parametrize("variant", ["v3", "v2"])
def test_every_hidden_state_matches_deberta_model_padding_included(deberta, variant):
    path, reference = deberta("DebertaV2Model", variant)
    batch = batch_for(variant, "left")
    backbone, info = flaxheads.load_backbone(path)

    out = backbone(**flax_inputs(batch))

    expected = torch_forward(reference, batch, output_hidden_states=True)
    assert info.newly_initialized == [] and info.unused == []
    assert len(out.hidden_states) == len(expected.hidden_states) == 3 and out.pooler_output is None
    for layer, (ours, theirs) in enumerate(zip(out.hidden_states, expected.hidden_states)):
        assert_close(ours, theirs, f"DebertaV2Model {variant} hidden state {layer}")


def test_token_types_and_position_ids_reach_v2_logits_as_in_transformers(deberta):
    path, reference = deberta("DebertaV2ForSequenceClassification", "v2", num_labels=3)
    batch = batch_for("v2", "right")
    model = flaxheads.from_pretrained(path)
    no_types = {k: v for k, v in batch.items() if k != "token_type_ids"}
    shifted = {**batch, "position_ids": np.broadcast_to(np.arange(3, 3 + SEQ_LEN), (3, SEQ_LEN)).copy()}

    with_types = model(**flax_inputs(batch))

    assert_close(model(**flax_inputs(no_types)), torch_forward(reference, no_types).logits, "no token types")
    assert_close(model(**flax_inputs(shifted)), torch_forward(reference, shifted).logits, "explicit position ids")
    assert np.max(np.abs(np.asarray(with_types) - np.asarray(model(**flax_inputs(no_types))))) > 1e-3


def test_v3_ignores_token_types_and_absolute_positions_as_it_has_neither(deberta):
    path, _ = deberta("DebertaV2ForSequenceClassification", "v3", num_labels=3)
    batch = batch_for("v3", "right")
    model = flaxheads.from_pretrained(path)
    extra = {**batch, "token_type_ids": np.ones_like(batch["input_ids"]),
             "position_ids": np.broadcast_to(np.arange(5, 5 + SEQ_LEN), (3, SEQ_LEN)).copy()}

    assert model.backbone.embeddings.token_type_embeddings is None
    assert model.backbone.embeddings.position_embeddings is None
    assert_close(model(**flax_inputs(extra)), model(**flax_inputs(batch)), "v3 with types and positions", atol=0, rtol=0)


def test_bfloat16_compute_stays_within_the_stated_tolerance_of_transformers_float32(deberta):
    for variant in ("v3", "v2"):
        path, reference = deberta("DebertaV2ForSequenceClassification", variant, num_labels=3)
        batch = batch_for(variant, "right")
        half = flaxheads.from_pretrained(path, dtype="bfloat16")

        logits = half(**flax_inputs(batch))

        assert logits.dtype == jnp.float32
        assert {v.dtype for v in flat_params(half).values()} == {np.dtype("float32")}
        assert_close(logits, torch_forward(reference, batch).logits, f"{variant} bfloat16 vs float32", BF16_ATOL, BF16_RTOL)


def test_dropout_acts_only_in_train_mode_and_gradients_reach_the_position_table(deberta):
    path, _ = deberta("DebertaV2ForSequenceClassification", "v2", num_labels=3)
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


def test_padding_side_is_right():
    assert backbone_spec("deberta-v2").padding_side == "right"


# ---------------------------------------------------------------------------------------------
# Every head on DeBERTa, the "deberta" head on BERT


@pytest.mark.parametrize("head", [h for h in HEAD_NAMES if h != "deberta"])
def test_every_head_on_deberta_reads_transformers_hidden_states_and_round_trips(deberta, tmp_path, head):
    path, reference = deberta("DebertaV2Model", "v3", num_hidden_layers=4)
    batch = batch_for("v3", "right")
    model, info = flaxheads.from_pretrained(path, head=head, num_labels=3, seed=1, output_loading_info=True)
    model.save_pretrained(tmp_path)

    logits = model(**flax_inputs(batch))

    hidden = torch_forward(reference, batch, output_hidden_states=True).hidden_states
    inputs = HeadInputs(tuple(jnp.asarray(h.numpy()) for h in hidden), jnp.asarray(batch["attention_mask"]),
                        jnp.asarray(batch["input_ids"]))
    assert_close(logits, model.head(inputs), f"{head} on DeBERTa vs the head on transformers' hidden states")
    assert info.newly_initialized and all(name.startswith("head.") for name in info.newly_initialized)
    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == ["DebertaV2Model"]
    again = flaxheads.from_pretrained(tmp_path)
    assert again.config.head == head
    assert_same_params(again, model)
    base, hf_info = transformers.AutoModel.from_pretrained(tmp_path, output_loading_info=True)
    assert not hf_info["missing_keys"] and all(k.startswith("head.") for k in hf_info["unexpected_keys"])
    assert_close(torch_forward(base.eval(), batch).last_hidden_state, hidden[-1], f"{head}: transformers reads the backbone")


@pytest.mark.parametrize("padding", ["right", "left"])
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


def test_head_options_default_to_config_json_and_head_options_override_them(deberta, tmp_path):
    path, reference = deberta("DebertaV2ForSequenceClassification", "v2", num_labels=3)
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
# Conversion


@pytest.mark.parametrize("variant", ["v3", "v2"])
@pytest.mark.parametrize("torch_dtype", ["float32", "bfloat16"])
def test_pytorch_flaxheads_pytorch_round_trip_is_bit_identical(deberta, tmp_path, variant, torch_dtype):
    path, _ = deberta("DebertaV2ForSequenceClassification", variant, num_labels=3, torch_dtype=torch_dtype)
    model = flaxheads.from_pretrained(path, param_dtype="auto")

    model.save_pretrained(tmp_path)

    assert_state_dicts_identical(load_file(tmp_path / "model.safetensors"), load_file(path / "model.safetensors"))
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == ["DebertaV2ForSequenceClassification"] and config["dtype"] == torch_dtype


def test_convert_to_flax_and_back_is_bit_identical(deberta, tmp_path):
    path, _ = deberta("DebertaV2ForSequenceClassification", "v2", num_labels=3)

    convert(path, tmp_path / "flax")
    convert(tmp_path / "flax", tmp_path / "pytorch")

    assert_state_dicts_identical(load_file(tmp_path / "pytorch" / "model.safetensors"), load_file(path / "model.safetensors"))


@pytest.mark.parametrize("layout", ["sharded_safetensors", "bin"])
def test_sharded_and_bin_checkpoints_read_like_the_single_safetensors_file(deberta, tmp_path, layout):
    path, reference = deberta("DebertaV2ForSequenceClassification", "v2", num_labels=3)
    if layout == "bin":
        torch.save(reference.state_dict(), tmp_path / "pytorch_model.bin")
        shutil.copy(path / "config.json", tmp_path)
    else:
        reference.save_pretrained(tmp_path, max_shard_size="20KB")
        assert len(list(tmp_path.glob("model-*-of-*.safetensors"))) > 1

    model, info = flaxheads.from_pretrained(tmp_path, output_loading_info=True)

    assert info.fully_pretrained and info.unused == []
    assert_same_params(model, flaxheads.from_pretrained(path))


@pytest.mark.parametrize("variant", ["v3", "v2"])
def test_export_loads_in_transformers_with_no_missing_or_unexpected_keys_and_same_logits(deberta, tmp_path, variant):
    path, _ = deberta("DebertaV2ForMaskedLM", variant)
    batch = batch_for(variant, "left")
    model = flaxheads.from_pretrained(path, num_labels=5, seed=4)
    model.save_pretrained(tmp_path)

    reloaded, info = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path, output_loading_info=True)

    assert type(reloaded).__name__ == "DebertaV2ForSequenceClassification"
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    assert_close(model(**flax_inputs(batch)), torch_forward(reloaded.eval(), batch).logits, f"{variant} export in transformers")


# ---------------------------------------------------------------------------------------------
# Loading report

_HEAD = ["classifier.bias", "classifier.weight", "pooler.dense.bias", "pooler.dense.weight"]
_MLM = ["lm_predictions.lm_head.LayerNorm.bias", "lm_predictions.lm_head.LayerNorm.weight",
        "lm_predictions.lm_head.bias", "lm_predictions.lm_head.dense.bias", "lm_predictions.lm_head.dense.weight"]
# The legacy head's decoder weight is tied to the word embeddings and not saved; its bias is.
_LEGACY_MLM = ["cls.predictions.bias", "cls.predictions.decoder.bias", "cls.predictions.transform.LayerNorm.bias",
               "cls.predictions.transform.LayerNorm.weight", "cls.predictions.transform.dense.bias",
               "cls.predictions.transform.dense.weight"]


@pytest.mark.parametrize(
    ("architecture", "overrides", "unused", "new"),
    [
        ("DebertaV2Model", {}, [], _HEAD),
        ("DebertaV2ForMaskedLM", {"legacy": False}, _MLM, _HEAD),
        ("DebertaV2ForMaskedLM", {"legacy": True}, _LEGACY_MLM, _HEAD),
        ("DebertaV2ForSequenceClassification", {}, [], []),
    ],
    ids=["model", "masked_lm", "legacy_masked_lm", "sequence_classification"],
)
def test_loading_report_lists_pretraining_heads_as_unused_and_the_head_as_new(deberta, architecture, overrides, unused, new):
    path, _ = deberta(architecture, "v3", **overrides)

    model, info = flaxheads.from_pretrained(path, num_labels=2, output_loading_info=True)

    assert info.head == "deberta" and model.config.head == "deberta"
    assert sorted(set(info.unused) - {"cls.predictions.decoder.bias"}) == sorted(set(unused) - {"cls.predictions.decoder.bias"})
    assert info.newly_initialized == new and info.fully_pretrained == (not new)
    assert {"encoder.rel_embeddings.weight", "encoder.LayerNorm.weight"} <= {n.removeprefix("deberta.") for n in info.loaded}


def test_v3_discriminator_checkpoint_reports_mask_predictions_and_unused_position_embeddings(deberta, tmp_path):
    """The hub's DeBERTa-v3 files come from ELECTRA-style pretraining: beside the MLM head they carry
    the replaced-token detector (`mask_predictions.*`), and some an absolute position table that
    position_biased_input=False leaves unused (transformers ignores it on load)."""
    path, _ = deberta("DebertaV2ForMaskedLM", "v3", legacy=False)
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


def test_weights_of_more_layers_than_config_json_says_are_refused(deberta, tmp_path):
    path, _ = deberta("DebertaV2ForSequenceClassification", "v3", num_labels=3)
    config = {**json.loads((path / "config.json").read_text()), "num_hidden_layers": 1}
    (tmp_path / "config.json").write_text(json.dumps(config))
    shutil.copy(path / "model.safetensors", tmp_path)

    with pytest.raises(flaxheads.CheckpointError, match="num_hidden_layers=1"):
        flaxheads.from_pretrained(tmp_path)


def test_position_table_of_another_size_is_refused_naming_the_tensor(deberta, tmp_path):
    path, _ = deberta("DebertaV2ForSequenceClassification", "v3", num_labels=3)
    config = {**json.loads((path / "config.json").read_text()), "position_buckets": 16}
    (tmp_path / "config.json").write_text(json.dumps(config))
    shutil.copy(path / "model.safetensors", tmp_path)

    with pytest.raises(flaxheads.ShapeMismatch, match=r"encoder\.rel_embeddings\.weight.*\(16, 36\).*\(32, 36\)"):
        flaxheads.from_pretrained(tmp_path)


# ---------------------------------------------------------------------------------------------
# Sharding on fake devices


def test_fsdp_rules_split_the_deberta_parameters_on_four_fake_devices(deberta):
    path, reference = deberta("DebertaV2ForSequenceClassification", "v2", num_labels=3, conv_groups=1)
    batch = batch_for("v2", "right")

    result = fsdp_on_fake_devices(path, batch)

    specs = result["specs"]
    # Position tables split by rows, kernels (the conv's too) by input features, wherever 4 divides the dimension.
    assert specs["backbone.rel_embeddings.embedding"] == ["fsdp", "None"]  # 2 * 16 rows
    assert specs["backbone.conv.conv.kernel"] == ["None", "fsdp", "None"]  # (width 3, in 36, out 36)
    for name in ("backbone.embeddings.embed_proj.kernel", "backbone.layers.1.attention.pos_key.kernel",
                 "backbone.layers.0.attention.pos_query.kernel", "head.dense.kernel"):
        assert specs[name][0] == "fsdp", name
    assert "backbone.embeddings.word_embeddings.embedding" not in result["split"]  # 99 rows: whole
    assert result["tree"] == result["split"]
    assert_close(result["logits"], torch_forward(reference, batch).logits, "fsdp=4 on fake devices vs torch")


# ---------------------------------------------------------------------------------------------
# Command line


@pytest.fixture(scope="module")
def deberta_with_tokenizer(tmp_path_factory):
    """A tiny v3-like DebertaV2ForMaskedLM with MiniLM's BERT vocab.txt tokenizer next to it."""
    from flaxheads.shipped_model import minilm_path

    path = tmp_path_factory.mktemp("deberta_tok")
    torch.manual_seed(0)
    config = transformers.DebertaV2Config(**{**V3, "vocab_size": 30522, "hidden_dropout_prob": 0.0,
                                                "attention_probs_dropout_prob": 0.0, "legacy": False})
    transformers.DebertaV2ForMaskedLM(config).save_pretrained(path)
    for name in TOKENIZER_FILES:
        shutil.copy(minilm_path() / name, path / name)
    return path


def test_cli_inspect_train_evaluate_predict_convert_on_deberta(deberta_with_tokenizer, snippets_csv, tmp_path, capsys):
    inspected = check_cli_lifecycle(deberta_with_tokenizer, snippets_csv, tmp_path, capsys,
                                    model_type="deberta-v2", head="deberta")

    assert "pooler.dense.weight" in inspected and "lm_predictions.lm_head.dense.weight" in inspected
    exported = load_file(tmp_path / "run" / "model.safetensors")
    assert "deberta.encoder.rel_embeddings.weight" in exported and "pooler.dense.weight" in exported
