"""Reading and writing safetensors through the safetensors library: what flaxheads reads is what the
library reads, one tensor at a time; every file the library refuses is a CheckpointError naming
the file and the fix; written files read back bit for bit in the library and in torch."""

from __future__ import annotations

import json
import os
import stat
import struct

import jax
import ml_dtypes
import numpy as np
import pytest
import torch
from safetensors.numpy import load_file as load_numpy, save_file as save_numpy
from safetensors.torch import load_file as load_torch

from flaxheads.conversion import checkpoint_io
from flaxheads.conversion.table import ALIGNMENT, aligned_empty, transposed


def _tensors() -> dict[str, np.ndarray]:
    rs = np.random.RandomState(0)
    return {
        "f32": rs.randn(3, 5).astype(np.float32),
        "f16": rs.randn(7).astype(np.float16),
        "bf16": rs.randn(2, 3).astype(ml_dtypes.bfloat16),
        "f64": rs.randn(2).astype(np.float64),
        "i64": np.arange(6, dtype=np.int64).reshape(2, 3),
        "i32": np.arange(3, dtype=np.int32),
        "u8": np.arange(5, dtype=np.uint8),
        "bool": np.array([True, False, True]),
        "scalar": np.array(1.5, np.float32),
        "empty": np.zeros((0, 4), np.float32),
        "transposed_view": rs.randn(4, 6).astype(np.float32).T,
    }


def test_written_files_read_back_identically_with_the_safetensors_library(tmp_path):
    tensors = _tensors()
    checkpoint_io.write_safetensors(tmp_path / "w.safetensors", tensors, metadata={"format": "pt"})

    back = load_numpy(tmp_path / "w.safetensors")
    assert set(back) == set(tensors)
    for name, expected in tensors.items():
        assert back[name].dtype == expected.dtype, name
        assert back[name].shape == expected.shape, name
        assert back[name].tobytes() == np.ascontiguousarray(expected).tobytes(), name

    as_torch = load_torch(tmp_path / "w.safetensors")
    assert as_torch["bf16"].dtype == torch.bfloat16
    assert torch.equal(as_torch["bf16"].view(torch.int16), torch.from_numpy(tensors["bf16"].view(np.int16)))
    header_len = struct.unpack("<Q", (tmp_path / "w.safetensors").read_bytes()[:8])[0]
    assert header_len % 8 == 0
    header = json.loads((tmp_path / "w.safetensors").read_bytes()[8:8 + header_len])
    assert header["__metadata__"] == {"format": "pt"}


def test_reader_returns_what_the_safetensors_library_wrote(tmp_path):
    tensors = {k: np.ascontiguousarray(v) for k, v in _tensors().items()}
    save_numpy(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})

    reader = checkpoint_io.open_weights(tmp_path, "model.safetensors")
    assert sorted(reader.names) == sorted(tensors)
    for name, expected in tensors.items():
        got = reader.read(name)
        assert reader.dtype_of(name) == expected.dtype
        assert got.dtype == expected.dtype and got.shape == expected.shape
        assert got.tobytes() == expected.tobytes(), name


def test_jax_adopts_transposed_arrays_without_copying():
    """Conversion transposes Linear weights into aligned memory: the copy becomes the jax buffer itself."""
    for array in (aligned_empty((64, 48), np.float32), transposed(np.ones((48, 64), np.float32))):
        array[...] = 1.0
        assert array.ctypes.data % ALIGNMENT == 0
        assert jax.device_put(array).unsafe_buffer_pointer() == array.ctypes.data
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    np.testing.assert_array_equal(transposed(a), a.T)


def _header_file(path, header: dict, data: bytes = b"") -> None:
    blob = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + data)


@pytest.mark.parametrize(
    "header, data, match",
    [
        ({"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}}, b"\0" * 8, "re-download or re-export"),
        ({"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 12]}}, b"\0" * 16, "re-download or re-export"),
        ({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0]}}, b"\0" * 8, "re-download or re-export"),
        ({"w": {"dtype": "F8_E4M3", "shape": [8], "data_offsets": [0, 8]}}, b"\0" * 8,
         "tensor 'w' has dtype F8_E4M3, which flaxheads does not read"),
        ([1, 2, 3], b"", "re-download or re-export"),
    ],
)
def test_damaged_headers_are_checkpoint_errors_naming_the_problem(tmp_path, header, data, match):
    file = tmp_path / "model.safetensors"
    _header_file(file, header, data)
    with pytest.raises(checkpoint_io.CheckpointError, match=match) as err:
        checkpoint_io.open_weights(tmp_path, "model.safetensors")
    assert str(file) in str(err.value)


def test_a_header_length_beyond_the_file_is_named(tmp_path):
    file = tmp_path / "model.safetensors"
    file.write_bytes(struct.pack("<Q", 10**6) + b"{}")
    with pytest.raises(checkpoint_io.CheckpointError, match=f"cannot read {file}.*re-download or re-export"):
        checkpoint_io.open_weights(tmp_path, "model.safetensors")


def test_a_file_truncated_after_opening_is_named_when_read(tmp_path):
    tensors = {"a": np.ones(1000, np.float32)}
    checkpoint_io.write_safetensors(tmp_path / "model.safetensors", tensors, metadata={})
    reader = checkpoint_io.open_weights(tmp_path, "model.safetensors")
    data = (tmp_path / "model.safetensors").read_bytes()
    (tmp_path / "model.safetensors").write_bytes(data[:-100])
    with pytest.raises(checkpoint_io.CheckpointError, match="cannot read tensor a .*truncated"):
        reader.read("a")


def _f32(shape, begin, end, **changes) -> dict:
    return {"dtype": "F32", "shape": shape, "data_offsets": [begin, end], **changes}


# Each header is one the safetensors library refuses (asserted below); flaxheads refuses it too,
# naming the file. Values: (header, data bytes after it).
STRICT_CASES = {
    "float offsets that equal integers": ({"w": _f32([2], 0, 8.0)}, 8, "'w'"),
    "fractional offsets": ({"w": _f32([2], 0.5, 8.5)}, 8, "'w'"),
    "offsets as strings": ({"w": _f32([2], "0", "8")}, 8, "'w'"),
    "offsets as booleans": ({"w": _f32([1], False, True), "v": _f32([1], 1, 4)}, 8, "'w'"),
    "three offsets": ({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8, 8]}}, 8, "'w'"),
    "begin after end": ({"w": _f32([0], 8, 0), "v": _f32([2], 0, 8)}, 8, "'w'"),
    "negative shape dimension": ({"w": _f32([-2, -1], 0, 8)}, 8, "'w'"),
    "boolean shape dimension": ({"w": _f32([True, 2], 0, 8)}, 8, "'w'"),
    "float shape dimension": ({"w": _f32([2.0], 0, 8)}, 8, "'w'"),
    "shape that is not a list": ({"w": _f32(2, 0, 8)}, 8, "'w'"),
    "unknown dtype name": ({"w": _f32([2], 0, 8, dtype="F33")}, 8, "'w'"),
    "dtype that is not a string": ({"w": _f32([2], 0, 8, dtype=32)}, 8, "'w'"),
    "key aliases query's bytes": ({"query": _f32([2], 0, 8), "key": _f32([2], 0, 8)}, 8, "'key'"),
    "overlapping tensors": ({"a": _f32([2], 0, 8), "b": _f32([2], 4, 12)}, 12, "'b'"),
    "gap between tensors": ({"a": _f32([1], 0, 4), "b": _f32([1], 8, 12)}, 12, "'b'"),
    "first tensor not at the data start": ({"a": _f32([1], 4, 8)}, 8, "'a'"),
    "bytes after the last tensor": ({"a": _f32([1], 0, 4)}, 8, "'a'"),
    "metadata that is not an object": ({"__metadata__": ["pt"], "a": _f32([1], 0, 4)}, 4, "__metadata__"),
    "metadata value that is not a string": ({"__metadata__": {"format": 1}, "a": _f32([1], 0, 4)}, 4, "__metadata__"),
    "empty tensor too large for any array": ({"w": _f32([0, 2**40, 2**40], 0, 0)}, 0, "'w'"),
}


@pytest.mark.parametrize("header, data_len, named", STRICT_CASES.values(), ids=list(STRICT_CASES))
def test_headers_the_safetensors_library_refuses_are_refused_naming_the_file(tmp_path, header, data_len, named):
    file = tmp_path / "model.safetensors"
    _header_file(file, header, b"\0" * data_len)
    with pytest.raises(Exception):
        load_numpy(file)

    with pytest.raises(checkpoint_io.CheckpointError) as err:  # on opening, or on reading the tensor
        reader = checkpoint_io.open_weights(tmp_path, "model.safetensors")
        for name in reader.names:
            reader.read(name)

    message = str(err.value)
    assert str(file) in message and "re-download or re-export" in message, message


@pytest.mark.parametrize(
    "raw_header",
    [
        b'{"w": {"dtype": "F32", "shape": [2], "data_offsets": [-0, 8]}}',
        b'{"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8e0]}}',
        b'{"w": {"dtype": "F32", "shape": [NaN], "data_offsets": [0, 8]}}',
        b'{"w": {"dtype": "F32", "shape": [2], "shape": [2], "data_offsets": [0, 8]}}',
        b'{"\\ud800": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}',
        '{}'.encode("utf-16"),
    ],
    ids=["minus zero", "exponent", "NaN", "duplicate field", "lone surrogate", "UTF-16"],
)
def test_json_that_python_accepts_and_serde_refuses_is_refused(tmp_path, raw_header):
    file = tmp_path / "model.safetensors"
    file.write_bytes(struct.pack("<Q", len(raw_header)) + raw_header + b"\0" * 8)
    with pytest.raises(Exception):
        load_numpy(file)

    with pytest.raises(checkpoint_io.CheckpointError, match="re-download or re-export"):
        checkpoint_io.open_weights(tmp_path, "model.safetensors")


@pytest.mark.parametrize(
    "header, data",
    [
        ({"__metadata__": None, "w": _f32([2], 0, 8)}, b"\1" * 8),
        ({"b": _f32([1], 4, 8), "a": _f32([1], 0, 4)}, bytes(range(8))),
        ({"e1": _f32([0, 3], 0, 0), "e2": _f32([0], 0, 0), "w": _f32([1], 0, 4)}, b"\2" * 4),
        ({"u": {"dtype": "U32", "shape": [1], "data_offsets": [0, 4]},
          "c": {"dtype": "C64", "shape": [1], "data_offsets": [4, 12]}}, bytes(range(12))),
        ({}, b""),
    ],
    ids=["null metadata", "offsets out of name order", "empty tensors sharing an offset", "U32 and C64", "no tensors"],
)
def test_unusual_headers_the_library_accepts_read_as_the_library_reads_them(tmp_path, header, data):
    file = tmp_path / "model.safetensors"
    _header_file(file, header, data)
    expected = load_numpy(file)

    reader = checkpoint_io.open_weights(tmp_path, "model.safetensors")

    assert sorted(reader.names) == sorted(expected)
    for name, want in expected.items():
        got = reader.read(name)
        assert (got.dtype, got.shape, got.tobytes()) == (want.dtype, want.shape, want.tobytes()), name


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_written_checkpoint_files_get_the_mode_the_umask_gives_new_files(tmp_path, umask, mode):
    old = os.umask(umask)
    try:
        checkpoint_io.write_checkpoint(tmp_path, {"model_type": "bert"}, {"w": np.ones(2, np.float32)})
    finally:
        os.umask(old)

    assert stat.S_IMODE((tmp_path / "config.json").stat().st_mode) == mode
    assert stat.S_IMODE((tmp_path / "model.safetensors").stat().st_mode) == mode
