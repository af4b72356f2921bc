"""The "squad" head: the question-answering head of transformers' `XLNetForQuestionAnswering` (the
SQuAD head XLNet and XLM share), with an end conditioned on the start and an answer class.

    start_logits   dense(state_t)                                            (batch, seq)
    end_logits     dense_1(LayerNorm(tanh(dense_0([state_t, start_state]))))  (batch, seq) per start
    cls_logits     dense_1(tanh(dense_0([start_state, cls_state])))           (batch,), dense_1 without bias

p_mask (1.0 where no answer may start or end: the question, special tokens, padding) sets a
start or end logit to `x * (1 - p_mask) - 1e30 * p_mask`, as transformers does.

Training (`start_positions` given): the end logits read the gold start's state and the answer
class the gold start and `cls_index`'s state: `SquadLogits`. Inference: the `start_n_top` most
probable starts, for each the `end_n_top` most probable ends, and the answer class of the
probability-weighted start state: `SquadBeams`, transformers' outputs (its `*_log_probs` are
softmax probabilities, named so in transformers). Without `cls_index` the answer class reads
the last position (XLNet puts <cls> there). Options (`HeadConfig.options`, XLNetConfig's
names): start_n_top, end_n_top (5 each), layer_norm_eps (1e-12). The head has no dropout.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from flaxheads.backbones import layers
from flaxheads.heads.base import HeadConfig, HeadInputs

SQUAD_DEFAULTS = {"start_n_top": 5, "end_n_top": 5, "layer_norm_eps": 1e-12}
"""XLNetConfig's defaults of the head's options."""

MASKED_LOGIT = 1e30
"""What p_mask subtracts (transformers': 1e30, or 65500 for a float16 p_mask)."""


class SquadLogits(NamedTuple):
    """The "squad" head in training (given the gold starts): float32 logits."""

    start_logits: jax.Array
    """(batch, seq)."""
    end_logits: jax.Array
    """(batch, seq): each end read with the gold start's state."""
    cls_logits: jax.Array
    """(batch,): whether the question has no answer, from the gold start's and `cls_index`'s states."""


class SquadBeams(NamedTuple):
    """The "squad" head at inference: transformers' `XLNetForQuestionAnsweringOutput` fields."""

    start_top_log_probs: jax.Array
    """(batch, start_n_top) float32: the most probable starts' probabilities (softmax, not log)."""
    start_top_index: jax.Array
    """(batch, start_n_top) int32: their positions."""
    end_top_log_probs: jax.Array
    """(batch, end_n_top * start_n_top) float32: entry e * start_n_top + k is start k's e-th most
    probable end's probability (transformers' (batch, end_n_top, start_n_top) viewed flat)."""
    end_top_index: jax.Array
    """(batch, end_n_top * start_n_top) int32: those ends' positions."""
    cls_logits: jax.Array
    """(batch,) float32: whether the question has no answer."""


def squad_options(cfg: HeadConfig) -> dict:
    """The head's options, defaults filled in; ValueError for unknown ones or top counts below 1."""
    given = dict(cfg.options)
    unknown = sorted(set(given) - set(SQUAD_DEFAULTS))
    if unknown:
        raise ValueError(f'head "squad" has no option(s) {unknown}; its options are {sorted(SQUAD_DEFAULTS)}')
    options = {**SQUAD_DEFAULTS, **given}
    for name in ("start_n_top", "end_n_top"):
        if not isinstance(options[name], int) or isinstance(options[name], bool) or options[name] < 1:
            raise ValueError(f"{name}={options[name]!r}: the beams of the squad head are a whole number (an int) of "
                             f"at least 1; correct \"{name}\" in config.json")
    return options


def masked(logits: jax.Array, p_mask: jax.Array | None) -> jax.Array:
    """`logits` where p_mask is 0, -1e30 where it is 1 (transformers' arithmetic, in float32)."""
    if p_mask is None:
        return logits
    p_mask = p_mask.astype(jnp.float32)
    return logits * (1 - p_mask) - MASKED_LOGIT * p_mask


def state_at(hidden_BTD: jax.Array, positions_B: jax.Array) -> jax.Array:
    """(batch, hidden): each row's state at its position (clipped into the sequence)."""
    return jnp.take_along_axis(hidden_BTD, positions_B[:, None, None].astype(jnp.int32), axis=1, mode="clip")[:, 0]


class StartLogits(nnx.Module):
    """`XLNetPoolerStartLogits`: a Linear to one logit per token."""

    def __init__(self, hidden_size: int, *, init_std: float, dtype, param_dtype, rngs: nnx.Rngs):
        self.dense = layers.dense(hidden_size, 1, init_std=init_std, dtype=dtype, param_dtype=param_dtype, rngs=rngs)

    def __call__(self, hidden_BTD: jax.Array, p_mask_BT: jax.Array | None) -> jax.Array:
        return masked(self.dense(hidden_BTD)[..., 0].astype(jnp.float32), p_mask_BT)


class EndLogits(nnx.Module):
    """`XLNetPoolerEndLogits`: [token state, start state] -> dense_0 -> tanh -> LayerNorm -> dense_1."""

    def __init__(self, hidden_size: int, *, eps: float, init_std: float, dtype, param_dtype, rngs: nnx.Rngs):
        kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.dense_0 = layers.dense(2 * hidden_size, hidden_size, init_std=init_std, **kw)
        self.layer_norm = layers.layer_norm(hidden_size, eps=eps, **kw)
        self.dense_1 = layers.dense(hidden_size, 1, init_std=init_std, **kw)

    def __call__(self, hidden: jax.Array, start_states: jax.Array, p_mask: jax.Array | None) -> jax.Array:
        """`hidden` and `start_states` of one shape (..., hidden) -> (...) float32 logits."""
        x = self.layer_norm(jnp.tanh(self.dense_0(jnp.concatenate([hidden, start_states], axis=-1))))
        return masked(self.dense_1(x)[..., 0].astype(jnp.float32), p_mask)


class AnswerClass(nnx.Module):
    """`XLNetPoolerAnswerClass`: [start state, cls state] -> dense_0 -> tanh -> dense_1 (no bias)."""

    def __init__(self, hidden_size: int, *, init_std: float, dtype, param_dtype, rngs: nnx.Rngs):
        kw = dict(init_std=init_std, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.dense_0 = layers.dense(2 * hidden_size, hidden_size, **kw)
        self.dense_1 = layers.dense(hidden_size, 1, use_bias=False, **kw)

    def __call__(self, start_state_BD: jax.Array, cls_state_BD: jax.Array) -> jax.Array:
        x = jnp.tanh(self.dense_0(jnp.concatenate([start_state_BD, cls_state_BD], axis=-1)))
        return self.dense_1(x)[..., 0].astype(jnp.float32)


class SquadHead(nnx.Module):
    """The "squad" head (module docstring): `start_logits`, `end_logits` and `answer_class` under
    transformers' names. New parameters start as transformers initialises them: kernels
    ~ normal(init_std), biases 0, the LayerNorm (1, 0)."""

    def __init__(self, cfg: HeadConfig, *, dtype, param_dtype, rngs: nnx.Rngs):
        self.cfg = cfg
        options = squad_options(cfg)
        self.start_n_top, self.end_n_top = options["start_n_top"], options["end_n_top"]
        kw = dict(init_std=cfg.init_std, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.start_logits = StartLogits(cfg.hidden_size, **kw)
        self.end_logits = EndLogits(cfg.hidden_size, eps=options["layer_norm_eps"], **kw)
        self.answer_class = AnswerClass(cfg.hidden_size, **kw)

    def __call__(self, inputs: HeadInputs, rngs: nnx.Rngs | None = None, *, start_positions: jax.Array | None = None,
                 p_mask: jax.Array | None = None) -> SquadLogits | SquadBeams:
        """`SquadLogits` given `start_positions` (batch,) (training), else `SquadBeams`; the answer
        class reads `inputs.cls_index` (batch,), or the last position without it. `p_mask`:
        (batch, seq), 1 where no answer may start or end."""
        hidden_BTD = inputs.hidden_states[-1]
        start_logits_BT = self.start_logits(hidden_BTD, p_mask)
        cls_state_BD = hidden_BTD[:, -1] if inputs.cls_index is None else state_at(hidden_BTD, inputs.cls_index)
        if start_positions is not None:
            start_state_BD = state_at(hidden_BTD, start_positions)
            end_logits_BT = self.end_logits(hidden_BTD, jnp.broadcast_to(start_state_BD[:, None], hidden_BTD.shape),
                                            p_mask)
            return SquadLogits(start_logits_BT, end_logits_BT, self.answer_class(start_state_BD, cls_state_BD))
        return self.beams(hidden_BTD, start_logits_BT, cls_state_BD, p_mask)

    def beams(self, hidden_BTD, start_logits_BT, cls_state_BD, p_mask_BT) -> SquadBeams:
        batch, seq, width = hidden_BTD.shape
        start_probs_BT = jax.nn.softmax(start_logits_BT, axis=-1)
        start_top_probs_BK, start_top_index_BK = jax.lax.top_k(start_probs_BT, self.start_n_top)
        start_states_BKD = jnp.take_along_axis(hidden_BTD, start_top_index_BK[..., None], axis=1)
        # Every position t read against every start k: (batch, seq, start_n_top, hidden), transformers' layout.
        shape_BTKD = (batch, seq, self.start_n_top, width)
        end_logits_BTK = self.end_logits(jnp.broadcast_to(hidden_BTD[:, :, None], shape_BTKD),
                                         jnp.broadcast_to(start_states_BKD[:, None], shape_BTKD),
                                         None if p_mask_BT is None else p_mask_BT[..., None])
        end_probs_BKT = jnp.swapaxes(jax.nn.softmax(end_logits_BTK, axis=1), 1, 2)
        end_top_probs_BKE, end_top_index_BKE = jax.lax.top_k(end_probs_BKT, self.end_n_top)
        # transformers' topk over dim 1 gives (batch, end_n_top, start_n_top), viewed flat as (batch, E * K).
        flat = (batch, self.end_n_top * self.start_n_top)
        end_top_probs = jnp.reshape(jnp.swapaxes(end_top_probs_BKE, 1, 2), flat)
        end_top_index = jnp.reshape(jnp.swapaxes(end_top_index_BKE, 1, 2), flat)
        # The answer class reads the start as the probability-weighted mean of the states.
        start_state_BD = jnp.einsum("btd,bt->bd", hidden_BTD, start_probs_BT.astype(hidden_BTD.dtype))
        return SquadBeams(start_top_probs_BK, start_top_index_BK.astype(jnp.int32), end_top_probs,
                          end_top_index.astype(jnp.int32), self.answer_class(start_state_BD, cls_state_BD))


__all__ = ["SQUAD_DEFAULTS", "SquadBeams", "SquadHead", "SquadLogits", "squad_options"]
