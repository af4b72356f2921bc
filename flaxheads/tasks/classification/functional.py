"""Sequence classification's Hugging Face Flax face: the stand-in for
`FlaxAutoModelForSequenceClassification` (`flaxheads.functional.FunctionalModel` over
`SequenceClassifier`), so a training script written for it (run_flax_glue.py) runs on flaxheads
with its model lines changed.

    model = FunctionalClassifier.from_pretrained("path/to/bert", num_labels=3)
    logits = model(input_ids, attention_mask, params=model.params, dropout_rng=key, train=True).logits
    model.save_pretrained("out", params=trained_params)     # a directory transformers loads
"""

from __future__ import annotations

from typing import NamedTuple

import jax

from flaxheads.functional import FunctionalModel, Params
from flaxheads.tasks.classification.model import SequenceClassifier


class ClassifierOutput(NamedTuple):
    """What `FunctionalClassifier.__call__` returns. `output[0]` is the logits, as in Hugging Face's
    `FlaxSequenceClassifierOutput`, so `apply_fn(...)[0]` keeps working; a pytree, so it can leave
    `jax.jit` / `jax.pmap`."""

    logits: jax.Array
    """(batch, num_labels) float32; (batch, num_segments, num_labels) for packed rows."""


class FunctionalClassifier(FunctionalModel):
    """A `SequenceClassifier` split into structure and `.params`, called as a pure function
    (`FunctionalModel`): `model(input_ids, attention_mask=None, token_type_ids=None,
    position_ids=None, *, params=, dropout_rng=, train=)` -> `ClassifierOutput`, (batch, seq) int
    inputs -> (batch, num_labels) float32 logits. The classifier's other inputs pass through as
    keywords: `cls_index`, and packed rows' `segment_ids` and `num_segments` (see
    `SequenceClassifier.__call__`), which give (batch, num_segments, num_labels)."""

    model_class = SequenceClassifier
    output_class = ClassifierOutput


__all__ = ["ClassifierOutput", "FunctionalClassifier", "Params"]
