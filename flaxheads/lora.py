"""LoRA (Hu et al. 2021) as peft applies it, on any backbone whose conversion table names its
Linear layers.

    model = flaxheads.lora.with_lora(model, LoRAConfig(r=8, alpha=16, target_modules=("query", "value")))
    model.save_pretrained("merged")              # adapters merged: a plain transformers checkpoint
    flaxheads.lora.save_adapter(model, "adapter", base_model_name_or_path="bert-base-uncased")  # peft folder

Targets are named as peft names them: Hugging Face module names matched against the model's
`*ForSequenceClassification` module paths (a name matches a path equal to it or ending in
"." + name; "all-linear" means every Linear of the backbone). The conversion table is what
knows both names, so every family with a table gets LoRA without a list of its own.

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
from pathlib import Path
from typing import Iterator

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from flaxheads import conversion
from flaxheads.backbones import layers
from flaxheads.conversion import checkpoint_io
from flaxheads.conversion.table import CONV1D, LINEAR, flax_to_hf

ALL_LINEAR = "all-linear"
"""peft's name for every Linear layer of the backbone (the classifier excluded)."""

ADAPTER_CONFIG_NAME = "adapter_config.json"
ADAPTER_WEIGHTS_NAME = "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."
"""peft's prefix of every key in an adapter file (the PeftModel's path to the transformers model)."""
PEFT_CLASSIFIER_MODULES = ("classifier", "score")
"""The modules peft's SEQ_CLS task always adds to modules_to_save."""


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


@dataclasses.dataclass(frozen=True)
class Target:
    """A Linear layer of the backbone that an adapter can wrap."""

    hf_module: str
    """Its module path in transformers' `*ForSequenceClassification` ("bert.encoder.layer.0.attention.self.query")."""
    flax_module: str
    """Its path in the flaxheads model ("backbone.layers.0.attention.query")."""
    conv1d: bool
    """transformers stores it as a `Conv1D` (weight (in, out)); peft's `fan_in_fan_out`."""


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
        rngs = None if key is None else nnx.Rngs(dropout=jax.random.fold_in(key, self.index))
        h = layers.dropout(x, self.dropout_rate, rngs, deterministic=self.deterministic)
        dtype = self.base.dtype or y.dtype
        update = (h.astype(dtype) @ self.lora_a[...].astype(dtype)) @ self.lora_b[...].astype(dtype)
        return y + (update * self.scaling).astype(y.dtype)

    def merged_kernel(self) -> jax.Array:
        """The base kernel with the adapter folded in, computed in float32, stored as the base's dtype."""
        kernel = self.base.kernel[...]
        delta = (self.lora_a[...].astype(jnp.float32) @ self.lora_b[...].astype(jnp.float32)) * self.scaling
        return (kernel.astype(jnp.float32) + delta).astype(kernel.dtype)


# -- which layers --------------------------------------------------------------------------------


def linear_targets(model_config) -> list[Target]:
    """Every backbone Linear (or Conv1D) the model's conversion table names, in table order."""
    table = conversion.architecture_table(model_config.backbone.model_type)
    rules = conversion.backbone_rules(table, model_config.backbone, f"{table.base_prefix}.")
    return [
        Target(r.hf.removesuffix(".weight"), r.flax.removesuffix(".kernel"), r.transform is CONV1D)
        for r in rules
        if r.transform in (LINEAR, CONV1D) and r.hf.endswith(".weight") and r.flax.endswith(".kernel")
    ]


def _matches(name: str, targets: tuple[str, ...]) -> bool:
    """peft's rule for a list of target_modules: the name itself, or a suffix after a dot."""
    return ALL_LINEAR in targets or name in targets or any(name.endswith(f".{t}") for t in targets)


def resolve_targets(model_config, target_modules: tuple[str, ...]) -> list[Target]:
    """The backbone Linears `target_modules` names. Raises ValueError when a name matches no
    Linear of this backbone (listing the ones there are), or names another kind of module."""
    candidates = linear_targets(model_config)
    short_names = sorted({t.hf_module.rsplit(".", 1)[-1] for t in candidates})
    model_type = model_config.backbone.model_type
    if not target_modules:
        raise ValueError(
            f"LoRA needs target modules: pass lora_target_modules (--lora_target_modules), names of the "
            f"{model_type} model's Linear layers as transformers names them: {', '.join(short_names)}, or {ALL_LINEAR}"
        )
    chosen = [t for t in candidates if _matches(t.hf_module, target_modules)]
    matched = {name for name in target_modules
               if name == ALL_LINEAR or any(_matches(t.hf_module, (name,)) for t in chosen)}
    unmatched = [name for name in target_modules if name not in matched]
    if unmatched:
        raise ValueError(
            f"lora_target_modules {unmatched} match no Linear layer of the {model_type} backbone; LoRA can wrap "
            f"{', '.join(short_names)} (or {ALL_LINEAR}). Embeddings, norms and the classifier are not LoRA targets"
        )
    return chosen


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


def with_lora(model: nnx.Module, config: LoRAConfig, *, seed: int = 0) -> nnx.Module:
    """A copy of the classifier `model` whose targeted backbone Linears carry fresh adapters
    (logits unchanged until they train); `model` is left as it is, and its weights are shared,
    not copied. The copy's `lora` attribute records `config`. ValueError for a model that has
    adapters already, or targets as `resolve_targets` says."""
    if lora_config(model) is not None:
        raise ValueError("the model has LoRA adapters already; merge them first (flaxheads.lora.merged(model))")
    targets = resolve_targets(model.config, config.target_modules)
    copy = _shallow_copy(model)
    deterministic = _in_eval_mode(model)
    rngs = nnx.Rngs(params=jax.random.fold_in(jax.random.key(seed), 0x10A))
    for index, target in enumerate(targets):
        parent, name = _parent_and_name(copy, target.flax_module)
        base = getattr(parent, name)
        if not isinstance(base, nnx.Linear):
            raise ValueError(f"{target.hf_module} is a {type(base).__name__} in flaxheads, not a Linear; LoRA "
                             "cannot wrap it: leave it out of lora_target_modules")
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


# -- the peft adapter folder ---------------------------------------------------------------------


def peft_adapter(model: nnx.Module, *, base_model_name_or_path: str | None = None
                 ) -> tuple[dict, dict[str, np.ndarray]]:
    """(adapter_config.json, adapter_model.safetensors tensors) as peft's `save_pretrained` writes
    them for a LoRA model of task type SEQ_CLS: the adapters under
    `base_model.model.<hf module>.lora_A.weight` (r, in) / `lora_B.weight` (out, r), and the
    classification head (trained in full) under `base_model.model.<hf name>` with its modules in
    `modules_to_save`. ValueError for a model without adapters, or with a head transformers'
    `*ForSequenceClassification` does not have (export it merged instead)."""
    config = lora_config(model)
    if config is None:
        raise ValueError("the model has no LoRA adapters; save it with save_pretrained instead")
    table = conversion.architecture_table(model.config.backbone.model_type)
    if not conversion.is_canonical(table, model.config.head):
        raise ValueError(
            f"a peft adapter is applied to transformers' {table.classification_architecture}, whose head is "
            f"{table.canonical_head!r}, not {model.config.head!r}: save this model merged "
            "(model.save_pretrained(path), or --lora_export merged)"
        )
    by_flax = {t.flax_module: t for t in linear_targets(model.config)}
    tensors: dict[str, np.ndarray] = {}
    targets = []
    for path, adapter in adapters(model).items():
        target = by_flax[path]
        targets.append(target)
        # peft's lora_A / lora_B are nn.Linear weights, (out, in): the flax (in, out) arrays transposed.
        module = f"{PEFT_PREFIX}{target.hf_module}"
        tensors[f"{module}.lora_A.weight"] = np.ascontiguousarray(np.asarray(adapter.lora_a[...]).T)
        tensors[f"{module}.lora_B.weight"] = np.ascontiguousarray(np.asarray(adapter.lora_b[...]).T)
    head = {".".join(map(str, p)): np.asarray(v[...]) for p, v in nnx.to_flat_state(nnx.state(model.head))}
    base = f"{table.base_prefix}."
    head_tensors = flax_to_hf({f"head.{k}": v for k, v in head.items()},
                              conversion.head_rules(table, model.config.head, list(head), base))
    tensors.update({PEFT_PREFIX + name: array for name, array in head_tensors.items()})
    adapter_config = {
        "peft_type": "LORA",
        "task_type": "SEQ_CLS",
        "base_model_name_or_path": base_model_name_or_path,
        "r": config.r,
        "lora_alpha": config.alpha,
        "lora_dropout": config.dropout,
        "target_modules": list(config.target_modules) if ALL_LINEAR not in config.target_modules else ALL_LINEAR,
        "modules_to_save": _modules_to_save(head_tensors, base),
        "fan_in_fan_out": any(t.conv1d for t in targets),
        "bias": "none",
        "use_rslora": False,
        "use_dora": False,
        "init_lora_weights": True,
        "inference_mode": True,
    }
    return adapter_config, tensors


def _modules_to_save(head_tensors: dict[str, np.ndarray], base: str) -> list[str]:
    """The head's modules as peft's modules_to_save names them: peft always adds "classifier" and
    "score"; a head module inside the base model (BERT's pooler) is named by its path there."""
    modules = set(PEFT_CLASSIFIER_MODULES)
    for name in head_tensors:
        module = name.rsplit(".", 1)[0].removeprefix(base)
        if module.split(".")[0] not in PEFT_CLASSIFIER_MODULES:
            modules.add(module)
    return sorted(modules)


def save_adapter(model: nnx.Module, path, *, base_model_name_or_path: str | None = None) -> Path:
    """Writes the peft adapter folder of the LoRA `model` (see `peft_adapter`) into `path`, all
    files or none (a temporary folder, then renames); returns the folder. Load it with
    `peft.PeftModel.from_pretrained(AutoModelForSequenceClassification.from_pretrained(base,
    num_labels=...), path)`."""
    adapter_config, tensors = peft_adapter(model, base_model_name_or_path=base_model_name_or_path)
    with checkpoint_io.staged_into(path) as staging:
        checkpoint_io.write_safetensors(staging / ADAPTER_WEIGHTS_NAME, tensors, metadata={"format": "pt"})
        checkpoint_io.write_json(staging / ADAPTER_CONFIG_NAME, adapter_config)
    return Path(path)


def trainable_summary(trainable: nnx.State, frozen: nnx.State) -> str:
    """peft's print_trainable_parameters line."""
    count = lambda state: sum(int(np.prod(x.shape)) for x in jax.tree.leaves(state))  # noqa: E731
    n_trainable, n_all = count(trainable), count(trainable) + count(frozen)
    return (f"trainable params: {n_trainable:,} || all params: {n_all:,} || "
            f"trainable%: {100 * n_trainable / max(n_all, 1):.4f}")


__all__ = ["ALL_LINEAR", "LoRAConfig", "LoRALinear", "Target", "adapter_dropout_key", "adapters", "linear_targets",
           "lora_config", "merged", "peft_adapter", "resolve_targets", "save_adapter", "with_lora"]
