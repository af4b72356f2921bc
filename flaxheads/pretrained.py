"""`from_pretrained`, `load_backbone` and `save_pretrained`: checkpoints in, checkpoints out."""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from flaxheads import conversion
from flaxheads.backbones import backbone_config_from_hf, build_backbone
from flaxheads.conversion import checkpoint_io
from flaxheads.conversion.checkpoint_io import CheckpointError
from flaxheads.conversion.loading_info import LoadingInfo
from flaxheads.conversion.table import Rule, ShapeMismatch, flax_to_hf, hf_to_flax
from flaxheads.model import ClassifierConfig, SequenceClassifier

FORMATS = ("pytorch", "flax")


def _dtype(name):
    return jnp.dtype(name or "float32")


def _checkpoint_dtype(reader: checkpoint_io.TensorReader, rules: list[Rule]):
    """The dtype the checkpoint stores its backbone in (for `param_dtype="auto"`)."""
    present = [r.hf for r in rules if r.hf in set(reader.names)]
    return jnp.dtype(reader.dtype_of(present[0])) if present else jnp.dtype("float32")


def _flat_variables(module: nnx.Module) -> dict[str, tuple[tuple, nnx.Variable]]:
    """'backbone.layers.0.attention.query.kernel' -> (nnx path, variable), for every parameter."""
    _, state = nnx.split(module)
    return {".".join(map(str, path)): (path, var) for path, var in nnx.to_flat_state(state)}


def _base(table: conversion.ArchitectureTable, names: list[str]) -> str:
    """`"bert."` for checkpoints of a model with a head, `""` for a bare `BertModel`."""
    prefix = f"{table.base_prefix}."
    return prefix if any(name.startswith(prefix) for name in names) else ""


Placement = Callable[[str, tuple[int, ...]], jax.sharding.Sharding]
"""(parameter path, shape) -> where the parameter lives, e.g. `Layout.param_sharding`."""


def _init_only(make: Callable[[], nnx.Module], keys: list[str], out_shardings=None) -> dict[str, jax.Array]:
    """The initial values `make()` gives the parameters `keys`, and no others: under jit, XLA
    drops the random initialisation of everything not returned, so a new classifier costs
    microseconds, not a whole model's init."""
    if not keys:
        return {}

    def init():
        variables = _flat_variables(make())
        return {k: variables[k][1][...] for k in keys}

    return jax.jit(init, out_shardings=out_shardings)()


def _place(array, param_dtype, sharding: jax.sharding.Sharding | None) -> jax.Array:
    """A checkpoint tensor on device; with a sharding each device receives only its shard, so a
    model larger than one device's memory still loads."""
    # device_put, not jnp.asarray: the array it makes is one np.asarray can later view without
    # a copy (measured: saving a BERT-base model after jnp.asarray loading cost 30% more memory).
    return jax.device_put(np.asarray(array, dtype=param_dtype), sharding)


def _load(
    make: Callable[[], nnx.Module],
    reader: checkpoint_io.TensorReader,
    required: list[Rule],
    optional: list[Rule],
    *,
    param_dtype,
    ignore_mismatched_sizes: bool,
    describe: str,
    abstract: nnx.Module | None = None,
    placement: Placement | None = None,
) -> tuple[nnx.Module, LoadingInfo]:
    """Builds `make()` with the checkpoint's tensors. `required` rules (the backbone) must all be
    satisfied; `optional` ones (the head) may be newly initialised, and are then reported so.
    `abstract` is `nnx.eval_shape(make)` when the caller already has it (tracing is not free)."""
    abstract = abstract if abstract is not None else nnx.eval_shape(make)
    variables = _flat_variables(abstract)
    shapes = {key: var.shape for key, (_, var) in variables.items()}
    arrays, absent, mismatched = hf_to_flax(reader.read, reader.names, required + optional, shapes)
    required_names = {r.hf for r in required}
    _raise_for_backbone_problems(reader, describe, [r for r in absent if r.hf in required_names],
                                 [m for m in mismatched if m.hf_name in required_names])
    if mismatched and not ignore_mismatched_sizes:
        raise mismatched[0].with_hint(
            "a head of another size: pass the checkpoint's num_labels, or ignore_mismatched_sizes=True "
            "to start a new head"
        )
    graphdef, _ = nnx.split(abstract)
    where = {k: placement(k, tuple(var.shape)) if placement else None for k, (_, var) in variables.items()}
    new_keys = [k for k in variables if k not in arrays]
    fresh = _init_only(make, new_keys, {k: where[k] for k in new_keys} if placement else None)
    module = nnx.merge(graphdef, nnx.from_flat_state([
        (path, var.replace(fresh[k] if k in fresh else _place(arrays.pop(k), param_dtype, where[k])))
        for k, (path, var) in variables.items()
    ]))
    module.eval()  # loaded models serve inference (dropout off); model.train() before training by hand
    used = {r.hf for r in required + optional if r.flax in variables and r.flax not in new_keys}
    info = LoadingInfo(
        source=reader.source,
        head=describe,
        loaded=sorted(used),
        newly_initialized=sorted(r.hf for r in absent),
        unused=sorted(set(reader.names) - used),
        mismatched=[(m.hf_name, m.got, m.expected) for m in mismatched],
    )
    return module, info


def _raise_for_backbone_problems(reader, describe, absent: list[Rule], mismatched: list[ShapeMismatch]) -> None:
    if mismatched:
        m = mismatched[0]
        raise m.with_hint("config.json and the weights describe different models; re-export the checkpoint")
    if absent:
        names = [r.hf for r in absent]
        raise CheckpointError(
            f"{reader.source} lacks {len(names)} backbone tensor(s) that config.json implies, e.g. "
            f"{names[:3]}. The file is incomplete or belongs to a different architecture; flaxheads never "
            "fills a backbone with random weights"
        )


def _layer_templates(table: conversion.ArchitectureTable, base: str, native: bool) -> list[str]:
    """The names of one layer's tensors with `{i}` for the layer index: Hugging Face names, or the
    flax paths flaxheads' own format stores (`backbone.layers.{i}.attention.query.kernel`)."""
    if native:
        return [f"backbone.{r.flax}" for r in table.backbone if "{i}" in r.flax]
    return [r.hf.replace("{base}", base) for r in table.backbone if "{i}" in r.hf]


def _raise_for_extra_layers(reader, hf_config: dict, num_layers: int, templates: list[str]) -> None:
    """Weights of more layers than config.json declares would otherwise load as a shallower model,
    the deeper layers merely listed as unused: a different network that still runs."""
    patterns = [re.compile(re.escape(before) + r"(\d+)" + re.escape(after))
                for before, after in (t.split("{i}", 1) for t in templates)]
    deepest, example = -1, ""
    for name in reader.names:
        for pattern in patterns:
            match = pattern.fullmatch(name) if isinstance(name, str) else None
            if match and int(match.group(1)) > deepest:
                deepest, example = int(match.group(1)), name
    if deepest >= num_layers:
        key = "n_layer" if "n_layer" in hf_config else "num_hidden_layers"
        raise CheckpointError(
            f"{reader.source} holds {deepest + 1} layers (e.g. {example}) but config.json says {key}={num_layers}; "
            f"loading would silently drop the last {deepest + 1 - num_layers}. Set \"{key}\": {deepest + 1} in "
            "config.json if the weights are right, or re-export the checkpoint"
        )


def from_pretrained(
    path: str | os.PathLike,
    *,
    num_labels: int | None = None,
    head: str | None = None,
    problem_type: str | None = None,
    dtype=None,
    param_dtype=None,
    id2label: list[str] | None = None,
    classifier_dropout: float | None = None,
    seed: int = 0,
    ignore_mismatched_sizes: bool = False,
    init_classifier_from_nsp: bool = False,
    pad_token_id: int | None = None,
    head_options: dict | None = None,
    placement: Placement | None = None,
    output_loading_info: bool = False,
):
    """A `SequenceClassifier` from a Hugging Face (or flaxheads) checkpoint directory.

    `pad_token_id` overrides config.json's (None keeps it), as `model.config.pad_token_id = ...`
    does in transformers: GPT-2 checkpoints have none, and the "last_token" head needs one to
    find the last real token of padded rows (usually `tokenizer.eos_token_id`). It is saved with
    the model. On RoBERTa it also moves the position ids, as in transformers.

    `placement(path, shape)` puts each parameter where it belongs (a mesh sharding) straight
    from the checkpoint, so a model too large for one device loads sharded.

    `head_options` set head-specific options (the "summary" head's `summary_type`, ...; see
    `flaxheads/heads/summary.py`) over those config.json gives; they are saved with the model.

    `head` defaults to the checkpoint's own (the one transformers' `*ForSequenceClassification`
    uses, or the head a flaxheads export recorded). New parameters (usually the classifier) are
    initialised from `seed` as transformers does and listed in the loading info. `param_dtype`
    defaults to float32; "auto" keeps the checkpoint's dtype (exact conversion). Returns the
    model, or `(model, LoadingInfo)` with `output_loading_info=True`.

    Raises ValueError (CheckpointError, ShapeMismatch) naming the key or setting at fault.
    """
    hf_config = checkpoint_io.read_config(path)
    if pad_token_id is not None:
        hf_config["pad_token_id"] = pad_token_id
    table = conversion.architecture_table(hf_config.get("model_type"))
    config = ClassifierConfig.from_hf_config(
        hf_config,
        default_head=table.canonical_head,
        head=head,
        num_labels=num_labels,
        problem_type=problem_type,
        id2label=id2label,
        classifier_dropout=classifier_dropout,
        head_options=head_options,
    )
    def make(param_dtype=jnp.float32):
        return SequenceClassifier(config, dtype=_dtype(dtype), param_dtype=param_dtype, rngs=nnx.Rngs(seed))

    abstract = nnx.eval_shape(make)
    param_paths = list(_flat_variables(abstract))
    head_paths = [k[len("head."):] for k in param_paths if k.startswith("head.")]
    native = (Path(path) / checkpoint_io.FLAX_NAME).is_file()
    if native:
        reader = checkpoint_io.open_weights(path, checkpoint_io.FLAX_NAME)
        base = ""
        backbone = [Rule(k, k) for k in param_paths if k.startswith("backbone.")]
        head_rules = [Rule(f"head.{k}", f"head.{k}") for k in head_paths]
    else:
        reader = checkpoint_io.open_weights(path)
        base = _base(table, reader.names)
        backbone = conversion.backbone_rules(table, config.backbone.num_hidden_layers, base)
        head_rules = conversion.head_rules(table, config.head, head_paths, base)
    _raise_for_extra_layers(reader, hf_config, config.backbone.num_hidden_layers, _layer_templates(table, base, native))
    param_dtype = _checkpoint_dtype(reader, backbone) if param_dtype == "auto" else _dtype(param_dtype)
    notes = list(table.loading_notes)
    if init_classifier_from_nsp:
        head_rules = _nsp_rules(table, config, head_rules, reader, base)
        notes.append(
            "classifier initialised from the NSP head cls.seq_relationship: label 0 = B follows A, "
            "label 1 = B is random"
        )
    if config.head == "last_token" and config.backbone.pad_token_id is None:
        notes.append(
            "no pad_token_id: padded batches need attention_mask to find each text's last token, and "
            "transformers refuses them; load with pad_token_id=tokenizer.eos_token_id (or another pad id)"
        )
    model, info = _load(
        functools.partial(make, param_dtype), reader, backbone, head_rules,
        param_dtype=param_dtype, ignore_mismatched_sizes=ignore_mismatched_sizes, describe=config.head,
        abstract=abstract, placement=placement,
    )
    info.notes += notes
    return (model, info) if output_loading_info else model


def _nsp_rules(table, config: ClassifierConfig, head_rules: list[Rule], reader, base: str) -> list[Rule]:
    if config.head != "pooler" or config.num_labels != 2 or not table.nsp_classifier:
        raise ValueError(
            "init_classifier_from_nsp=True needs head='pooler', num_labels=2 and a BERT checkpoint; got "
            f"head={config.head!r}, num_labels={config.num_labels}, model_type={table.model_type!r}"
        )
    nsp = conversion.under("head", conversion.expand(table.nsp_classifier, num_layers=0, base=base))
    missing = [r.hf for r in nsp if r.hf not in reader.names]
    if missing:
        raise CheckpointError(
            f"init_classifier_from_nsp=True but {reader.source} has no {missing[0]}; only pretraining "
            "checkpoints (BertForPreTraining, BertForNextSentencePrediction) carry the NSP head"
        )
    return [r for r in head_rules if not r.flax.startswith("head.classifier.")] + nsp


def load_backbone(path: str | os.PathLike, *, dtype=None, param_dtype=None):
    """(backbone, LoadingInfo) for a checkpoint's base model, with its pooler when it has one."""
    hf_config = checkpoint_io.read_config(path)
    table = conversion.architecture_table(hf_config.get("model_type"))
    config = backbone_config_from_hf(hf_config)
    native = (Path(path) / checkpoint_io.FLAX_NAME).is_file()
    if native:
        # flaxheads' own layout: the classifier's backbone, and the "pooler" head's pooler if any.
        reader = checkpoint_io.open_weights(path, checkpoint_io.FLAX_NAME)
        base = ""
        pooler = [Rule(f"head.{r.flax}", r.flax) for r in table.pooler]
        rules = [Rule(f"backbone.{r.flax}", r.flax) for r in conversion.expand(
            table.backbone, num_layers=config.num_hidden_layers, base="")]
    else:
        reader = checkpoint_io.open_weights(path)
        base = _base(table, reader.names)
        pooler = conversion.expand(table.pooler, num_layers=0, base=base)
        rules = conversion.expand(table.backbone, num_layers=config.num_hidden_layers, base=base)
    _raise_for_extra_layers(reader, hf_config, config.num_hidden_layers, _layer_templates(table, base, native))
    has_pooler = bool(pooler) and all(r.hf in reader.names for r in pooler)
    rules += pooler if has_pooler else []

    def make():
        return build_backbone(
            config, dtype=_dtype(dtype), param_dtype=_dtype(param_dtype), rngs=nnx.Rngs(0), add_pooling_layer=has_pooler
        )

    return _load(make, reader, rules, [], param_dtype=_dtype(param_dtype), ignore_mismatched_sizes=False,
                 describe="none (backbone only)")


def save_pretrained(model: SequenceClassifier, path: str | os.PathLike, *, format: str = "pytorch") -> None:
    """`"pytorch"`: a Hugging Face directory (`config.json` + `model.safetensors`) that transformers
    loads; `"flax"`: the same config with `flaxheads_model.safetensors` keyed by flax paths."""
    if format not in FORMATS:
        raise ValueError(f"format={format!r}; choose one of {FORMATS}")
    path = Path(path)
    other = checkpoint_io.FLAX_NAME if format == "pytorch" else checkpoint_io.SAFETENSORS_NAME
    if (path / other).exists():
        raise FileExistsError(
            f"{path} already holds {other}; save each format into its own directory so neither is "
            "mistaken for the other"
        )
    config: ClassifierConfig = model.config
    table = conversion.architecture_table(config.backbone.model_type)
    arrays = {key: np.asarray(var[...]) for key, (_, var) in _flat_variables(model).items()}
    architecture = (
        table.classification_architecture if conversion.is_canonical(table, config.head) else table.base_architecture
    )
    hf_config = config.to_hf_config(architecture)
    hf_config["dtype"] = str(next(iter(arrays.values())).dtype)
    if format == "flax":
        checkpoint_io.write_checkpoint(path, hf_config, arrays, checkpoint_io.FLAX_NAME)
        return
    base = f"{table.base_prefix}."
    head_paths = [k[len("head."):] for k in arrays if k.startswith("head.")]
    rules = conversion.backbone_rules(table, config.backbone.num_hidden_layers, base)
    rules += conversion.head_rules(table, config.head, head_paths, base)
    checkpoint_io.write_checkpoint(path, hf_config, flax_to_hf(arrays, rules))
