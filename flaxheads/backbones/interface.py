"""What every backbone returns, and what every backbone config exposes to heads."""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Mapping, NamedTuple, Protocol

import jax


class BackboneOutput(NamedTuple):
    last_hidden_state: jax.Array
    """(batch, seq, hidden) output of the last layer."""
    hidden_states: tuple[jax.Array, ...]
    """num_hidden_layers + 1 arrays: the embeddings' output, then every layer's."""
    pooler_output: jax.Array | None = None
    """(batch, hidden) tanh(dense(first token)) when the backbone was built with a pooler."""


class Backbone(Protocol):
    """How every backbone module is called (Encoder, Albert, GPT2, XLNet, DebertaV2, ModernBert, Decoder)."""

    def __call__(
        self,
        input_ids: jax.Array,
        attention_mask: jax.Array | None = None,
        token_type_ids: jax.Array | None = None,
        position_ids: jax.Array | None = None,
        *,
        segment_ids: jax.Array | None = None,
        rngs=None,
    ) -> BackboneOutput:
        """(batch, seq) ints in, every layer's states out. `segment_ids` (batch, seq) packs several
        examples per row (`backbones.segments`): attention within a segment only (plus causal and
        windows where the family has them), positions restarting per segment by the family's own
        rule when position_ids is None; attention_mask is then not read for attention."""
        ...


class BackboneConfig(Protocol):
    """The fields a head may read from any backbone's config.

    Optional: a dataclass config whose config.json carries a head's options (XLNet's summary_*
    fields for "summary", DeBERTa's pooler_* for "deberta") exposes them as a `<head>_options`
    dict; `ClassifierConfig` uses them as that head's defaults and writes the options in effect
    back into those fields on export.
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


def known_fields(hf: Mapping[str, Any], names: Iterable[str] | type) -> dict[str, Any]:
    """The entries of a config.json dict `hf` that a backbone config has a field for: `names` are
    the field names, or the dataclass whose fields they are. Everything else in config.json
    (transformers' bookkeeping, other families' fields) is left out; absent fields keep the
    dataclass defaults."""
    fields = {f.name for f in dataclasses.fields(names)} if isinstance(names, type) else set(names)
    return {key: value for key, value in hf.items() if key in fields}


def require_multiple(**sizes: int) -> None:
    """ValueError unless the first size is a multiple of the second, naming both as config.json
    does: `require_multiple(hidden_size=36, num_attention_heads=5)` -> "hidden_size=36 is not a
    multiple of num_attention_heads=5"."""
    (whole_name, whole), (part_name, part) = sizes.items()
    if whole % part:
        raise ValueError(f"{whole_name}={whole} is not a multiple of {part_name}={part}")
