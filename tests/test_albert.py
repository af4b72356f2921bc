"""ALBERT: what is particular to factorised embeddings and shared layers. The parameters exist
once, every layer-sharing layout gives transformers' hidden states, every shared layer gets
gradients, the pooler of each pretraining checkpoint type, the classifier dropout on export,
configs and weights it refuses, and transformers 4's Flax ALBERT files. The scenarios every
family shares (row "albert" of tests/families.py) are in tests/test_family_*.py."""

from __future__ import annotations

import json
import os

import jax.numpy as jnp
import numpy as np
import pytest
import transformers
from flax import nnx

import flaxheads
from families import ALBERT
from family_parity import assert_close, flat_params, flax_inputs, torch_forward


def albert(hf_checkpoint, architecture: str, **overrides):
    """(path, torch model) of the ALBERT row's checkpoint (tests/families.py)."""
    return hf_checkpoint(architecture, **overrides)


def albert_batch(padding: str = "right", **options):
    """Three sequences of lengths (9, 6, 2) padded with <pad> = 0, the second half of each in segment 1."""
    return ALBERT.batch(padding, **options)


# ---------------------------------------------------------------------------------------------
# Parity


def test_shared_layers_exist_once_in_the_model(hf_checkpoint):
    path, reference = albert(hf_checkpoint, "AlbertForSequenceClassification", num_hidden_groups=2, inner_group_num=2)
    model = flaxheads.from_pretrained(path)

    ours = sum(p.size for p in flat_params(model).values())

    assert ours == sum(p.numel() for p in reference.parameters())
    assert len(model.backbone.groups) == 2 and all(len(group.layers) == 2 for group in model.backbone.groups)


@pytest.mark.slow  # runs the family beyond its canonical parity (the fast lane has that)
def test_token_types_position_ids_and_missing_inputs_match_transformers(hf_checkpoint):
    path, reference = albert(hf_checkpoint, "AlbertForSequenceClassification", num_labels=3)
    batch = albert_batch("right")
    model = flaxheads.from_pretrained(path)
    no_types = {k: v for k, v in batch.items() if k != "token_type_ids"}
    shifted = {**batch, "position_ids": np.broadcast_to(np.arange(2, 11), (3, 9)).copy()}

    with_types = model(**flax_inputs(batch))

    assert_close(model(**flax_inputs(no_types)), torch_forward(reference, no_types).logits, "no token types")
    assert_close(model(**flax_inputs(shifted)), torch_forward(reference, shifted).logits, "explicit position ids")
    assert np.max(np.abs(np.asarray(with_types) - np.asarray(model(**flax_inputs(no_types))))) > 1e-3


# One group of one layer (the row's own config) is in tests/test_family_parity.py.
@pytest.mark.parametrize(("groups", "inner"), [(1, 2), (2, 2)])
@pytest.mark.slow  # runs the family beyond its canonical parity (the fast lane has that)
def test_every_hidden_state_and_the_pooler_match_albert_model(hf_checkpoint, groups, inner):
    """transformers 5 records every inner layer's output; flaxheads returns one state per layer
    (after its whole group), the interface's num_hidden_layers + 1: every inner_group_num-th of theirs."""
    path, reference = albert(hf_checkpoint, "AlbertModel", num_hidden_groups=groups, inner_group_num=inner)
    batch = albert_batch("right")
    backbone, info = flaxheads.load_backbone(path)

    out = backbone(**flax_inputs(batch))

    expected = torch_forward(reference, batch, output_hidden_states=True)
    assert info.newly_initialized == [] and info.unused == []
    assert len(out.hidden_states) == 4 and len(expected.hidden_states) == 3 * inner + 1
    for layer, (ours, theirs) in enumerate(zip(out.hidden_states, expected.hidden_states[::inner])):
        assert_close(ours, theirs, f"AlbertModel hidden state {layer} (groups={groups} inner={inner})")
    assert_close(out.pooler_output, expected.pooler_output, "AlbertModel pooler output")


@pytest.mark.slow  # compiles the gradient of a train-mode model
def test_dropout_is_active_only_in_train_mode_and_every_shared_layer_gets_gradients(hf_checkpoint):
    path, _ = albert(hf_checkpoint, "AlbertForSequenceClassification", num_labels=3, num_hidden_groups=2,
                     hidden_dropout_prob=0.2)
    batch = flax_inputs(albert_batch("right"))
    model = flaxheads.from_pretrained(path)

    def loss_and_logits(m):
        logits = m(**batch, rngs=nnx.Rngs(dropout=1))
        return m.loss(logits, jnp.array([0, 1, 2])), logits

    deterministic = np.asarray(model(**batch))
    model.train()
    (_, with_dropout), grads = nnx.jit(nnx.value_and_grad(loss_and_logits, has_aux=True))(model)

    assert np.max(np.abs(np.asarray(with_dropout) - deterministic)) > 1e-4
    for group in range(2):
        assert np.any(np.asarray(grads.backbone.groups[group].layers[0].attention.query.kernel[...]) != 0)
    assert np.any(np.asarray(grads.backbone.embedding_projection.kernel[...]) != 0)


# ---------------------------------------------------------------------------------------------
# The pooler, the classifier dropout


def test_pretraining_checkpoint_keeps_its_pooler_and_a_masked_lm_one_starts_a_new_one_and_says_so(hf_checkpoint):
    # AlbertForMaskedLM builds AlbertModel(add_pooling_layer=False): no pretrained pooler exists.
    _, pretraining = flaxheads.from_pretrained(albert(hf_checkpoint, "AlbertForPreTraining")[0], num_labels=3,
                                               output_loading_info=True)
    _, masked_lm = flaxheads.from_pretrained(albert(hf_checkpoint, "AlbertForMaskedLM")[0], output_loading_info=True)

    assert pretraining.head == "pooler"
    assert {"albert.pooler.weight", "albert.pooler.bias"} <= set(pretraining.loaded)
    assert "albert.pooler.weight" in masked_lm.newly_initialized and "albert.pooler.weight" in str(masked_lm)


def test_export_writes_the_classifier_dropout_where_transformers_albert_reads_it(hf_checkpoint, tmp_path):
    path, _ = albert(hf_checkpoint, "AlbertModel", num_hidden_groups=2, inner_group_num=2)
    flaxheads.from_pretrained(path, num_labels=4, classifier_dropout=0.3, seed=2).save_pretrained(tmp_path)

    reloaded = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path)

    assert reloaded.config.classifier_dropout_prob == 0.3  # where AlbertForSequenceClassification reads it
    assert flaxheads.from_pretrained(tmp_path).head.cfg.dropout_rate == 0.3


def test_masked_lm_file_carrying_a_pooler_loads_it_as_the_hub_albert_v2_files_do(hf_checkpoint, tmp_path):
    # The hub's albert-*-v2 files (AlbertForMaskedLM, converted from TensorFlow) hold albert.pooler.*,
    # which transformers' AlbertForMaskedLM ignores and AlbertForSequenceClassification loads.
    from safetensors.numpy import load_file as load_numpy, save_file as save_numpy

    path, _ = albert(hf_checkpoint, "AlbertForPreTraining")
    tensors = {k: v for k, v in load_numpy(path / "model.safetensors").items() if not k.startswith("sop_classifier.")}
    save_numpy(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    config = {**json.loads((path / "config.json").read_text()), "architectures": ["AlbertForMaskedLM"]}
    (tmp_path / "config.json").write_text(json.dumps(config))

    _, info = flaxheads.from_pretrained(tmp_path, output_loading_info=True)

    assert info.newly_initialized == ["classifier.bias", "classifier.weight"]
    assert "albert.pooler.weight" in info.loaded and all(n.startswith("predictions.") for n in info.unused)


# ---------------------------------------------------------------------------------------------
# Errors


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"num_hidden_groups": 5}, r"num_hidden_groups=5.*num_hidden_layers=3"),
        ({"position_embedding_type": "relative_key"}, "relative_key"),
        ({"hidden_size": 34}, r"hidden_size=34 is not a multiple of num_attention_heads=4"),
    ],
)
def test_unsupported_albert_configs_say_what_is_wrong(hf_checkpoint, tmp_path, change, message):
    path, _ = albert(hf_checkpoint, "AlbertModel")
    (tmp_path / "config.json").write_text(json.dumps({**json.loads((path / "config.json").read_text()), **change}))
    (tmp_path / "model.safetensors").write_bytes((path / "model.safetensors").read_bytes())

    with pytest.raises((ValueError, NotImplementedError), match=message):
        flaxheads.from_pretrained(tmp_path)


def test_weights_of_more_groups_than_config_json_says_are_refused_naming_num_hidden_groups(hf_checkpoint, tmp_path):
    path, _ = albert(hf_checkpoint, "AlbertForSequenceClassification", num_labels=2, num_hidden_groups=2)
    config = {**json.loads((path / "config.json").read_text()), "num_hidden_groups": 1}
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "model.safetensors").write_bytes((path / "model.safetensors").read_bytes())

    with pytest.raises(flaxheads.CheckpointError, match=r"albert_layer_groups\.1\..*num_hidden_groups=1"):
        flaxheads.from_pretrained(tmp_path)


def test_wrong_shape_shared_layer_tensor_names_key_and_both_shapes(hf_checkpoint, tmp_path):
    from safetensors.numpy import load_file as load_numpy, save_file as save_numpy

    path, _ = albert(hf_checkpoint, "AlbertForSequenceClassification", num_labels=2, num_hidden_groups=2)
    tensors = load_numpy(path / "model.safetensors")
    name = "albert.encoder.albert_layer_groups.1.albert_layers.0.ffn.weight"
    tensors[name] = np.zeros((36, 36), np.float32)
    save_numpy(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    (tmp_path / "config.json").write_text((path / "config.json").read_text())

    with pytest.raises(flaxheads.ShapeMismatch, match=r"albert_layer_groups\.1\.albert_layers\.0\.ffn\.weight.*\(36, 36\).*\(37, 36\)"):
        flaxheads.from_pretrained(tmp_path)


# ---------------------------------------------------------------------------------------------
# Hugging Face Flax (transformers 4.x FlaxAlbert) checkpoints

HF_FLAX_ALBERT = os.path.join(os.path.dirname(__file__), "fixtures", "hf_flax", "albert_seq_cls")
"""Saved by transformers 4.57's FlaxAlbertForSequenceClassification (scripts/make_hf_flax_fixtures.py):
embedding_size 24, hidden 32, 2 groups of 2 layers; expected.npz holds its inputs and logits."""


@pytest.mark.slow  # reads, runs and converts a msgpack checkpoint
def test_hf_flax_albert_classifier_matches_transformers_flax_and_converts_to_pytorch(tmp_path):
    with np.load(os.path.join(HF_FLAX_ALBERT, "expected.npz")) as npz:
        values = dict(npz)
    batch = {k: values[k] for k in ("input_ids", "attention_mask", "token_type_ids")}
    model, info = flaxheads.from_pretrained(HF_FLAX_ALBERT, output_loading_info=True)

    logits = model(**flax_inputs(batch))
    model.save_pretrained(tmp_path)

    assert info.fully_pretrained and info.unused == []
    assert "albert/encoder/albert_layer_groups/1/albert_layers/1/ffn/kernel" in info.loaded
    assert_close(logits, values["logits"], "HF Flax ALBERT vs transformers 4.57 Flax")
    reloaded = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path).eval()
    batch64 = {k: v.astype(np.int64) for k, v in batch.items()}
    assert_close(torch_forward(reloaded, batch64).logits, values["logits"], "converted to PyTorch, in transformers 5")
