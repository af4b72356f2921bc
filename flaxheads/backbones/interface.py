"""What every backbone returns, and what every backbone config exposes to heads."""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Mapping, NamedTuple, Protocol

import jax
import jax.numpy as jnp
import numpy as np


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

    @property
    def position_table_size(self) -> int | None:
        """Position ids the absolute position table holds (position_ids lie in [0, size)); None when
        positions are relative or rotary and no table bounds them. Optional: absent reads as None."""
        ...

    @property
    def token_type_vocab_size(self) -> int | None:
        """Token type ids the embeddings hold (token_type_ids lie in [0, size)); None when token types
        are not looked up in a table (not read, or compared only, as XLNet's). Optional: absent reads
        as None."""
        ...

    def to_hf_config(self) -> dict: ...


def known_fields(hf: Mapping[str, Any], names: Iterable[str] | type) -> dict[str, Any]:
    """The entries of a config.json dict `hf` that a backbone config has a field for: `names` are
    the field names, or the dataclass whose fields they are. Everything else in config.json
    (transformers' bookkeeping, other families' fields) is left out; absent fields keep the
    dataclass defaults."""
    fields = {f.name for f in dataclasses.fields(names)} if isinstance(names, type) else set(names)
    return {key: value for key, value in hf.items() if key in fields}


def require_sizes(config, *names: str, at_least: int = 1, optional: tuple[str, ...] = ()) -> None:
    """ValueError naming the first field of `names` (and of `optional`, which may also be None) of
    the dataclass `config` that is not an int of at least `at_least`: a hidden size of -32, 32.0
    or "32" in config.json would otherwise fail later in jax with a TypeError or a
    ZeroDivisionError, or build a model of no width. Called first in every backbone config's
    `__post_init__`, before anything divides by these sizes."""
    for name in (*names, *optional):
        value = getattr(config, name)
        if value is None and name in optional:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < at_least:
            raise ValueError(
                f"{name}={value!r}: a {config.model_type} model's {name} is a whole number (an int) of at least "
                f"{at_least}{' (or null)' if name in optional else ''}; correct \"{name}\" in config.json, or the "
                "value passed for it")


def require_multiple(**sizes: int) -> None:
    """ValueError unless the first size is a multiple of the second, naming both as config.json
    does: `require_multiple(hidden_size=36, num_attention_heads=5)` -> "hidden_size=36 is not a
    multiple of num_attention_heads=5"."""
    (whole_name, whole), (part_name, part) = sizes.items()
    if whole % part:
        raise ValueError(f"{whole_name}={whole} is not a multiple of {part_name}={part}")


def check_inputs(cfg: BackboneConfig, input_ids, attention_mask=None, token_type_ids=None, position_ids=None, *,
                 segment_ids=None, axes: tuple[str, ...] = ("batch", "seq")) -> None:
    """ValueError naming the input and the fix for inputs a model of backbone `cfg` would turn into
    NaN or into another computation without a word: every model class calls it before its backbone.

    From shapes, also under jit (`check_shapes`): input_ids that are not integer arrays of `axes`,
    other inputs shaped otherwise, a sequence longer than the position table. From values, for
    concrete arrays only (an eager call: a traced value under jit cannot be looked at, and the
    data pipeline keeps tokenizer output in range): input_ids outside [0, vocab_size),
    token_type_ids outside [0, token_type_vocab_size), position_ids outside [0,
    position_table_size). jax's lookups would give NaN or wrap a negative id around; PyTorch's
    embedding raises."""
    check_shapes(cfg, input_ids, attention_mask, token_type_ids, position_ids, segment_ids=segment_ids, axes=axes)
    _check_range("input_ids", input_ids, getattr(cfg, "vocab_size", None), "the model's vocabulary",
                 "ids come from this model's own tokenizer, which never gives such an id")
    _check_range("token_type_ids", token_type_ids, getattr(cfg, "token_type_vocab_size", None),
                 "the model's token types", "pass the token_type_ids of this model's own tokenizer (0 for the first "
                 "text, 1 for a second one where the model has two types), or leave token_type_ids out")
    _check_range("position_ids", position_ids, getattr(cfg, "position_table_size", None), "the model's position table",
                 "leave position_ids out (the model counts positions itself), or truncate the text")


def check_shapes(cfg: BackboneConfig, input_ids, attention_mask=None, token_type_ids=None, position_ids=None, *,
                 segment_ids=None, axes: tuple[str, ...] = ("batch", "seq")) -> None:
    """The part of `check_inputs` read from shapes alone, so free under jit (backbones that are
    called on their own run it too): ValueError for input_ids that are not integer arrays of
    `axes` (the last is the sequence); attention_mask, token_type_ids, position_ids or segment_ids
    of another shape than input_ids (jax would broadcast a mask of batch 1 over every row); a
    sequence longer than the position table covers (`max_sequence_length`, when
    `position_table_size` says positions are absolute and position_ids / segment_ids do not give
    them)."""
    shape = _integer_array_shape("input_ids", input_ids, axes)
    given = {"attention_mask": attention_mask, "token_type_ids": token_type_ids, "position_ids": position_ids,
             "segment_ids": segment_ids}
    for name, array in given.items():
        if array is None:
            continue
        if not hasattr(array, "shape") or tuple(array.shape) != shape:
            got = tuple(array.shape) if hasattr(array, "shape") else type(array).__name__
            raise ValueError(f"{name} has shape {got} but input_ids has {shape}: give one {name} value per token, "
                             f"in an array shaped like input_ids {_axes(axes)}")
        if name != "attention_mask":
            _integer_array_shape(name, array, axes)
    limit = cfg.max_sequence_length if getattr(cfg, "position_table_size", None) is not None else None
    if limit is not None and position_ids is None and segment_ids is None and shape[-1] > limit:
        raise ValueError(
            f"input_ids has {shape[-1]} tokens per sequence, and this {cfg.model_type} model's position table "
            f"covers at most {limit}: truncate the text to at most {limit} tokens "
            f"(max_seq_length={limit}; with a tokenizer, truncation=True, max_length={limit})")


def _axes(axes: tuple[str, ...]) -> str:
    return f"({', '.join(axes)})"


def _integer_array_shape(name: str, array, axes: tuple[str, ...]) -> tuple[int, ...]:
    """`array`'s shape; ValueError unless it is an integer array of len(axes) dimensions."""
    if not hasattr(array, "shape") or not hasattr(array, "dtype"):
        raise ValueError(f"{name} must be a jax or numpy array of ids shaped {_axes(axes)}, got "
                         f"{type(array).__name__}: pass jnp.asarray(...) of the tokenizer's output")
    if len(array.shape) != len(axes) or not jnp.issubdtype(array.dtype, jnp.integer):
        raise ValueError(f"{name} must be integers of shape {_axes(axes)}; got shape {tuple(array.shape)} and dtype "
                         f"{array.dtype}" + (": add the batch axis (ids[None])" if len(array.shape) == len(axes) - 1
                                            else ""))
    return tuple(array.shape)


def _check_range(name: str, array, size: int | None, what: str, fix: str) -> None:
    """ValueError naming the first value of concrete `array` outside [0, size); a traced value
    (under jit), an absent array, or one no table bounds (`size` None: not looked up) is let through."""
    if array is None or size is None or isinstance(array, jax.core.Tracer):
        return
    values = np.asarray(array)
    if values.size == 0:
        return
    low, high = int(values.min()), int(values.max())
    if low < 0 or high >= size:
        bad = low if low < 0 else high
        where = tuple(int(i) for i in np.argwhere(values == bad)[0])
        raise ValueError(f"{name} holds {bad} at {where}, outside {what} [0, {size}): {fix}")
