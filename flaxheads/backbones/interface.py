"""What every backbone returns, and what every backbone config exposes to heads."""

from __future__ import annotations

from typing import NamedTuple, Protocol

import jax


class BackboneOutput(NamedTuple):
    last_hidden_state: jax.Array
    """(batch, seq, hidden) output of the last layer."""
    hidden_states: tuple[jax.Array, ...]
    """num_hidden_layers + 1 arrays: the embeddings' output, then every layer's."""
    pooler_output: jax.Array | None = None
    """(batch, hidden) tanh(dense(first token)) when the backbone was built with a pooler."""


class BackboneConfig(Protocol):
    """The fields a head may read from any backbone's config.

    Optional: a dataclass config whose config.json carries a head's options (XLNet's summary_*
    for "summary", ModernBERT's classifier_* for "modernbert") exposes them as a dict attribute
    (`summary_options`, `modernbert_head_options`; `model.BACKBONE_HEAD_OPTIONS`); `ClassifierConfig`
    uses them as that head's defaults and writes the options in effect back into those fields on export.
    """

    model_type: str
    hidden_size: int
    num_hidden_layers: int
    initializer_range: float
    pad_token_id: int | None
    classifier_dropout: float | None

    @property
    def default_classifier_dropout(self) -> float: ...

    @property
    def max_sequence_length(self) -> int | None:
        """Longest input the position embeddings cover; None when positions are relative."""
        ...

    def to_hf_config(self) -> dict: ...
