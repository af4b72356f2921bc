"""Every head on every family: the logits of a head transformers has no class for (on that
family) equal the head applied to transformers' hidden states, and its export reloads exactly
while transformers' AutoModel reads the backbone from it."""

from __future__ import annotations

import json

import jax.numpy as jnp
import numpy as np
import pytest
import transformers

import flaxheads
from families import FAMILIES, case
from family_parity import assert_close, assert_same_params, flax_inputs, torch_forward
from flaxheads.heads import HEAD_NAMES, HeadInputs

OTHER_HEADS = [case(row, head, id=f"{row.name}-{head}", fast=False) for row in FAMILIES.values()
               for head in (HEAD_NAMES if row.other_heads is None else row.other_heads) if head != row.head]


@pytest.mark.matrix("row", "head")
@pytest.mark.parametrize(("row", "head"), OTHER_HEADS)
def test_other_head_reads_transformers_hidden_states_and_its_export_reloads(hf_checkpoint, tmp_path, row, head):
    checkpoint = hf_checkpoint(row.base, family=row.name, **{row.layers_key: 4})  # concat_last4 needs 4 layers
    batch = row.batch(row.sample_padding)
    model, info = flaxheads.from_pretrained(checkpoint.path, head=head, num_labels=3, seed=1,
                                            output_loading_info=True, **dict(row.load_options))

    logits = model(**flax_inputs(batch))

    hidden = torch_forward(checkpoint.model, batch, output_hidden_states=True).hidden_states
    inputs = HeadInputs(tuple(jnp.asarray(h.numpy()) for h in hidden), jnp.asarray(batch["attention_mask"]),
                        jnp.asarray(batch["input_ids"]))
    assert np.isfinite(np.asarray(logits)).all()
    assert_close(logits, model.head(inputs), f"{head} on {row.name} vs the head on transformers' hidden states")
    assert info.newly_initialized and all(name.startswith(row.head_prefix) for name in info.newly_initialized)

    model.save_pretrained(tmp_path)
    again = flaxheads.from_pretrained(tmp_path)
    options = {"attn_implementation": "eager"} if row.eager else {}
    base, hf_info = transformers.AutoModel.from_pretrained(tmp_path, output_loading_info=True, **options)

    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == [row.base]
    assert again.config.head == head
    assert_same_params(again, model)
    # Only the "pooler" head holds a pooler: transformers' model starts its own where it has one.
    assert all("pooler" in key for key in hf_info["missing_keys"])
    assert all(key.startswith(row.head_prefix) for key in hf_info["unexpected_keys"])
    assert_close(torch_forward(base.eval(), batch).last_hidden_state, hidden[-1],
                 f"{head} on {row.name}: transformers reads the backbone")
