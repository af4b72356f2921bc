"""ELECTRA and the "electra" head: what is particular to them. embedding_size in the config, token
types, the head's own activation, the hidden states when no projection is needed, the pooler head
(ELECTRA has no pooler), the RoBERTa head on ELECTRA and the "electra" head on BERT against
transformers' own head classes, the embedding projection loaded, and refused when missing. The
scenarios every family shares (row "electra" of tests/families.py) are in tests/test_family_*.py."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
import transformers
from safetensors.torch import load_file

import flaxheads
from families import ELECTRA
from family_parity import assert_close, assert_same_params, flax_inputs, torch_forward
from flaxheads.backbones import EncoderConfig

TINY_ELECTRA = ELECTRA.config
SAME_WIDTH = dict(embedding_size=36)  # no embeddings_project


def electra(hf_checkpoint, architecture: str, **overrides):
    """(path, torch model) of the ELECTRA row's checkpoint (tests/families.py)."""
    return hf_checkpoint(architecture, **overrides)


def token_batch(padding: str = "right", **options):
    """Three sequences of lengths (10, 7, 2) padded on `padding`; token type 1 on each second half."""
    return ELECTRA.batch(padding, **options)


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


@pytest.mark.slow  # runs the family beyond its canonical parity (the fast lane has that)
def test_token_type_ids_reach_the_logits_as_in_transformers(hf_checkpoint):
    path, reference = electra(hf_checkpoint, "ElectraForSequenceClassification", num_labels=3)
    batch = token_batch("right")
    zeros = {**batch, "token_type_ids": np.zeros_like(batch["token_type_ids"])}
    model = flaxheads.from_pretrained(path)

    with_types, all_zero = model(**flax_inputs(batch)), model(**flax_inputs(zeros))
    without = model(**flax_inputs({k: v for k, v in batch.items() if k != "token_type_ids"}))

    assert np.max(np.abs(np.asarray(with_types - all_zero))) > 1e-3
    assert_close(all_zero, torch_forward(reference, zeros).logits, "all-zero token types")
    assert_close(without, all_zero, "no token types vs all zeros", atol=0, rtol=0)


@pytest.mark.slow  # runs the family beyond its canonical parity (the fast lane has that)
def test_electra_head_uses_gelu_even_when_the_backbone_activation_is_another(hf_checkpoint):
    path, reference = electra(hf_checkpoint, "ElectraForSequenceClassification", num_labels=3, hidden_act="relu")
    batch = token_batch("right")

    assert_close(flaxheads.from_pretrained(path)(**flax_inputs(batch)), torch_forward(reference, batch).logits, "relu backbone")


@pytest.mark.slow  # runs the family beyond its canonical parity (the fast lane has that)
def test_every_hidden_state_matches_electra_model_without_a_projection_at_the_same_width(hf_checkpoint):
    widths = SAME_WIDTH  # the projected config is the row's own: tests/test_family_parity.py
    path, reference = electra(hf_checkpoint, "ElectraModel", **widths)
    batch = token_batch("right")
    backbone, info = flaxheads.load_backbone(path)

    out = backbone(**flax_inputs(batch))

    expected = torch_forward(reference, batch, output_hidden_states=True)
    assert info.newly_initialized == [] and info.unused == []
    assert len(out.hidden_states) == len(expected.hidden_states) == 3
    assert out.hidden_states[0].shape[-1] == 36 and out.pooler_output is None
    for layer, (ours, theirs) in enumerate(zip(out.hidden_states, expected.hidden_states)):
        assert_close(ours, theirs, f"ElectraModel hidden state {layer} {widths}")


# ---------------------------------------------------------------------------------------------
# Every head on ELECTRA, the "electra" head on BERT


def test_pooler_head_on_electra_is_new_and_said_so_as_electra_has_no_pooler(hf_checkpoint):
    path, _ = electra(hf_checkpoint, "ElectraModel")

    _, info = flaxheads.from_pretrained(path, head="pooler", num_labels=3, output_loading_info=True)

    assert "head.pooler.dense.weight" in info.newly_initialized


@pytest.mark.slow  # runs the family beyond its canonical parity (the fast lane has that)
def test_roberta_head_on_electra_matches_roberta_classification_head(hf_checkpoint, tmp_path):
    path, reference = electra(hf_checkpoint, "ElectraModel")
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
@pytest.mark.slow  # runs the family beyond its canonical parity (the fast lane has that)
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
# Loading report

@pytest.mark.parametrize("architecture", ["ElectraModel", "ElectraForPreTraining", "ElectraForMaskedLM"])
def test_every_checkpoint_type_loads_the_embedding_projection(hf_checkpoint, architecture):
    _, info = flaxheads.from_pretrained(electra(hf_checkpoint, architecture)[0], num_labels=2, output_loading_info=True)

    assert any(name.endswith("embeddings_project.weight") for name in info.loaded)


def test_missing_projection_is_refused_naming_the_tensor(hf_checkpoint, tmp_path):
    path, _ = electra(hf_checkpoint, "ElectraForSequenceClassification", num_labels=3)
    config = {**json.loads((path / "config.json").read_text()), "embedding_size": 36}  # no projection in the weights
    (tmp_path / "config.json").write_text(json.dumps(config))
    shutil.copy(path / "model.safetensors", tmp_path)

    with pytest.raises(flaxheads.ShapeMismatch, match=r"electra\.embeddings\.word_embeddings\.weight.*\(99, 20\)"):
        flaxheads.from_pretrained(tmp_path)


