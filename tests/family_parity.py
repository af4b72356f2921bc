"""Helpers the backbone-family test files share: padded input batches, running a torch model and a
flaxheads model on them, and comparisons that print the difference they measured."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import torch
from flax import nnx
from safetensors.torch import load_file

ATOL = RTOL = 1e-5


def padded_batch(padding: str = "right", *, seq_len: int, seed: int = 0, pad_id: int = 0, lowest_id: int = 1,
                 token_types: bool = True) -> dict[str, np.ndarray]:
    """Three sequences of lengths (seq_len, seq_len - 3, 2) padded with `pad_id` on `padding`
    ("right", "left"), the second half of each in segment 1 when `token_types`."""
    rng = np.random.default_rng(seed)
    lengths = np.array([seq_len, seq_len - 3, 2])
    positions = np.arange(seq_len)[None, :]
    start = seq_len - lengths[:, None] if padding == "left" else np.zeros_like(lengths[:, None])
    real = (positions >= start) & (positions < start + lengths[:, None])
    offset = positions - start
    ids = np.where(real, rng.integers(lowest_id, 99, (3, seq_len)), pad_id)
    batch = {"input_ids": ids, "attention_mask": real.astype(np.int64)}
    if token_types:
        batch["token_type_ids"] = np.where(real & (offset >= lengths[:, None] // 2), 1, 0)
    return batch


def two_padded_rows(padding: str, *, seq_len: int = 11, seed: int = 0, pad_id: int = 0) -> dict[str, np.ndarray]:
    """Three rows of random ids; rows 1 and 2 (real lengths 7 and 4) padded on `padding`'s side
    ("none": no padding)."""
    rng = np.random.RandomState(seed)
    ids = rng.randint(3, 99, size=(3, seq_len)).astype(np.int64)
    mask = np.ones_like(ids)
    if padding != "none":
        for row, length in ((1, 7), (2, 4)):
            pads = slice(length, None) if padding == "right" else slice(0, seq_len - length)
            ids[row, pads], mask[row, pads] = pad_id, 0
    return {"input_ids": ids, "attention_mask": mask}


def torch_forward(model, batch, **kwargs):
    with torch.no_grad():
        return model(**{k: torch.as_tensor(v) for k, v in batch.items()}, **kwargs)


def torch_logits(model, batch) -> np.ndarray:
    return torch_forward(model, batch).logits.float().numpy()


def flax_inputs(batch) -> dict:
    return {k: jnp.asarray(v) for k, v in batch.items()}


def flax_logits(model, batch) -> np.ndarray:
    return np.asarray(model(**flax_inputs(batch)))


def assert_close(actual, expected, what: str, atol: float = ATOL, rtol: float = RTOL) -> None:
    actual, expected = np.asarray(actual, np.float32), np.asarray(expected, np.float32)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    print(f"{what}: max abs difference {np.max(np.abs(actual - expected)):.3g}")
    np.testing.assert_allclose(actual, expected, atol=atol, rtol=rtol, err_msg=what)


def state_dict(path) -> dict[str, torch.Tensor]:
    return load_file(path / "model.safetensors")


def assert_state_dicts_identical(actual: dict, expected: dict) -> None:
    assert sorted(actual) == sorted(expected)
    for name, tensor in expected.items():
        assert actual[name].dtype == tensor.dtype, name
        assert torch.equal(actual[name], tensor), name


def flat_params(model) -> dict:
    return {path: np.asarray(v[...]) for path, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}


def assert_same_params(a, b) -> None:
    pa, pb = flat_params(a), flat_params(b)
    assert pa.keys() == pb.keys() and all(np.array_equal(pa[k], pb[k]) for k in pa)
