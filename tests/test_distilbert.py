"""DistilBERT and the "distilbert" head: what is particular to them. No token types, the head on
BERT against a torch reference, which dropout the head takes, transformers' sinusoidal position
table, every DistilBERT config field kept on export, the loaded names of a masked-LM checkpoint.
The scenarios every family shares (row "distilbert" of tests/families.py) are in
tests/test_family_*.py."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import transformers
from flax import nnx

import flaxheads
from families import BERT, DISTILBERT
from family_parity import assert_close, flax_logits, state_dict
from flaxheads.backbones import DistilBertConfig, backbone_config_from_hf
from flaxheads.backbones.encoder import sinusoidal_table


@pytest.mark.slow  # runs the family beyond its canonical parity (the fast lane has that)
def test_token_type_ids_are_ignored_as_distilbert_has_no_token_types(hf_checkpoint):
    model = flaxheads.from_pretrained(hf_checkpoint(DISTILBERT.classifier).path)
    batch = DISTILBERT.batch("right")
    token_types = np.zeros_like(batch["input_ids"])
    token_types[:, 5:] = 1

    with_types = flax_logits(model, {**batch, "token_type_ids": token_types})

    np.testing.assert_array_equal(with_types, flax_logits(model, batch))
    assert model.backbone.embeddings.token_type_embeddings is None


@pytest.mark.parametrize("padding", ["right", "left"])
@pytest.mark.slow  # runs the family beyond its canonical parity (the fast lane has that)
def test_distilbert_head_on_bert_matches_a_torch_reference_and_round_trips(hf_checkpoint, tmp_path, padding):
    checkpoint = hf_checkpoint(BERT.base)
    batch = {**DISTILBERT.batch(padding), "token_type_ids": np.zeros((3, 11), np.int64)}
    model = flaxheads.from_pretrained(checkpoint.path, head="distilbert", num_labels=4)
    model.save_pretrained(tmp_path)
    weights = state_dict(tmp_path)
    with torch.no_grad():
        first = checkpoint.model(**{k: torch.as_tensor(v) for k, v in batch.items()}).last_hidden_state[:, 0]
        pre = torch.relu(first @ weights["head.pre_classifier.weight"].T + weights["head.pre_classifier.bias"])
        expected = pre @ weights["head.classifier.weight"].T + weights["head.classifier.bias"]

    assert_close(flax_logits(model, batch), expected.numpy(), f"distilbert head on bert, {padding} padding")
    assert_close(flax_logits(flaxheads.from_pretrained(tmp_path), batch), expected.numpy(), "reloaded")


def test_head_dropout_is_seq_classif_dropout_on_distilbert_and_the_classifier_dropout_elsewhere(hf_checkpoint):
    on_distilbert = flaxheads.from_pretrained(hf_checkpoint(DISTILBERT.classifier, seq_classif_dropout=0.3).path)
    on_bert = flaxheads.from_pretrained(hf_checkpoint(BERT.base).path, head="distilbert")
    overridden = flaxheads.from_pretrained(hf_checkpoint(DISTILBERT.classifier).path, classifier_dropout=0.05)

    assert on_distilbert.config.head_config().dropout_rate == 0.3
    assert on_bert.config.head_config().dropout_rate == 0.1  # BERT's hidden_dropout_prob
    assert overridden.config.head_config().dropout_rate == 0.05


@pytest.mark.slow  # initialises a model
def test_fresh_sinusoidal_model_starts_from_transformers_position_table():
    config = DistilBertConfig(vocab_size=99, dim=32, n_heads=4, hidden_dim=37, n_layers=1, max_position_embeddings=24,
                              sinusoidal_pos_embds=True)
    model = flaxheads.SequenceClassifier(flaxheads.ClassifierConfig(config, head="distilbert"), rngs=nnx.Rngs(0))
    torch_model = transformers.DistilBertModel(transformers.DistilBertConfig(**config.to_hf_config()))

    table = np.asarray(model.backbone.embeddings.position_embeddings.embedding[...])

    np.testing.assert_array_equal(table, sinusoidal_table(24, 32))
    np.testing.assert_array_equal(table, torch_model.embeddings.position_embeddings.weight.detach().numpy())


def test_export_keeps_every_distilbert_config_field(hf_checkpoint, tmp_path):
    checkpoint = hf_checkpoint(DISTILBERT.classifier, num_labels=2, sinusoidal_pos_embds=True, activation="relu")
    flaxheads.from_pretrained(checkpoint.path).save_pretrained(tmp_path)
    source, exported = (json.loads((p / "config.json").read_text()) for p in (checkpoint.path, tmp_path))

    for name in ("dim", "n_layers", "n_heads", "hidden_dim", "activation", "sinusoidal_pos_embds", "dropout",
                 "attention_dropout", "seq_classif_dropout", "qa_dropout", "max_position_embeddings", "model_type"):
        assert exported[name] == source[name], name
    assert backbone_config_from_hf(exported) == backbone_config_from_hf(source)


def test_masked_lm_checkpoint_loads_its_distilbert_backbone_and_nothing_else(hf_checkpoint):
    _, info = flaxheads.from_pretrained(hf_checkpoint("DistilBertForMaskedLM").path, output_loading_info=True)

    assert all(name.startswith("distilbert.") for name in info.loaded)

