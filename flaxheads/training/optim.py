"""The optimizer: AdamW with warmup then linear or cosine decay, global-norm clipping, and no
weight decay on biases or LayerNorm parameters; its state is float32 whatever the parameters'
dtype (`float32_state`)."""

from __future__ import annotations

import dataclasses
import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax

from flaxheads.names import SCHEDULES


def learning_rate_schedule(
    learning_rate: float, total_steps: int, warmup_steps: int, kind: str = "linear"
) -> Schedule:
    """0 -> `learning_rate` linearly over `warmup_steps`, then `kind` decay to 0 at `total_steps`
    (the shape of transformers' get_linear/cosine_schedule_with_warmup)."""
    if kind not in SCHEDULES:
        raise ValueError(f"lr_scheduler_type={kind!r}; choose one of {SCHEDULES}")
    warmup_steps = min(warmup_steps, total_steps)
    return Schedule(kind, learning_rate, warmup_steps, max(total_steps - warmup_steps, 1))


@dataclasses.dataclass(frozen=True)
class Schedule:
    """A learning-rate schedule (`learning_rate_schedule`) whose numbers may arrive at run time.

    `schedule(count)` is optax's `join_schedules([linear_schedule(0, lr, max(warmup, 1)), decay],
    [warmup])` (or `decay` alone without warmup). `schedule(count, values)` computes the same
    formulas from `values` (`self.values()`, or arrays of the same structure traced by jit): a
    train step that takes them as an argument compiles to one program for every learning rate,
    warmup and run length, where numbers folded in as constants made a run with another
    `--learning_rate` or `--max_steps` compile its train step again (6.7 s for MiniLM on 2 cores).
    Only `kind` shapes the program. The two agree to float32 rounding of the rate: bit for bit
    under XLA:CPU's default options in the settings tried (tests/test_optimizer.py's grid, run
    without the suite's compile options); with constants XLA may divide through a reciprocal,
    which the warmup's -lr * frac + lr magnifies to a few ulps of lr at other optimisation
    levels."""

    kind: str
    learning_rate: float
    warmup_steps: int
    decay_steps: int

    def values(self) -> dict[str, np.ndarray]:
        """The numbers, as the 0-d arrays a jitted step takes (float32 rate, int32 steps)."""
        return {"learning_rate": np.float32(self.learning_rate), "warmup_steps": np.int32(self.warmup_steps),
                "decay_steps": np.int32(self.decay_steps)}

    def __call__(self, count, values: dict | None = None):
        if values is None:  # Python numbers: optax's own schedules, constants in a traced program
            return self._optax()(count)
        rate, warmup, decay = values["learning_rate"], values["warmup_steps"], values["decay_steps"]
        # optax's formulas term for term (polynomial_schedule with power 1, cosine_decay_schedule
        # with alpha 0 and exponent 1, join_schedules), with array numbers where optax wants ints
        warm = (0.0 - rate) * (1 - jnp.clip(count, 0, jnp.maximum(warmup, 1)) / jnp.maximum(warmup, 1)) + rate
        after = count - warmup
        if self.kind == "linear":
            decayed = rate * (1 - jnp.clip(after, 0, decay) / decay) + 0.0
        elif self.kind == "cosine":
            cosine = 0.5 * (1 + jnp.cos(jnp.pi * jnp.minimum(after, decay) / decay))
            decayed = rate * ((1 - 0.0) * cosine**1.0 + 0.0)
        else:
            decayed = rate * jnp.ones_like(after, dtype=jnp.result_type(rate))
        return jnp.where(count < warmup, warm, decayed)

    def _optax(self) -> optax.Schedule:
        decay = {
            "linear": optax.linear_schedule(self.learning_rate, 0.0, self.decay_steps),
            "cosine": optax.cosine_decay_schedule(self.learning_rate, self.decay_steps),
            "constant": optax.constant_schedule(self.learning_rate),
        }[self.kind]
        if self.warmup_steps == 0:
            return decay
        warmup = optax.linear_schedule(0.0, self.learning_rate, max(self.warmup_steps, 1))
        return optax.join_schedules([warmup, decay], [self.warmup_steps])


_NO_DECAY_NAME = re.compile(r"bias|layernorm|rmsnorm|(?:^|\.)norm(?:$|\.)|_norm(?:$|\.)")
"""transformers' Trainer exempts parameters whose dotted name (lowercased) matches one of these
(`Trainer.get_decay_parameter_names`), e.g. XLNet's 2-D `r_w_bias`."""


def decay_mask(params):
    """Which parameters weight decay applies to, as transformers' Trainer decides: True for kernels
    and embeddings, False for biases (any parameter named `*bias*`) and norm scales and biases
    (any vector, or a name matching Trainer's norm patterns), whatever the layers are called.

    `params` may be any pytree of arrays: a nested dict (plain or FrozenDict, string or integer
    keys), an `nnx.State`, or a flat dict keyed by tuples or by "a.b.c" / "a/b/c" strings. The
    mask has the same structure, so it serves as optax's `mask=` (`optax.adamw(..., mask=decay_mask)`).
    """
    return jax.tree_util.tree_map_with_path(lambda path, p: _decays(_dotted_name(path), p), params)


def _decays(name: str, param) -> bool:
    # Vectors stand in for Trainer's LayerNorm-module test: every norm parameter is a vector, and
    # every matrix or larger that Trainer exempts is caught by its name.
    return len(param.shape) >= 2 and not _NO_DECAY_NAME.search(name.lower())


def _dotted_name(path) -> str:
    """'backbone.layers.0.attention_norm.scale' for a pytree key path of any container."""
    parts = []
    for entry in path:
        if isinstance(entry, jax.tree_util.GetAttrKey):
            if entry.name != "value":  # an nnx.Variable's array, not a name the model chose
                parts.append(entry.name)
        elif isinstance(entry, jax.tree_util.DictKey):
            key = entry.key
            # flat dicts: ("a", "b", "bias") tuples or "a/b/bias" strings
            parts.extend(map(str, key) if isinstance(key, tuple) else [str(key).replace("/", ".")])
        elif isinstance(entry, jax.tree_util.SequenceKey):
            parts.append(str(entry.idx))
        else:
            parts.append(str(getattr(entry, "key", entry)))
    return ".".join(parts)


def _as_float32(tree):
    """`tree` with every floating array of fewer than 32 bits upcast to float32 (exact)."""
    def upcast(x):
        if x is None or not jnp.issubdtype(x.dtype, jnp.floating) or jnp.finfo(x.dtype).bits >= 32:
            return x
        return x.astype(jnp.float32)

    return jax.tree.map(upcast, tree, is_leaf=lambda x: x is None)


def float32_state(inner: optax.GradientTransformation) -> optax.GradientTransformation:
    """`inner` computing in float32 for parameters stored in a narrower dtype (bfloat16): `init`
    and `update` see the parameters and gradients upcast to float32, so every state `inner`
    keeps (Adam's mu and nu) is float32 and the update is computed, and returned, in float32.
    `optax.apply_updates(params, updates)` then adds it in float32 and rounds the sum to the
    parameter's dtype once. The wrapper keeps no state of its own (the state is `inner`'s, so
    checkpoints are the same with or without it) and changes nothing for float32 parameters.

    What bfloat16 storage still costs: a parameter moves only when its update exceeds half its
    bfloat16 spacing (8 bits of mantissa), so small updates to large weights are lost; no
    float32 master copy is kept (that is what saves the memory)."""

    def init(params):
        return inner.init(_as_float32(params))

    def update(updates, state, params=None, **extra_args):
        return inner.update(_as_float32(updates), state, _as_float32(params), **extra_args)

    return optax.GradientTransformationExtraArgs(init, update)


def make_optimizer(
    schedule: optax.Schedule,
    *,
    weight_decay: float = 0.0,
    max_grad_norm: float | None = 1.0,
    adam_b1: float = 0.9,
    adam_b2: float = 0.999,
    adam_eps: float = 1e-8,
) -> optax.GradientTransformation:
    """Global-norm clipping then AdamW (decay masked by `decay_mask`), with float32 state and
    updates for parameters of any floating dtype (`float32_state`): `clipped_adamw`, optax's
    arithmetic and state in one pass per parameter."""
    return float32_state(clipped_adamw(schedule, b1=adam_b1, b2=adam_b2, eps=adam_eps, weight_decay=weight_decay,
                                       max_grad_norm=max_grad_norm, mask=decay_mask))


OPTIMIZER_NUMBERS = ("weight_decay", "max_grad_norm", "adam_b1", "adam_b2", "adam_eps")
"""The optimizer's numbers a train step may take at run time (`optimizer_values`), as a
`Schedule`'s are: a search over them shares one compiled step."""


def optimizer_values(*, weight_decay: float, max_grad_norm: float | None, adam_b1: float, adam_b2: float,
                     adam_eps: float) -> dict[str, np.ndarray]:
    """`make_optimizer`'s numbers as the 0-d float32 arrays a jitted step takes beside a
    `Schedule`'s (`clipped_adamw`'s `update(..., schedule_values=...)` reads them), so that runs
    with other betas, epsilon, weight decay or clipping norm share the compiled step. `1 - b1` and
    `1 - b2` are computed here in float64, as Python computed them when they were constants, so
    the update is the same bit for bit. What still shapes the program: whether clipping is on
    (`max_grad_norm` None or 0 keeps no clipping state) and whether weight decay is 0."""
    return {"adam_b1": np.float32(adam_b1), "adam_one_minus_b1": np.float32(1 - adam_b1),
            "adam_b2": np.float32(adam_b2), "adam_one_minus_b2": np.float32(1 - adam_b2),
            "adam_eps": np.float32(adam_eps), "weight_decay": np.float32(weight_decay),
            "max_grad_norm": np.float32(max_grad_norm or 0.0)}


def reference_adamw(schedule: optax.Schedule, *, b1: float, b2: float, eps: float, weight_decay: float,
                    max_grad_norm: float | None, mask) -> optax.GradientTransformation:
    """optax's chain: `clip_by_global_norm(max_grad_norm)` (when set), then `adamw`."""
    steps = [optax.clip_by_global_norm(max_grad_norm)] if max_grad_norm else []
    steps.append(optax.adamw(schedule, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay, mask=mask))
    return optax.chain(*steps)


def clipped_adamw(schedule: optax.Schedule, *, b1: float, b2: float, eps: float, weight_decay: float,
                  max_grad_norm: float | None, mask) -> optax.GradientTransformation:
    """`reference_adamw`'s update with its state (the same pytree: checkpoints are unchanged),
    its formulas term for term, computed as one function per parameter.

    optax's chain builds each quantity (clipped gradient, moments, bias-corrected moments, decay,
    learning-rate scaling) as a tree of its own; XLA:CPU then writes several of them to memory
    and reads them back: on MiniLM's 22.7M parameters that update took 55-69 ms, this one 33-36
    (one process, alternating). `mask` is a tree of bools or a function of the parameters
    giving one (which parameters decay), as optax's. `update(..., schedule_values=v)` takes the
    learning rate from `schedule(count, v)` (a `Schedule`'s numbers given at run time) and, where
    `v` holds them (`optimizer_values`), the betas, epsilon, weight decay and clipping norm too;
    `b1`, ... given here then only say whether clipping is on and whether weight decay is 0."""
    reference = reference_adamw(schedule, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay,
                                max_grad_norm=max_grad_norm, mask=mask)

    def update(grads, state, params=None, *, schedule_values=None):
        if params is None:
            raise ValueError(optax.NO_PARAMS_MSG)
        # the chain's state: (clipping's, adamw's) or, unclipped, (adamw's,)
        clip_state, (adam, decay_state, schedule_state) = state if max_grad_norm else (None, state[0])
        g_norm = optax.tree.norm(grads) if max_grad_norm else None
        given = _given(schedule_values)
        numbers = constants if given is None else given
        count = optax.safe_increment(adam.count)
        correction1, correction2 = 1 - numbers["adam_b1"]**count, 1 - numbers["adam_b2"]**count
        run_time = () if schedule_values is None else (schedule_values,)
        step_size = -1 * schedule(schedule_state.count, *run_time)
        decays = mask(params) if callable(mask) else mask
        leaves, treedef = jax.tree.flatten(grads)

        # A jit of its own, traced once per parameter shape and decay (MiniLM: 105 parameters,
        # 10 kinds) instead of once per parameter; XLA inlines it, so the compiled update is the
        # same (bit-identical states, tests/test_optimizer.py).
        @functools.partial(jax.jit, static_argnames="decay")
        def one(g, mu, nu, p, g_norm, correction1, correction2, step_size, given, *, decay):
            n = constants if given is None else given  # Python numbers: constants, as optax has them
            if max_grad_norm:
                g = jax.lax.select(g_norm < n["max_grad_norm"], g, (g / g_norm.astype(g.dtype)) * n["max_grad_norm"])
            mu = n["adam_one_minus_b1"] * g + n["adam_b1"] * mu
            nu = n["adam_one_minus_b2"] * (g**2) + n["adam_b2"] * nu
            u = (mu / correction1.astype(mu.dtype)) / (jnp.sqrt(nu / correction2.astype(nu.dtype)) + n["adam_eps"])
            if decay and weight_decay != 0.0:
                u = u + n["weight_decay"] * p
            return step_size.astype(u.dtype) * u, mu, nu

        scalars = (g_norm, correction1, correction2, jnp.asarray(step_size), given)
        out = [one(g, mu, nu, p, *scalars, decay=bool(decay))
               for g, mu, nu, p, decay in zip(leaves, *(treedef.flatten_up_to(t) for t in (adam.mu, adam.nu, params)),
                                              treedef.flatten_up_to(decays))]
        updates, mu, nu = (treedef.unflatten(column) for column in zip(*out))
        adam = adam._replace(count=count, mu=mu, nu=nu)
        inner = (adam, decay_state, schedule_state._replace(count=optax.safe_increment(schedule_state.count)))
        return updates, ((clip_state, inner) if max_grad_norm else (inner,))

    constants = {"adam_b1": b1, "adam_one_minus_b1": 1 - b1, "adam_b2": b2, "adam_one_minus_b2": 1 - b2,
                 "adam_eps": eps, "weight_decay": weight_decay, "max_grad_norm": max_grad_norm}

    def _given(schedule_values: dict | None) -> dict | None:
        """The numbers given at run time (`optimizer_values`), or None: this optimizer's own."""
        if schedule_values is None or "adam_b1" not in schedule_values:
            return None
        return {name: schedule_values[name] for name in constants}

    return optax.GradientTransformationExtraArgs(reference.init, update)
