"""Checkpoints in, checkpoints out: `from_pretrained`, `load_backbone`, `save_pretrained`.

The one home of loading and saving. A checkpoint folder is opened once
(`model_folder.open_checkpoint`: its config.json and the weight format found) and passed on.
The loader is generic over the model class (`cls.config_class` reads config.json), so the model
module imports this one and never the other way round.
"""

from __future__ import annotations

import functools
import numbers
import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from flaxheads import atomic, conversion
from flaxheads.backbones import backbone_config_from_hf, build_backbone, dropout
from flaxheads.conversion import checkpoint_io, formats, rules
from flaxheads.conversion.checkpoint_io import CheckpointError, TensorReader
from flaxheads.conversion.formats import WeightFormat
from flaxheads.conversion.loading_info import LoadingInfo
from flaxheads.conversion.model_folder import Checkpoint, open_checkpoint, weight_format  # noqa: F401 (re-exported)
from flaxheads.conversion.table import Rule, ShapeMismatch, expand, flax_to_hf, hf_to_flax

# ---------------------------------------------------------------------------------------------
# Loading


def flat_variables(module: nnx.Module) -> dict[str, tuple[tuple, nnx.Variable]]:
    """'backbone.layers.0.attention.query.kernel' -> (nnx path, variable), for every parameter."""
    _, state = nnx.split(module)
    return {".".join(map(str, path)): (path, var) for path, var in nnx.to_flat_state(state)}


def _dtype(name):
    return jnp.dtype(name or "float32")


def _checkpoint_dtype(reader: TensorReader, rules: list[Rule]):
    """The dtype the checkpoint stores its backbone in (for `param_dtype="auto"`)."""
    present = [r.hf for r in rules if r.hf in set(reader.names)]
    return jnp.dtype(reader.dtype_of(present[0])) if present else jnp.dtype("float32")


Placement = Callable[[str, tuple[int, ...]], jax.sharding.Sharding]
"""(parameter path, shape) -> where the parameter lives, e.g. `Layout.param_sharding`."""


class SeedKeys:
    """What a model's constructor asks of `nnx.Rngs(seed)`, key for key: every stream it names
    (`rngs.params()`, ...) is that Rngs' one default stream, whose n-th key is
    `fold_in(key(seed), n)`, here counted in Python. Loading builds each model under traces
    (`nnx.eval_shape`, and jit for the new head), where nnx.Rngs' traced count costs a trace-long
    error message per key (see `dropout.DropoutKeys`): ~0.2 s of tracing per MiniLM build."""

    def __init__(self, seed: int):
        self._stream = dropout.DropoutKeys(seed)

    def __getattr__(self, name: str):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return self._stream.dropout

    def __getitem__(self, name: str):
        return self._stream.dropout


def _init_only(make: Callable[[], nnx.Module], keys: list[str], out_shardings=None) -> dict[str, jax.Array]:
    """The initial values `make()` gives the parameters `keys`, and no others: under jit, XLA
    drops the random initialisation of everything not returned, so a new classifier costs
    microseconds, not a whole model's init."""
    if not keys:
        return {}

    def init():
        variables = flat_variables(make())
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
    reader: TensorReader,
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
    variables = flat_variables(abstract)
    shapes = {key: var.shape for key, (_, var) in variables.items()}
    where = {k: placement(k, tuple(var.shape)) if placement else None for k, (_, var) in variables.items()}
    _raise_for_non_float_weights(reader, required + optional, {k: var.dtype for k, (_, var) in variables.items()})
    # Each tensor goes to its device (its shards to theirs) as it is read, so the host holds one
    # tensor at a time, never the model's state.
    arrays, absent, mismatched = hf_to_flax(reader.read, reader.names, required + optional, shapes,
                                            place=lambda key, array: _place(array, param_dtype, where[key]))
    required_names = {r.hf for r in required}
    _raise_for_backbone_problems(reader, [r for r in absent if r.hf in required_names],
                                 [m for m in mismatched if m.hf_name in required_names])
    if mismatched and not ignore_mismatched_sizes:
        raise mismatched[0].with_hint(
            "a head of another size: pass the checkpoint's num_labels, or ignore_mismatched_sizes=True "
            "to start a new head"
        )
    graphdef, _ = nnx.split(abstract)
    new_keys = [k for k in variables if k not in arrays]
    fresh = _init_only(make, new_keys, {k: where[k] for k in new_keys} if placement else None)
    module = nnx.merge(graphdef, nnx.from_flat_state([
        (path, var.replace(fresh[k] if k in fresh else arrays.pop(k)))
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


def _raise_for_backbone_problems(reader: TensorReader, absent: list[Rule], mismatched: list[ShapeMismatch]) -> None:
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


def _raise_for_non_float_weights(reader: TensorReader, rules: list[Rule], dtypes: Mapping[str, Any]) -> None:
    """A tensor stored as integers (or booleans) where the model has a float parameter holds no
    weights: cast, its values would load as numbers like 1.2e9 (a float tensor relabelled I32 in a
    safetensors header, say). Raises CheckpointError naming it before anything is read."""
    present = set(reader.names)
    for rule in rules:
        if rule.hf not in present or not jnp.issubdtype(dtypes[rule.flax], jnp.floating):
            continue
        stored = np.dtype(reader.dtype_of(rule.hf))
        if not jnp.issubdtype(stored, jnp.floating):
            raise CheckpointError(
                f"{reader.source}: tensor {rule.hf} is stored as {stored}, but it is a weight of the model "
                f"({rule.flax}), which is {np.dtype(dtypes[rule.flax])}: the file is damaged or was written "
                "wrongly; re-download or re-export the checkpoint"
            )


def _raise_for_another_layer_count(checkpoint: Checkpoint, table, base: str, backbone_config) -> None:
    """CheckpointError when the weights hold another number of layers (ALBERT: groups) than
    config.json declares, before the model is built. More would load as a shallower model, the
    deeper layers merely listed as unused: a different network that still runs. Fewer would fail
    only once the model is built, and building it costs time in proportion to the layer count
    (num_hidden_layers=100000 took minutes). A checkpoint where no layer is found at all is left
    to the tensor-by-tensor check, which names what is missing."""
    reader = checkpoint.reader
    patterns = rules.layer_name_patterns(table, base, checkpoint.format.rename)
    deepest, example = rules.deepest_layer(reader.names, patterns)
    field = next(iter(table.layer_indices.values()))
    num_layers = getattr(backbone_config, field)
    if deepest < 0 or deepest + 1 == num_layers:
        return
    key = next((name for name in (field, "n_layer", "n_layers") if name in checkpoint.config), field)
    what = (f"loading would silently drop the last {deepest + 1 - num_layers}" if deepest >= num_layers
            else f"a model of {num_layers} layers would have no weights for {num_layers - deepest - 1} of them")
    raise CheckpointError(
        f"{reader.source} holds {deepest + 1} layers (e.g. {example}) but config.json says {key}={num_layers}; "
        f"{what}. Set \"{key}\": {deepest + 1} in config.json if the weights are right, or re-export the checkpoint"
    )


_LABEL_SETTINGS = frozenset({"num_labels", "id2label", "label2id", "problem_type", "classifier_dropout", "pad_token_id"})
"""The fields of `from_pretrained(config=...)` that override config.json's."""
_RUN_SETTINGS = ("dropout", "pdrop", "summary_")
"""Fields containing these (dropout rates, XLNet's summary-head options) change training or the
head, not the weights the checkpoint holds: `config=` may set them too, as in transformers."""


def _overridden(hf_config: dict[str, Any], config: Any) -> dict[str, Any]:
    """config.json's settings with those `from_pretrained(config=...)` may change taken from it.

    Raises ValueError naming the first field `config` sets differently from the checkpoint's
    config.json that would build another backbone (model_type, hidden_size, ...)."""
    given = dict(config.to_dict() if hasattr(config, "to_dict") else config)
    settable = {k: v for k, v in given.items() if k in _LABEL_SETTINGS or any(s in k for s in _RUN_SETTINGS)}
    _raise_for_other_architecture(hf_config, {k: v for k, v in given.items() if k not in settable})
    merged = {**hf_config, **settable}
    if "num_labels" in settable and not {"id2label", "label2id"} & set(settable):
        # A new label count makes config.json's names (for its own count) meaningless.
        merged = {k: v for k, v in merged.items() if k not in ("id2label", "label2id")}
    return merged


def _raise_for_other_architecture(hf_config: dict[str, Any], given: dict[str, Any]) -> None:
    """A field is part of the architecture when changing it changes the backbone config.json
    builds; bookkeeping fields (transformers_version, architectures, ...) are not."""
    expected = backbone_config_from_hf(hf_config)
    for key, value in given.items():
        if key in hf_config and hf_config[key] == value:
            continue
        try:
            same = backbone_config_from_hf({**hf_config, key: value}) == expected
        except (ValueError, NotImplementedError, TypeError, KeyError):
            same = False
        if not same:
            has = repr(hf_config[key]) if key in hf_config else "no value (the default)"
            raise ValueError(
                f"config= sets {key}={value!r} but the checkpoint's config.json has {has}: the weights belong "
                f"to a model with config.json's {key}. config= may change only label and dropout settings "
                f"({sorted(_LABEL_SETTINGS)}); pass the config that matches the checkpoint, or leave it out"
            )


def _raise_for_another_task(checkpoint: Checkpoint, table, task: str, model_class: type) -> None:
    """ValueError when config.json's `architectures` name the family's transformers class for
    another task than `task` (a token classifier loaded as a sequence classifier, say): its head
    has the same tensor names (`classifier.weight`) and would silently fill a head that computes
    something else. A bare model or a pretraining checkpoint names no task: its head is new."""
    for architecture in checkpoint.config.get("architectures") or ():
        theirs = table.task_of(architecture)
        if theirs is not None and theirs != task:
            raise ValueError(
                f"{checkpoint.folder} holds a {architecture}, a {theirs} model, and {model_class.__name__} is a "
                f"{task} model: its head would be filled with the other task's weights. Load it with "
                f"flaxheads.from_pretrained(path, task={theirs!r})"
            )


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _check_arguments(*, num_labels, classifier_dropout, seed, dtype, param_dtype, pad_token_id, id2label, label2id,
                     head_options) -> None:
    """ValueError naming the first of `from_pretrained`'s arguments whose value is of the wrong
    kind or out of range, before anything is read: otherwise a TypeError or AttributeError from
    deep in the build, or, for a NaN or 1.5 dropout rate and an id2label string, a model that
    silently computes something else (the string's letters become the labels)."""
    wrong = None
    if num_labels is not None and not (_is_int(num_labels) and num_labels >= 1):
        wrong = "num_labels", num_labels, "an int of at least 1, or None (config.json's)"
    elif classifier_dropout is not None and not (isinstance(classifier_dropout, numbers.Real)
                                                 and not isinstance(classifier_dropout, bool)
                                                 and 0 <= classifier_dropout < 1):
        wrong = "classifier_dropout", classifier_dropout, "a rate in [0, 1), or None (the checkpoint's own)"
    elif not _is_int(seed):
        wrong = "seed", seed, "an int"
    elif pad_token_id is not None and not (_is_int(pad_token_id) and pad_token_id >= 0):
        wrong = "pad_token_id", pad_token_id, "a token id (an int of at least 0), or None (config.json's)"
    elif id2label is not None and (isinstance(id2label, str) or not isinstance(id2label, (Sequence, Mapping))):
        wrong = "id2label", id2label, "a list of label names or an {id: name} dict"
    elif label2id is not None and not isinstance(label2id, Mapping):
        wrong = "label2id", label2id, "a {name: id} dict"
    elif head_options is not None and not isinstance(head_options, Mapping):
        wrong = "head_options", head_options, "a dict of the head's options"
    else:
        for name, value in (("dtype", dtype), ("param_dtype", param_dtype)):
            if value is not None and not (name == "param_dtype" and value == "auto") and not _is_float_dtype(value):
                wrong = name, value, 'a float dtype ("float32", "bfloat16", jnp.bfloat16)' + (
                    ', "auto" (the checkpoint\'s)' if name == "param_dtype" else "") + ", or None (float32)"
                break
    if wrong is not None:
        name, value, expected = wrong
        raise ValueError(f"{name}={value!r}: it must be {expected}")


def _is_float_dtype(value) -> bool:
    try:
        return jnp.issubdtype(jnp.dtype(value), jnp.floating)
    except TypeError:
        return False


def _refuse_remote_code(trust_remote_code: bool) -> None:
    if trust_remote_code:
        raise ValueError(
            "trust_remote_code=True: flaxheads runs no code from checkpoints; it has its own implementation "
            f"of the architectures with model_type {sorted(conversion.TABLES)}. Load a checkpoint of one of "
            "these with trust_remote_code=False (the default)"
        )


def from_pretrained(
    cls,
    path: str | os.PathLike | Checkpoint,
    *,
    config: Any = None,
    num_labels: int | None = None,
    head: str | None = None,
    problem_type: str | None = None,
    dtype=None,
    param_dtype=None,
    id2label: list[str] | Mapping[int, str] | None = None,
    label2id: Mapping[str, int] | None = None,
    classifier_dropout: float | None = None,
    seed: int = 0,
    ignore_mismatched_sizes: bool = False,
    init_classifier_from_nsp: bool = False,
    pad_token_id: int | None = None,
    head_options: dict | None = None,
    placement: Placement | None = None,
    output_loading_info: bool = False,
    revision: str | None = None,
    cache_dir: str | os.PathLike | None = None,
    token: str | bool | None = None,
    local_files_only: bool = False,
    trust_remote_code: bool = False,
):
    """A `cls` model (`SequenceClassifier`, `TokenClassifier`, `MultipleChoice`: the task is
    `cls.config_class.task`) from a Hugging Face (or flaxheads) checkpoint.

    `path` is a checkpoint folder, or what `resolve_checkpoint` resolves with `revision`,
    `cache_dir`, `token` and `local_files_only` (as in transformers), or an open `Checkpoint`.

    `config` is a transformers `PretrainedConfig` or a dict: its label settings (num_labels,
    id2label/label2id, problem_type, classifier_dropout, pad_token_id) and dropout rates override
    config.json's; any other field that would build another backbone (model_type, hidden_size,
    num_hidden_layers, vocab_size, ...) raises ValueError naming the field and both values. The
    keyword arguments override both.

    `id2label` is a list of names or an {id: name} dict; `label2id` a {name: id} dict.

    `pad_token_id` overrides config.json's (None keeps it), as `model.config.pad_token_id = ...`
    does in transformers: GPT-2 checkpoints have none, and the "last_token" head needs one to
    find the last real token of padded rows (usually `tokenizer.eos_token_id`). It is saved with
    the model. On RoBERTa it also moves the position ids, as in transformers.

    `placement(path, shape)` puts each parameter where it belongs (a mesh sharding) straight
    from the checkpoint, so a model too large for one device loads sharded: e.g.
    `placement=Layout.create("fsdp=8").param_sharding` (`flaxheads.training.sharding`). The model
    is built abstractly (`nnx.eval_shape`) and each tensor is read, converted, cast to
    `param_dtype` and sent to its devices before the next is read, so the host holds one tensor
    at a time, never the state (`flaxheads bench load` measures it); with
    `param_dtype=jnp.bfloat16` a bf16 checkpoint stays bf16 all the way.

    `head_options` set head-specific options (the "summary" head's `summary_type`, ...; see
    `flaxheads/heads/summary.py`) over those config.json gives; they are saved with the model.

    `head` defaults to the checkpoint's own (the one transformers' `*ForSequenceClassification`
    uses, or the head a flaxheads export recorded). New parameters (usually the classifier) are
    initialised from `seed` as transformers does and listed in the loading info. `param_dtype`
    defaults to float32; "auto" keeps the checkpoint's dtype (exact conversion). Returns the
    model, or `(model, LoadingInfo)` with `output_loading_info=True`.

    Raises ValueError (CheckpointError, ShapeMismatch) naming the key or setting at fault;
    ValueError for `trust_remote_code=True` (flaxheads runs no code from checkpoints), for a
    checkpoint whose config.json names transformers' class of another task (a
    `BertForTokenClassification` loaded by `SequenceClassifier`: the error names the task to
    load it with), and for a family transformers has no class of `cls`'s task for.
    """
    _refuse_remote_code(trust_remote_code)
    _check_arguments(num_labels=num_labels, classifier_dropout=classifier_dropout, seed=seed, dtype=dtype,
                     param_dtype=param_dtype, pad_token_id=pad_token_id, id2label=id2label, label2id=label2id,
                     head_options=head_options)
    checkpoint = open_checkpoint(
        path, revision=revision, cache_dir=cache_dir, token=token, local_files_only=local_files_only
    )
    hf_config = _overridden(checkpoint.config, config) if config is not None else dict(checkpoint.config)
    if pad_token_id is not None:
        hf_config["pad_token_id"] = pad_token_id
    table = conversion.architecture_table(hf_config.get("model_type"))
    task = cls.config_class.task
    _raise_for_another_task(checkpoint, table, task, cls)
    model_config = cls.config_class.from_hf_config(
        hf_config,
        default_head=table.default_head(task, hf_config.get("architectures")),
        head=head,
        num_labels=num_labels,
        problem_type=problem_type,
        id2label=id2label,
        label2id=label2id,
        classifier_dropout=classifier_dropout,
        head_options=head_options,
    )

    def make(param_dtype=jnp.float32):
        return cls(model_config, dtype=_dtype(dtype), param_dtype=param_dtype, rngs=SeedKeys(seed))

    reader, rename = checkpoint.reader, checkpoint.format.rename
    base = rules.base_prefix(table, reader.names, rename)
    _raise_for_another_layer_count(checkpoint, table, base, model_config.backbone)  # before building: see there
    abstract = nnx.eval_shape(make)
    param_paths = list(flat_variables(abstract))
    head_paths = [k[len("head."):] for k in param_paths if k.startswith("head.")]
    backbone = rename(rules.backbone_rules(table, model_config.backbone, base, param_paths))
    head_rules = rename(rules.head_rules(table, model_config.head, head_paths, base, task))
    param_dtype = _checkpoint_dtype(reader, backbone) if param_dtype == "auto" else _dtype(param_dtype)
    notes = list(table.loading_notes)
    if init_classifier_from_nsp:
        head_rules = _with_nsp_classifier(checkpoint, table, model_config, head_rules, base)
        notes.append(
            "classifier initialised from the NSP head cls.seq_relationship: label 0 = B follows A, "
            "label 1 = B is random"
        )
    if model_config.head == "last_token" and model_config.backbone.pad_token_id is None:
        notes.append(
            "no pad_token_id: padded batches need attention_mask to find each text's last token, and "
            "transformers refuses them; load with pad_token_id=tokenizer.eos_token_id (or another pad id)"
        )
    model, info = _load(
        functools.partial(make, param_dtype), reader, backbone, head_rules,
        param_dtype=param_dtype, ignore_mismatched_sizes=ignore_mismatched_sizes, describe=model_config.head,
        abstract=abstract, placement=placement,
    )
    info.notes += notes
    return (model, info) if output_loading_info else model


def _with_nsp_classifier(checkpoint: Checkpoint, table, config, head_rules: list[Rule], base: str) -> list[Rule]:
    """`head_rules` with the classifier's taken from the pretraining NSP head."""
    if config.head != "pooler" or getattr(config, "num_labels", None) != 2 or not table.nsp_classifier:
        raise ValueError(
            "init_classifier_from_nsp=True needs head='pooler', num_labels=2 and a BERT checkpoint; got "
            f"head={config.head!r}, num_labels={getattr(config, 'num_labels', None)}, model_type={table.model_type!r}"
        )
    nsp = rules.nsp_rules(table, base)
    if checkpoint.format.holds_pretraining_heads:
        nsp = checkpoint.format.rename(nsp)
    # Left with PyTorch names in a format that cannot hold them, the rules find no tensor.
    missing = [r.hf for r in nsp if r.hf not in set(checkpoint.reader.names)]
    if missing:
        raise CheckpointError(
            f"init_classifier_from_nsp=True but {checkpoint.reader.source} has no {missing[0]}; only pretraining "
            "checkpoints (BertForPreTraining, BertForNextSentencePrediction) carry the NSP head"
        )
    return [r for r in head_rules if not r.flax.startswith("head.classifier.")] + nsp


def _relative(rules: list[Rule]) -> list[Rule]:
    """Rules for a bare backbone: flax paths without the classifier's `backbone.`/`head.` part."""
    return [Rule(r.hf, r.flax.split(".", 1)[1], r.transform) for r in rules]


def load_backbone(path: str | os.PathLike | Checkpoint, *, dtype=None, param_dtype=None, **where):
    """(backbone, LoadingInfo) for a checkpoint's base model, with its pooler when it has one.

    `where` are `open_checkpoint`'s (revision=, cache_dir=, token=, local_files_only=)."""
    checkpoint = open_checkpoint(path, **where)
    table = conversion.architecture_table(checkpoint.config.get("model_type"))
    config = backbone_config_from_hf(checkpoint.config)
    reader, rename = checkpoint.reader, checkpoint.format.rename
    base = rules.base_prefix(table, reader.names, rename)
    _raise_for_another_layer_count(checkpoint, table, base, config)
    # The pooler: the base model's own, or, in flaxheads' format, the "pooler" head's.
    pooler = _relative(rename(rules.under("head", expand(table.pooler, num_layers=0, base=base))))
    has_pooler = bool(pooler) and all(r.hf in reader.names for r in pooler)

    def make():
        return build_backbone(
            config, dtype=_dtype(dtype), param_dtype=_dtype(param_dtype), rngs=SeedKeys(0), add_pooling_layer=has_pooler
        )

    abstract = nnx.eval_shape(make)
    param_paths = [f"backbone.{k}" for k in flat_variables(abstract)]
    required = _relative(rename(rules.backbone_rules(table, config, base, param_paths)))
    required += pooler if has_pooler else []
    return _load(make, reader, required, [], param_dtype=_dtype(param_dtype), ignore_mismatched_sizes=False,
                 describe="none (backbone only)", abstract=abstract)


# ---------------------------------------------------------------------------------------------
# Saving


def writable_format(format: str, *, argument: str = "format") -> WeightFormat:
    """The format `save_pretrained(format=...)` / `convert(to=...)` names (legacy names accepted);
    ValueError naming `argument` and the writable formats otherwise."""
    writable = {name: fmt for name, fmt in conversion.WEIGHT_FORMATS.items() if fmt.written_as}
    fmt = conversion.WEIGHT_FORMATS.get(formats.canonical_name(format))
    if fmt is None or fmt.name not in writable:
        why = (" (flaxheads reads Hugging Face Flax checkpoints but does not write them: transformers 5 has no Flax "
               "models to load them)" if fmt is not None else "")
        raise ValueError(f"{argument}={format!r}{why}; choose one of {sorted(writable)}")
    return fmt


def save_pretrained(model, path: str | os.PathLike, *, format: str = "pytorch", tokenizer=None,
                    replaces: Iterable[str] = ()) -> None:
    """Writes `model` (a plain classifier: merge LoRA adapters first, as
    `SequenceClassifier.save_pretrained` does) as a checkpoint folder in `format`: `"pytorch"`, a
    Hugging Face directory (`config.json` + `model.safetensors`) that transformers loads, or
    `"flaxheads"` (formerly "flax"), the same config with `flaxheads_model.safetensors` keyed by
    flax paths.

    With `tokenizer` (a transformers tokenizer) its files are saved into the same folder
    (`tokenizer.save_pretrained`). Everything is written into a temporary folder beside `path`
    and moved in only when complete (`atomic.staged_into`), so a failure leaves `path` as it was
    and a reader never pairs new weights with an old config.json.

    The folder then holds only this save's files of those a loader reads: weight files it does
    not write (another format's, a shard index, a .bin) and, with `tokenizer`, tokenizer files it
    does not write (an earlier tokenizer's special_tokens_map.json) are refused, unless named in
    `replaces`, the files the caller knows it wrote there before (a run's recorded export): those
    are removed in the same move. Without `tokenizer`, tokenizer files are left alone.

    Raises ValueError for a format it cannot write, FileExistsError (writing nothing) when `path`
    holds another format's weights or other files a loader would read beside the new ones,
    NotADirectoryError when `path` is a file, `atomic.NoSpace` (writing nothing) when its device
    has less free space than the weights take."""
    fmt = writable_format(format)
    path = Path(path)
    for other in conversion.WEIGHT_FORMATS.values():
        if other is not fmt and other.written_as and (path / other.written_as).exists():
            raise FileExistsError(
                f"{path} already holds {other.written_as}; save each format into its own directory so neither is "
                "mistaken for the other"
            )
    hf_config, tensors = _exported(model, fmt)
    atomic.require_space(path, sum(tensor.nbytes for tensor in tensors.values()), f"saving {fmt.written_as}")

    def stale(written: set[str]) -> set[str]:
        loaded = {name for name in formats.checkpoint_files(path)
                  if name not in written and (tokenizer is not None or name not in formats.TOKENIZER_FILES)}
        foreign = sorted(loaded - set(replaces))
        if foreign:
            raise FileExistsError(
                f"{path} holds {', '.join(foreign)}, which this save does not write: a loader (transformers, "
                "flaxheads) would read them beside the new files. Move them out of the folder, or save into another one"
            )
        return loaded

    # Staged even without a tokenizer: config.json and the weights must change together.
    with atomic.staged_into(path, describe=f"saving a {fmt.name} checkpoint", remove=stale) as staging:
        checkpoint_io.write_checkpoint(staging, hf_config, tensors, fmt.written_as)
        if tokenizer is not None:
            tokenizer.save_pretrained(str(staging))


def saved_tokenizer_files(tokenizer) -> set[str]:
    """The names `tokenizer.save_pretrained` writes (it saves into a temporary folder to see)."""
    with tempfile.TemporaryDirectory() as folder:
        tokenizer.save_pretrained(folder)
        return set(os.listdir(folder))


def _exported(model, fmt: WeightFormat) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """(config.json, tensors by their names in `fmt`) of `model`."""
    config = model.config
    table = conversion.architecture_table(config.backbone.model_type)
    arrays = {key: np.asarray(var[...]) for key, (_, var) in flat_variables(model).items()}
    hf_config = config.to_hf_config(table.architecture(config.task, config.head))
    hf_config["dtype"] = str(next(iter(arrays.values())).dtype)
    base = f"{table.base_prefix_of(config.task)}."
    head_paths = [k[len("head."):] for k in arrays if k.startswith("head.")]
    model_rules = rules.backbone_rules(table, config.backbone, base, arrays)
    model_rules += rules.head_rules(table, config.head, head_paths, base, config.task)
    return hf_config, flax_to_hf(arrays, fmt.rename(model_rules))
