"""Reading and writing Hugging Face checkpoint directories, without torch where possible.

Read order: `model.safetensors`, `model.safetensors.index.json` (sharded), `pytorch_model.bin`,
`pytorch_model.bin.index.json`. `.bin` files are unpickled only through
`torch.load(weights_only=True)`. safetensors files are read and written by the safetensors
library, one tensor at a time, so converting a checkpoint costs about its own size in memory.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable, Mapping

import ml_dtypes
import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

from flaxheads import atomic

CONFIG_NAME = "config.json"
SAFETENSORS_NAME = "model.safetensors"
SAFETENSORS_INDEX_NAME = "model.safetensors.index.json"
BIN_NAME = "pytorch_model.bin"
BIN_INDEX_NAME = "pytorch_model.bin.index.json"
FLAX_NAME = "flaxheads_model.safetensors"
"""flaxheads' native weights: flax parameter paths ('backbone.layers.0.attention.query.kernel')."""


class CheckpointError(ValueError):
    """A checkpoint directory that cannot be read as it is; the message says what to do."""


def read_config(path: str | os.PathLike) -> dict[str, Any]:
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"{path} is not a directory; pass a Hugging Face checkpoint directory")
    try:
        atomic.require_complete(path, fix="Re-run the command that wrote it (a training run resumes and exports again)")
    except atomic.IncompleteFolder as err:
        raise CheckpointError(str(err)) from None
    config_file = path / CONFIG_NAME
    if not config_file.is_file():
        raise CheckpointError(f"{path} has no {CONFIG_NAME}; a checkpoint directory needs one")
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointError(f"{config_file} is not valid JSON ({err}); fix or re-export it") from None
    if not isinstance(config, dict):
        raise CheckpointError(
            f"{config_file} holds {_json_kind(config)}, but it must be a JSON object of settings "
            '({"model_type": ..., ...}); fix or re-export it'
        )
    return config


def _json_kind(value: Any) -> str:
    kinds = {list: "a JSON array", str: "a JSON string", bool: "a JSON boolean", type(None): "JSON null"}
    return kinds.get(type(value), "a JSON number")


class TensorReader:
    """Lazy, read-only access to a checkpoint's tensors as numpy arrays (bfloat16 via ml_dtypes)."""

    def __init__(
        self,
        names: list[str],
        read: Callable[[str], np.ndarray],
        source: str,
        dtype_of: Callable[[str], np.dtype] | None = None,
    ):
        self.names = names
        self.read = read
        self.source = source
        """The file(s) the tensors come from, for messages."""
        self._dtype_of = dtype_of

    def dtype_of(self, name: str) -> np.dtype:
        """A tensor's dtype, without reading it where the format allows."""
        return self._dtype_of(name) if self._dtype_of else self.read(name).dtype


def open_weights(path: str | os.PathLike, file_name: str | None = None) -> TensorReader:
    """The tensors of a checkpoint directory, from the first weight file found in read order."""
    path = Path(path)
    candidates = [file_name] if file_name else [SAFETENSORS_NAME, SAFETENSORS_INDEX_NAME, BIN_NAME, BIN_INDEX_NAME]
    for name in candidates:
        if (path / name).is_file():
            return _OPENERS[name](path / name)
    raise CheckpointError(
        f"{path} has no weights: expected one of {candidates}. flaxheads never starts a backbone "
        "from random weights; point it at a directory saved with save_pretrained"
    )


def _open_safetensors(file: Path) -> TensorReader:
    """The tensors of a safetensors file, read by the safetensors library, which validates the
    header (types, offsets tiling the data exactly, lengths that the file can back) before
    anything is allocated.

    The file is opened once to list its tensors, then again for each tensor: the library maps the
    whole file while it is open, and every page it touches counts in this process's memory on top
    of the copies, so one mapping held for a whole model would cost its size twice (measured on a
    503 MiB float32 file: peak 2.04x its size with one mapping, 1.03x reopened per tensor)."""
    try:
        with safe_open(file, framework="np") as f:
            names = list(f.keys())
            codes = {name: f.get_slice(name).get_dtype() for name in names}
    except Exception as err:  # SafetensorError, and the OSErrors of unreadable files
        raise _damaged(file, _one_line(err)) from None
    unreadable = {name: code for name, code in codes.items() if code not in SAFETENSORS_DTYPES}
    if unreadable:
        name, code = next(iter(unreadable.items()))
        raise CheckpointError(
            f"{file}: tensor {name!r} has dtype {code}, which flaxheads does not read; "
            f"re-export it in one of {sorted(SAFETENSORS_DTYPES)}"
        )

    def read(name: str) -> np.ndarray:
        try:
            with safe_open(file, framework="np") as f:
                return f.get_tensor(name)
        except Exception as err:  # cut short or changed since it was opened; a shape numpy cannot make
            raise CheckpointError(
                f"cannot read tensor {name} from {file} ({_one_line(err)}): the file is truncated, damaged or was "
                "changed while loading; re-download or re-export it"
            ) from None

    return TensorReader(names, read, str(file), lambda name: np.dtype(SAFETENSORS_DTYPES[codes[name]]))


def safetensors_format(file: str | os.PathLike) -> str | None:
    """The "format" a safetensors file's metadata declares ("pt", "flax", ...); None when it
    declares none or cannot be read (reading it then says why)."""
    try:
        with safe_open(file, framework="np") as f:
            return (f.metadata() or {}).get("format")
    except Exception:
        return None


def _damaged(file: Path, why: str) -> CheckpointError:
    return CheckpointError(
        f"cannot read {file}: {why}. The file is truncated, damaged or not safetensors; re-download or re-export it"
    )


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split()) or type(err).__name__


SAFETENSORS_DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16, "C64": np.complex64,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8,
    "U64": np.uint64, "U32": np.uint32, "U16": np.uint16, "U8": np.uint8, "BOOL": np.bool_,
}
"""The safetensors dtypes flaxheads reads, as numpy dtypes (bfloat16 through ml_dtypes)."""


def open_sharded(index_file: Path, open_shard: Callable[[Path], TensorReader]) -> TensorReader:
    """Opens every shard the index names and checks, from the shards' own lists of tensors, that each
    tensor is where the index says, so that a mismatch is named before any tensor is loaded."""
    try:
        index = json.loads(index_file.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointError(f"{index_file} is not valid JSON ({err}); re-download or re-export the checkpoint") from None
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not all(
        isinstance(name, str) and isinstance(shard, str) for name, shard in weight_map.items()
    ):
        raise CheckpointError(
            f"{index_file} is not a valid shard index: it needs a \"weight_map\" object mapping each tensor "
            "name to the name of its shard file; re-download or re-export the checkpoint"
        )
    outside = sorted({shard for shard in weight_map.values()
                      if shard in ("", ".", "..") or "/" in shard or "\\" in shard or os.path.isabs(shard)})
    if outside:
        raise CheckpointError(
            f"{index_file} names shard {outside[0]!r}, a path rather than a file beside the index: a checkpoint's "
            "shards are read only from its own folder. Fix the index's weight_map, or re-download or re-export "
            "the checkpoint"
        )
    shards: dict[str, TensorReader] = {}
    for shard in sorted(set(weight_map.values())):
        shard_file = index_file.parent / shard
        if not shard_file.is_file():
            raise CheckpointError(
                f"{index_file} lists shard {shard}, which is missing from {index_file.parent}; download it beside the "
                "index, or re-export the checkpoint"
            )
        shards[shard] = open_shard(shard_file)
    shard_names = {shard: set(reader.names) for shard, reader in shards.items()}
    for name, shard in weight_map.items():
        if name not in shard_names[shard]:
            raise CheckpointError(
                f"{index_file} puts tensor {name!r} in {index_file.parent / shard}, which has no such tensor: "
                "the index and the shards come from different exports; re-download or re-export the checkpoint"
            )

    def read(name: str) -> np.ndarray:
        return shards[weight_map[name]].read(name)

    def dtype_of(name: str) -> np.dtype:
        return shards[weight_map[name]].dtype_of(name)

    return TensorReader(list(weight_map), read, str(index_file), dtype_of)


def _torch_to_numpy(tensor) -> np.ndarray:
    import torch

    tensor = tensor.detach().cpu().contiguous()
    if tensor.dtype == torch.bfloat16:  # numpy has no bfloat16; reinterpret the bits
        return tensor.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return tensor.numpy()


def _numpy_dtype(tensor) -> np.dtype:
    """The numpy dtype a torch tensor converts to, without converting it."""
    import torch

    if tensor.dtype == torch.bfloat16:
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(torch.empty((), dtype=tensor.dtype).numpy().dtype)


_ZIP_MAGIC = b"PK\x03\x04"
"""How torch.load itself tells the zip format from the legacy one (`torch.serialization._is_zipfile`)."""


def _open_bin(file: Path) -> TensorReader:
    try:
        import torch
    except ImportError:
        raise CheckpointError(
            f"{file} is a PyTorch pickle and reading it needs torch: pip install 'flaxheads[torch]' "
            "(or convert the checkpoint to model.safetensors)"
        ) from None
    with open(file, "rb") as f:
        # torch.load can map only the zip format (torch >= 1.6); older, legacy files are read whole.
        is_zip = f.read(4) == _ZIP_MAGIC
    try:
        state = torch.load(str(file), map_location="cpu", weights_only=True, mmap=is_zip)
    except Exception as err:  # torch raises many types for corrupt or unsafe pickles
        raise CheckpointError(
            f"cannot load {file} with torch.load(weights_only=True): {err}. The file is corrupt, "
            "truncated, or holds objects other than tensors"
        ) from None
    if not isinstance(state, Mapping):
        raise CheckpointError(f"{file} holds a {type(state).__name__}, not a state dict of tensors")
    return TensorReader(list(state), lambda name: _torch_to_numpy(state[name]), str(file),
                        lambda name: _numpy_dtype(state[name]))


_OPENERS: dict[str, Callable[[Path], TensorReader]] = {
    SAFETENSORS_NAME: _open_safetensors,
    SAFETENSORS_INDEX_NAME: lambda f: open_sharded(f, _open_safetensors),
    BIN_NAME: _open_bin,
    BIN_INDEX_NAME: lambda f: open_sharded(f, _open_bin),
    FLAX_NAME: _open_safetensors,
}


def write_checkpoint(
    path: str | os.PathLike, config: dict[str, Any], tensors: Mapping[str, np.ndarray], file_name: str = SAFETENSORS_NAME
) -> None:
    """Writes `config.json` and one safetensors file (metadata format "pt", as transformers requires)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    atomic.write_file(path / file_name, lambda tmp: write_safetensors(tmp, tensors, metadata={"format": "pt"}))
    atomic.write_json(path / CONFIG_NAME, config, sort_keys=True)


_DTYPE_CODES = {np.dtype(t): code for code, t in SAFETENSORS_DTYPES.items()}


def write_safetensors(file: str | os.PathLike, tensors: Mapping[str, np.ndarray], metadata: dict[str, str]) -> None:
    """`tensors` as a safetensors file, written by the safetensors library. Since safetensors 0.6
    it writes straight from each array's memory (earlier versions copy each tensor first), so
    only an array that is not C-contiguous costs a copy here."""
    for name, array in tensors.items():
        if array.dtype not in _DTYPE_CODES:
            raise TypeError(f"tensor {name} has dtype {array.dtype}, which safetensors cannot store")
    # np.require keeps a 0-d array 0-d (np.ascontiguousarray would make it (1,)).
    contiguous = {name: np.require(array, requirements="C") for name, array in tensors.items()}
    save_file(contiguous, str(file), metadata=metadata)
