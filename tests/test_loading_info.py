"""LoadingInfo: exactly which checkpoint tensors a load used, created, and left, per checkpoint kind."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from safetensors import safe_open

import flaxheads

CLASSIFIER_BERT = ["classifier.bias", "classifier.weight"]
CLASSIFIER_ROBERTA = [
    "classifier.dense.bias", "classifier.dense.weight", "classifier.out_proj.bias", "classifier.out_proj.weight",
]


def checkpoint_names(checkpoint) -> list[str]:
    with safe_open(checkpoint.path / "model.safetensors", framework="numpy") as handle:
        return sorted(handle.keys())


def load(checkpoint, **kwargs):
    return flaxheads.from_pretrained(checkpoint.path, output_loading_info=True, **kwargs)


def assert_partition(info, names: list[str], *, new: list[str], unused_prefixes: tuple[str, ...] = ()) -> None:
    """`names` (the checkpoint's) split into loaded and unused by prefix; `new` exactly as given."""
    unused = sorted(n for n in names if n.startswith(unused_prefixes)) if unused_prefixes else []
    assert info.newly_initialized == sorted(new)
    assert info.unused == unused
    assert info.loaded == sorted(set(names) - set(unused))
    assert info.mismatched == []


def test_bert_base_model_loads_pooler_and_creates_only_the_classifier(hf_checkpoint):
    checkpoint = hf_checkpoint("BertModel")

    _, info = load(checkpoint)

    assert_partition(info, checkpoint_names(checkpoint), new=CLASSIFIER_BERT)
    assert {"pooler.dense.weight", "pooler.dense.bias"} <= set(info.loaded)
    assert info.head == "pooler"
    assert not info.fully_pretrained


def test_bert_pretraining_checkpoint_leaves_mlm_and_nsp_heads_unused(hf_checkpoint):
    checkpoint = hf_checkpoint("BertForPreTraining")

    _, info = load(checkpoint)

    assert_partition(info, checkpoint_names(checkpoint), new=CLASSIFIER_BERT, unused_prefixes=("cls.",))
    assert {"cls.seq_relationship.weight", "cls.predictions.transform.dense.weight"} <= set(info.unused)
    assert "bert.pooler.dense.weight" in info.loaded


def test_bert_masked_lm_checkpoint_has_no_pooler_so_pooler_is_new(hf_checkpoint):
    checkpoint = hf_checkpoint("BertForMaskedLM")

    _, info = load(checkpoint)

    new = ["bert.pooler.dense.bias", "bert.pooler.dense.weight", *CLASSIFIER_BERT]
    assert_partition(info, checkpoint_names(checkpoint), new=new, unused_prefixes=("cls.",))


def test_roberta_base_model_creates_classification_head_and_leaves_pooler_unused(hf_checkpoint):
    checkpoint = hf_checkpoint("RobertaModel")

    _, info = load(checkpoint)

    assert info.head == "roberta"
    assert_partition(info, checkpoint_names(checkpoint), new=CLASSIFIER_ROBERTA, unused_prefixes=("pooler.",))


def test_roberta_masked_lm_checkpoint_leaves_lm_head_unused(hf_checkpoint):
    checkpoint = hf_checkpoint("RobertaForMaskedLM")

    _, info = load(checkpoint)

    assert_partition(info, checkpoint_names(checkpoint), new=CLASSIFIER_ROBERTA, unused_prefixes=("lm_head.",))
    assert "lm_head.dense.weight" in info.unused


@pytest.mark.parametrize("architecture", ["BertForSequenceClassification", "RobertaForSequenceClassification"])
def test_classifier_checkpoint_is_fully_pretrained(hf_checkpoint, architecture):
    checkpoint = hf_checkpoint(architecture, num_labels=3)

    model, info = load(checkpoint)

    assert_partition(info, checkpoint_names(checkpoint), new=[])
    assert info.fully_pretrained
    assert model.config.num_labels == 3
    assert "new: none" in str(info)


def test_roberta_pooler_head_takes_pretrained_pooler_from_base_model(hf_checkpoint):
    checkpoint = hf_checkpoint("RobertaModel")

    _, info = load(checkpoint, head="pooler")

    assert info.newly_initialized == ["head.classifier.bias", "head.classifier.weight"]
    assert {"pooler.dense.weight", "pooler.dense.bias"} <= set(info.loaded)
    assert info.unused == []


@pytest.mark.parametrize("head", ["cls", "mean"])
def test_pooler_free_heads_leave_bert_pooler_unused(hf_checkpoint, head):
    checkpoint = hf_checkpoint("BertModel")

    _, info = load(checkpoint, head=head)

    assert_partition(
        info, checkpoint_names(checkpoint),
        new=["head.classifier.bias", "head.classifier.weight"], unused_prefixes=("pooler.",),
    )


def test_summary_names_every_parameter_that_must_be_trained(hf_checkpoint):
    _, info = load(hf_checkpoint("BertForMaskedLM"))

    text = str(info)

    assert "must be trained" in text
    for name in ["bert.pooler.dense.weight", "classifier.weight", "classifier.bias"]:
        assert name in text
    assert "unused" in text and "cls.predictions.transform.dense.weight" in text
    assert str(info.source) in text


def test_same_seed_gives_the_same_new_classifier(hf_checkpoint):
    checkpoint = hf_checkpoint("BertModel")

    kernels = [
        np.asarray(flaxheads.from_pretrained(checkpoint.path, num_labels=3, seed=seed).head.classifier.kernel[...])
        for seed in (0, 0, 1)
    ]

    np.testing.assert_array_equal(kernels[0], kernels[1])
    assert not np.allclose(kernels[0], kernels[2])


# ---------------------------------------------------------------------------------------------
# init_classifier_from_nsp


def test_nsp_initialisation_loads_seq_relationship_into_classifier(hf_checkpoint):
    checkpoint = hf_checkpoint("BertForPreTraining")

    model, info = load(checkpoint, num_labels=2, init_classifier_from_nsp=True)

    assert info.newly_initialized == []
    assert {"cls.seq_relationship.weight", "cls.seq_relationship.bias"} <= set(info.loaded)
    assert "cls.seq_relationship.weight" not in info.unused
    assert any("seq_relationship" in note for note in info.notes)
    assert "seq_relationship" in str(info)
    state = checkpoint.model.state_dict()
    np.testing.assert_array_equal(
        np.asarray(model.head.classifier.kernel[...]), state["cls.seq_relationship.weight"].numpy().T
    )


@pytest.mark.slow
def test_nsp_initialised_classifier_reproduces_transformers_nsp_logits(hf_checkpoint):
    checkpoint = hf_checkpoint("BertForPreTraining")
    rng = np.random.default_rng(0)
    input_ids = rng.integers(3, 99, (2, 8))
    token_type_ids = (np.arange(8) >= 4).astype(np.int64)[None].repeat(2, axis=0)
    model = flaxheads.from_pretrained(checkpoint.path, num_labels=2, init_classifier_from_nsp=True)

    logits = model(jnp.asarray(input_ids), token_type_ids=jnp.asarray(token_type_ids))

    with torch.no_grad():
        expected = checkpoint.model(
            torch.from_numpy(input_ids), token_type_ids=torch.from_numpy(token_type_ids)
        ).seq_relationship_logits.numpy()
    print(f"NSP logits: max abs difference {np.max(np.abs(np.asarray(logits) - expected)):.3g}")
    np.testing.assert_allclose(np.asarray(logits), expected, atol=1e-5, rtol=1e-5)


def test_nsp_initialisation_without_nsp_head_names_the_missing_tensor(hf_checkpoint):
    with pytest.raises(flaxheads.CheckpointError, match=r"cls\.seq_relationship\.weight"):
        load(hf_checkpoint("BertForMaskedLM"), num_labels=2, init_classifier_from_nsp=True)


def test_nsp_initialisation_with_three_labels_says_it_needs_two(hf_checkpoint):
    with pytest.raises(ValueError, match=r"num_labels=2.*num_labels=3"):
        load(hf_checkpoint("BertForPreTraining"), num_labels=3, init_classifier_from_nsp=True)


def test_nsp_initialisation_on_roberta_is_refused(hf_checkpoint):
    with pytest.raises(ValueError, match="init_classifier_from_nsp.*model_type='roberta'"):
        load(hf_checkpoint("RobertaModel"), num_labels=2, head="pooler", init_classifier_from_nsp=True)
