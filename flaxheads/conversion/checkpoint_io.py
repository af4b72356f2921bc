"""Reading and writing Hugging Face checkpoint directories, without torch where possible.

Read order: `model.safetensors`, `model.safetensors.index.json` (sharded), `pytorch_model.bin`,
`pytorch_model.bin.index.json`. `.bin` files are unpickled only through
`torch.load(weights_only=True)`. safetensors files are read and written by flaxheads itself
(the format is a JSON header and raw bytes), one tensor at a time, so converting a checkpoint
costs about its own size in memory.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import struct
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

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


_MAX_HEADER_BYTES = 100_000_000
"""The safetensors library's `MAX_HEADER_SIZE`: it refuses a longer header, and so does flaxheads."""
_MAX_USIZE = 2**64 - 1
"""Offsets and dimensions are `usize` in the safetensors library (64-bit); larger numbers are refused there."""
_MAX_ARRAY_BYTES = np.iinfo(np.intp).max
"""numpy refuses an array whose non-zero dimensions times its item size pass this, even an empty one."""
_MAX_DIMS = 64
"""numpy's limit on dimensions (NPY_MAXDIMS in numpy 2)."""

# Every dtype name the safetensors format defines; flaxheads reads those in _SAFETENSORS_DTYPES.
_FORMAT_DTYPES = frozenset({
    "BOOL", "F4", "F6_E2M3", "F6_E3M2", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0", "F8_E4M3FNUZ",
    "F8_E5M2FNUZ", "I16", "U16", "F16", "BF16", "I32", "U32", "F32", "C64", "F64", "I64", "U64",
})
_TENSOR_KEYS = frozenset({"dtype", "shape", "data_offsets"})

Entry = tuple[np.dtype, tuple[int, ...], tuple[int, int]]
"""(dtype, shape, (begin, end)), the offsets relative to the start of the data section."""


def _safetensors_header(file: Path) -> tuple[dict[str, Entry], int]:
    """{name: (dtype, shape, (begin, end))} and where the data starts.

    As strict as the safetensors library (Rust `SafeTensors::read_metadata`): the header is UTF-8
    JSON of the exact types the format defines, and the tensors, ordered by offset, tile the data
    section exactly (no gap, no overlap, no trailing byte), each as long as its shape and dtype
    say. So a damaged file fails here, naming itself and the tensor, before anything is allocated,
    and never loads another tensor's bytes. Also refused, where the library is more lenient:
    duplicate JSON keys (it keeps the last tensor of a name), tensor entries written as JSON
    arrays or with keys other than dtype, shape and data_offsets.
    """

    def damaged(why: str) -> CheckpointError:
        return _damaged(file, why)

    size = file.stat().st_size
    with open(file, "rb") as f:
        prefix = f.read(8)
        if len(prefix) < 8:
            raise damaged("it is shorter than a safetensors header")
        (header_len,) = struct.unpack("<Q", prefix)
        if header_len > _MAX_HEADER_BYTES:
            raise damaged(f"its header claims {header_len} bytes, more than the {_MAX_HEADER_BYTES} safetensors allows")
        if header_len > size - 8:
            raise damaged(f"its header claims {header_len} bytes and the file has {size}")
        header = _header_json(f.read(header_len), damaged)
    entries = {name: _tensor_entry(file, name, info) for name, info in header.items() if name != "__metadata__"}
    _check_metadata(header.get("__metadata__"), damaged)
    _check_layout(entries, size - 8 - header_len, damaged)
    return entries, 8 + header_len


def _damaged(file: Path, why: str) -> CheckpointError:
    return CheckpointError(
        f"cannot read {file}: {why}. The file is truncated, damaged or not safetensors; re-download or re-export it"
    )


def _header_json(raw: bytes, damaged: Callable[[str], CheckpointError]) -> dict[str, Any]:
    """The header as Python values, refusing what serde_json (the library's parser) refuses and
    Python's json accepts: NaN and Infinity, `-0` (a float to serde), duplicate keys, lone
    surrogates, non-UTF-8 text."""

    def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise damaged(f"its header has the key {key!r} twice in one JSON object")
            seen.add(key)
        return dict(pairs)

    def not_json(constant: str):
        raise damaged(f"its header holds {constant}, which is not JSON")

    try:
        header = json.loads(
            raw.decode("utf-8"),
            object_pairs_hook=unique_keys,
            parse_constant=not_json,
            parse_int=lambda text: -0.0 if text == "-0" else int(text),
        )
    except CheckpointError:
        raise
    except UnicodeDecodeError:
        raise damaged("its header is not UTF-8 text") from None
    except (ValueError, RecursionError):  # JSONDecodeError, an int of over 4300 digits, deep nesting
        raise damaged("its header is not JSON") from None
    if not isinstance(header, dict):
        raise damaged("its header is not a JSON object")
    return header


def _is_usize(value: Any) -> bool:
    """An offset or dimension the library would accept; `type is` because JSON true is no number."""
    return type(value) is int and 0 <= value <= _MAX_USIZE


def _is_text(value: Any) -> bool:
    """A str serde_json would accept: JSON escapes can spell lone surrogates, which UTF-8 cannot hold."""
    if not isinstance(value, str):
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _tensor_entry(file: Path, name: str, info: Any) -> Entry:
    def damaged(why: str) -> CheckpointError:
        return _damaged(file, why)

    if not _is_text(name):
        raise damaged(f"tensor name {name!r} is not valid Unicode")
    if not isinstance(info, dict) or set(info) != _TENSOR_KEYS:
        raise damaged(
            f"tensor {name!r} is not a JSON object with exactly dtype, shape and data_offsets ({info!r})"
        )
    code, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
    if not isinstance(code, str) or code not in _FORMAT_DTYPES:
        raise damaged(f"tensor {name!r} has dtype {code!r}, which is not a safetensors dtype")
    if code not in _SAFETENSORS_DTYPES:
        raise CheckpointError(
            f"{file}: tensor {name!r} has dtype {code}, which flaxheads does not read; "
            f"re-export it in one of {sorted(_SAFETENSORS_DTYPES)}"
        )
    if not isinstance(shape, list) or not all(_is_usize(d) for d in shape):
        raise damaged(f"tensor {name!r} has shape {shape!r}; a shape is a list of non-negative integers")
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_usize(o) for o in offsets):
        raise damaged(f"tensor {name!r} has data_offsets {offsets!r}; they are two non-negative integers")
    dtype = np.dtype(_SAFETENSORS_DTYPES[code])
    begin, end = offsets
    if len(shape) > _MAX_DIMS or math.prod(d for d in shape if d) * dtype.itemsize > _MAX_ARRAY_BYTES:
        raise damaged(f"tensor {name!r} has shape {shape}, larger than any array can be")
    if begin > end or end - begin != math.prod(shape) * dtype.itemsize:
        raise damaged(f"tensor {name!r}: data_offsets {begin}..{end} do not fit shape {tuple(shape)} of {code}")
    return dtype, tuple(shape), (begin, end)


def _check_metadata(metadata: Any, damaged: Callable[[str], CheckpointError]) -> None:
    # null is what the library writes for "no metadata" and accepts as such.
    if metadata is not None and not (
        isinstance(metadata, dict) and all(_is_text(k) and _is_text(v) for k, v in metadata.items())
    ):
        raise damaged(f"its __metadata__ is {metadata!r}, not a JSON object of strings")


def _check_layout(entries: Mapping[str, Entry], data_len: int, damaged: Callable[[str], CheckpointError]) -> None:
    """The tensors, in offset order, cover the `data_len` bytes after the header exactly once:
    an overlap would read another tensor's bytes, a gap or trailing bytes mean the header and
    the data do not belong together."""
    expected_begin, previous = 0, None
    for name, (_, _, (begin, end)) in sorted(entries.items(), key=lambda item: item[1][2]):
        if begin != expected_begin:
            where = f"where {previous!r} ends" if previous else "where the data starts"
            raise damaged(
                f"tensor {name!r} starts at data byte {begin}, not at {expected_begin} {where}: "
                "tensors must follow each other without gaps or overlaps"
            )
        expected_begin, previous = end, name
    if expected_begin > data_len:
        raise damaged(f"tensor {previous!r} ends at data byte {expected_begin} and the file holds {data_len} data bytes")
    if expected_begin < data_len:
        after = f"after the last tensor {previous!r}" if previous else "and it has no tensors"
        raise damaged(f"the file holds {data_len - expected_begin} data bytes {after}, which belong to no tensor")


_SAFETENSORS_DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16, "C64": np.complex64,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8,
    "U64": np.uint64, "U32": np.uint32, "U16": np.uint16, "U8": np.uint8, "BOOL": np.bool_,
}


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
    return TensorReader(list(state), lambda name: _torch_to_numpy(state[name]), str(file))


_OPENERS: dict[str, Callable[[Path], TensorReader]] = {
    SAFETENSORS_NAME: _open_safetensors,
    SAFETENSORS_INDEX_NAME: lambda f: open_sharded(f, _open_safetensors),
    BIN_NAME: _open_bin,
    BIN_INDEX_NAME: lambda f: open_sharded(f, _open_bin),
    FLAX_NAME: _open_safetensors,
}


def _umask() -> int:
    """The process's umask. Linux reports it in /proc/self/status; elsewhere the only way to read it
    is to set it and set it back, which is process-wide: a file another thread creates meanwhile
    gets the stricter 0o077, never a looser mode."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def _atomic_write(target: Path, write: Callable[[str], None]) -> None:
    """Writes through a temporary file in the same folder and renames it: a crash never leaves
    a half-written file where a good one was."""
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        # mkstemp makes the file private (0600); the export gets the mode any new file would.
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json(file: str | os.PathLike, value: Any) -> None:
    """`value` as indented JSON, written atomically (numpy scalars become floats)."""
    _atomic_write(Path(file), lambda tmp: Path(tmp).write_text(json.dumps(value, indent=2, default=float) + "\n"))


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


@contextlib.contextmanager
def staged_into(dst: str | os.PathLike) -> Iterator[Path]:
    """An empty folder to write a checkpoint into. When the block ends without error, every file
    written there moves into `dst` (created if missing) with one rename each; on any error `dst`
    is left as it was, and folders created for it are removed again. The staging folder is gone
    either way. Files in `dst` that the block did not write are never touched."""
    target = Path(dst).resolve()
    created = make_folders(target.parent)
    staging = _staging_folder(target)
    try:
        yield staging
        _move_into(staging, target, set(os.listdir(staging)))
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        remove_empty(created)
        raise
    shutil.rmtree(staging, ignore_errors=True)  # now only the files dst held before


def make_folders(folder: Path) -> list[Path]:
    """Creates `folder` and any missing parents; returns those it created, deepest first."""
    missing = []
    while not folder.exists() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    for new in reversed(missing):
        new.mkdir(exist_ok=True)
    return missing


def remove_empty(folders: list[Path]) -> None:
    """Removes `folders` (made by `make_folders`), deepest first, if nothing else has filled them."""
    for folder in folders:
        with contextlib.suppress(OSError):
            folder.rmdir()


def _staging_folder(dst: Path) -> Path:
    """An empty private folder on `dst`'s file system, so each file moves in with one rename:
    beside `dst`, or inside it where `dst` is a mount point or its parent is read-only."""
    parent = dst.parent
    beside = not dst.is_dir() or (os.access(parent, os.W_OK) and dst.stat().st_dev == parent.stat().st_dev)
    return Path(tempfile.mkdtemp(prefix=f".{dst.name}.tmp-", dir=parent if beside else dst))


def _move_into(staging: Path, dst: Path, names: set[str]) -> None:
    """Moves the files `names` from `staging` into `dst` (created if missing) with one rename
    each; the files they replace wait in `staging`, and are put back if any move fails."""
    created = make_folders(dst)
    replaced = Path(tempfile.mkdtemp(dir=staging))
    moved = []
    try:
        for name in sorted(names):
            if os.path.lexists(dst / name):
                os.replace(dst / name, replaced / name)
            moved.append(name)
            os.replace(staging / name, dst / name)
    except BaseException:
        for name in reversed(moved):
            with contextlib.suppress(OSError):  # put back as much as can be; the first error is what to report
                if os.path.lexists(replaced / name):
                    os.replace(replaced / name, dst / name)
                else:
                    (dst / name).unlink(missing_ok=True)
        remove_empty(created)
        raise
