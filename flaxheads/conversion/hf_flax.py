"""Hugging Face Flax checkpoints: what transformers 4.x `Flax*` models wrote with `save_pretrained`.

`flax_model.msgpack` is a nested dict of arrays in flax's msgpack encoding (no pickle), read
with `flax.serialization.msgpack_restore`; its names join the dict keys with "/"
("bert/encoder/layer/0/attention/self/query/kernel"). A sharded save writes
`flax_model.msgpack.index.json`, whose "weight_map" names each tensor's
`flax_model-0000x-of-0000y.msgpack` shard, like a sharded safetensors index. With
`safe_serialization=True` transformers 4.x wrote `model.safetensors` instead, its metadata format
"flax" and its names the same keys joined with "." ("bert.encoder.layer.0...."); it is read here too,
with the "/" names (`FLAX_SAFETENSORS`).

The names and layouts follow from the PyTorch conversion tables, rule by rule
(`hf_flax_rules`): nothing here is a second table to keep in step. transformers 5 removed the
Flax models; XLNet never had one.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
from flax import serialization

from flaxheads.conversion import checkpoint_io
from flaxheads.conversion.checkpoint_io import CheckpointError, TensorReader
from flaxheads.conversion.table import CONV1D, IDENTITY, LINEAR, Rule, Transform, transposed

MSGPACK_NAME = "flax_model.msgpack"
MSGPACK_INDEX_NAME = "flax_model.msgpack.index.json"
WEIGHT_NAMES = (MSGPACK_NAME, MSGPACK_INDEX_NAME)
"""In transformers 4.x's read order: the single file first."""
FLAX_SAFETENSORS = "model.safetensors"
"""Where transformers 4.x Flax models' safe_serialization=True wrote (metadata format "flax")."""
SEPARATOR = "/"
"""Joins the keys of the nested parameter dict: the base prefix is "bert/" where PyTorch has "bert."."""

NO_FLAX_MODEL = {"xlnet": "transformers never had a Flax XLNet"}
"""Model types flaxheads converts from PyTorch that have no Hugging Face Flax model to read."""

# transformers' FlaxConv1D (GPT-2) stores its kernel (out, in) and computes `x @ kernel.T`; the
# PyTorch Conv1D and flaxheads store (in, out).
FLAX_CONV1D = Transform("FlaxConv1D (out, in), transposed", transposed, transposed, lambda s: s[::-1])
_LEAVES = {"kernel", "bias", "scale", "embedding"}
"""The flax parameter names a Hugging Face Flax module holds, the same as flaxheads'."""


def weights_file(folder: str | os.PathLike) -> Path | None:
    """The Hugging Face Flax weight file `folder` has (single file first, then a sharded index,
    then a `model.safetensors` whose metadata says "flax"), or None."""
    for name in WEIGHT_NAMES:
        if (Path(folder) / name).is_file():
            return Path(folder) / name
    if is_flax_safetensors(folder):
        return Path(folder) / FLAX_SAFETENSORS
    return None


def is_flax_safetensors(folder: str | os.PathLike) -> bool:
    """Whether `folder`'s model.safetensors was written by a transformers 4.x Flax model."""
    file = Path(folder) / FLAX_SAFETENSORS
    return file.is_file() and checkpoint_io.safetensors_format(file) == "flax"


def open_hf_flax(folder: str | os.PathLike) -> TensorReader:
    """The tensors of a Hugging Face Flax checkpoint folder, by "/"-joined names.

    Raises CheckpointError naming the file and the fix when the folder has no such weights, its
    config.json names a model type transformers has no Flax model for (XLNet), a file is
    truncated, damaged or not msgpack (a Git LFS pointer, say), a shard is missing, or a leaf of
    the parameter tree is not an array of numbers.
    """
    file = weights_file(folder)
    if file is None:
        raise CheckpointError(
            f"{folder} has no Hugging Face Flax weights: expected {MSGPACK_NAME} or {MSGPACK_INDEX_NAME}"
        )
    if (Path(folder) / checkpoint_io.CONFIG_NAME).is_file():
        _check_model_type(checkpoint_io.read_config(folder).get("model_type"), folder)
    if file.name == MSGPACK_INDEX_NAME:
        # The sharded-index checks (valid weight_map, every shard present, each tensor where the
        # index says) are the safetensors ones: one home for them.
        return checkpoint_io.open_sharded(file, _open_msgpack)
    if file.name == FLAX_SAFETENSORS:
        return _open_flax_safetensors(file)
    return _open_msgpack(file)


def _open_flax_safetensors(file: Path) -> TensorReader:
    """A Flax model's model.safetensors, its "."-joined names read as the "/"-joined ones of msgpack
    (Flax module and parameter names hold no ".")."""
    reader = checkpoint_io.open_weights(file.parent, file.name)
    original = {name.replace(".", SEPARATOR): name for name in reader.names}
    return TensorReader(list(original), lambda name: reader.read(original[name]), str(file),
                        lambda name: reader.dtype_of(original[name]))


def _open_msgpack(file: Path) -> TensorReader:
    """Reads the whole file: msgpack has no index to read one tensor from."""
    data = file.read_bytes()
    if data.startswith(b"version https://git-lfs"):
        raise CheckpointError(
            f"{file} is a Git LFS pointer, not the weights: run `git lfs pull` in the clone, or download the file"
        )
    try:
        tree = serialization.msgpack_restore(data)
    except Exception as err:  # msgpack and numpy raise many types for damaged bytes
        raise _damaged(file, f"it does not decode ({type(err).__name__}: {err})") from None
    if not isinstance(tree, dict) or not tree:
        raise _damaged(file, f"it holds {'an empty dict' if isinstance(tree, dict) else _kind(tree)}, not a tree of parameters")
    tensors: dict[str, np.ndarray] = {}
    _flatten(tree, "", file, tensors)
    return TensorReader(list(tensors), tensors.__getitem__, str(file), lambda name: tensors[name].dtype)


def _damaged(file: Path, why: str) -> CheckpointError:
    return CheckpointError(
        f"cannot read {file}: {why}. The file is truncated, damaged or not a flax msgpack checkpoint; "
        "re-download it or save it again with save_pretrained"
    )


def _flatten(node: dict, prefix: str, file: Path, out: dict[str, np.ndarray]) -> None:
    for key, value in node.items():
        if not isinstance(key, str) or not key or SEPARATOR in key:
            raise _damaged(file, f"{prefix or 'its top level'} has the key {key!r}; parameter names are non-empty strings without '/'")
        name = f"{prefix}{SEPARATOR}{key}" if prefix else key
        if isinstance(value, dict):
            _flatten(value, name, file, out)
        elif _is_numeric_array(value):
            out[name] = value
        else:
            raise CheckpointError(
                f"{file}: {name} is {_kind(value)}, not an array of numbers; the file is not a Flax model's "
                "parameters. Save them with the Flax model's save_pretrained"
            )


def _is_numeric_array(value: Any) -> bool:
    return isinstance(value, np.ndarray) and (value.dtype.kind in "fiub" or value.dtype == ml_dtypes.bfloat16)


def _kind(value: Any) -> str:
    if isinstance(value, np.ndarray):
        return f"an array of {value.dtype}"
    return f"a {type(value).__name__} ({value!r:.40})"


def _check_model_type(model_type: str | None, source: str | os.PathLike) -> None:
    """Said before the tensors are read: their names alone would only fail as missing backbone tensors."""
    if model_type in NO_FLAX_MODEL:
        raise CheckpointError(
            f"{source} holds Hugging Face Flax weights but config.json says model_type={model_type!r}: "
            f"{NO_FLAX_MODEL[model_type]}, so flaxheads has no names to read them by. Convert the model "
            "from its PyTorch checkpoint (model.safetensors) instead"
        )


def hf_flax_rules(rules: list[Rule]) -> list[Rule]:
    """The same rules, naming the Hugging Face Flax tensor instead of the PyTorch one.

    Each rule's PyTorch module path keeps its keys, joined by "/"; its leaf becomes the flax
    parameter's own (kernel, bias, scale, embedding), and its transform follows from the PyTorch
    one: an `nn.Linear` (out, in) is a Flax Dense kernel (in, out), as flaxheads stores it; a
    PyTorch `Conv1D` (in, out) is a `FlaxConv1D` kernel (out, in). `{i}` in a name stays, so
    layer templates convert too. Raises ValueError for a rule of another kind (a table bug).
    """
    return [Rule(_hf_flax_name(rule), rule.flax, _hf_flax_transform(rule)) for rule in rules]


def _hf_flax_name(rule: Rule) -> str:
    module, torch_leaf = rule.hf.rsplit(".", 1)
    leaf = rule.flax.rsplit(".", 1)[-1]
    if leaf not in _LEAVES or (torch_leaf == "bias") != (leaf == "bias") or torch_leaf not in ("weight", "bias"):
        raise ValueError(f"no Hugging Face Flax name for the rule {rule.hf} -> {rule.flax}")
    return SEPARATOR.join([*module.split("."), leaf])


def _hf_flax_transform(rule: Rule) -> Transform:
    if rule.transform is LINEAR:
        return IDENTITY
    if rule.transform is CONV1D:
        return FLAX_CONV1D
    if rule.transform is IDENTITY and not rule.flax.endswith(".kernel"):
        return IDENTITY
    raise ValueError(f"no Hugging Face Flax layout for the rule {rule.hf} -> {rule.flax} ({rule.transform.name})")
