"""The decoder head: a bias-free linear `score` on the last real token, as
`GPT2ForSequenceClassification` (and most reward models) classify.

Which token is "the last real one", in this order of precedence:

1. `pad_token_id` is set: the rightmost position whose id is not `pad_token_id`, exactly as
   transformers does, so left and right padding both work and logits match it. The attention
   mask is not consulted. When pad id == eos id (GPT-2's usual setup) a text that really ends in
   eos is read one real token earlier with right padding, as in transformers.
2. No `pad_token_id`, but the caller passed `attention_mask`: the rightmost position whose mask
   is 1 (transformers raises here for batches of more than one).
3. Neither, batch of one: the last position (transformers' rule).
4. Neither, batch of more than one: ValueError saying what to set.

A row with no real token at all reads position 0, as transformers' argmax does.

Packed rows (`HeadInputs.segment_ids`): the same precedence inside each segment, the segment
standing for the example run alone and unpadded: the rightmost position whose id is not
`pad_token_id` (its first position when there is none), or without a pad id the segment's last
position (rules 2 and 3: the example alone has no padding).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from flaxheads.backbones import layers, segments
from flaxheads.heads.base import HeadConfig, HeadInputs


def last_real_token_index(
    input_ids_BT: jax.Array, attention_mask_BT: jax.Array | None, pad_token_id: int | None
) -> jax.Array:
    """(batch,) int32 index of each row's last real token, by the precedence in the module doc."""
    batch, seq = input_ids_BT.shape
    if pad_token_id is not None:
        is_real_BT = input_ids_BT != pad_token_id
    elif attention_mask_BT is not None:
        is_real_BT = attention_mask_BT != 0
    elif batch == 1:
        return jnp.full((1,), seq - 1, jnp.int32)
    else:
        raise ValueError(
            f'head "last_token" cannot find the last real token of {batch} padded sequences: the model '
            "has no pad_token_id and no attention_mask was passed. Pass attention_mask, or set the pad "
            "id when loading: from_pretrained(path, pad_token_id=tokenizer.pad_token_id), or "
            "pad_token_id=tokenizer.eos_token_id for a tokenizer without a pad token (transformers: model.config.pad_token_id = tokenizer.eos_token_id)"
        )
    # argmax returns the first maximum: the rightmost real position, or 0 for an all-padding row.
    positions_BT = jnp.arange(seq, dtype=jnp.int32) * is_real_BT.astype(jnp.int32)
    return jnp.argmax(positions_BT, axis=-1).astype(jnp.int32)


def last_real_token_index_packed(inputs: HeadInputs, pad_token_id: int | None) -> jax.Array:
    """(batch, num_segments) int32 index of each segment's last real token (module doc)."""
    if pad_token_id is None:
        return segments.ends(inputs.segment_ids, inputs.num_segments)
    return segments.last_where(inputs.input_ids != pad_token_id, inputs.segment_ids, inputs.num_segments)


class LastTokenHead(nnx.Module):
    """Last real token's final hidden state -> `score` (linear, no bias). No dropout, as in
    `GPT2ForSequenceClassification`."""

    OUTPUT_LAYER = "score"
    """The Linear that gives the logits (calibration folds a temperature into it)."""

    def __init__(self, cfg: HeadConfig, *, dtype, param_dtype, rngs: nnx.Rngs):
        self.cfg = cfg
        self.score = layers.dense(
            cfg.hidden_size, cfg.num_labels, init_std=cfg.init_std, dtype=dtype, param_dtype=param_dtype,
            rngs=rngs, use_bias=False,
        )

    def __call__(self, inputs: HeadInputs, rngs: nnx.Rngs | None = None) -> jax.Array:
        hidden_BTD = inputs.hidden_states[-1]
        if inputs.packed:
            return self.score(segments.gather(hidden_BTD, last_real_token_index_packed(inputs, self.cfg.pad_token_id)))
        index_B = last_real_token_index(inputs.input_ids, inputs.attention_mask, self.cfg.pad_token_id)
        last_BD = jnp.take_along_axis(hidden_BTD, index_B[:, None, None], axis=1)[:, 0]
        return self.score(last_BD)
