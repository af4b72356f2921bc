"""Damaged safetensors files, generated: flaxheads either reads exactly what the safetensors library
reads from the same bytes, or raises CheckpointError, never another exception.

flaxheads reads safetensors through the library itself (`safe_open`, one tensor at a time), so this
suite guards the wrapping: every library error becomes a CheckpointError naming the file, and
what is read is what the library reads.

Starting from a small valid file (written by flaxheads' `write_safetensors`), each example damages
it one way: the header's JSON structure (re-encoded with a right or wrong length prefix), raw
bytes anywhere, or the file's length. Byte flips in the data legitimately change values, so the
reference is always `safetensors.numpy.load_file` on the damaged file, never the original.

The one thing flaxheads refuses although the library reads it: dtypes it does not read (the F8
family, F4, F6), with a CheckpointError naming the tensor and its dtype.
"""

from __future__ import annotations

import copy
import json
import shutil
import struct
import tempfile
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from safetensors.numpy import load_file as load_numpy

from flaxheads.conversion import checkpoint_io

# Names that differ in more than one byte, so a single flipped byte rarely makes two equal.
TENSORS = {
    "alpha": np.arange(12, dtype=np.float32).reshape(3, 4),
    "beta": np.linspace(-2, 2, 5).astype(ml_dtypes.bfloat16),
    "gamma": np.array([7, -9], np.int64),
    "delta": np.arange(3, dtype=np.uint8),
    "flags": np.array([True, False]),
    "halves": np.arange(4, dtype=np.float16).reshape(2, 2),
    "pair": np.array([1.5, -3.0], np.float32),  # as many bytes as "halves": swapping their offsets is valid
    "nothing": np.zeros((0, 3), np.float32),
}
FORMAT_DTYPES = sorted({*checkpoint_io.SAFETENSORS_DTYPES, "F4", "F6_E2M3", "F6_E3M2", "F8_E5M2", "F8_E4M3",
                         "F8_E8M0", "F8_E4M3FNUZ", "F8_E5M2FNUZ"})
LIBRARY_IS_MORE_LENIENT = ("which flaxheads does not read",)
"""What flaxheads may refuse although the library reads the file (see the module docstring)."""
SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _valid_file() -> bytes:
    with tempfile.TemporaryDirectory() as folder:
        file = Path(folder) / "model.safetensors"
        checkpoint_io.write_safetensors(file, TENSORS, metadata={"format": "pt"})
        return file.read_bytes()


VALID = _valid_file()
HEADER_LEN = struct.unpack("<Q", VALID[:8])[0]
HEADER = json.loads(VALID[8:8 + HEADER_LEN])
DATA = VALID[8 + HEADER_LEN:]
NAMES = sorted(TENSORS)


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


def assert_reads_like_the_library_or_refuses(scratch: Path, content: bytes) -> str:
    """Returns which way it went, for hypothesis' statistics (`pytest --hypothesis-show-statistics`)."""
    folder = Path(tempfile.mkdtemp(dir=scratch))  # a fresh file each time: the library maps it
    file = folder / "model.safetensors"
    file.write_bytes(content)
    try:
        try:
            expected = load_numpy(file)
        except Exception:  # the library's error, or numpy's on an impossible shape
            expected = None
        try:
            reader = checkpoint_io.open_weights(folder, "model.safetensors")
            got = {name: reader.read(name) for name in reader.names}
        except checkpoint_io.CheckpointError as err:
            assert expected is None or any(why in str(err) for why in LIBRARY_IS_MORE_LENIENT), (
                f"flaxheads refused a file the library reads: {err}"
            )
            return "both refuse" if expected is None else "only flaxheads refuses"
        assert expected is not None, "flaxheads read a file the safetensors library refuses"
        assert sorted(got) == sorted(expected)
        for name, want in expected.items():
            assert got[name].dtype == want.dtype, name
            assert got[name].shape == want.shape, name
            assert got[name].tobytes() == want.tobytes(), name
        return "both read"
    finally:
        shutil.rmtree(folder)


# ---------------------------------------------------------------------------------------------
# Header mutations


NUMBER_LIKE = st.one_of(
    st.integers(-(2**65), 2**65),
    st.sampled_from([0, 1, 2**63 - 1, 2**63, 2**64 - 1, 2**64, True, False, None, "8", 8.0, 1.5, -0.0, [], {}]),
)


@st.composite
def header_edit(draw, header: dict) -> None:
    """Changes `header` in place in one of the ways a damaged or hostile header differs."""
    names = [n for n in header if n != "__metadata__"] or ["alpha"]
    name = draw(st.sampled_from(names))
    info = header.setdefault(name, {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]})
    if not isinstance(info, dict):
        return
    kind = draw(st.sampled_from([
        "rename", "reorder", "shift offset", "swap offsets", "weird offset", "weird dim", "reshape", "dtype", "drop key",
        "drop tensor", "alias", "new tensor", "metadata", "extra key", "offset count",
    ]))
    offsets = info.get("data_offsets")
    if kind == "rename":
        header[draw(st.sampled_from(["renamed", "alpha", "__metadata__"]))] = header.pop(name)
    elif kind == "reorder":  # offsets, not header order, decide where a tensor's bytes are
        items = draw(st.permutations(list(header.items())))
        header.clear()
        header.update(items)
    elif kind == "shift offset" and isinstance(offsets, list) and offsets:
        i = draw(st.integers(0, len(offsets) - 1))
        if type(offsets[i]) is int:
            offsets[i] += draw(st.one_of(st.integers(-16, 16), st.integers(-(2**64), 2**64)))
    elif kind == "swap offsets":
        other = header.get(draw(st.sampled_from(names)))
        if isinstance(other, dict) and "data_offsets" in other and "data_offsets" in info:
            info["data_offsets"], other["data_offsets"] = other["data_offsets"], info["data_offsets"]
    elif kind == "weird offset" and isinstance(offsets, list) and offsets:
        offsets[draw(st.integers(0, len(offsets) - 1))] = draw(NUMBER_LIKE)
    elif kind == "weird dim" and isinstance(info.get("shape"), list) and info["shape"]:
        info["shape"][draw(st.integers(0, len(info["shape"]) - 1))] = draw(NUMBER_LIKE)
    elif kind == "reshape":
        info["shape"] = draw(st.lists(st.one_of(st.integers(0, 6), st.sampled_from([2**40, 2**62, 2**64 - 1])),
                                      max_size=5))
    elif kind == "dtype":
        info["dtype"] = draw(st.one_of(st.sampled_from(FORMAT_DTYPES), st.sampled_from(["F33", "f32", "", 4, None])))
    elif kind == "drop key" and info:
        del info[draw(st.sampled_from(sorted(info)))]
    elif kind == "drop tensor":
        del header[name]
    elif kind == "alias":  # another tensor's bytes, e.g. key over query's
        other = header.get(draw(st.sampled_from(names)))
        if isinstance(other, dict) and isinstance(other.get("data_offsets"), list):
            header[draw(st.sampled_from(["alias", name]))] = {**other, "data_offsets": list(other["data_offsets"])}
    elif kind == "new tensor":
        header[draw(st.sampled_from(["extra", "zz", "__metadata__"]))] = {
            "dtype": draw(st.sampled_from(FORMAT_DTYPES)),
            "shape": draw(st.lists(st.integers(0, 4), max_size=3)),
            "data_offsets": draw(st.lists(st.integers(0, len(DATA) + 8), min_size=2, max_size=2)),
        }
    elif kind == "metadata":
        header["__metadata__"] = draw(st.sampled_from([None, {}, {"format": 1}, [], "pt", {"format": "np"}]))
    elif kind == "extra key":
        info[draw(st.sampled_from(["offsets", "dtype "]))] = draw(NUMBER_LIKE)
    elif kind == "offset count" and isinstance(offsets, list):
        info["data_offsets"] = offsets[:1] if draw(st.booleans()) else offsets + offsets[-1:]


@st.composite
def mutated_header_files(draw) -> bytes:
    header = copy.deepcopy(HEADER)
    for _ in range(draw(st.integers(1, 3))):
        draw(header_edit(header))
    blob = json.dumps(header).encode()
    blob += b" " * draw(st.sampled_from([0, -len(blob) % 8, 3]))
    length, data = len(blob), DATA
    if draw(st.integers(0, 3)) == 0:  # a quarter also get a wrong length prefix or extra data
        length += draw(st.one_of(st.integers(-8, 8), st.just(2**64 - 1 - len(blob))))
        data += b"\0" * draw(st.sampled_from([0, 4, 8]))
    return struct.pack("<Q", max(length, 0)) + blob + data


@settings(max_examples=150, **SETTINGS)
@given(content=mutated_header_files())
def test_a_mutated_header_reads_like_the_library_or_is_a_checkpoint_error(scratch, content):
    event(assert_reads_like_the_library_or_refuses(scratch, content))


# ---------------------------------------------------------------------------------------------
# Raw bytes and length


REGIONS = {"length and header": (0, 8 + HEADER_LEN), "data": (8 + HEADER_LEN, len(VALID)), "anywhere": (0, len(VALID))}


@settings(max_examples=75, **SETTINGS)
@given(region=st.sampled_from(sorted(REGIONS)), data=st.data())
def test_overwritten_bytes_read_like_the_library_or_are_a_checkpoint_error(scratch, region, data):
    # The header is most of this small file; aiming at each region keeps value-only changes common.
    low, high = REGIONS[region]
    edits = data.draw(st.lists(st.tuples(st.integers(low, high - 1), st.integers(0, 255)), min_size=1, max_size=4))
    content = bytearray(VALID)
    for position, value in edits:
        content[position] = value
    event(assert_reads_like_the_library_or_refuses(scratch, bytes(content)))


@settings(max_examples=50, **SETTINGS)
@given(length=st.integers(0, len(VALID) + 64), filler=st.binary(min_size=1, max_size=1))
def test_a_truncated_or_extended_file_reads_like_the_library_or_is_a_checkpoint_error(scratch, length, filler):
    content = VALID[:length] + filler * max(0, length - len(VALID))
    event(assert_reads_like_the_library_or_refuses(scratch, content))


def test_the_unmutated_file_reads_like_the_library(scratch):
    assert assert_reads_like_the_library_or_refuses(scratch, VALID) == "both read"
