"""Every family of tests/families.py refuses, with a ValueError that names the input and the fix,
the inputs transformers cannot run (an IndexError in its embeddings, or a RuntimeError from a
buffer as long as the position table: a sequence past the table, a token type or id outside its table) and those of mismatched shapes, which jax would
broadcast; and runs, as transformers does, the ones transformers runs (a long sequence under
relative or rotary positions, any token type where types are compared, not looked up).
Before the check, jax's lookups gave NaN logits or wrapped a negative id around."""

from __future__ import annotations

import inspect
import re

import numpy as np
import pytest
import torch

import flaxheads
from families import FAMILIES, case
from family_parity import assert_close, flax_inputs

_MODELS: dict[str, tuple] = {}


def _classifier(hf_checkpoint, row):
    """(the row's 2-label transformers classifier, the same checkpoint loaded by flaxheads), loaded once per row."""
    if row.name not in _MODELS:
        checkpoint = hf_checkpoint(row.classifier, family=row.name, num_labels=2)
        _MODELS[row.name] = checkpoint.model, flaxheads.from_pretrained(checkpoint.path, **dict(row.load_options))
    return _MODELS[row.name]


def _ids(length: int, batch: int = 1) -> np.ndarray:
    """Ids in [6, 90): no family's pad, bos, eos or cls id (GPT-2's pad is 98, XLNet's 5)."""
    return np.random.default_rng(0).integers(6, 90, (batch, length))


def _transformers_refuses(model, **inputs) -> tuple[bool, np.ndarray | None]:
    """(whether transformers cannot run `inputs`: an IndexError from an embedding, or a RuntimeError from
    a buffer as long as the position table; its logits when it runs them)."""
    with torch.no_grad():
        try:
            return False, model(**{k: torch.as_tensor(v) for k, v in inputs.items()}).logits.float().numpy()
        except (IndexError, RuntimeError):
            return True, None


def _takes_token_types(row) -> bool:
    import transformers

    return "token_type_ids" in inspect.signature(getattr(transformers, row.classifier).forward).parameters


@pytest.mark.parametrize("row", [case(row, id=row.name, fast=True) for row in FAMILIES.values()])
def test_inputs_shaped_otherwise_than_input_ids_are_refused_naming_both_shapes(hf_checkpoint, row):
    _, model = _classifier(hf_checkpoint, row)
    batch = flax_inputs(row.batch(row.sample_padding))
    shape = tuple(batch["input_ids"].shape)
    names = ["attention_mask", "position_ids"] + (["token_type_ids"] if "token_type_ids" in batch else [])

    for name in names:
        for other in ((1, shape[1]), (shape[0], shape[1] - 1)):  # a mask of batch 1 would broadcast over every row
            given = {**batch, name: np.zeros(other, np.int32)}
            with pytest.raises(ValueError, match=re.escape(f"{name} has shape {other} but input_ids has {shape}")):
                model(**flax_inputs(given))


@pytest.mark.parametrize("row", [case(row, id=row.name, fast=True) for row in FAMILIES.values()])
def test_a_sequence_past_the_position_table_is_refused_where_transformers_refuses_it(hf_checkpoint, row):
    torch_model, model = _classifier(hf_checkpoint, row)
    hf = row.hf_config()
    table = hf.get("max_position_embeddings") or hf.get("n_positions") or 64
    ids = _ids(table + 1)

    refused, expected = _transformers_refuses(torch_model, input_ids=ids)

    if refused:
        limit = model.config.backbone.max_sequence_length
        with pytest.raises(ValueError, match=rf"input_ids has {table + 1} tokens per sequence.*covers at most "
                                             rf"{limit}: truncate the text to at most {limit} tokens"):
            model(flax_inputs({"input_ids": ids})["input_ids"])
    else:
        assert_close(model(flax_inputs({"input_ids": ids})["input_ids"]), expected, f"{row.name}, {table + 1} tokens")


@pytest.mark.parametrize("row", [case(row, id=row.name, fast=True) for row in FAMILIES.values()
                                 if _takes_token_types(row)])
def test_token_types_outside_the_table_are_refused_where_transformers_refuses_them(hf_checkpoint, row):
    torch_model, model = _classifier(hf_checkpoint, row)
    hf = row.hf_config()
    ids = _ids(8, batch=2)
    for value in (hf.get("type_vocab_size") or hf["vocab_size"], -1):
        types = np.full_like(ids, value)

        refused, expected = _transformers_refuses(torch_model, input_ids=ids, token_type_ids=types)

        call = flax_inputs({"input_ids": ids, "token_type_ids": types})
        if refused:
            with pytest.raises(ValueError, match=rf"token_type_ids holds {value} at \(0, 0\), outside"):
                model(**call)
        else:
            assert_close(model(**call), expected, f"{row.name}, token type {value}")


@pytest.mark.parametrize("row", [case(row, id=row.name, fast=True) for row in FAMILIES.values()])
@pytest.mark.parametrize("bad_id", [-1, 99])  # every row's vocabulary is 99 ids
def test_ids_outside_the_vocabulary_are_refused_as_transformers_refuses_them(hf_checkpoint, row, bad_id):
    torch_model, model = _classifier(hf_checkpoint, row)
    ids = _ids(8, batch=2)
    ids[1, 3] = bad_id

    assert _transformers_refuses(torch_model, input_ids=ids)[0]
    with pytest.raises(ValueError, match=rf"input_ids holds {bad_id} at \(1, 3\), outside the model's vocabulary"):
        model(flax_inputs({"input_ids": ids})["input_ids"])
