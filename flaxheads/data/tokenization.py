"""Tokenising `TaskData` splits once, unpadded, with a cache keyed by data and tokenizer; texts
to classify the same way (`tokenize_texts`). Which id pads them is `flaxheads.tokenizer`'s decision.

Padding is left to batching, which pads each batch to a length bucket; storing unpadded ids
keeps the cache small and lets one tokenisation serve any batch size or padding side.
"""

from __future__ import annotations

import functools
import hashlib
import json
import pathlib
import sys
from collections.abc import Sequence

import datasets
import pyarrow as pa
from datasets.fingerprint import Hasher, generate_random_fingerprint
from datasets.table import InMemoryTable

from flaxheads.data.task import CHOSEN, LABEL, REJECTED, TEXT, TEXT_PAIR, TaskData

# Bump when the tokenised layout changes, so old cache files are not reused.
_CACHE_VERSION = "flaxheads-tokenized-v1"
LENGTH = "length"
LABELS = "labels"


def tokenize_task(
    task: TaskData, tokenizer, max_seq_length: int, *, cache_dir: str | pathlib.Path | None = None
) -> datasets.DatasetDict:
    """Every split of `task` tokenised: `tokenize_split`, or the task's own rows (`task.rows`)."""
    if task.rows is not None:
        return datasets.DatasetDict({name: task.rows.tokenize(task, name, tokenizer, max_seq_length, cache_dir=cache_dir)
                                     for name in task.splits})
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
    A split of preference pairs (`chosen` and `rejected` columns) gets each text tokenised alone,
    and its `input_ids`, `attention_mask` (and `token_type_ids`) hold two sequences per example,
    chosen then rejected; its `length` is the longer one's.

    The result is cached under a fingerprint of (split fingerprint, tokenizer pipeline,
    max_seq_length): in `cache_dir/tokenized-<fingerprint>.arrow` when `cache_dir` is given,
    otherwise wherever `datasets` caches the split (in memory for in-memory splits). A cache file
    that does not read back whole, one row per example (cut short by a full disk or a copy), is
    removed with a warning naming it and built again (`_drop_damaged_cache`).
    Raises ValueError if `max_seq_length` exceeds the tokenizer's `model_max_length`.
    """
    unread = [name for name in split.column_names if name not in (TEXT, TEXT_PAIR, LABEL, CHOSEN, REJECTED)]
    if unread:
        raise ValueError(f"the split has columns tokenize_split does not read ({', '.join(unread)}): it holds another "
                         "task's examples (multiple choice's choices, token classification's words), whose rows the "
                         "task makes: tokenise them with tokenize_task(task, ...)")
    per_example = 2 if CHOSEN in split.column_names else 1
    return tokenize_with(split, _tokenize_batch, tokenizer, max_seq_length, per_example=per_example,
                         cache_dir=cache_dir)


def tokenize_with(split: datasets.Dataset, encode_batch, tokenizer, max_seq_length: int, *, per_example: int = 1,
                  cache_dir: str | pathlib.Path | None = None) -> datasets.Dataset:
    """`split` tokenised by `encode_batch(batch, tokenizer=, max_seq_length=)` (a batch of its
    columns -> the tokenised columns, `labels` included), as `tokenize_split` does: the label
    column's feature kept, `per_example` sequences per example (a list of them when not 1), and
    the result cached under a fingerprint of (split, tokenizer, max_seq_length, `encode_batch`'s
    name) in `cache_dir` when given. The one tokenisation path of every task's rows that are one
    per example."""
    _check_max_length(tokenizer, max_seq_length)
    # `_fingerprint` is how datasets itself identifies a split's content and history.
    fingerprint = Hasher.hash(
        [_CACHE_VERSION, split._fingerprint, tokenizer_fingerprint(tokenizer), max_seq_length,
         *([] if encode_batch is _tokenize_batch else [f"{encode_batch.__module__}.{encode_batch.__qualname__}"])]
    )
    cache_file_name = None
    if cache_dir is not None:
        pathlib.Path(cache_dir).mkdir(parents=True, exist_ok=True)
        cache_file_name = str(pathlib.Path(cache_dir) / f"tokenized-{fingerprint}.arrow")
        _drop_damaged_cache(pathlib.Path(cache_file_name), len(split))
    return split.map(
        functools.partial(encode_batch, tokenizer=tokenizer, max_seq_length=max_seq_length),
        batched=True,
        remove_columns=split.column_names,
        features=tokenized_features(tokenizer, split.features[LABEL], per_example=per_example),
        new_fingerprint=fingerprint,
        cache_file_name=cache_file_name,
        desc="Tokenizing",
    )


def _drop_damaged_cache(file: pathlib.Path, rows: int) -> None:
    """Removes the tokenised cache `file` (flaxheads' own: named by the fingerprint of what it
    holds) with a warning naming it when it does not read back whole with `rows` rows, so that
    `map` builds it again instead of failing on it with an Arrow error that names no file."""
    if not file.is_file():
        return
    try:
        cached = datasets.Dataset.from_file(str(file))
        found = cached.num_rows
        del cached  # its memory map, before the file goes
        problem = None if found == rows else f"{found} rows, and the split has {rows}"
    except Exception as error:  # noqa: BLE001 (Arrow says damage in several exception types)
        problem = f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}"
    if problem is not None:
        print(f"warning: the tokenized cache {file} is damaged ({problem}); it is removed and the split tokenized "
              "again", file=sys.stderr)
        file.unlink()


def tokenize_texts(
    texts: Sequence[str], tokenizer, max_seq_length: int, text_pairs: Sequence[str] | None = None
) -> datasets.Dataset:
    """Texts to classify (and their second texts), tokenised exactly as `tokenize_split` tokenises
    a split, in memory and uncached: the same columns without `labels`, ready for `eval_batches`.

    Raises ValueError if `max_seq_length` exceeds the tokenizer's `model_max_length`.
    """
    _check_max_length(tokenizer, max_seq_length)
    columns = encode(list(texts), None if text_pairs is None else list(text_pairs), tokenizer, max_seq_length)
    features = tokenized_features(tokenizer)
    # Not `Dataset.from_dict`: it fingerprints the rows (pickling the table) for a cache this
    # in-memory dataset never enters, and that was most of a short pipeline call's own time.
    table = pa.Table.from_pydict({name: columns[name] for name in features}, schema=features.arrow_schema)
    return datasets.Dataset(InMemoryTable(table), info=datasets.DatasetInfo(features=features),
                            fingerprint=generate_random_fingerprint())


def _check_max_length(tokenizer, max_seq_length: int) -> None:
    if not 0 < max_seq_length <= tokenizer.model_max_length:
        raise ValueError(
            f"max_seq_length={max_seq_length}: it must be in [1, {tokenizer.model_max_length}], the "
            "tokenizer's model_max_length"
        )


def tokenizer_fingerprint(tokenizer) -> str:
    """A hash of everything that decides a fast tokenizer's ids, stable across processes.

    The backend's truncation and padding state is left out: it changes with every call that
    truncates or pads, without changing what the pipeline tokenises to.
    """
    return _pipeline_fingerprint(type(tokenizer).__name__, tokenizer.backend_tokenizer.to_str(),
                                 tuple(tokenizer.model_input_names))


def _pipeline_fingerprint(name: str, pipeline: str, input_names: tuple[str, ...]) -> str:
    # Parsing and re-serialising a vocabulary of 30k entries costs 0.05-0.3 s (the garbage
    # collector walks a large process's heap as the entries are made), and a run asks for the
    # fingerprint once per split and once for its identity: the same serialised pipeline gives the
    # same fingerprint, so it is computed once per pipeline (keyed by a hash of it, 1 ms).
    key = (name, hashlib.sha256(pipeline.encode()).hexdigest(), input_names)
    if key not in _FINGERPRINTS:
        parsed = json.loads(pipeline)
        parsed.pop("truncation", None)
        parsed.pop("padding", None)
        if len(_FINGERPRINTS) >= 16:
            _FINGERPRINTS.pop(next(iter(_FINGERPRINTS)))
        _FINGERPRINTS[key] = Hasher.hash([name, json.dumps(parsed, sort_keys=True), list(input_names)])
    return _FINGERPRINTS[key]


_FINGERPRINTS: dict[tuple[str, str, tuple[str, ...]], str] = {}


def tokenized_features(tokenizer, label_feature=None, *, per_example: int = 1) -> datasets.Features:
    """The tokenised columns; `labels` only when a `label_feature` is given; a list of
    `per_example` sequences per example when that is not 1 (pairs, choices)."""
    ids = datasets.List(datasets.Value("int32"))
    if per_example != 1:
        ids = datasets.List(ids, length=per_example)
    names = ["input_ids", "attention_mask"]
    if "token_type_ids" in tokenizer.model_input_names:
        names.append("token_type_ids")
    labels = {} if label_feature is None else {LABELS: label_feature}
    return datasets.Features({**{name: ids for name in names}, **labels, LENGTH: datasets.Value("int32")})


def _tokenize_batch(batch: dict[str, list], *, tokenizer, max_seq_length: int) -> dict[str, list]:
    if CHOSEN in batch:
        texts = [text for pair in zip(batch[CHOSEN], batch[REJECTED]) for text in pair]
        columns = encode_groups(texts, None, 2, tokenizer, max_seq_length)
    else:
        columns = encode(batch[TEXT], batch.get(TEXT_PAIR), tokenizer, max_seq_length)
    columns[LABELS] = batch[LABEL]
    return columns


def encode_groups(texts: list[str], text_pairs: list[str] | None, size: int, tokenizer, max_seq_length: int
                  ) -> dict[str, list]:
    """`encode` of texts that come in consecutive groups of `size`, one group per example: per
    example the list of its group's sequences, and `length` the longest of them."""
    flat = encode(texts, text_pairs, tokenizer, max_seq_length)
    return {name: [max(values[i:i + size]) if name == LENGTH else values[i:i + size]
                   for i in range(0, len(values), size)] for name, values in flat.items()}


def encode(texts: list[str], text_pairs: list[str] | None, tokenizer, max_seq_length: int) -> dict[str, list]:
    """Unpadded ids, masks (and token types) of texts, truncated to `max_seq_length`, and `length`."""
    encoded = tokenizer(
        texts,
        text_pairs,
        truncation=True,
        max_length=max_seq_length,
        return_attention_mask=True,
        return_token_type_ids="token_type_ids" in tokenizer.model_input_names,
    )
    columns = {"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"]}
    if "token_type_ids" in encoded:
        columns["token_type_ids"] = encoded["token_type_ids"]
    columns[LENGTH] = [len(ids) for ids in encoded["input_ids"]]
    empty = [i for i, length in enumerate(columns[LENGTH]) if length == 0]
    if empty:
        raise ValueError(
            f"{len(empty)} text(s) give no tokens at all (e.g. {texts[empty[0]]!r}): they are empty and the tokenizer "
            "adds no special tokens, so the model would have nothing to read and any score would be made up "
            "(transformers raises too). Remove them, or give them text"
        )
    return columns
