"""flaxheads' own safetensors reader and writer: the same bytes meaning as the safetensors library,
one tensor at a time, into memory jax adopts without a copy."""

from __future__ import annotations

import json
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


def test_reader_returns_what_the_safetensors_library_wrote_in_aligned_memory(tmp_path):
    tensors = {k: np.ascontiguousarray(v) for k, v in _tensors().items()}
    save_numpy(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})

    reader = checkpoint_io.open_weights(tmp_path, "model.safetensors")
    assert sorted(reader.names) == sorted(tensors)
    for name, expected in tensors.items():
        got = reader.read(name)
        assert reader.dtype_of(name) == expected.dtype
        assert got.dtype == expected.dtype and got.shape == expected.shape
        assert got.tobytes() == expected.tobytes(), name
        if got.size:
            assert got.ctypes.data % ALIGNMENT == 0, name


def test_jax_adopts_read_and_transposed_arrays_without_copying():
    """The memory goal of conversion rests on this: an aligned array becomes the jax buffer itself."""
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
        ({"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}}, b"\0" * 8, "ends at byte"),
        ({"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 12]}}, b"\0" * 16, "do not fit shape"),
        ({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0]}}, b"\0" * 8, "no valid dtype, shape and data_offsets"),
        ({"w": {"dtype": "U32", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 8, "dtype U32, which flaxheads does not read"),
        ([1, 2, 3], b"", "not a JSON object"),
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
    with pytest.raises(checkpoint_io.CheckpointError, match="header claims 1000000 bytes and the file has 10"):
        checkpoint_io.open_weights(tmp_path, "model.safetensors")


def test_a_file_truncated_after_opening_is_named_when_read(tmp_path):
    tensors = {"a": np.ones(1000, np.float32)}
    checkpoint_io.write_safetensors(tmp_path / "model.safetensors", tensors, metadata={})
    reader = checkpoint_io.open_weights(tmp_path, "model.safetensors")
    data = (tmp_path / "model.safetensors").read_bytes()
    (tmp_path / "model.safetensors").write_bytes(data[:-100])
    with pytest.raises(checkpoint_io.CheckpointError, match="cannot read tensor a .*truncated"):
        reader.read("a")
