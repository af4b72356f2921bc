"""BERT and RoBERTa: what is particular to them. Token types and explicit position ids, the family
default pad id of a config without one, the backbone of a classifier checkpoint, the heads
transformers has no class for against torch references written here from transformers' hidden
states and the exported weights, and the export of labels, problem type, classifier dropout and
float16 / bfloat16 files. The scenarios every family shares are in tests/test_family_*.py."""

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
from families import BERT, ROBERTA
from family_parity import (
    assert_close, assert_same_params, assert_state_dicts_identical, flax_inputs, flax_logits, state_dict, torch_forward,
    torch_logits,
)

ROWS = {"bert": BERT, "roberta": ROBERTA}
PAD_ID = {"bert": 0, "roberta": 1}


def token_batch(family: str, padding: str) -> dict[str, np.ndarray]:
    """Three sequences of lengths (10, 7, 2) padded on `padding` with the family's pad id; BERT's
    in two segments."""
    return ROWS[family].batch(padding)


# ---------------------------------------------------------------------------------------------
# Inputs and configs


def test_bert_token_type_ids_reach_the_logits_as_in_transformers(hf_checkpoint):
    checkpoint = hf_checkpoint(BERT.classifier, num_labels=2)
    batch = token_batch("bert", "none")
    batch["token_type_ids"] = 1 - batch["token_type_ids"]
    model = flaxheads.from_pretrained(checkpoint.path)

    logits = model(**flax_inputs(batch))
    without_types = model(**flax_inputs({**batch, "token_type_ids": np.zeros_like(batch["input_ids"])}))

    assert_close(logits, torch_logits(checkpoint.model, batch), "bert, swapped segments")
    assert np.max(np.abs(np.asarray(logits - without_types))) > 1e-3


def test_roberta_explicit_position_ids_match_transformers(hf_checkpoint):
    checkpoint = hf_checkpoint(ROBERTA.classifier, num_labels=2)
    batch = token_batch("roberta", "left")
    batch["position_ids"] = np.broadcast_to(np.arange(2, 12), batch["input_ids"].shape).copy()
    model = flaxheads.from_pretrained(checkpoint.path)

    assert_close(model(**flax_inputs(batch)), torch_logits(checkpoint.model, batch), "roberta position_ids")


@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_config_without_pad_token_id_uses_the_family_default_as_transformers_does(hf_checkpoint, tmp_path, family):
    checkpoint = hf_checkpoint(ROWS[family].classifier, num_labels=2)
    shutil.copytree(checkpoint.path, tmp_path, dirs_exist_ok=True)
    config = json.loads((tmp_path / "config.json").read_text())
    del config["pad_token_id"]  # third-party configs may leave family defaults out
    (tmp_path / "config.json").write_text(json.dumps(config))
    batch = token_batch(family, "right")
    reference = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path).eval()

    model = flaxheads.from_pretrained(tmp_path)

    assert model.config.backbone.pad_token_id == reference.config.pad_token_id == PAD_ID[family]
    assert_close(model(**flax_inputs(batch)), torch_logits(reference, batch), f"{family} without pad_token_id")


@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_load_backbone_reads_a_flaxheads_format_directory(hf_checkpoint, tmp_path, family):
    checkpoint = hf_checkpoint(ROWS[family].base)
    inputs = flax_inputs(token_batch(family, "right"))
    flaxheads.from_pretrained(checkpoint.path, head="pooler", num_labels=3).save_pretrained(tmp_path, format="flaxheads")

    from_flax, info = flaxheads.load_backbone(tmp_path)

    from_pytorch, _ = flaxheads.load_backbone(checkpoint.path)
    assert info.newly_initialized == []
    assert info.unused == ["head.classifier.bias", "head.classifier.kernel"]
    assert_same_params(from_flax, from_pytorch)
    expected = from_pytorch(**inputs)
    np.testing.assert_array_equal(np.asarray(from_flax(**inputs).pooler_output), np.asarray(expected.pooler_output))


# ---------------------------------------------------------------------------------------------
# Heads transformers has no class for: reference from transformers' hidden states + exported weights


def _linear(x: torch.Tensor, weights: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    return torch.nn.functional.linear(x, weights[f"{name}.weight"], weights[f"{name}.bias"])


def _masked_mean(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    mask = mask[..., None].to(hidden.dtype)
    return (hidden * mask).sum(1) / mask.sum(1)


def _masked_max(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return hidden.masked_fill(mask[..., None] == 0, -torch.inf).amax(1)


def _attention_pool(hidden: torch.Tensor, mask: torch.Tensor, query: torch.Tensor) -> torch.Tensor:
    scores = (hidden @ query[0]).masked_fill(mask == 0, -torch.inf)
    return (torch.softmax(scores, dim=1)[..., None] * hidden).sum(1)


# head -> f(hidden_states, attention_mask, exported tensors, base prefix) -> logits
REFERENCE_HEADS = {
    "cls": lambda hs, mask, w, base: _linear(hs[-1][:, 0], w, "head.classifier"),
    "mean": lambda hs, mask, w, base: _linear(_masked_mean(hs[-1], mask), w, "head.classifier"),
    "mean_max": lambda hs, mask, w, base: _linear(
        torch.cat([_masked_mean(hs[-1], mask), _masked_max(hs[-1], mask)], dim=-1), w, "head.classifier"
    ),
    "attention": lambda hs, mask, w, base: _linear(
        _attention_pool(hs[-1], mask, w["head.query.weight"]), w, "head.classifier"
    ),
    "concat_last4": lambda hs, mask, w, base: _linear(
        torch.cat([hs[-k][:, 0] for k in (1, 2, 3, 4)], dim=-1), w, "head.classifier"
    ),
    "roberta": lambda hs, mask, w, base: _linear(
        torch.tanh(_linear(hs[-1][:, 0], w, "head.dense")), w, "head.out_proj"
    ),
    "pooler": lambda hs, mask, w, base: _linear(
        torch.tanh(_linear(hs[-1][:, 0], w, f"{base}.pooler.dense")), w, "head.classifier"
    ),
}
NON_CANONICAL = [
    *[("bert", head) for head in ("roberta", "cls", "mean", "mean_max", "attention", "concat_last4")],
    *[("roberta", head) for head in ("pooler", "cls", "mean", "mean_max", "attention", "concat_last4")],
]


@pytest.mark.parametrize("padding", ["right", pytest.param("left", marks=pytest.mark.slow)])
@pytest.mark.parametrize(("family", "head"), NON_CANONICAL)
def test_non_canonical_head_logits_match_torch_reference(hf_checkpoint, tmp_path, family, head, padding):
    checkpoint = hf_checkpoint(ROWS[family].base, num_hidden_layers=4)
    batch = token_batch(family, padding)
    model = flaxheads.from_pretrained(checkpoint.path, head=head, num_labels=3, seed=1)
    model.save_pretrained(tmp_path)
    exported = load_file(tmp_path / "model.safetensors")

    logits = model(**flax_inputs(batch))

    hidden_states = torch_forward(checkpoint.model, batch, output_hidden_states=True).hidden_states
    expected = REFERENCE_HEADS[head](hidden_states, torch.from_numpy(batch["attention_mask"]), exported, family)
    assert logits.shape == (3, 3)
    assert_close(logits, expected, f"{head} head on {family}, padding={padding}")


def test_pooler_head_on_roberta_uses_the_pretrained_pooler(hf_checkpoint, tmp_path):
    checkpoint = hf_checkpoint(ROBERTA.base, num_hidden_layers=4)
    model = flaxheads.from_pretrained(checkpoint.path, head="pooler", num_labels=3)
    model.save_pretrained(tmp_path)
    exported = load_file(tmp_path / "model.safetensors")

    for name in ("pooler.dense.weight", "pooler.dense.bias"):
        assert torch.equal(exported[f"roberta.{name}"], checkpoint.model.state_dict()[name])


def test_mean_head_ignores_padding_tokens(hf_checkpoint):
    checkpoint = hf_checkpoint(BERT.base, num_hidden_layers=2)
    batch = token_batch("bert", "right")
    model = flaxheads.from_pretrained(checkpoint.path, head="mean", num_labels=3)
    changed_padding = {**batch, "input_ids": np.where(batch["attention_mask"] == 1, batch["input_ids"], 7)}

    np.testing.assert_allclose(
        np.asarray(model(**flax_inputs(batch))), np.asarray(model(**flax_inputs(changed_padding))), atol=1e-6
    )


# Train-mode dropout compiles per head: the fast lane keeps one.
@pytest.mark.parametrize("head", [pytest.param(h, marks=() if h == "cls" else pytest.mark.slow)
                                  for h in flaxheads.HEAD_NAMES])
def test_all_padding_row_gives_finite_logits_with_and_without_dropout(hf_checkpoint, head):
    """Batches padded with dummy examples (example_mask 0) must not poison the loss with NaN."""
    checkpoint = hf_checkpoint(BERT.base, num_hidden_layers=4)
    batch = token_batch("bert", "right")
    batch["attention_mask"][2] = 0
    batch["input_ids"][2] = PAD_ID["bert"]
    model = flaxheads.from_pretrained(checkpoint.path, head=head, num_labels=3)

    logits = model(**flax_inputs(batch))
    model.train()
    with_dropout = model(**flax_inputs(batch), rngs=nnx.Rngs(dropout=0))

    assert np.isfinite(np.asarray(logits)).all() and np.isfinite(np.asarray(with_dropout)).all()


@pytest.mark.parametrize("head", ["mean", "mean_max", "attention", "concat_last4"])
def test_non_canonical_head_round_trips_through_flax_format(hf_checkpoint, tmp_path, head):
    checkpoint = hf_checkpoint(ROBERTA.base, num_hidden_layers=4)
    model = flaxheads.from_pretrained(checkpoint.path, head=head, num_labels=3)

    model.save_pretrained(tmp_path, format="flaxheads")
    again, info = flaxheads.from_pretrained(tmp_path, output_loading_info=True)

    assert again.config.head == head and info.fully_pretrained
    assert_same_params(again, model)


# ---------------------------------------------------------------------------------------------
# What the export keeps


def test_default_float32_params_upcast_a_float16_checkpoint(hf_checkpoint):
    checkpoint = hf_checkpoint(BERT.classifier, num_labels=3, torch_dtype="float16")

    model = flaxheads.from_pretrained(checkpoint.path)

    assert {v[...].dtype for _, v in nnx.to_flat_state(nnx.state(model, nnx.Param))} == {jnp.dtype("float32")}
    np.testing.assert_array_equal(
        np.asarray(model.head.classifier.kernel[...]),
        checkpoint.model.classifier.weight.detach().float().numpy().T,
    )


def test_bfloat16_pytorch_bin_keeps_its_bits(hf_checkpoint, tmp_path):
    checkpoint = hf_checkpoint(BERT.classifier, num_labels=3, torch_dtype="bfloat16")
    torch.save(checkpoint.model.state_dict(), tmp_path / "pytorch_model.bin")
    shutil.copy(checkpoint.path / "config.json", tmp_path)

    model = flaxheads.from_pretrained(tmp_path, param_dtype="auto")
    model.save_pretrained(tmp_path / "export")

    assert_state_dicts_identical(state_dict(tmp_path / "export"), state_dict(checkpoint.path))


def test_export_of_a_new_classifier_keeps_labels_and_problem_type(hf_checkpoint, tmp_path):
    checkpoint = hf_checkpoint(BERT.base)
    model = flaxheads.from_pretrained(
        checkpoint.path, num_labels=3, id2label=["neg", "neu", "pos"], problem_type=flaxheads.SINGLE_LABEL
    )
    model.save_pretrained(tmp_path)

    config = transformers.AutoConfig.from_pretrained(tmp_path)
    again = flaxheads.from_pretrained(tmp_path)

    assert config.id2label == {0: "neg", 1: "neu", 2: "pos"}
    assert config.problem_type == flaxheads.SINGLE_LABEL
    assert again.config.label_names == ("neg", "neu", "pos")
    assert again.config.problem_type == flaxheads.SINGLE_LABEL


@pytest.mark.parametrize("override", [None, 0.2])
def test_export_keeps_the_classifier_dropout(hf_checkpoint, tmp_path, override):
    checkpoint = hf_checkpoint(BERT.classifier, num_labels=2, classifier_dropout=0.3)
    expected = 0.3 if override is None else override
    model = flaxheads.from_pretrained(checkpoint.path, classifier_dropout=override)
    model.save_pretrained(tmp_path)

    again = flaxheads.from_pretrained(tmp_path)

    assert model.head.cfg.dropout_rate == expected
    assert json.loads((tmp_path / "config.json").read_text())["classifier_dropout"] == expected
    assert transformers.AutoConfig.from_pretrained(tmp_path).classifier_dropout == expected
    assert again.head.cfg.dropout_rate == expected


def test_non_canonical_export_keeps_the_head_weights_transposed_as_torch_linear(hf_checkpoint, tmp_path):
    checkpoint = hf_checkpoint(BERT.base, num_hidden_layers=4)
    model = flaxheads.from_pretrained(checkpoint.path, head="mean", num_labels=3)

    model.save_pretrained(tmp_path)

    exported = load_file(tmp_path / "model.safetensors")
    assert sorted(k for k in exported if not k.startswith("bert.")) == ["head.classifier.bias", "head.classifier.weight"]
    np.testing.assert_array_equal(exported["head.classifier.weight"].numpy(),
                                  np.asarray(model.head.classifier.kernel[...]).T)
    np.testing.assert_array_equal(flax_logits(flaxheads.from_pretrained(tmp_path), token_batch("bert", "right")),
                                  flax_logits(model, token_batch("bert", "right")))
