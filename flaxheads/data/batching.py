"""Padded numpy batches from a tokenised split: a resumable shuffled training stream and an
evaluation pass that sees every example exactly once.

Shapes. The batch size is fixed and the sequence length is padded up to a bucket from
`bucket_lengths(max_seq_length)`, so a jitted step compiles at most once per bucket.

Filler rows. A global batch that runs out of examples (the last of an epoch or of an
evaluation pass) is completed with copies of its own first example carrying `example_mask` 0.
Copies rather than all-padding rows keep every row a well-formed sequence: a fully masked row
turns a `-inf` attention bias into NaN, and a NaN loss times a 0 mask is still NaN.

Several hosts. With `process_count` P every process builds the same global batch plan and keeps
rows `[p * B/P, (p + 1) * B/P)` of it, reading only those rows from the split. The bucket comes
from the lengths of the whole global batch, so all processes pad to the same shape.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Sequence

import datasets
import numpy as np

from flaxheads.data.task import PROBLEM_TYPES, REGRESSION, SINGLE_LABEL, TaskData
from flaxheads.data.tokenization import LABELS, LENGTH

Batch = dict[str, np.ndarray]
SMALLEST_BUCKET = 16


def bucket_lengths(max_seq_length: int, smallest: int = SMALLEST_BUCKET) -> tuple[int, ...]:
    """The padded lengths a batch may have: powers of two from `smallest` below `max_seq_length`,
    then `max_seq_length` itself (e.g. 100 -> (16, 32, 64, 100); 8 -> (8,))."""
    buckets = []
    length = smallest
    while length < max_seq_length:
        buckets.append(length)
        length *= 2
    return (*buckets, max_seq_length)


def bucket_for(longest: int, buckets: Sequence[int]) -> int:
    """The smallest bucket >= `longest`; ValueError if `longest` exceeds the largest bucket."""
    for bucket in buckets:
        if bucket >= longest:
            return bucket
    raise ValueError(
        f"an example has {longest} tokens, more than the largest bucket {buckets[-1]}; tokenise "
        "with the same max_seq_length as the batches"
    )


@dataclasses.dataclass(frozen=True)
class BatchFormat:
    """How examples become arrays: padding values, padding side, label layout."""

    max_seq_length: int
    pad_token_id: int
    pad_token_type_id: int = 0
    padding_side: str = "right"
    """"right" for BERT, RoBERTa, GPT-2; "left" for XLNet, which reads its summary token last."""
    problem_type: str = SINGLE_LABEL
    num_labels: int = 2
    """Width of multi-label rows; unused by the other problem types."""

    def __post_init__(self):
        if self.padding_side not in ("right", "left"):
            raise ValueError(f"padding_side must be 'right' or 'left', got {self.padding_side!r}")
        if self.problem_type not in PROBLEM_TYPES:
            raise ValueError(f"problem_type={self.problem_type!r} is not one of {PROBLEM_TYPES}")

    @classmethod
    def for_task(cls, task: TaskData, tokenizer, max_seq_length: int, padding_side: str | None = None):
        """Pad values from `tokenizer`, label layout from `task`; `padding_side` defaults to the
        tokenizer's. A tokenizer without a pad token (GPT-2) pads with its end-of-text token;
        heads find real tokens through `attention_mask`, so the pad id only has to be valid."""
        pad_token_id = tokenizer.pad_token_id
        if pad_token_id is None:
            pad_token_id = tokenizer.eos_token_id
        if pad_token_id is None:
            raise ValueError("the tokenizer has neither a pad token nor an end-of-sequence token to pad with")
        return cls(
            max_seq_length=max_seq_length,
            pad_token_id=pad_token_id,
            pad_token_type_id=getattr(tokenizer, "pad_token_type_id", 0),
            padding_side=padding_side or tokenizer.padding_side,
            problem_type=task.problem_type,
            num_labels=task.num_labels,
        )

    @property
    def buckets(self) -> tuple[int, ...]:
        return bucket_lengths(self.max_seq_length)


@dataclasses.dataclass(frozen=True)
class DataPosition:
    """Where a training stream stands: the next batch is batch `batch_in_epoch` of `epoch`."""

    epoch: int = 0
    batch_in_epoch: int = 0

    def to_dict(self) -> dict[str, int]:
        """Plain ints, for a checkpoint."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, saved: dict) -> DataPosition:
        return cls(epoch=int(saved["epoch"]), batch_in_epoch=int(saved["batch_in_epoch"]))


def epoch_order(num_examples: int, seed: int, epoch: int) -> np.ndarray:
    """The order in which epoch `epoch` visits the examples: a permutation of
    `range(num_examples)` that depends only on `(seed, epoch)`."""
    return np.random.default_rng([seed, epoch]).permutation(num_examples)


def length_grouped_order(
    lengths: np.ndarray, seed: int, epoch: int, global_batch_size: int, batches_per_group: int = 32
) -> np.ndarray:
    """`epoch_order`, rearranged so each global batch holds examples of similar length.

    The shuffled order is cut into groups of `batches_per_group` batches; each group is sorted
    by length and cut into batches, and the batches of the epoch are shuffled again. Batches stay
    random in content and order, but pad to smaller buckets (the idea of transformers'
    `group_by_length`). Depends only on (lengths, seed, epoch), so resuming stays exact.
    """
    order = epoch_order(len(lengths), seed, epoch)
    group = global_batch_size * batches_per_group
    # A stable sort keeps ties in shuffled order.
    chunks = [c[np.argsort(-lengths[c], kind="stable")] for c in np.split(order, range(group, len(order), group))]
    grouped = np.concatenate(chunks)
    batches = np.split(grouped, range(global_batch_size, len(grouped), global_batch_size))
    # The partial batch stays last so the epoch still ends with the only filler rows.
    full, last = (batches[:-1], batches[-1:]) if len(batches[-1]) < global_batch_size else (batches, [])
    shuffled = [full[i] for i in np.random.default_rng([seed, epoch, 1]).permutation(len(full))]
    return np.concatenate(shuffled + last)


def num_batches(num_examples: int, global_batch_size: int) -> int:
    """Global batches needed to see every example once, the last one completed with filler."""
    return math.ceil(num_examples / global_batch_size)


class TrainBatches:
    """An endless stream of training batches, reshuffled each epoch and resumable anywhere.

    Each epoch visits every example exactly once, in `epoch_order(n, seed, epoch)`, as
    `num_batches(n, global_batch_size)` global batches; the last is completed with filler rows.
    `position` is the position of the next batch: save `position.to_dict()` with a checkpoint,
    and a stream started from `DataPosition.from_dict(saved)` yields exactly the batches an
    uninterrupted stream would have yielded from there.

    Each batch is this process's `global_batch_size // process_count` rows (see `make_batch`).
    """

    def __init__(
        self,
        dataset: datasets.Dataset,
        batch_format: BatchFormat,
        *,
        global_batch_size: int,
        seed: int = 0,
        start: DataPosition = DataPosition(),
        process_index: int = 0,
        process_count: int = 1,
        group_by_length: bool = False,
    ):
        if len(dataset) == 0:
            raise ValueError("cannot train on an empty split")
        self._group_by_length = group_by_length
        _check_processes(global_batch_size, process_index, process_count)
        self._dataset = dataset
        self._lengths = example_lengths(dataset)
        self._format = batch_format
        self._global_batch_size = global_batch_size
        self._seed = seed
        self._process_index = process_index
        self._process_count = process_count
        self.batches_per_epoch = num_batches(len(dataset), global_batch_size)
        self.position = start
        self._order_epoch, self._order = None, None

    def __iter__(self) -> Iterator[Batch]:
        return self

    def __next__(self) -> Batch:
        batch = self.batch_at(self.position)
        next_batch = self.position.batch_in_epoch + 1
        if next_batch == self.batches_per_epoch:
            self.position = DataPosition(self.position.epoch + 1, 0)
        else:
            self.position = DataPosition(self.position.epoch, next_batch)
        return batch

    def batch_at(self, position: DataPosition) -> Batch:
        """The batch at `position`, without moving the stream."""
        if not 0 <= position.batch_in_epoch < self.batches_per_epoch:
            raise ValueError(f"{position} is outside an epoch of {self.batches_per_epoch} batches")
        start = position.batch_in_epoch * self._global_batch_size
        examples = self._epoch_order(position.epoch)[start : start + self._global_batch_size]
        return make_batch(
            self._dataset,
            self._lengths,
            examples,
            self._format,
            global_batch_size=self._global_batch_size,
            process_index=self._process_index,
            process_count=self._process_count,
        )

    def _epoch_order(self, epoch: int) -> np.ndarray:
        if self._order_epoch != epoch:  # one permutation per epoch, not per batch
            if self._group_by_length:
                order = length_grouped_order(self._lengths, self._seed, epoch, self._global_batch_size)
            else:
                order = epoch_order(len(self._dataset), self._seed, epoch)
            self._order_epoch, self._order = epoch, order
        return self._order


def eval_batches(
    dataset: datasets.Dataset,
    batch_format: BatchFormat,
    *,
    global_batch_size: int,
    process_index: int = 0,
    process_count: int = 1,
) -> Iterator[Batch]:
    """One pass over `dataset` in order, `num_batches(len(dataset), global_batch_size)` batches.

    Concatenating the rows with `example_mask` 1 across processes and batches gives every
    example exactly once, in dataset order; the last batch is completed with filler rows.
    """
    _check_processes(global_batch_size, process_index, process_count)
    lengths = example_lengths(dataset)
    for start in range(0, len(dataset), global_batch_size):
        examples = np.arange(start, min(start + global_batch_size, len(dataset)))
        yield make_batch(
            dataset,
            lengths,
            examples,
            batch_format,
            global_batch_size=global_batch_size,
            process_index=process_index,
            process_count=process_count,
        )


def example_lengths(dataset: datasets.Dataset) -> np.ndarray:
    """Token count of every example: the `length` column `tokenize_split` adds, if present."""
    if LENGTH in dataset.column_names:
        return np.asarray(dataset[LENGTH], dtype=np.int64)
    return np.asarray([len(ids) for ids in dataset["input_ids"]], dtype=np.int64)


def make_batch(
    dataset: datasets.Dataset,
    lengths: np.ndarray,
    examples: np.ndarray,
    batch_format: BatchFormat,
    *,
    global_batch_size: int,
    process_index: int = 0,
    process_count: int = 1,
) -> Batch:
    """This process's slice of the global batch holding `examples` (1 to global_batch_size
    dataset indices) followed by filler rows.

    Returns, for B = global_batch_size // process_count and T the global batch's bucket:
    `input_ids`, `attention_mask` and (if the split has them) `token_type_ids` int32 (B, T);
    `labels` int32 (B,) single-label, float32 (B,) regression or float32 (B, num_labels)
    multi-label (absent if the split has none); `example_mask` float32 (B,), 1 for real rows.
    """
    if not 0 < len(examples) <= global_batch_size:
        raise ValueError(f"a batch needs 1 to {global_batch_size} examples, got {len(examples)}")
    padded_length = bucket_for(int(lengths[examples].max()), batch_format.buckets)
    rows = np.full(global_batch_size, examples[0])
    rows[: len(examples)] = examples
    example_mask = (np.arange(global_batch_size) < len(examples)).astype(np.float32)
    local_size = global_batch_size // process_count
    local = slice(process_index * local_size, (process_index + 1) * local_size)
    records = dataset[rows[local].tolist()]
    return _collate(records, padded_length, example_mask[local], batch_format)


def _check_processes(global_batch_size: int, process_index: int, process_count: int) -> None:
    if global_batch_size <= 0 or global_batch_size % process_count:
        raise ValueError(
            f"the global batch size {global_batch_size} must be a positive multiple of the "
            f"process count {process_count}"
        )
    if not 0 <= process_index < process_count:
        raise ValueError(f"process_index {process_index} is outside [0, {process_count})")


def _collate(
    records: dict[str, list], padded_length: int, example_mask: np.ndarray, fmt: BatchFormat
) -> Batch:
    pad_values = {"input_ids": fmt.pad_token_id, "attention_mask": 0, "token_type_ids": fmt.pad_token_type_id}
    batch = {
        name: _pad(records[name], padded_length, pad_value, fmt.padding_side)
        for name, pad_value in pad_values.items()
        if name in records
    }
    if LABELS in records:
        batch["labels"] = _labels(records[LABELS], fmt)
    batch["example_mask"] = example_mask
    return batch


def _pad(sequences: Sequence[Sequence[int]], padded_length: int, pad_value: int, side: str) -> np.ndarray:
    padded = np.full((len(sequences), padded_length), pad_value, dtype=np.int32)
    for row, sequence in enumerate(sequences):
        if side == "right":
            padded[row, : len(sequence)] = sequence
        else:
            padded[row, padded_length - len(sequence) :] = sequence
    return padded


def _labels(values: list, fmt: BatchFormat) -> np.ndarray:
    if fmt.problem_type == SINGLE_LABEL:
        return np.asarray(values, dtype=np.int32)
    if fmt.problem_type == REGRESSION:
        return np.asarray(values, dtype=np.float32)
    return np.asarray(values, dtype=np.float32).reshape(len(values), fmt.num_labels)
