"""Token classification's Hugging Face Flax face: the stand-in for
`FlaxAutoModelForTokenClassification` (`flaxheads.functional.FunctionalModel` over
`TokenClassifier`), so a training script written for it (run_flax_ner.py) runs on flaxheads with
its model lines changed.

    model = FunctionalTokenClassifier.from_pretrained("path/to/bert", config=config)  # config: num_labels, id2label
    logits = model(**batch, params=model.params, dropout_rng=key, train=True)[0]      # (batch, seq, num_labels)
    model.save_pretrained("out", params=trained_params)     # a directory transformers loads
"""

from __future__ import annotations

from typing import NamedTuple

import jax

from flaxheads.functional import FunctionalModel
from flaxheads.tasks.token.model import TokenClassifier


class TokenClassifierOutput(NamedTuple):
    """What `FunctionalTokenClassifier.__call__` returns. `output[0]` is the logits, as in Hugging
    Face's `FlaxTokenClassifierOutput`, so `apply_fn(...)[0]` keeps working; a pytree, so it can
    leave `jax.jit` / `jax.pmap`."""

    logits: jax.Array
    """(batch, seq, num_labels) float32, padding positions included (as transformers computes them)."""


class FunctionalTokenClassifier(FunctionalModel):
    """A `TokenClassifier` split into structure and `.params`, called as a pure function
    (`FunctionalModel`): `model(input_ids, attention_mask=None, token_type_ids=None,
    position_ids=None, *, params=, dropout_rng=, train=)` -> `TokenClassifierOutput`, (batch, seq)
    int inputs -> (batch, seq, num_labels) float32 logits; packed rows' `segment_ids` pass through
    as a keyword (see `TokenClassifier.__call__`). `.config` has `num_labels`, `id2label` and
    `label2id`."""

    model_class = TokenClassifier
    output_class = TokenClassifierOutput


__all__ = ["FunctionalTokenClassifier", "TokenClassifierOutput"]
