"""The peft LoRA format: which layers a peft `target_modules` list names in a flaxheads model,
and the adapter folder peft's `save_pretrained` writes (adapter_config.json +
adapter_model.safetensors), so `peft.PeftModel.from_pretrained` loads a flaxheads LoRA run.

Targets are Hugging Face module names matched against the model's `*ForSequenceClassification`
module paths (a name matches a path equal to it or ending in "." + name; "all-linear" means every
Linear of the backbone). The conversion table is what knows both names, so every family with a
table gets LoRA without a list of its own. The LoRA layer itself is model code (`flaxheads.lora`).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
from flax import nnx

from flaxheads import atomic, lora
from flaxheads.conversion import architecture_table, checkpoint_io, rules
from flaxheads.conversion.table import CONV1D, LINEAR, SEQUENCE_CLASSIFICATION, flax_to_hf

ALL_LINEAR = "all-linear"
"""peft's name for every Linear layer of the backbone (the classifier excluded)."""

ADAPTER_CONFIG_NAME = "adapter_config.json"
ADAPTER_WEIGHTS_NAME = "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."
"""peft's prefix of every key in an adapter file (the PeftModel's path to the transformers model)."""
PEFT_TASK_TYPES = {SEQUENCE_CLASSIFICATION: "SEQ_CLS"}
"""peft's task type of each task flaxheads writes adapter folders of (by the task's name)."""
PEFT_CLASSIFIER_MODULES = ("classifier", "score")
"""The modules peft's SEQ_CLS task always adds to modules_to_save."""


@dataclasses.dataclass(frozen=True)
class Target:
    """A Linear layer of the backbone that an adapter can wrap."""

    hf_module: str
    """Its module path in transformers' `*ForSequenceClassification` ("bert.encoder.layer.0.attention.self.query")."""
    flax_module: str
    """Its path in the flaxheads model ("backbone.layers.0.attention.query")."""
    conv1d: bool
    """transformers stores it as a `Conv1D` (weight (in, out)); peft's `fan_in_fan_out`."""


def linear_targets(model_config) -> list[Target]:
    """Every backbone Linear (or Conv1D) the model's conversion table names, in table order."""
    table = architecture_table(model_config.backbone.model_type)
    table_rules = rules.backbone_rules(table, model_config.backbone, f"{table.base_prefix}.")
    return [
        Target(r.hf.removesuffix(".weight"), r.flax.removesuffix(".kernel"), r.transform is CONV1D)
        for r in table_rules
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


def peft_adapter(model: nnx.Module, *, base_model_name_or_path: str | None = None
                 ) -> tuple[dict, dict[str, np.ndarray]]:
    """(adapter_config.json, adapter_model.safetensors tensors) as peft's `save_pretrained` writes
    them for a LoRA model of task type SEQ_CLS: the adapters under
    `base_model.model.<hf module>.lora_A.weight` (r, in) / `lora_B.weight` (out, r), and the
    classification head (trained in full) under `base_model.model.<hf name>` with its modules in
    `modules_to_save`. ValueError for a model without adapters, a model of another task (a
    `TokenClassifier`, a `MultipleChoice`), or with a head transformers'
    `*ForSequenceClassification` does not have (export them merged instead)."""
    config = lora.lora_config(model)
    if config is None:
        raise ValueError("the model has no LoRA adapters; save it with save_pretrained instead")
    table = architecture_table(model.config.backbone.model_type)
    if model.config.task not in PEFT_TASK_TYPES:
        raise ValueError(
            f"flaxheads writes peft adapters of task type {', '.join(PEFT_TASK_TYPES.values())} only, and this is a "
            f"{model.config.task} model: save it merged (model.save_pretrained(path))"
        )
    if not table.is_canonical(model.config.head):
        raise ValueError(
            f"a peft adapter is applied to transformers' {table.classification_architecture}, whose head is "
            f"{table.canonical_head!r}, not {model.config.head!r}: save this model merged "
            "(model.save_pretrained(path), or --lora_export merged)"
        )
    by_flax = {t.flax_module: t for t in linear_targets(model.config)}
    tensors: dict[str, np.ndarray] = {}
    targets = []
    for path, adapter in lora.adapters(model).items():
        target = by_flax[path]
        targets.append(target)
        # peft's lora_A / lora_B are nn.Linear weights, (out, in): the flax (in, out) arrays transposed.
        module = f"{PEFT_PREFIX}{target.hf_module}"
        tensors[f"{module}.lora_A.weight"] = np.ascontiguousarray(np.asarray(adapter.lora_a[...]).T)
        tensors[f"{module}.lora_B.weight"] = np.ascontiguousarray(np.asarray(adapter.lora_b[...]).T)
    head = {".".join(map(str, p)): np.asarray(v[...]) for p, v in nnx.to_flat_state(nnx.state(model.head))}
    base = f"{table.base_prefix}."
    head_tensors = flax_to_hf({f"head.{k}": v for k, v in head.items()},
                              rules.head_rules(table, model.config.head, list(head), base))
    tensors.update({PEFT_PREFIX + name: array for name, array in head_tensors.items()})
    adapter_config = {
        "peft_type": "LORA",
        "task_type": PEFT_TASK_TYPES[model.config.task],
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
    with atomic.replace_folder(path) as staging:
        checkpoint_io.write_safetensors(staging / ADAPTER_WEIGHTS_NAME, tensors, metadata={"format": "pt"})
        atomic.write_json(staging / ADAPTER_CONFIG_NAME, adapter_config)
    return Path(path)


__all__ = ["ADAPTER_CONFIG_NAME", "ADAPTER_WEIGHTS_NAME", "ALL_LINEAR", "Target", "linear_targets", "peft_adapter",
           "resolve_targets", "save_adapter"]
