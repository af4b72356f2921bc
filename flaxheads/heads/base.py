"""The interface every classification head implements, and what it is built from."""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax


class HeadInputs(NamedTuple):
    """What a head may look at. Heads never see the backbone itself."""

    hidden_states: tuple[jax.Array, ...]
    """Every layer's (batch, seq, hidden) output, embeddings first; [-1] is the last layer."""
    attention_mask: jax.Array | None
    """(batch, seq), 1 for real tokens, 0 for padding; None when the caller passed no mask
    (every token is real), so a head can tell "no mask given" from "all ones"."""
    input_ids: jax.Array
    """(batch, seq) token ids (the GPT-2 head finds the last non-pad token from them)."""
    cls_index: jax.Array | None = None
    """(batch,) int position to classify from, for the "summary" head's summary_type="cls_index";
    (batch, num_segments) positions within each segment for packed rows."""
    segment_ids: jax.Array | None = None
    """(batch, seq) int for packed rows: 1..S for the examples, 0 for padding (`backbones.segments`).
    With it every head pools each segment alone and returns (batch, num_segments, num_labels)."""
    num_segments: int | None = None
    """S, a Python int, given with `segment_ids`: the slots of the logits per row."""

    @property
    def packed(self) -> bool:
        """Whether the rows hold several examples (`segment_ids` given)."""
        return self.segment_ids is not None


@dataclasses.dataclass(frozen=True)
class HeadConfig:
    """Everything a head needs to know about its backbone, read from the backbone's config."""

    name: str
    hidden_size: int
    num_labels: int
    dropout_rate: float
    init_std: float
    num_hidden_layers: int
    pad_token_id: int | None = None
    options: tuple[tuple[str, Any], ...] = ()
    """Head-specific settings (e.g. the XLNet summary's), as sorted (key, value) pairs."""

    def option(self, key: str, default: Any = None) -> Any:
        return dict(self.options).get(key, default)
