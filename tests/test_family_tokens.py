"""Token classification and multiple choice on every family of tests/families.py that transformers
has the class for (`Family.token_classifier`, `Family.multiple_choice`): logits and loss equal
transformers' on every padding side the row tests, the trained head loads as pretrained and a new
head is reported as new (with the tensors transformers' own class would leave unused), exports
load in transformers' Auto classes with no missing or unexpected keys, PyTorch -> flaxheads ->
PyTorch is bit-identical, and a checkpoint of another task's class is refused."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import transformers
from flax import nnx

import flaxheads
from families import FAMILIES, case
from family_parity import (
    assert_close, assert_state_dicts_identical, flax_inputs, flax_logits, state_dict, torch_forward, torch_logits,
)
from flaxheads import lora
from flaxheads.conversion import peft
from flaxheads.training.trainable import split_trainable

TAGS = ("O", "B-PER", "I-PER", "B-LOC", "I-LOC")
"""The labels of the token classifiers: 5 classes with names, as a NER checkpoint has."""
CHOICES = 3


def _rows(field: str, *, fast: bool = True) -> list:
    """A param per row whose `field` names a transformers class; a second config of another row's
    classes (deberta-v2, llama_linear_rope) runs in the full suite only."""
    return [case(row, id=row.name, fast=fast and row.family_of_classes)
            for row in FAMILIES.values() if getattr(row, field) is not None]


def _token_labels(batch: dict, seed: int = 0) -> np.ndarray:
    """A class per real token, -100 (ignored) on padding and on every fourth token."""
    ids = batch["input_ids"]
    labels = np.random.default_rng(seed).integers(0, len(TAGS), ids.shape)
    ignored = (batch["attention_mask"] == 0) | (np.arange(ids.shape[1])[None, :] % 4 == 3)
    return np.where(ignored, -100, labels)


def _six_rows(row, padding: str) -> dict:
    """(6, seq): the row's three sequences (padded on `padding`) under two seeds. The token and
    the multiple-choice tests run the backbone on this one shape, so each family's operations
    compile once for both."""
    first, second = row.batch(padding, seed=0), row.batch(padding, seed=1)
    return {name: np.concatenate([first[name], second[name]]) for name in first}


def _choice_batch(row, padding: str) -> dict:
    """Two examples of CHOICES choices, (2, CHOICES, seq) (`_six_rows`): each example holds a
    long, a shorter and a two-token choice."""
    return {name: rows.reshape(2, CHOICES, -1) for name, rows in _six_rows(row, padding).items()}


def _eager(row) -> dict:
    return {"attn_implementation": "eager"} if row.eager else {}


def _expected_report(source, trained, row, architecture: str) -> tuple[list[str], list[str]]:
    """(newly_initialized, unused) of a load of `source` as transformers' class whose checkpoint
    is `trained`: the tensors one has and the other lacks, named as in `source` (a bare model
    names its tensors without the base-model prefix)."""
    prefix = f"{trained.model.base_model_prefix}."
    wanted = set(state_dict(trained.path))
    if architecture == row.base:
        wanted = {name.removeprefix(prefix) for name in wanted}
    present = set(state_dict(source.path))
    return sorted(wanted - present), sorted(present - wanted)


def _assert_export_loads_in_transformers(model, path, row, auto_class, architecture: str, batch: dict) -> None:
    config = json.loads((path / "config.json").read_text())
    reloaded, info = auto_class.from_pretrained(path, output_loading_info=True, **_eager(row))

    assert config["architectures"] == [architecture] and type(reloaded).__name__ == architecture
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    assert_close(flax_logits(model, batch), torch_logits(reloaded.eval(), batch), f"{row.name} export in transformers")


# ---------------------------------------------------------------------------------------------
# Token classification


@pytest.mark.parametrize("row", _rows("token_classifier"))
def test_token_logits_and_loss_match_transformers_and_the_round_trip_is_bit_identical(hf_checkpoint, tmp_path, row):
    checkpoint = hf_checkpoint(row.token_classifier, family=row.name, num_labels=len(TAGS))
    model, info = flaxheads.from_pretrained(checkpoint.path, task="token-classification", output_loading_info=True)

    assert isinstance(model, flaxheads.TokenClassifier) and model.config.num_labels == len(TAGS)
    assert info.fully_pretrained and info.unused == []
    for padding in row.paddings:
        batch = _six_rows(row, padding)
        labels = _token_labels(batch)
        logits = model(**flax_inputs(batch))
        expected = torch_forward(checkpoint.model, {**batch, "labels": labels})
        assert logits.shape == (*batch["input_ids"].shape, len(TAGS)) and logits.dtype == jnp.float32
        assert_close(logits, expected.logits, f"{row.token_classifier} logits, {padding} padding")
        assert_close(model.loss(logits, jnp.asarray(labels)), expected.loss, f"{row.token_classifier} loss, {padding}")

    model.save_pretrained(tmp_path)
    assert_state_dicts_identical(state_dict(tmp_path), state_dict(checkpoint.path))
    _assert_export_loads_in_transformers(model, tmp_path, row, transformers.AutoModelForTokenClassification,
                                         row.token_classifier, batch)
    with pytest.raises(ValueError, match=rf"{row.token_classifier}.*task='token-classification'"):
        flaxheads.from_pretrained(checkpoint.path)  # a sequence classifier would take `classifier` for its own


def _new_head_rows(field: str) -> list:
    """Slow params (each load initialises a new head, compiled), one per family of classes."""
    return [case(row, id=row.name, fast=False) for row in FAMILIES.values()
            if getattr(row, field) is not None and row.family_of_classes]


@pytest.mark.parametrize("row", _new_head_rows("token_classifier"))
def test_token_head_is_new_on_the_bare_model_and_exports_with_its_label_names(hf_checkpoint, tmp_path, row):
    """transformers' token classifier of the row names the tensors the report must list (the
    bare model's pooler, where it has one, is unused); the pretraining checkpoints' reports are
    the next test's and the multiple-choice test's."""
    trained = hf_checkpoint(row.token_classifier, family=row.name, num_labels=len(TAGS))
    source = hf_checkpoint(row.base, family=row.name)
    model, info = flaxheads.TokenClassifier.from_pretrained(source.path, id2label=list(TAGS), seed=3,
                                                           output_loading_info=True)

    new, unused = _expected_report(source, trained, row, row.base)
    assert new and info.newly_initialized == new
    assert info.unused == unused
    model.save_pretrained(tmp_path)
    _assert_export_loads_in_transformers(model, tmp_path, row, transformers.AutoModelForTokenClassification,
                                         row.token_classifier, _six_rows(row, row.sample_padding))
    assert transformers.AutoConfig.from_pretrained(tmp_path).id2label == dict(enumerate(TAGS))


@pytest.mark.parametrize("row", [case(row, id=row.name, fast=False) for row in FAMILIES.values()
                                 if row.token_classifier and row.family_of_classes
                                 and (row.multiple_choice is None or row.name == "bert")])
def test_token_head_is_new_on_a_pretraining_checkpoint_whose_lm_head_is_unused(hf_checkpoint, row):
    """BERT's masked LM, GPT-2's and the decoders' causal LMs (the families without a multiple-choice
    class, whose test covers the encoders' pretraining checkpoints): the token head is new and the
    LM head unused, as transformers' own token classifier reports them (a tied LM head is not saved)."""
    trained = hf_checkpoint(row.token_classifier, family=row.name, num_labels=len(TAGS))
    source = hf_checkpoint(row.pretrained, family=row.name)
    _, info = flaxheads.TokenClassifier.from_pretrained(source.path, id2label=list(TAGS), output_loading_info=True,
                                                        **dict(row.load_options))

    new, unused = _expected_report(source, trained, row, row.pretrained)
    assert new and info.newly_initialized == new
    assert info.unused == unused
    print(f"{row.pretrained}: new {new}, unused {unused}")


# ---------------------------------------------------------------------------------------------
# Multiple choice


@pytest.mark.parametrize("row", _rows("multiple_choice"))
def test_choice_logits_and_loss_match_transformers_and_the_round_trip_is_bit_identical(hf_checkpoint, tmp_path, row):
    checkpoint = hf_checkpoint(row.multiple_choice, family=row.name)
    model, info = flaxheads.from_pretrained(checkpoint.path, task="multiple-choice", output_loading_info=True)
    labels = np.array([2, 0])

    assert isinstance(model, flaxheads.MultipleChoice)
    assert info.fully_pretrained and info.unused == []
    for padding in row.paddings:
        batch = _choice_batch(row, padding)
        logits = model(**flax_inputs(batch))
        expected = torch_forward(checkpoint.model, {**batch, "labels": labels})
        assert logits.shape == (2, CHOICES) and logits.dtype == jnp.float32
        assert_close(logits, expected.logits, f"{row.multiple_choice} logits, {padding} padding")
        assert_close(model.loss(logits, jnp.asarray(labels)), expected.loss, f"{row.multiple_choice} loss, {padding}")

    model.save_pretrained(tmp_path)
    assert_state_dicts_identical(state_dict(tmp_path), state_dict(checkpoint.path))
    _assert_export_loads_in_transformers(model, tmp_path, row, transformers.AutoModelForMultipleChoice,
                                         row.multiple_choice, batch)
    with pytest.raises(ValueError, match=rf"{row.multiple_choice}.*task='multiple-choice'"):
        flaxheads.TokenClassifier.from_pretrained(checkpoint.path)


@pytest.mark.parametrize("row", _new_head_rows("multiple_choice"))
def test_choice_head_is_new_on_a_pretraining_checkpoint_and_its_export_loads_in_transformers(
    hf_checkpoint, tmp_path, row
):
    """The pretraining heads are unused; ModernBERT's masked-LM prediction head is pretrained, as in transformers."""
    trained = hf_checkpoint(row.multiple_choice, family=row.name)
    source = hf_checkpoint(row.pretrained, family=row.name)
    model, info = flaxheads.MultipleChoice.from_pretrained(source.path, seed=3, output_loading_info=True)

    new, unused = _expected_report(source, trained, row, row.pretrained)
    assert new and info.newly_initialized == new
    assert info.unused == unused
    model.save_pretrained(tmp_path)
    _assert_export_loads_in_transformers(model, tmp_path, row, transformers.AutoModelForMultipleChoice,
                                         row.multiple_choice, _choice_batch(row, row.sample_padding))


# ---------------------------------------------------------------------------------------------
# What every task model shares


def test_a_family_without_the_class_and_an_unknown_task_are_refused(hf_checkpoint):
    checkpoint = hf_checkpoint("Gemma3ForCausalLM", family="gemma3_text")

    with pytest.raises(ValueError, match="'gemma3_text' has no token-classification model in transformers"):
        flaxheads.from_pretrained(checkpoint.path, task="token-classification")
    with pytest.raises(ValueError, match="'gpt2' has no multiple-choice model"):
        flaxheads.MultipleChoice.from_pretrained(hf_checkpoint("GPT2Model").path)
    with pytest.raises(ValueError, match="unknown task 'ner'"):
        flaxheads.from_pretrained(checkpoint.path, task="ner")


def test_lora_merges_into_the_exports_and_a_frozen_backbone_leaves_only_the_head_trainable(hf_checkpoint, tmp_path):
    """LoRA and freezing are generic over the model class: BERT's token classifier and multiple
    choice (a peft adapter folder is refused: save merged)."""
    config = lora.LoRAConfig(r=2, target_modules=("query", "value"))
    cases = (("BertForTokenClassification", flaxheads.TokenClassifier, transformers.AutoModelForTokenClassification,
              _six_rows(FAMILIES["bert"], "left")),
             ("BertForMultipleChoice", flaxheads.MultipleChoice, transformers.AutoModelForMultipleChoice,
              _choice_batch(FAMILIES["bert"], "right")))
    for architecture, model_class, auto_class, batch in cases:
        base = model_class.from_pretrained(hf_checkpoint(architecture, num_labels=len(TAGS)).path)
        model = base.with_lora(config)
        np.testing.assert_array_equal(flax_logits(model, batch), flax_logits(base, batch))  # fresh adapters: no-op
        for i, adapter in enumerate(lora.adapters(model).values()):  # as after training
            adapter.lora_b[...] = 0.3 * jax.random.normal(jax.random.key(i), adapter.lora_b.shape)
        trainable, _ = split_trainable(nnx.state(model, nnx.Param))
        frozen_backbone, _ = split_trainable(nnx.state(base, nnx.Param), freeze_backbone=True)

        assert {path[0] for path, _ in nnx.to_flat_state(trainable)} == {"backbone", "head"}  # adapters and head
        assert all(isinstance(v, nnx.LoRAParam) for p, v in nnx.to_flat_state(trainable) if p[0] == "backbone")
        assert {path[0] for path, _ in nnx.to_flat_state(frozen_backbone)} == {"head"}
        with pytest.raises(ValueError, match="SEQ_CLS only"):
            peft.peft_adapter(model)  # peft's adapter format is written for sequence classifiers only
        model.save_pretrained(tmp_path / architecture)
        _assert_export_loads_in_transformers(model, tmp_path / architecture, FAMILIES["bert"], auto_class,
                                             architecture, batch)
