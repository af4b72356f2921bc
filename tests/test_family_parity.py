"""Every family of tests/families.py against transformers (PyTorch, eval mode, eager attention
where the row says so) on tiny random checkpoints: the canonical head's logits equal
*ForSequenceClassification's for each config variant and padding side, every hidden state equals
the bare model's (and the backbone of a classifier checkpoint its bare model's), bfloat16 compute
stays within the row's stated tolerance, and the data pipeline pads on the family's side."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

import flaxheads
from families import FAMILIES, case, rows
from flaxheads.backbones import backbone_spec
from family_parity import assert_close, flat_params, flax_inputs, torch_forward, torch_logits

CANONICAL = [
    case(row, overrides, num_labels, padding, id=f"{row.name}-{variant}-{padding}", fast=index == 0)
    for row in FAMILIES.values() for index, (variant, overrides, num_labels) in enumerate(row.variants)
    for padding in row.paddings
]


@pytest.mark.matrix("row", "num_labels", "padding")
@pytest.mark.parametrize(("row", "overrides", "num_labels", "padding"), CANONICAL)
def test_canonical_head_logits_match_transformers(hf_checkpoint, row, overrides, num_labels, padding):
    checkpoint = hf_checkpoint(row.classifier, family=row.name, num_labels=num_labels, **dict(overrides))
    batch = row.batch(padding)
    model = flaxheads.from_pretrained(checkpoint.path, **dict(row.load_options))

    logits = model(**flax_inputs(batch))

    assert model.config.head == row.head and model.config.backbone.model_type == row.model_type
    assert logits.shape == (3, num_labels) and logits.dtype == jnp.float32
    assert_close(logits, torch_logits(checkpoint.model, batch), f"{row.name} {dict(overrides)} {num_labels} {padding}")


@pytest.mark.parametrize("row", rows(fast=False))
def test_every_hidden_state_matches_the_bare_model_padding_included(hf_checkpoint, row):
    checkpoint = hf_checkpoint(row.base, family=row.name, **{row.layers_key: 3})
    backbone, info = flaxheads.load_backbone(checkpoint.path)

    assert info.newly_initialized == [] and info.unused == []
    for padding in row.paddings:
        batch = row.batch(padding)
        out = backbone(**flax_inputs(batch))

        expected = torch_forward(checkpoint.model, batch, output_hidden_states=True)
        assert len(out.hidden_states) == len(expected.hidden_states) == 4
        for layer, (ours, theirs) in enumerate(zip(out.hidden_states, expected.hidden_states)):
            assert_close(ours, theirs, f"{row.base} hidden state {layer}, {padding} padding")
        assert_close(out.last_hidden_state, expected.last_hidden_state, f"{row.base} last_hidden_state, {padding}")
        if getattr(expected, "pooler_output", None) is None:
            assert out.pooler_output is None
        else:
            assert_close(out.pooler_output, expected.pooler_output, f"{row.base} pooler_output, {padding}")


@pytest.mark.parametrize("row", rows(fast=False))
def test_bfloat16_compute_stays_within_the_stated_tolerance_of_transformers_float32(hf_checkpoint, row):
    checkpoint = hf_checkpoint(row.classifier, family=row.name, num_labels=3)
    batch = row.batch(row.sample_padding)
    half = flaxheads.from_pretrained(checkpoint.path, dtype="bfloat16", **dict(row.load_options))

    logits = half(**flax_inputs(batch))

    assert logits.dtype == jnp.float32
    assert {v.dtype for v in flat_params(half).values()} == {np.dtype("float32")}
    assert_close(logits, torch_logits(checkpoint.model, batch), f"{row.name} bfloat16 vs transformers float32",
                 row.bf16_atol, row.bf16_rtol or row.bf16_atol)


@pytest.mark.parametrize("row", rows(fast=False))
def test_backbone_of_a_classifier_checkpoint_is_its_bare_model_and_leaves_the_head_unused(hf_checkpoint, row):
    checkpoint = hf_checkpoint(row.classifier, family=row.name, num_labels=3)
    batch = row.batch(row.sample_padding)
    backbone, info = flaxheads.load_backbone(checkpoint.path)

    out = backbone(**flax_inputs(batch))

    bare = checkpoint.model.base_model  # the classifier's own bare model
    expected = torch_forward(bare, batch, output_hidden_states=True)
    assert info.unused and not any(name.startswith(f"{checkpoint.model.base_model_prefix}.") for name in info.unused)
    assert info.newly_initialized == []
    for layer, (ours, theirs) in enumerate(zip(out.hidden_states, expected.hidden_states, strict=True)):
        assert_close(ours, theirs, f"{row.classifier} backbone hidden state {layer}")


@pytest.mark.parametrize("row", rows())
def test_data_pipeline_pads_on_the_side_of_the_familys_tokenizers(row):
    assert backbone_spec(row.model_type).padding_side == row.padding_side
