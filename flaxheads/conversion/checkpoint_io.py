"""Reading and writing Hugging Face checkpoint directories, without torch where possible.

Read order: `model.safetensors`, `model.safetensors.index.json` (sharded), `pytorch_model.bin`,
`pytorch_model.bin.index.json`. `.bin` files are unpickled only through
`torch.load(weights_only=True)`. safetensors files are read and written by flaxheads itself
(the format is a JSON header and raw bytes), one tensor at a time, so converting a checkpoint
costs about its own size in memory.
"""

from __future__ import annotations

import json
import math
import os
import struct
import tempfile
from pathlib import Path
from typing import Any, Callable, Mapping

import ml_dtypes
import numpy as np

from flaxheads.conversion.table import aligned_empty

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
    config_file = path / CONFIG_NAME
    if not config_file.is_file():
        raise CheckpointError(f"{path} has no {CONFIG_NAME}; a checkpoint directory needs one")
    try:
        return json.loads(config_file.read_text())
    except json.JSONDecodeError as err:
        raise CheckpointError(f"{config_file} is not valid JSON ({err}); fix or re-export it") from None


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
    """Reads the header once; each tensor is then read with plain file I/O straight into its own
    array. (safetensors' `safe_open` maps the whole file, and every page it touches counts in
    this process's memory on top of the copies.)"""
    entries, data_start = _safetensors_header(file)

    def read(name: str) -> np.ndarray:
        dtype, shape, (begin, end) = entries[name]
        array = aligned_empty(shape, dtype)
        with open(file, "rb") as f:
            f.seek(data_start + begin)
            got = f.readinto(array.reshape(-1).view(np.uint8).data)
        if got != end - begin:
            raise CheckpointError(f"cannot read tensor {name} from {file}: the file is truncated; re-download or re-export it")
        return array

    return TensorReader(list(entries), read, str(file), lambda name: entries[name][0])


_MAX_HEADER_BYTES = 100 * 2**20


def _safetensors_header(file: Path) -> tuple[dict[str, tuple[np.dtype, tuple[int, ...], tuple[int, int]]], int]:
    """{name: (dtype, shape, (begin, end))} and where the data starts, every entry checked
    against the file's size so that a damaged file fails here, naming itself."""

    def damaged(why: str) -> CheckpointError:
        return CheckpointError(
            f"cannot read {file}: {why}. The file is truncated or not safetensors; re-download or re-export it"
        )

    size = file.stat().st_size
    with open(file, "rb") as f:
        prefix = f.read(8)
        if len(prefix) < 8:
            raise damaged("it is shorter than a safetensors header")
        (header_len,) = struct.unpack("<Q", prefix)
        if header_len > min(size - 8, _MAX_HEADER_BYTES):
            raise damaged(f"its header claims {header_len} bytes and the file has {size}")
        try:
            header = json.loads(f.read(header_len))
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise damaged("its header is not JSON") from None
    if not isinstance(header, dict):
        raise damaged("its header is not a JSON object")
    data_start = 8 + header_len
    entries = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        if isinstance(entry, dict) and entry.get("dtype") not in _SAFETENSORS_DTYPES and "dtype" in entry:
            raise CheckpointError(
                f"{file}: tensor {name!r} has dtype {entry['dtype']}, which flaxheads does not read; "
                f"re-export it in one of {sorted(_SAFETENSORS_DTYPES)}"
            )
        try:
            dtype = np.dtype(_SAFETENSORS_DTYPES[entry["dtype"]])
            shape = tuple(int(d) for d in entry["shape"])
            begin, end = (int(o) for o in entry["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise damaged(f"tensor {name!r} has no valid dtype, shape and data_offsets ({entry!r})") from None
        if end - begin != math.prod(shape) * dtype.itemsize or begin < 0:
            raise damaged(f"tensor {name!r}: data_offsets {begin}..{end} do not fit shape {shape} of {dtype}")
        if data_start + end > size:
            raise damaged(f"tensor {name!r} ends at byte {data_start + end} and the file has {size}")
        entries[name] = (dtype, shape, (begin, end))
    return entries, data_start


_SAFETENSORS_DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_,
}


def _open_sharded(index_file: Path, open_shard: Callable[[Path], TensorReader]) -> TensorReader:
    try:
        weight_map: dict[str, str] = json.loads(index_file.read_text())["weight_map"]
    except (json.JSONDecodeError, KeyError) as err:
        raise CheckpointError(f"{index_file} is not a valid shard index ({err!r}); re-export it") from None
    shards: dict[str, TensorReader] = {}
    for shard in sorted(set(weight_map.values())):
        shard_file = index_file.parent / shard
        if not shard_file.is_file():
            raise CheckpointError(f"{index_file} lists shard {shard}, which is missing from {index_file.parent}")
        shards[shard] = open_shard(shard_file)

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


def _open_bin(file: Path) -> TensorReader:
    try:
        import torch
    except ImportError:
        raise CheckpointError(
            f"{file} is a PyTorch pickle and reading it needs torch: pip install 'flaxheads[torch]' "
            "(or convert the checkpoint to model.safetensors)"
        ) from None
    try:
        state = torch.load(str(file), map_location="cpu", weights_only=True, mmap=True)
    except Exception as err:  # torch raises many types for corrupt or unsafe pickles
        raise CheckpointError(
            f"cannot load {file} with torch.load(weights_only=True): {err}. The file is corrupt, "
            "truncated, or holds objects other than tensors"
        ) from None
    if not isinstance(state, Mapping):
        raise CheckpointError(f"{file} holds a {type(state).__name__}, not a state dict of tensors")
    return TensorReader(list(state), lambda name: _torch_to_numpy(state[name]), str(file))


_OPENERS: dict[str, Callable[[Path], TensorReader]] = {
    SAFETENSORS_NAME: _open_safetensors,
    SAFETENSORS_INDEX_NAME: lambda f: _open_sharded(f, _open_safetensors),
    BIN_NAME: _open_bin,
    BIN_INDEX_NAME: lambda f: _open_sharded(f, _open_bin),
    FLAX_NAME: _open_safetensors,
}


def _atomic_write(target: Path, write: Callable[[str], None]) -> None:
    """Writes through a temporary file in the same folder and renames it: a crash never leaves
    a half-written file where a good one was."""
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_checkpoint(
    path: str | os.PathLike, config: dict[str, Any], tensors: Mapping[str, np.ndarray], file_name: str = SAFETENSORS_NAME
) -> None:
    """Writes `config.json` and one safetensors file (metadata format "pt", as transformers requires)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    _atomic_write(path / file_name, lambda tmp: write_safetensors(tmp, tensors, metadata={"format": "pt"}))
    _atomic_write(path / CONFIG_NAME, lambda tmp: Path(tmp).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n"))


_DTYPE_CODES = {np.dtype(t): code for code, t in _SAFETENSORS_DTYPES.items()}


def write_safetensors(file: str | os.PathLike, tensors: Mapping[str, np.ndarray], metadata: dict[str, str]) -> None:
    """The safetensors format, streamed: each tensor goes from its own memory to the file, one at a
    time, so writing costs at most one tensor's copy (for a transposed view) on top of the arrays
    themselves; `safetensors.numpy.save_file` first copies every tensor with `tobytes()`.

    Layout as the safetensors library writes it: a little-endian u64 header length, a JSON header
    padded with spaces to 8 bytes, then the tensors' bytes, larger items first so every tensor is
    aligned to its item size.
    """
    order = sorted(tensors, key=lambda name: (-tensors[name].dtype.itemsize, name))
    header: dict[str, Any] = {"__metadata__": metadata}
    offset = 0
    for name in order:
        array = tensors[name]
        if array.dtype not in _DTYPE_CODES:
            raise TypeError(f"tensor {name} has dtype {array.dtype}, which safetensors cannot store")
        header[name] = {"dtype": _DTYPE_CODES[array.dtype], "shape": list(array.shape),
                        "data_offsets": [offset, offset + array.nbytes]}
        offset += array.nbytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    with open(file, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for name in order:
            f.write(np.ascontiguousarray(tensors[name]).reshape(-1).view(np.uint8).data)
