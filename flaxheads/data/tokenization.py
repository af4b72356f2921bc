"""Tokenising `TaskData` splits once, unpadded, with a cache keyed by data and tokenizer.

Padding is left to batching, which pads each batch to a length bucket; storing unpadded ids
keeps the cache small and lets one tokenisation serve any batch size or padding side.
"""

from __future__ import annotations

import functools
import json
import pathlib

import datasets
from datasets.fingerprint import Hasher

from flaxheads.data.task import LABEL, TEXT, TEXT_PAIR, TaskData

# Bump when the tokenised layout changes, so old cache files are not reused.
_CACHE_VERSION = "flaxheads-tokenized-v1"
LENGTH = "length"
LABELS = "labels"


def tokenize_task(
    task: TaskData, tokenizer, max_seq_length: int, *, cache_dir: str | pathlib.Path | None = None
) -> datasets.DatasetDict:
    """`tokenize_split` applied to every split of `task`."""
    return datasets.DatasetDict(
        {
            name: tokenize_split(split, tokenizer, max_seq_length, cache_dir=cache_dir)
            for name, split in task.splits.items()
        }
    )


def tokenize_split(
    split: datasets.Dataset, tokenizer, max_seq_length: int, *, cache_dir: str | pathlib.Path | None = None
) -> datasets.Dataset:
    """Tokenises the `text` (and `text_pair`, when present) column of a canonical split.

    Returns a Dataset with, per example: `input_ids`, `attention_mask`, `token_type_ids` (only
    when the tokenizer's `model_input_names` include it), `labels` (the `label` column) and
    `length` (the number of tokens, at most `max_seq_length`; pairs are truncated longest-first).

    The result is cached under a fingerprint of (split fingerprint, tokenizer pipeline,
    max_seq_length): in `cache_dir/tokenized-<fingerprint>.arrow` when `cache_dir` is given,
    otherwise wherever `datasets` caches the split (in memory for in-memory splits).
    Raises ValueError if `max_seq_length` exceeds the tokenizer's `model_max_length`.
    """
    if not 0 < max_seq_length <= tokenizer.model_max_length:
        raise ValueError(
            f"--max_seq_length {max_seq_length} must be in [1, {tokenizer.model_max_length}], the "
            "tokenizer's model_max_length"
        )
    # `_fingerprint` is how datasets itself identifies a split's content and history.
    fingerprint = Hasher.hash(
        [_CACHE_VERSION, split._fingerprint, tokenizer_fingerprint(tokenizer), max_seq_length]
    )
    cache_file_name = None
    if cache_dir is not None:
        pathlib.Path(cache_dir).mkdir(parents=True, exist_ok=True)
        cache_file_name = str(pathlib.Path(cache_dir) / f"tokenized-{fingerprint}.arrow")
    return split.map(
        functools.partial(_tokenize_batch, tokenizer=tokenizer, max_seq_length=max_seq_length),
        batched=True,
        remove_columns=split.column_names,
        features=_tokenized_features(tokenizer, split.features[LABEL]),
        new_fingerprint=fingerprint,
        cache_file_name=cache_file_name,
        desc="Tokenizing",
    )


def tokenizer_fingerprint(tokenizer) -> str:
    """A hash of everything that decides a fast tokenizer's ids, stable across processes.

    The backend's truncation and padding state is left out: it changes with every call that
    truncates or pads, without changing what the pipeline tokenises to.
    """
    pipeline = json.loads(tokenizer.backend_tokenizer.to_str())
    pipeline.pop("truncation", None)
    pipeline.pop("padding", None)
    return Hasher.hash(
        [type(tokenizer).__name__, json.dumps(pipeline, sort_keys=True), list(tokenizer.model_input_names)]
    )


def _tokenized_features(tokenizer, label_feature) -> datasets.Features:
    ids = datasets.List(datasets.Value("int32"))
    names = ["input_ids", "attention_mask"]
    if "token_type_ids" in tokenizer.model_input_names:
        names.append("token_type_ids")
    return datasets.Features(
        {**{name: ids for name in names}, LABELS: label_feature, LENGTH: datasets.Value("int32")}
    )


def _tokenize_batch(batch: dict[str, list], *, tokenizer, max_seq_length: int) -> dict[str, list]:
    encoded = tokenizer(
        batch[TEXT],
        batch.get(TEXT_PAIR),
        truncation=True,
        max_length=max_seq_length,
        return_attention_mask=True,
        return_token_type_ids="token_type_ids" in tokenizer.model_input_names,
    )
    columns = {"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"]}
    if "token_type_ids" in encoded:
        columns["token_type_ids"] = encoded["token_type_ids"]
    columns[LABELS] = batch[LABEL]
    columns[LENGTH] = [len(ids) for ids in encoded["input_ids"]]
    return columns
