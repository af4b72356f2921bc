"""Data and a stand-in model for the packing tests of tests/test_packing_data.py (and its
subprocesses): splits whose token ids say which example and position they are, the batch format,
and a tiny classifier that honours the packing contract."""

from __future__ import annotations

import datasets
import jax.numpy as jnp
import numpy as np
from flax import nnx

from flaxheads.data.batching import BatchFormat

T = 32
"""The row length (max_seq_length) of the packing tests."""


def numbered_split(n: int = 60, seed: int = 0, *, shortest: int = 2, longest: int = 20, num_labels: int = 3,
           token_types: bool = False) -> datasets.Dataset:
    """A tokenised split of `n` examples whose ids say which example and position they are."""
    lengths = np.random.default_rng(seed).integers(shortest, longest + 1, n)
    columns = {"input_ids": [[1000 * i + t for t in range(length)] for i, length in enumerate(lengths)],
               "attention_mask": [[1] * length for length in lengths]}
    if token_types:
        columns["token_type_ids"] = [[t % 2 for t in range(length)] for length in lengths]
    columns["labels"] = [i % num_labels for i in range(n)]
    columns["length"] = lengths.tolist()
    return datasets.Dataset.from_dict(columns)


def batch_format(segments: int = 4, **overrides) -> BatchFormat:
    return BatchFormat(**{**dict(max_seq_length=T, pad_token_id=7, num_labels=3, max_segments=segments), **overrides})


class MeanEmbedding(nnx.Module):
    """A tiny classifier that honours the packing contract: logits from the mean token embedding
    of each example (of each segment, (B, S, C), when given `segment_ids`)."""

    def __init__(self, vocab_size: int, num_labels: int, rngs: nnx.Rngs):
        self.embed = nnx.Embed(vocab_size, 8, rngs=rngs)
        self.out = nnx.Linear(8, num_labels, rngs=rngs)

    def __call__(self, input_ids, attention_mask=None, token_type_ids=None, *, segment_ids=None,
                 num_segments=None, rngs=None):
        if segment_ids is None:
            members = attention_mask[:, None, :] > 0  # (B, 1, T)
        else:  # (B, S, T): token t belongs to slot s
            members = segment_ids[:, None, :] == jnp.arange(1, num_segments + 1)[None, :, None]
        weights = members / jnp.maximum(members.sum(-1, keepdims=True), 1)
        logits = self.out(jnp.tanh(jnp.einsum("BST,BTH->BSH", weights, self.embed(input_ids))))
        return logits if segment_ids is not None else logits[:, 0]
