"""ELECTRA and the "electra" head: parity with transformers (PyTorch, eval mode) with
embedding_size != hidden_size (the projection) and ==, both padding sides and token types; every
head on ELECTRA and the "electra" head on BERT; conversion both ways (safetensors, sharded, .bin);
the loading report of ElectraModel / ElectraForPreTraining / ElectraForMaskedLM; sharding on fake
devices; the command line on a tiny checkpoint with a BERT-style tokenizer."""

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
from safetensors.torch import load_file

import flaxheads
from family_parity import (
    assert_close, assert_same_params, assert_state_dicts_identical, check_cli_lifecycle, flat_params, flax_inputs,
    fsdp_on_fake_devices, padded_batch, torch_forward,
)
from flaxheads.backbones import EncoderConfig, backbone_spec
from flaxheads.convert import convert
from flaxheads.heads import HEAD_NAMES, HeadInputs

BF16_ATOL = BF16_RTOL = 5e-2
"""bfloat16 compute against transformers' float32 logits (measured max difference ~1e-2)."""
# Odd widths: 20-wide embeddings projected to 36 (head_dim 9), a 37-wide MLP.
TINY_ELECTRA = dict(
    vocab_size=99, embedding_size=20, hidden_size=36, num_attention_heads=4, intermediate_size=37,
    max_position_embeddings=64, type_vocab_size=2, num_hidden_layers=2, initializer_range=0.1, pad_token_id=0,
)
SAME_WIDTH = dict(embedding_size=36)  # no embeddings_project
PAD_ID = 0


@pytest.fixture(scope="session")
def electra(tmp_path_factory):
    """`electra("ElectraForSequenceClassification", num_labels=3)` -> (directory written by
    transformers, the torch model in eval mode). Cached: treat both as read-only."""
    cache = {}

    def build(architecture: str, *, torch_dtype: str = "float32", **overrides):
        key = (architecture, torch_dtype, tuple(sorted(overrides.items())))
        if key not in cache:
            torch.manual_seed(0)
            model_cls = getattr(transformers, architecture)
            model = model_cls(transformers.ElectraConfig(**{**TINY_ELECTRA, **overrides})).eval()
            _randomize_(model, seed=zlib.crc32(repr(key).encode()))
            model = model.to(getattr(torch, torch_dtype))
            path = tmp_path_factory.mktemp(architecture)
            model.save_pretrained(path)
            cache[key] = (path, model)
        return cache[key]

    return build
















def token_batch(padding: str = "right", *, seq_len: int = 10, seed: int = 0, token_types: bool = True):
    """Three sequences of lengths (10, 7, 2) padded on `padding`; token type 1 on each second half."""
    return padded_batch(padding, seq_len=seq_len, seed=seed, pad_id=PAD_ID, token_types=token_types)


# ---------------------------------------------------------------------------------------------
# Config


def test_electra_config_reads_embedding_size_and_writes_it_back_while_bert_has_none():
    hf = {**TINY_ELECTRA, "model_type": "electra"}
    config = EncoderConfig.from_hf_config(hf)
    bert = EncoderConfig.from_hf_config({"model_type": "bert", "hidden_size": 36, "num_attention_heads": 4})

    assert config.embedding_size == 20 and config.projects_embeddings
    assert config.to_hf_config()["embedding_size"] == 20
    assert EncoderConfig.from_hf_config(config.to_hf_config()) == config
    # ElectraConfig's defaults, not BertConfig's, fill what config.json leaves out.
    defaults = EncoderConfig.from_hf_config({"model_type": "electra"})
    assert (defaults.embedding_size, defaults.hidden_size, defaults.num_attention_heads) == (128, 256, 4)
    assert not EncoderConfig.from_hf_config({**hf, **SAME_WIDTH}).projects_embeddings
    assert "embedding_size" not in bert.to_hf_config() and not bert.projects_embeddings
    # Left unset, ELECTRA embeds at hidden_size, and says so (transformers' default is 128).
    assert EncoderConfig(model_type="electra", hidden_size=48).to_hf_config()["embedding_size"] == 48
    with pytest.raises(ValueError, match="embedding_size is ELECTRA's"):
        EncoderConfig(model_type="bert", embedding_size=20)


# ---------------------------------------------------------------------------------------------
# Parity: ElectraForSequenceClassification logits


@pytest.mark.parametrize("padding", ["right", "left"])
@pytest.mark.parametrize(
    ("widths", "num_labels"), [({}, 3), (SAME_WIDTH, 2), ({}, 1)], ids=["projected-3", "same_width-2", "projected-1"]
)
def test_electra_head_logits_match_transformers(electra, widths, num_labels, padding):
    path, reference = electra("ElectraForSequenceClassification", num_labels=num_labels, **widths)
    batch = token_batch(padding)
    model = flaxheads.from_pretrained(path)

    logits = model(**flax_inputs(batch))

    assert model.config.head == "electra" and logits.shape == (3, num_labels) and logits.dtype == jnp.float32
    assert (model.backbone.embeddings_project is None) == bool(widths)
    assert_close(logits, torch_forward(reference, batch).logits, f"electra {widths} num_labels={num_labels} {padding}")


def test_token_type_ids_reach_the_logits_as_in_transformers(electra):
    path, reference = electra("ElectraForSequenceClassification", num_labels=3)
    batch = token_batch("right")
    zeros = {**batch, "token_type_ids": np.zeros_like(batch["token_type_ids"])}
    model = flaxheads.from_pretrained(path)

    with_types, all_zero = model(**flax_inputs(batch)), model(**flax_inputs(zeros))
    without = model(**flax_inputs({k: v for k, v in batch.items() if k != "token_type_ids"}))

    assert np.max(np.abs(np.asarray(with_types - all_zero))) > 1e-3
    assert_close(all_zero, torch_forward(reference, zeros).logits, "all-zero token types")
    assert_close(without, all_zero, "no token types vs all zeros", atol=0, rtol=0)


def test_electra_head_uses_gelu_even_when_the_backbone_activation_is_another(electra):
    path, reference = electra("ElectraForSequenceClassification", num_labels=3, hidden_act="relu")
    batch = token_batch("right")

    assert_close(flaxheads.from_pretrained(path)(**flax_inputs(batch)), torch_forward(reference, batch).logits, "relu backbone")


@pytest.mark.parametrize("widths", [{}, SAME_WIDTH], ids=["projected", "same_width"])
def test_every_hidden_state_matches_electra_model_the_first_after_the_projection(electra, widths):
    path, reference = electra("ElectraModel", **widths)
    batch = token_batch("right")
    backbone, info = flaxheads.load_backbone(path)

    out = backbone(**flax_inputs(batch))

    expected = torch_forward(reference, batch, output_hidden_states=True)
    assert info.newly_initialized == [] and info.unused == []
    assert len(out.hidden_states) == len(expected.hidden_states) == 3
    assert out.hidden_states[0].shape[-1] == 36 and out.pooler_output is None
    for layer, (ours, theirs) in enumerate(zip(out.hidden_states, expected.hidden_states)):
        assert_close(ours, theirs, f"ElectraModel hidden state {layer} {widths}")


def test_bfloat16_compute_stays_within_tolerance_of_transformers_float32(electra):
    path, reference = electra("ElectraForSequenceClassification", num_labels=3)
    batch = token_batch("right")
    half = flaxheads.from_pretrained(path, dtype="bfloat16")

    logits = half(**flax_inputs(batch))

    assert logits.dtype == jnp.float32
    assert {v.dtype for v in flat_params(half).values()} == {np.dtype("float32")}
    assert_close(logits, torch_forward(reference, batch).logits, "bfloat16 vs transformers float32", BF16_ATOL, BF16_RTOL)


# ---------------------------------------------------------------------------------------------
# Every head on ELECTRA, the "electra" head on BERT


@pytest.mark.parametrize("head", [h for h in HEAD_NAMES if h != "electra"])
def test_every_head_on_electra_reads_transformers_hidden_states_and_round_trips(electra, tmp_path, head):
    path, reference = electra("ElectraModel", num_hidden_layers=4)
    batch = token_batch("right")
    model, info = flaxheads.from_pretrained(path, head=head, num_labels=3, seed=1, output_loading_info=True)

    model.save_pretrained(tmp_path)
    again = flaxheads.from_pretrained(tmp_path)
    base, hf_info = transformers.AutoModel.from_pretrained(tmp_path, output_loading_info=True)

    # The head on transformers' hidden states gives the model's logits.
    hidden = torch_forward(reference, batch, output_hidden_states=True).hidden_states
    inputs = HeadInputs(tuple(jnp.asarray(h.numpy()) for h in hidden), jnp.asarray(batch["attention_mask"]),
                        jnp.asarray(batch["input_ids"]))
    assert_close(model(**flax_inputs(batch)), model.head(inputs), f"{head} head on ELECTRA")
    assert info.newly_initialized and all(name.startswith("head.") for name in info.newly_initialized)
    if head == "pooler":  # ELECTRA has no pooler: the head's is new, and said so
        assert "head.pooler.dense.weight" in info.newly_initialized
    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == ["ElectraModel"]
    assert again.config.head == head
    assert_same_params(again, model)
    assert not hf_info["missing_keys"] and all(k.startswith("head.") for k in hf_info["unexpected_keys"])
    assert_close(torch_forward(base.eval(), batch).last_hidden_state, hidden[-1], f"{head}: transformers reads the backbone")


def test_roberta_head_on_electra_matches_roberta_classification_head(electra, tmp_path):
    path, reference = electra("ElectraModel")
    batch = token_batch("left")
    model = flaxheads.from_pretrained(path, head="roberta", num_labels=3, seed=2)
    model.save_pretrained(tmp_path)
    exported = load_file(tmp_path / "model.safetensors")

    head = transformers.models.roberta.modeling_roberta.RobertaClassificationHead(
        transformers.RobertaConfig(hidden_size=36, num_labels=3)
    ).eval()
    head.load_state_dict({k[len("head."):]: v for k, v in exported.items() if k.startswith("head.")})
    with torch.no_grad():
        expected = head(torch_forward(reference, batch).last_hidden_state)
    assert_close(model(**flax_inputs(batch)), expected, "roberta head on ELECTRA")


@pytest.mark.parametrize("padding", ["right", "left"])
def test_electra_head_on_bert_matches_electra_classification_head(hf_checkpoint, tmp_path, padding):
    checkpoint = hf_checkpoint("BertModel")
    batch = token_batch(padding)
    model = flaxheads.from_pretrained(checkpoint.path, head="electra", num_labels=4, seed=3)
    model.save_pretrained(tmp_path)
    exported = load_file(tmp_path / "model.safetensors")

    head = transformers.models.electra.modeling_electra.ElectraClassificationHead(
        transformers.ElectraConfig(hidden_size=32, num_labels=4)
    ).eval()
    head.load_state_dict({k[len("head."):]: v for k, v in exported.items() if k.startswith("head.")})
    with torch.no_grad():
        expected = head(torch_forward(checkpoint.model, batch).last_hidden_state)
    assert sorted(k for k in exported if k.startswith("head.")) == [
        "head.dense.bias", "head.dense.weight", "head.out_proj.bias", "head.out_proj.weight"
    ]
    assert_close(model(**flax_inputs(batch)), expected, f"electra head on BERT, {padding} padding")
    again = flaxheads.from_pretrained(tmp_path)
    assert again.config.head == "electra"
    assert_same_params(again, model)


# ---------------------------------------------------------------------------------------------
# Conversion


@pytest.mark.parametrize("torch_dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("widths", [{}, SAME_WIDTH], ids=["projected", "same_width"])
def test_pytorch_flaxheads_pytorch_round_trip_is_bit_identical(electra, tmp_path, widths, torch_dtype):
    path, _ = electra("ElectraForSequenceClassification", num_labels=3, torch_dtype=torch_dtype, **widths)
    model = flaxheads.from_pretrained(path, param_dtype="auto")

    model.save_pretrained(tmp_path)

    assert_state_dicts_identical(load_file(tmp_path / "model.safetensors"), load_file(path / "model.safetensors"))
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == ["ElectraForSequenceClassification"] and config["dtype"] == torch_dtype
    assert config["embedding_size"] == TINY_ELECTRA["embedding_size"] if not widths else config["embedding_size"] == 36


def test_convert_to_flax_and_back_is_bit_identical(electra, tmp_path):
    path, _ = electra("ElectraForSequenceClassification", num_labels=3)

    convert(path, tmp_path / "flax")
    convert(tmp_path / "flax", tmp_path / "pytorch")

    assert_state_dicts_identical(load_file(tmp_path / "pytorch" / "model.safetensors"), load_file(path / "model.safetensors"))


@pytest.mark.parametrize("layout", ["sharded_safetensors", "bin"])
def test_sharded_and_bin_checkpoints_read_like_the_single_safetensors_file(electra, tmp_path, layout):
    path, reference = electra("ElectraForSequenceClassification", num_labels=3)
    if layout == "bin":
        torch.save(reference.state_dict(), tmp_path / "pytorch_model.bin")
        shutil.copy(path / "config.json", tmp_path)
    else:
        reference.save_pretrained(tmp_path, max_shard_size="20KB")
        assert len(list(tmp_path.glob("model-*-of-*.safetensors"))) > 1

    model, info = flaxheads.from_pretrained(tmp_path, output_loading_info=True)

    assert info.fully_pretrained and info.unused == []
    assert_same_params(model, flaxheads.from_pretrained(path))


def test_export_loads_in_transformers_with_no_missing_or_unexpected_keys_and_same_logits(electra, tmp_path):
    path, _ = electra("ElectraForPreTraining")
    batch = token_batch("right")
    model = flaxheads.from_pretrained(path, num_labels=5, seed=4)
    model.save_pretrained(tmp_path)

    reloaded, info = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path, output_loading_info=True)

    assert type(reloaded).__name__ == "ElectraForSequenceClassification"
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    assert_close(model(**flax_inputs(batch)), torch_forward(reloaded.eval(), batch).logits, "export in transformers")


# ---------------------------------------------------------------------------------------------
# Loading report

_CLASSIFIER = ["classifier.dense.bias", "classifier.dense.weight", "classifier.out_proj.bias", "classifier.out_proj.weight"]


@pytest.mark.parametrize(
    ("architecture", "unused", "new"),
    [
        ("ElectraModel", [], _CLASSIFIER),
        ("ElectraForPreTraining", [
            "discriminator_predictions.dense.bias", "discriminator_predictions.dense.weight",
            "discriminator_predictions.dense_prediction.bias", "discriminator_predictions.dense_prediction.weight",
        ], _CLASSIFIER),
        # generator_lm_head.weight is tied to the word embeddings and not saved.
        ("ElectraForMaskedLM", [
            "generator_lm_head.bias", "generator_predictions.LayerNorm.bias", "generator_predictions.LayerNorm.weight",
            "generator_predictions.dense.bias", "generator_predictions.dense.weight",
        ], _CLASSIFIER),
        ("ElectraForSequenceClassification", [], []),
    ],
)
def test_loading_report_lists_pretraining_heads_as_unused_and_the_classifier_as_new(electra, architecture, unused, new):
    path, _ = electra(architecture)

    model, info = flaxheads.from_pretrained(path, num_labels=2, output_loading_info=True)

    assert info.head == "electra" and model.config.head == "electra"
    assert info.unused == unused and info.newly_initialized == new
    assert any(name.endswith("embeddings_project.weight") for name in info.loaded)
    assert info.fully_pretrained == (not new)


def test_missing_projection_is_refused_naming_the_tensor(electra, tmp_path):
    path, _ = electra("ElectraForSequenceClassification", num_labels=3)
    config = {**json.loads((path / "config.json").read_text()), "embedding_size": 36}  # no projection in the weights
    (tmp_path / "config.json").write_text(json.dumps(config))
    shutil.copy(path / "model.safetensors", tmp_path)

    with pytest.raises(flaxheads.ShapeMismatch, match=r"electra\.embeddings\.word_embeddings\.weight.*\(99, 20\)"):
        flaxheads.from_pretrained(tmp_path)


# ---------------------------------------------------------------------------------------------
# Sharding on fake devices

def test_fsdp_splits_the_embedding_projection_and_keeps_the_logits(electra):
    path, reference = electra("ElectraForSequenceClassification", num_labels=3)
    batch = padded_batch("right", seq_len=9)

    result = fsdp_on_fake_devices(path, batch, layout="data=1,fsdp=4")

    # (embedding_size 20, hidden 36): the projection's rows split over the fsdp axis.
    assert result["specs"]["backbone.embeddings_project.kernel"] == ["fsdp", "None"]
    assert result["tree"] == result["split"]
    assert_close(result["logits"], torch_forward(reference, batch).logits, "fsdp=4 vs torch")


# ---------------------------------------------------------------------------------------------
# Command line


@pytest.fixture(scope="module")
def electra_with_tokenizer(tmp_path_factory):
    """A tiny ElectraForPreTraining (discriminator) with MiniLM's BERT vocab.txt tokenizer."""
    from flaxheads.shipped_model import minilm_path

    path = tmp_path_factory.mktemp("electra_tok")
    torch.manual_seed(0)
    config = transformers.ElectraConfig(**{**TINY_ELECTRA, "vocab_size": 30522, "hidden_dropout_prob": 0.0,
                                                     "attention_probs_dropout_prob": 0.0})
    transformers.ElectraForPreTraining(config).save_pretrained(path)
    for name in TOKENIZER_FILES:
        shutil.copy(minilm_path() / name, path / name)
    return path


def test_padding_side_is_right():
    assert backbone_spec("electra").padding_side == "right"


def test_inspect_train_evaluate_predict_and_convert_commands_work_on_electra(
    electra_with_tokenizer, snippets_csv, tmp_path, capsys
):
    inspected = check_cli_lifecycle(electra_with_tokenizer, snippets_csv, tmp_path, capsys,
                                    model_type="electra", head="electra")
    assert "classifier.out_proj.weight" in inspected and "discriminator_predictions.dense.weight" in inspected
    exported = load_file(tmp_path / "run" / "model.safetensors")
    assert "electra.embeddings_project.weight" in exported and "classifier.out_proj.weight" in exported
