"""XLM-RoBERTa: RoBERTa's encoder and conversion table under model_type "xlm-roberta". What is
particular to it: token types when a checkpoint has them, the pooler head reading transformers'
pooler, the family defaults of a config.json without them, and the loading report naming the
roberta.* backbone. The scenarios every family shares (row "xlm-roberta" of tests/families.py)
are in tests/test_family_*.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import flaxheads
from families import XLM_ROBERTA
from family_parity import assert_close, flax_logits, torch_logits
from flaxheads.backbones import backbone_config_from_hf


@pytest.mark.slow  # runs the family beyond its canonical parity (the fast lane has that)
def test_token_type_ids_reach_the_logits_as_in_transformers(hf_checkpoint):
    checkpoint = hf_checkpoint(XLM_ROBERTA.classifier, num_labels=3, type_vocab_size=2, hidden_act="gelu_new")
    batch = XLM_ROBERTA.batch("right")
    batch["token_type_ids"] = np.zeros_like(batch["input_ids"])
    batch["token_type_ids"][:, 5:] = 1
    model = flaxheads.from_pretrained(checkpoint.path)

    with_types = flax_logits(model, batch)

    assert_close(with_types, torch_logits(checkpoint.model, batch), "with token types")
    assert np.abs(with_types - flax_logits(model, {**batch, "token_type_ids": 0 * batch["token_type_ids"]})).max() > 1e-3


@pytest.mark.slow  # runs the family beyond its canonical parity (the fast lane has that)
def test_pooler_head_on_xlm_roberta_matches_transformers_pooler(hf_checkpoint):
    checkpoint = hf_checkpoint(XLM_ROBERTA.base)
    batch = XLM_ROBERTA.batch("left")
    model = flaxheads.from_pretrained(checkpoint.path, head="pooler", num_labels=2)
    with torch.no_grad():
        pooled = checkpoint.model(**{k: torch.as_tensor(v) for k, v in batch.items()}).pooler_output.numpy()
    kernel, bias = (np.asarray(p[...]) for p in (model.head.classifier.kernel, model.head.classifier.bias))

    assert_close(flax_logits(model, batch), pooled @ kernel + bias, "pooler head")


def test_config_without_pad_token_id_means_xlm_robertas_pad_one():
    config = backbone_config_from_hf({"model_type": "xlm-roberta", "hidden_size": 32, "num_attention_heads": 4})

    assert config.pad_token_id == 1 and config.position_ids_from_padding and config.max_sequence_length == 510
    assert config.to_hf_config()["model_type"] == "xlm-roberta"


def test_masked_lm_checkpoint_loads_its_roberta_backbone_and_nothing_else(hf_checkpoint):
    _, info = flaxheads.from_pretrained(hf_checkpoint("XLMRobertaForMaskedLM").path, output_loading_info=True)

    assert info.unused and all(name.startswith("lm_head.") for name in info.unused)
    assert all(name.startswith("roberta.") for name in info.loaded)
