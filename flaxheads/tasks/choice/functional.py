"""Multiple choice's Hugging Face Flax face: the stand-in for `FlaxAutoModelForMultipleChoice`
(`flaxheads.functional.FunctionalModel` over `MultipleChoice`), so a training script written for
it runs on flaxheads with its model lines changed.

    model = FunctionalMultipleChoice.from_pretrained("path/to/bert")
    logits = model(**batch, params=model.params, dropout_rng=key, train=True)[0]   # (batch, choices)
    model.save_pretrained("out", params=trained_params)     # a directory transformers loads
"""

from __future__ import annotations

from typing import NamedTuple

import jax

from flaxheads.functional import FunctionalModel
from flaxheads.tasks.choice.model import MultipleChoice


class MultipleChoiceOutput(NamedTuple):
    """What `FunctionalMultipleChoice.__call__` returns. `output[0]` is the logits, as in Hugging
    Face's `FlaxMultipleChoiceModelOutput`, so `apply_fn(...)[0]` keeps working; a pytree, so it
    can leave `jax.jit` / `jax.pmap`."""

    logits: jax.Array
    """(batch, num_choices) float32: one score per choice."""


class FunctionalMultipleChoice(FunctionalModel):
    """A `MultipleChoice` model split into structure and `.params`, called as a pure function
    (`FunctionalModel`): `model(input_ids, attention_mask=None, token_type_ids=None,
    position_ids=None, *, params=, dropout_rng=, train=)` -> `MultipleChoiceOutput`, (batch,
    num_choices, seq) int inputs -> (batch, num_choices) float32 logits, each choice read as its
    own sequence."""

    model_class = MultipleChoice
    output_class = MultipleChoiceOutput


__all__ = ["FunctionalMultipleChoice", "MultipleChoiceOutput"]
