"""LoRA (Hu et al. 2021) as peft applies it: the layer, and adding and merging adapters.

    model = model.with_lora(LoRAConfig(r=8, alpha=16, target_modules=("query", "value")))
    model.save_pretrained("merged")        # adapters merged: a plain transformers checkpoint
    flaxheads.conversion.peft.save_adapter(model, "adapter", base_model_name_or_path="bert-base-uncased")

This module is model code: it knows Linear layers by their flax paths. Targets are named as peft
names them (Hugging Face module names, "all-linear"); turning those names into paths, and the
peft adapter folder, are the peft format's (`flaxheads.conversion.peft`), which every family with
a conversion table gets without a list of its own.

Each targeted `nnx.Linear` at path P becomes a `LoRALinear` at P holding the original layer as
`P.base` (its weights untouched) and the adapters `P.lora_a` (in, r) and `P.lora_b` (r, out),
`nnx.LoRAParam`s: y = base(x) + dropout(x) @ lora_a @ lora_b * alpha / r. lora_a starts as
peft's kaiming-uniform(a=sqrt(5)) (uniform in +-1/sqrt(in)), lora_b at zero, so a fresh adapter
changes nothing. transformers' `Conv1D` (GPT-2) stores its weight (in, out) like a Flax kernel;
its adapter has the same shapes as a Linear's (peft's fan_in_fan_out only changes the merge).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import math
from typing import Iterator, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from flaxheads.backbones import dropout


@dataclasses.dataclass(frozen=True)
class LoRAConfig:
    r: int
    """Rank of the adapters (peft's `r`)."""
    alpha: float = 8.0
    """The adapter output is scaled by alpha / r (peft's `lora_alpha`)."""
    dropout: float = 0.0
    """Dropout on the adapter input, in train mode only (peft's `lora_dropout`)."""
    target_modules: tuple[str, ...] = ()
    """Hugging Face module names, as peft's `target_modules` list, or ("all-linear",)."""

    def __post_init__(self):
        if self.r <= 0:
            raise ValueError(f"LoRA rank r={self.r}: it must be positive (lora_r=0 means no LoRA)")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"lora_dropout={self.dropout}: it must be in [0, 1)")
        object.__setattr__(self, "target_modules", tuple(self.target_modules))

    @property
    def scaling(self) -> float:
        return self.alpha / self.r


# -- the module ------------------------------------------------------------------------------

_ADAPTER_KEY: contextvars.ContextVar[jax.Array | None] = contextvars.ContextVar("flaxheads_lora_key", default=None)
"""The key of the adapters' dropout during one model call: the layers call their Linears
without rngs, so `SequenceClassifier.__call__` provides it here (`adapter_dropout_key`)."""


@contextlib.contextmanager
def adapter_dropout_key(config: LoRAConfig | None, rngs: nnx.Rngs | None) -> Iterator[None]:
    """Inside, every `LoRALinear` draws its dropout from one key of `rngs` (folded with its own
    index). Draws nothing when there is no adapter dropout, so models without it see the same
    random stream as before."""
    if config is None or config.dropout == 0.0 or rngs is None:
        yield
        return
    token = _ADAPTER_KEY.set(rngs.dropout())
    try:
        yield
    finally:
        _ADAPTER_KEY.reset(token)


class LoRALinear(nnx.Module):
    """`base(x) + dropout(x) @ lora_a @ lora_b * scaling`; `base` is the frozen original layer."""

    def __init__(self, base: nnx.Linear, config: LoRAConfig, *, index: int, deterministic: bool, rngs: nnx.Rngs):
        self.base = base
        # float32 adapters on bf16 (or f16) weights, as peft's autocast_adapter_dtype=True default:
        # they are what trains, and they are small.
        param_dtype = jnp.promote_types(base.kernel.dtype, jnp.float32)
        bound = 1.0 / math.sqrt(base.in_features)  # torch's kaiming_uniform_(a=sqrt(5)) on (r, in)
        self.lora_a = nnx.LoRAParam(
            jax.random.uniform(rngs.params(), (base.in_features, config.r), jnp.float32, -bound, bound)
            .astype(param_dtype)
        )
        self.lora_b = nnx.LoRAParam(jnp.zeros((config.r, base.out_features), param_dtype))
        self.scaling = config.scaling
        self.dropout_rate = config.dropout
        self.index = index
        """Folded into the call's dropout key: each adapter drops different units."""
        self.deterministic = deterministic

    def __call__(self, x: jax.Array) -> jax.Array:
        y = self.base(x)
        key = _ADAPTER_KEY.get()
        rngs = None if key is None else dropout.DropoutKeys(jax.random.fold_in(key, self.index))
        h = dropout.apply(x, self.dropout_rate, rngs, deterministic=self.deterministic)
        dtype = self.base.dtype or y.dtype
        update = (h.astype(dtype) @ self.lora_a[...].astype(dtype)) @ self.lora_b[...].astype(dtype)
        return y + (update * self.scaling).astype(y.dtype)

    def merged_kernel(self) -> jax.Array:
        """The base kernel with the adapter folded in, computed in float32, stored as the base's dtype."""
        kernel = self.base.kernel[...]
        delta = (self.lora_a[...].astype(jnp.float32) @ self.lora_b[...].astype(jnp.float32)) * self.scaling
        return (kernel.astype(jnp.float32) + delta).astype(kernel.dtype)


# -- adding and merging ------------------------------------------------------------------------

def _parent_and_name(model: nnx.Module, path: str) -> tuple[nnx.Module, str]:
    *parents, name = path.split(".")
    node = model
    for part in parents:
        node = node[int(part)] if part.isdigit() else getattr(node, part)
    return node, name


def _shallow_copy(model: nnx.Module) -> nnx.Module:
    """A new module tree over the same arrays (no array is copied)."""
    graphdef, state = nnx.split(model)
    return nnx.merge(graphdef, state)


def _in_eval_mode(model: nnx.Module) -> bool:
    return any(getattr(module, "deterministic", False) for _, module in nnx.iter_modules(model))


def add_adapters(model: nnx.Module, config: LoRAConfig, module_paths: Sequence[str], *, seed: int = 0) -> nnx.Module:
    """A copy of the classifier `model` whose Linear layers at `module_paths` (flax paths,
    "backbone.layers.0.attention.query") carry fresh adapters (logits unchanged until they
    train); `model` is left as it is, and its weights are shared, not copied. The copy's `lora`
    attribute records `config`. Which paths a peft `target_modules` list names is the peft
    format's business: `SequenceClassifier.with_lora` resolves them (`conversion.peft`).

    ValueError for a model that has adapters already, or a path that is not a Linear."""
    if lora_config(model) is not None:
        raise ValueError("the model has LoRA adapters already; merge them first (flaxheads.lora.merged(model))")
    copy = _shallow_copy(model)
    deterministic = _in_eval_mode(model)
    rngs = nnx.Rngs(params=jax.random.fold_in(jax.random.key(seed), 0x10A))
    for index, path in enumerate(module_paths):
        parent, name = _parent_and_name(copy, path)
        base = getattr(parent, name)
        if not isinstance(base, nnx.Linear):
            raise ValueError(f"{path} is a {type(base).__name__} in flaxheads, not a Linear; LoRA cannot wrap it: "
                             "leave it out of lora_target_modules")
        setattr(parent, name, LoRALinear(base, config, index=index, deterministic=deterministic, rngs=rngs))
    copy.lora = config
    return copy


def lora_config(model: nnx.Module) -> LoRAConfig | None:
    """The LoRAConfig of a model `with_lora` made; None for a plain model."""
    return getattr(model, "lora", None)


def adapters(model: nnx.Module) -> dict[str, LoRALinear]:
    """{flax module path: LoRALinear} of the model's adapters."""
    return {".".join(map(str, path)): module
            for path, module in nnx.iter_modules(model) if isinstance(module, LoRALinear)}


def merged(model: nnx.Module) -> nnx.Module:
    """The plain model the LoRA `model` computes: each adapter folded into its base kernel
    (W + A B alpha/r). A model without adapters is returned as it is; `model` is not changed."""
    if lora_config(model) is None:
        return model
    copy = _shallow_copy(model)
    for path, adapter in adapters(copy).items():
        parent, name = _parent_and_name(copy, path)
        base = adapter.base
        base.kernel = nnx.Param(adapter.merged_kernel())
        setattr(parent, name, base)
    del copy.lora
    return copy


def trainable_summary(trainable: nnx.State, frozen: nnx.State) -> str:
    """peft's print_trainable_parameters line."""
    count = lambda state: sum(int(np.prod(x.shape)) for x in jax.tree.leaves(state))  # noqa: E731
    n_trainable, n_all = count(trainable), count(trainable) + count(frozen)
    return (f"trainable params: {n_trainable:,} || all params: {n_all:,} || "
            f"trainable%: {100 * n_trainable / max(n_all, 1):.4f}")


__all__ = ["LoRAConfig", "LoRALinear", "adapter_dropout_key", "adapters", "add_adapters", "lora_config", "merged",
           "trainable_summary"]
