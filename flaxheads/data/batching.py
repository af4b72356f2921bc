"""Padded numpy batches from a tokenised split: a resumable shuffled training stream and an
evaluation pass that sees every example exactly once.

Shapes. The batch size is fixed and the sequence length is padded up to a bucket from
`bucket_lengths(max_seq_length, pad_to_multiple_of)`, so a jitted step compiles at most once per
bucket.

Data shards. A split's rows are cut into `num_shards` S contiguous shards (the boundaries of
`np.array_split`), and rows `[s * B/S, (s + 1) * B/S)` of every global batch of B rows come from
shard s: in each epoch's order of that shard for training, in index order for evaluation. With
S = 1 the whole split is one shard, walked in one order.

Filler rows. A shard that runs out of examples (in the last batches of an epoch or of an
evaluation pass) completes its part of the batch with copies of that part's first example, or,
once it has none left, of the shard's shortest example, carrying `example_mask` 0. Copies rather
than all-padding rows keep every row a well-formed sequence: a fully masked row turns a `-inf`
attention bias into NaN, and a NaN loss times a 0 mask is still NaN.

Several hosts. With `process_count` P every process builds the same global batch plan and keeps
rows `[p * B/P, (p + 1) * B/P)` of it. When S is a multiple of P those rows are exactly the parts
of shards `[p * S/P, (p + 1) * S/P)`, so a process needs (and tokenises) only those shards' rows
(`process_rows`); it is given them together with the lengths of every example of the split, from
which all processes pick the same bucket for a global batch and pad to the same shape.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Iterator, Sequence

import datasets
import numpy as np

from flaxheads import problem
from flaxheads.problem import IGNORE_INDEX
from flaxheads.data.packing import EMPTY, RowPlan, pack_sequences
from flaxheads.data.task import SINGLE_LABEL, TaskData, column_array
from flaxheads.data.tokenization import LABELS, LENGTH
from flaxheads.names import PAD_TO_MULTIPLE_OF  # default rounding of a padded length, and why
from flaxheads.tokenizer import pad_token_ids

Batch = dict[str, np.ndarray]
SMALLEST_BUCKET = 16
SAMPLING = ("random", "group_by_length", "sequential")
"""How `TrainBatches` orders each epoch's examples."""


HALF_OCTAVES = -1
"""`pad_to_multiple_of` for powers of two and the midpoints between them (16, 24, 32, 48, 64, 96,
128, ...): two shapes an octave, so their count grows with log(`max_seq_length`) as powers of
two's does, with a third less padding on texts of natural lengths (`flaxheads serve` pads its
classifiers so: movie snippets of 27 tokens, in batches of 16 cut as it cuts them, pad to 35.5
tokens a text, against 40.2 with powers of two and 34.4 with multiples of 8, which at 128 tokens
are twice the shapes)."""


def bucket_lengths(max_seq_length: int, multiple: int = PAD_TO_MULTIPLE_OF, smallest: int = SMALLEST_BUCKET
                   ) -> tuple[int, ...]:
    """The padded lengths a batch may have, ending at `max_seq_length`: multiples of `multiple`
    from `smallest` (e.g. 8 -> 16, 24, ..., 120, 128), or, with `multiple` 0, powers of two from
    `smallest` (e.g. 100 -> (16, 32, 64, 100); 8 -> (8,)), or, with `multiple` `HALF_OCTAVES`,
    those and the midpoints between them (e.g. 100 -> (16, 24, 32, 48, 64, 96, 100))."""
    if multiple < HALF_OCTAVES:
        raise ValueError(f"pad_to_multiple_of must be 0 (powers of two), {HALF_OCTAVES} (powers of two and the "
                         f"midpoints between them) or positive, got {multiple}")
    if multiple > 0:
        first = -(-smallest // multiple) * multiple
        return (*range(first, max_seq_length, multiple), max_seq_length)
    buckets = []
    length = smallest
    while length < max_seq_length:
        buckets.append(length)
        if multiple == HALF_OCTAVES and length + length // 2 < max_seq_length:
            buckets.append(length + length // 2)
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
class ExampleFormat:
    """What one example is in a batch, whatever the task: how many sequences it is read as, what
    its label looks like, and whether several examples may share a packed row. A task's data
    (`TaskData.example_format`) says it; batching follows it without knowing the task."""

    grouped: bool = False
    """Each example is a group of sequences read together, (B, G, T) in a batch: a preference
    pair's two texts, a multiple-choice example's choices; every example of a split has G."""
    label_dtype: str = "int32"
    label_width: int | None = None
    """None: one label value per example, (B,); k: k values per example, (B, k) (multi-hot rows)."""
    token_labels: bool = False
    """One label per token, (B, T) of `label_dtype`, padded like the tokens with `IGNORE_INDEX`."""
    unpacked_because: str = ""
    """Why sequence packing does not apply to such examples ("" : it does)."""

    def labels(self, values: list) -> np.ndarray:
        """The batch's per-example labels: (B,) or (B, label_width) of `label_dtype`."""
        shape = (len(values),) if self.label_width is None else (len(values), self.label_width)
        return np.asarray(values, dtype=self.label_dtype).reshape(shape)


def problem_type_format(problem_type: str, num_labels: int = 2) -> ExampleFormat:
    """The examples of a text classifier's data of `problem_type` (`flaxheads.problem`): class ids
    (B,) int32, scores (B,) float32, multi-hot rows (B, num_labels) float32, or preference pairs
    of two texts, (B, 2, T), with a float margin each."""
    return problem.by_problem_type(
        problem_type,
        single_label=ExampleFormat(),
        regression=ExampleFormat(label_dtype="float32"),
        multi_label=ExampleFormat(label_dtype="float32", label_width=num_labels),
        pairwise_reward=ExampleFormat(
            grouped=True, label_dtype="float32",
            unpacked_because="preference pairs (problem_type pairwise_reward): each pair is scored as two rows"),
    )


def examples_of(task: TaskData) -> ExampleFormat:
    """What an example of `task` is in a batch: its task's format, else its problem type's."""
    return task.example_format or problem_type_format(task.problem_type, task.num_labels)


@dataclasses.dataclass(frozen=True)
class BatchFormat:
    """How examples become arrays: padding values, padding side, the examples' format."""

    max_seq_length: int
    pad_token_id: int
    pad_token_type_id: int = 0
    padding_side: str = "right"
    """"right" for BERT, RoBERTa, GPT-2; "left" for XLNet, which reads its summary token last."""
    problem_type: str | None = SINGLE_LABEL
    """A text classifier's problem type, which gives `example` (None: `example_format` does)."""
    num_labels: int = 2
    """Width of multi-label rows; unused by the other problem types."""
    pad_to_multiple_of: int = PAD_TO_MULTIPLE_OF
    """A batch pads to its longest row rounded up to a multiple of this (from 16, at most
    max_seq_length); 0: to powers of two (fewer compiled shapes, more padding)."""
    max_segments: int = 0
    """Sequence packing: > 0 makes every row exactly max_seq_length tokens holding up to this many
    examples, padded on the right (see the module docstring); 0: one example per row."""
    example_format: ExampleFormat | None = None
    """The examples' format when a task gives its own (`TaskData.example_format`); None: the
    problem type's (`problem_type_format`)."""

    def __post_init__(self):
        if self.padding_side not in ("right", "left"):
            raise ValueError(f"padding_side must be 'right' or 'left', got {self.padding_side!r}")
        if self.example_format is None:
            if self.problem_type is None:
                raise ValueError("BatchFormat needs a problem_type or an example_format")
            problem.require_known(self.problem_type)
        if self.max_segments < 0:
            raise ValueError(f"max_segments must be 0 (no packing) or positive, got {self.max_segments}")
        if self.max_segments and self.example.unpacked_because:
            raise ValueError(f"sequence packing (TrainConfig(packing=True), --packing) does not apply to "
                             f"{self.example.unpacked_because}. Train without packing")
        bucket_lengths(self.max_seq_length, self.pad_to_multiple_of)  # its error names a bad value

    @property
    def example(self) -> ExampleFormat:
        """The examples' format: `example_format`, else the problem type's."""
        if self.example_format is not None:
            return self.example_format
        return problem_type_format(self.problem_type, self.num_labels)

    @classmethod
    def for_task(cls, task: TaskData, tokenizer, max_seq_length: int, padding_side: str | None = None, *,
                 model_pad_token_id: int | None = None, pad_to_multiple_of: int = PAD_TO_MULTIPLE_OF,
                 max_segments: int = 0):
        """Pad values from `tokenizer` and the model's `model_pad_token_id` (its config's
        pad_token_id) as `pad_token_ids` decides them, the examples' format from `task`;
        `padding_side` defaults to the tokenizer's."""
        return cls(
            max_seq_length=max_seq_length,
            pad_token_id=pad_token_ids(tokenizer, model_pad_token_id).input_ids,
            pad_token_type_id=getattr(tokenizer, "pad_token_type_id", 0),
            padding_side=padding_side or tokenizer.padding_side,
            problem_type=task.problem_type,
            num_labels=task.num_labels,
            pad_to_multiple_of=pad_to_multiple_of,
            max_segments=max_segments,
            example_format=task.example_format,
        )

    @property
    def buckets(self) -> tuple[int, ...]:
        return bucket_lengths(self.max_seq_length, self.pad_to_multiple_of)

    @property
    def packed(self) -> bool:
        return self.max_segments > 0


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


def epoch_order(num_examples: int, seed: int, epoch: int, shard: int | None = None) -> np.ndarray:
    """The order in which epoch `epoch` visits the examples: a permutation of
    `range(num_examples)` that depends only on `(seed, epoch)`, and on `shard` when the split is
    cut into several data shards (None: a single shard)."""
    return np.random.default_rng(_stream(seed, epoch, shard)).permutation(num_examples)


def length_grouped_order(
    lengths: np.ndarray, seed: int, epoch: int, batch_size: int, batches_per_group: int = 32,
    shard: int | None = None,
) -> np.ndarray:
    """`epoch_order`, rearranged so each batch of `batch_size` rows (a shard's part of a global
    batch) holds examples of similar length.

    The shuffled order is cut into groups of `batches_per_group` batches; each group is sorted
    by length and cut into batches, and the batches of the epoch are shuffled again. Batches stay
    random in content and order, but pad to smaller buckets (the idea of transformers'
    `group_by_length`). Depends only on (lengths, seed, epoch, shard), so resuming stays exact.
    """
    order = epoch_order(len(lengths), seed, epoch, shard)
    group = batch_size * batches_per_group
    # A stable sort keeps ties in shuffled order.
    chunks = [c[np.argsort(-lengths[c], kind="stable")] for c in np.split(order, range(group, len(order), group))]
    grouped = np.concatenate(chunks)
    batches = np.split(grouped, range(batch_size, len(grouped), batch_size))
    # The partial batch stays last so the epoch still ends with the only filler rows.
    full, last = (batches[:-1], batches[-1:]) if len(batches[-1]) < batch_size else (batches, [])
    shuffled = [full[i] for i in np.random.default_rng(_stream(seed, epoch, shard, 1)).permutation(len(full))]
    return np.concatenate(shuffled + last)


def _stream(seed: int, epoch: int, shard: int | None, *more: int) -> list[int]:
    """Seed of a random stream. A single shard (None) keys on (seed, epoch) alone, as runs did
    before data shards, so their data order is unchanged."""
    return [seed, epoch, *([] if shard is None else [shard]), *more]


def num_batches(num_examples: int, global_batch_size: int) -> int:
    """Global batches needed to see every example once, the last one completed with filler.

    The same for any number of data shards S: the largest shard has ceil(n / S) examples, and
    ceil(ceil(n / S) / (B / S)) = ceil(n / B).
    """
    return math.ceil(num_examples / global_batch_size)


def shard_bounds(num_examples: int, num_shards: int) -> np.ndarray:
    """(num_shards + 1,) int64: shard s is rows `[bounds[s], bounds[s + 1])`, cut as
    `np.array_split` cuts (the first `num_examples % num_shards` shards one row longer)."""
    if num_shards <= 0:
        raise ValueError(f"the number of data shards must be positive, got {num_shards}")
    sizes = np.full(num_shards, num_examples // num_shards, dtype=np.int64)
    sizes[: num_examples % num_shards] += 1
    return np.concatenate([[0], np.cumsum(sizes)])


def process_shards(num_shards: int, process_index: int = 0, process_count: int = 1) -> range:
    """The shards with rows in process p's slice of every global batch: `[p * S/P, (p + 1) * S/P)`
    when S is a multiple of P, so that each shard is read by one process; with S = 1, the whole
    split, read by every process."""
    return range(process_index * num_shards // process_count, -(-(process_index + 1) * num_shards // process_count))


def process_rows(num_examples: int, num_shards: int, process_index: int = 0, process_count: int = 1) -> range:
    """The rows of a split of `num_examples` that a process reads: those of its `process_shards`,
    one contiguous range. Give `TrainBatches` and `eval_batches` exactly these rows."""
    bounds = shard_bounds(num_examples, num_shards)
    shards = process_shards(num_shards, process_index, process_count)
    return range(int(bounds[shards.start]), int(bounds[shards.stop]))


class TrainBatches:
    """An endless stream of training batches, reshuffled each epoch and resumable anywhere.

    Each epoch visits every example exactly once, as `num_batches(n, global_batch_size)` global
    batches; the last ones are completed with filler rows. With one data shard the epoch's order
    is `epoch_order(n, seed, epoch)` (or `length_grouped_order` with `sampling="group_by_length"`,
    or the split's own order, every epoch, with `sampling="sequential"`); with
    `num_shards` S > 1 each shard is walked in its own such order (`shard=s`), and part s of every
    global batch comes from shard s (see the module docstring). `position` is the position of the
    next batch: save `position.to_dict()` with a checkpoint, and a stream started from
    `DataPosition.from_dict(saved)` yields exactly the batches an uninterrupted stream would have
    yielded from there.

    `dataset` is the split (a single process, or S = 1), or this process's `process_rows` of it
    with `lengths` the token counts of every example of the split. Each batch is this process's
    `global_batch_size // process_count` rows (see `make_batch`). The batches depend on
    (split, seed, global_batch_size, num_shards, sampling), not on the process count.

    `sampling`: "random", "group_by_length" or "sequential"; None: "group_by_length" when
    `group_by_length` is true, else "random".

    Packed (`batch_format.max_segments` > 0), a batch is `global_batch_size` packed rows and an
    epoch `batches_per_epoch(...)` of them: each shard's examples, in the epoch's order
    ("group_by_length" reads as "random": rows all have one length), fill its row plan, and the
    rows are shuffled with the same seed ("sequential": kept in plan order).
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
        num_shards: int = 1,
        lengths: np.ndarray | None = None,
        sampling: str | None = None,
    ):
        if (len(dataset) if lengths is None else len(lengths)) == 0:
            raise ValueError("cannot train on an empty split")
        self.sampling = sampling or ("group_by_length" if group_by_length else "random")
        if self.sampling not in SAMPLING:
            raise ValueError(f"sampling={self.sampling!r}: choose one of {', '.join(SAMPLING)}")
        self._split = _ShardedSplit(
            dataset, lengths, batch_format, global_batch_size=global_batch_size, num_shards=num_shards,
            process_index=process_index, process_count=process_count,
        )
        self._seed = seed
        self.batches_per_epoch = self._split.num_batches
        self.position = start
        self._order_epoch, self._orders = None, None

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
        return self._split.batch(self._epoch_orders(position.epoch), position.batch_in_epoch)

    def _epoch_orders(self, epoch: int) -> list[np.ndarray]:
        """Per shard, the split indices of its examples (packed: the rows of its examples) in
        the order epoch `epoch` takes them."""
        if self._order_epoch != epoch:  # one permutation per shard and epoch, not per batch
            split = self._split
            orders = []
            for shard, (first, end) in enumerate(split.shard_ranges):
                key = None if len(split.shard_ranges) == 1 else shard
                if self.sampling == "sequential":  # the data's own order, the same every epoch
                    order = np.arange(end - first)
                elif self.sampling == "group_by_length" and not split.packed:  # packed rows have one length
                    order = length_grouped_order(split.lengths[first:end], self._seed, epoch, split.part_size,
                                                 shard=key)
                else:
                    order = epoch_order(end - first, self._seed, epoch, key)
                order = first + order
                if split.packed:
                    order = split.packed_rows(shard, order)
                    if self.sampling != "sequential":
                        order = order[np.random.default_rng(_stream(self._seed, epoch, key, 2)).permutation(len(order))]
                orders.append(order)
            self._order_epoch, self._orders = epoch, orders
        return self._orders


def eval_batches(
    dataset: datasets.Dataset,
    batch_format: BatchFormat,
    *,
    global_batch_size: int,
    process_index: int = 0,
    process_count: int = 1,
    num_shards: int = 1,
    lengths: np.ndarray | None = None,
) -> Iterator[Batch]:
    """One pass over the split, `num_batches(n, global_batch_size)` batches; part s of each global
    batch walks shard s in index order (one shard: the whole split in order).

    Concatenating the rows with `example_mask` 1 across processes and batches gives every
    example exactly once (in dataset order when `num_shards` is 1); the last batches are completed
    with filler rows. `dataset` and `lengths` are as for `TrainBatches`.
    """
    split = _ShardedSplit(
        dataset, lengths, batch_format, global_batch_size=global_batch_size, num_shards=num_shards,
        process_index=process_index, process_count=process_count,
    )
    in_order = [np.arange(first, end) for first, end in split.shard_ranges]
    if split.packed:
        in_order = [split.packed_rows(shard, order) for shard, order in enumerate(in_order)]
    for batch_index in range(split.num_batches):
        yield split.batch(in_order, batch_index)


def batches_per_epoch(lengths: np.ndarray, batch_format: BatchFormat, *, global_batch_size: int,
                      num_shards: int = 1) -> int:
    """Global batches in an epoch (or an evaluation pass) over a split whose examples have
    `lengths` tokens: `num_batches` of its examples, or, packed, of each shard's rows (the most
    of any shard)."""
    if not batch_format.packed:
        return num_batches(len(lengths), global_batch_size)
    plans = _shard_plans(np.asarray(lengths), batch_format, shard_bounds(len(lengths), num_shards))
    return _packed_num_batches(plans, global_batch_size // num_shards)


def fitted_batch_size(lengths: np.ndarray, batch_format: BatchFormat, *, global_batch_size: int, unit: int,
                      num_shards: int = 1) -> int:
    """The global batch an evaluation pass over a split whose examples have `lengths` tokens takes:
    `global_batch_size`, or, when the whole split fits in one batch, the smallest multiple of
    `unit` (what divides over the devices and data shards) times a power of two that still holds
    it, so that a split of 3 examples is not padded to a batch of 64 (with 4 choices each, 256
    sequences; the same logits either way, one more compiled shape)."""
    if batches_per_epoch(lengths, batch_format, global_batch_size=global_batch_size, num_shards=num_shards) > 1:
        return global_batch_size
    size = unit
    while size < global_batch_size and batches_per_epoch(lengths, batch_format, global_batch_size=size,
                                                         num_shards=num_shards) > 1:
        size *= 2
    return min(size, global_batch_size)


def packed_num_rows(lengths: np.ndarray, batch_format: BatchFormat, *, num_shards: int = 1) -> int:
    """Packed rows that a split whose examples have `lengths` tokens fills, over all its shards."""
    plans = _shard_plans(np.asarray(lengths), batch_format, shard_bounds(len(lengths), num_shards))
    return sum(plan.num_rows for plan in plans)


def _shard_plans(lengths: np.ndarray, batch_format: BatchFormat, bounds: np.ndarray) -> list[RowPlan]:
    """The row plan of each data shard (shard s is examples `[bounds[s], bounds[s + 1])`)."""
    return [RowPlan.build(lengths[first:end], batch_format.max_seq_length, batch_format.max_segments)
            for first, end in itertools.pairwise(bounds)]


def _packed_num_batches(plans: Sequence[RowPlan], part_size: int) -> int:
    """Global batches until the shard with the most rows has given them all, `part_size` a batch."""
    return max(math.ceil(plan.num_rows / part_size) for plan in plans)


def example_lengths(dataset: datasets.Dataset) -> np.ndarray:
    """Token count of every example: the `length` column `tokenize_split` adds, if present."""
    if LENGTH in dataset.column_names:
        return column_array(dataset, LENGTH).astype(np.int64)
    return np.asarray([len(ids) for ids in dataset["input_ids"]], dtype=np.int64)


class _ShardedSplit:
    """This process's rows of a split cut into data shards, and how global batches take them."""

    def __init__(
        self,
        dataset: datasets.Dataset,
        lengths: np.ndarray | None,
        batch_format: BatchFormat,
        *,
        global_batch_size: int,
        num_shards: int,
        process_index: int,
        process_count: int,
    ):
        _check_processes(global_batch_size, process_index, process_count, num_shards)
        self.lengths = example_lengths(dataset) if lengths is None else np.asarray(lengths, dtype=np.int64)
        num_examples = len(self.lengths)
        if 0 < num_examples < num_shards:
            raise ValueError(f"a split of {num_examples} examples cannot be cut into {num_shards} data shards")
        rows = process_rows(num_examples, num_shards, process_index, process_count)
        if len(dataset) != len(rows):
            raise ValueError(
                f"process {process_index} of {process_count} reads rows [{rows.start}, {rows.stop}) of the "
                f"{num_examples} examples ({num_shards} data shards) but was given {len(dataset)} rows: pass "
                "exactly its `process_rows` and the `lengths` of the whole split"
            )
        bounds = shard_bounds(num_examples, num_shards)
        self.shard_ranges = [(int(first), int(end)) for first, end in itertools.pairwise(bounds)]
        # A shard that has run out pads with its shortest example: it rarely raises the bucket.
        self._shortest = [first + int(np.argmin(self.lengths[first:end])) if end > first else -1
                          for first, end in self.shard_ranges]
        self.part_size = global_batch_size // num_shards
        self._dataset, self._first_row, self._format = dataset, rows.start, batch_format
        self._process_index, self._process_count = process_index, process_count
        self.packed = batch_format.packed
        # Packed, every process plans every shard (from the lengths alone) to count the batches.
        self._plans = _shard_plans(self.lengths, batch_format, bounds) if self.packed else []
        self.num_batches = (_packed_num_batches(self._plans, self.part_size) if self.packed
                            else num_batches(num_examples, global_batch_size))

    def packed_rows(self, shard: int, order: np.ndarray) -> np.ndarray:
        """(rows, S) split indices (`EMPTY` for none) of shard `shard`'s packed rows, whose
        examples of equal length take the plan's slots in `order` (split indices of the shard)."""
        first = self.shard_ranges[shard][0]
        table = self._plans[shard].rows(order - first, self.lengths[first : self.shard_ranges[shard][1]])
        return np.where(table == EMPTY, EMPTY, table + first)

    def batch(self, shard_orders: Sequence[np.ndarray], batch_index: int) -> Batch:
        """This process's rows of global batch `batch_index`, whose part s holds rows
        `[b * B/S, (b + 1) * B/S)` of `shard_orders[s]` (split indices of shard s; packed: its
        rows of split indices), then filler."""
        if self.packed:
            return self._packed_batch(shard_orders, batch_index)
        rows, real = [], []
        for shard, order in enumerate(shard_orders):
            part = order[batch_index * self.part_size : (batch_index + 1) * self.part_size]
            filler = part[0] if len(part) else self._shortest[shard]
            rows.append(np.concatenate([part, np.full(self.part_size - len(part), filler, dtype=np.int64)]))
            real.append(np.arange(self.part_size) < len(part))
        return make_batch(
            self._dataset, self.lengths, np.concatenate(rows), np.concatenate(real).astype(np.float32),
            self._format, process_index=self._process_index, process_count=self._process_count,
            first_row=self._first_row,
        )


    def _packed_batch(self, shard_rows: Sequence[np.ndarray], batch_index: int) -> Batch:
        tables, real = [], []
        for shard, rows in enumerate(shard_rows):
            part = rows[batch_index * self.part_size : (batch_index + 1) * self.part_size]
            # A filler row holds the shard's shortest example alone, masked.
            filler = np.full((self.part_size - len(part), rows.shape[1]), EMPTY, np.int64)
            filler[:, 0] = self._shortest[shard]
            tables.append(np.concatenate([part, filler]))
            real.append(np.arange(self.part_size) < len(part))
        table = np.concatenate(tables)
        example_mask = ((table != EMPTY) & np.concatenate(real)[:, None]).astype(np.float32)
        return make_packed_batch(self._dataset, table, example_mask, self._format, process_index=self._process_index,
                                 process_count=self._process_count, first_row=self._first_row)


def process_slice(global_rows: int, process_index: int, process_count: int) -> slice:
    """The rows of a global batch of `global_rows` that process `process_index` of
    `process_count` holds: an equal, contiguous share."""
    local_size = global_rows // process_count
    return slice(process_index * local_size, (process_index + 1) * local_size)


def make_packed_batch(
    dataset: datasets.Dataset,
    table: np.ndarray,
    example_mask: np.ndarray,
    batch_format: BatchFormat,
    *,
    process_index: int = 0,
    process_count: int = 1,
    first_row: int = 0,
) -> Batch:
    """This process's slice of a global batch of packed rows: `table` (global rows, S) holds
    the split index in each slot (`EMPTY` for none), `example_mask` (global rows, S) is 1 for the
    real examples (0 for empty slots and filler rows). `dataset` is as for `make_batch`.

    Returns, for B = global rows // process_count, T = max_seq_length and S slots: `input_ids`,
    `attention_mask` (`segment_ids > 0`), `token_type_ids` (if the split has them) and
    `segment_ids` (1..S, 0 for padding) int32 (B, T), padded on the right; `labels` (B, S) or
    (B, S, num_labels) (absent if the split has none; 0 in empty slots); `example_mask` float32
    (B, S); `example_index` int32 (B, S), the split index of each real example, else -1.
    """
    local = process_slice(len(table), process_index, process_count)
    table, example_mask = table[local], example_mask[local]
    present = table != EMPTY
    records = dataset[(table[present] - first_row).tolist()]  # row-major, as pack_sequences reads them
    fmt = batch_format
    pad_values = {"input_ids": fmt.pad_token_id, "token_type_ids": fmt.pad_token_type_id}
    batch = pack_sequences({name: records[name] for name in pad_values if name in records}, table,
                           fmt.max_seq_length, {name: pad for name, pad in pad_values.items() if name in records})
    batch["attention_mask"] = (batch["segment_ids"] > 0).astype(np.int32)
    if LABELS in records:
        values = fmt.example.labels(records[LABELS])
        labels = np.zeros((*table.shape, *values.shape[1:]), values.dtype)
        labels[present] = values
        batch["labels"] = labels
    batch["example_mask"] = example_mask.astype(np.float32)
    batch["example_index"] = np.where(example_mask > 0, table, EMPTY).astype(np.int32)
    return batch


def make_batch(
    dataset: datasets.Dataset,
    lengths: np.ndarray,
    rows: np.ndarray,
    example_mask: np.ndarray,
    batch_format: BatchFormat,
    *,
    process_index: int = 0,
    process_count: int = 1,
    first_row: int = 0,
) -> Batch:
    """This process's slice of the global batch of split rows `rows` (global_batch_size indices,
    filler rows included), whose `example_mask` is 1 for real examples and 0 for fillers.

    `dataset` holds split rows `[first_row, first_row + len(dataset))`, which must include this
    process's slice of `rows`; `lengths` is the token count of every example of the split, so that
    every process pads to the bucket of the longest row of the whole global batch.

    Returns, for B = global_batch_size // process_count and T the global batch's bucket:
    `input_ids`, `attention_mask` and (if the split has them) `token_type_ids` int32 (B, T), or
    (B, 2, T) for preference pairs (chosen, rejected; both padded to the bucket of the longer), or
    (B, num_choices, T) for multiple choice;
    `labels` int32 (B,) single-label, float32 (B,) regression or pair margins, or float32
    (B, num_labels) multi-label (absent if the split has none); `example_mask` float32 (B,), 1
    for real rows.
    """
    padded_length = bucket_for(int(lengths[rows].max()), batch_format.buckets)
    local = process_slice(len(rows), process_index, process_count)
    records = dataset[(rows[local] - first_row).tolist()]
    return _collate(records, padded_length, example_mask[local], batch_format)


def _check_processes(global_batch_size: int, process_index: int, process_count: int, num_shards: int = 1) -> None:
    if global_batch_size <= 0 or global_batch_size % process_count:
        raise ValueError(
            f"the global batch size {global_batch_size} must be a positive multiple of the "
            f"process count {process_count}"
        )
    if num_shards <= 0 or global_batch_size % num_shards:
        raise ValueError(
            f"the global batch size {global_batch_size} must be a multiple of the number of data shards {num_shards}"
        )
    if not 0 <= process_index < process_count:
        raise ValueError(f"process_index {process_index} is outside [0, {process_count})")


def _collate(
    records: dict[str, list], padded_length: int, example_mask: np.ndarray, fmt: BatchFormat
) -> Batch:
    pad_values = {"input_ids": fmt.pad_token_id, "attention_mask": 0, "token_type_ids": fmt.pad_token_type_id}
    example = fmt.example
    pad = _pad_groups if example.grouped else _pad
    batch = {
        name: pad(records[name], padded_length, pad_value, fmt.padding_side)
        for name, pad_value in pad_values.items()
        if name in records
    }
    if LABELS in records and example.token_labels:
        # a label per token, padded like the tokens with the ignored label
        batch["labels"] = pad(records[LABELS], padded_length, IGNORE_INDEX, fmt.padding_side, example.label_dtype)
    elif LABELS in records:
        batch["labels"] = example.labels(records[LABELS])
    batch["example_mask"] = example_mask
    return batch


def _pad(sequences: Sequence[Sequence[int]], padded_length: int, pad_value: int, side: str,
         dtype: str = "int32") -> np.ndarray:
    padded = np.full((len(sequences), padded_length), pad_value, dtype=dtype)
    for row, sequence in enumerate(sequences):
        if side == "right":
            padded[row, : len(sequence)] = sequence
        else:
            padded[row, padded_length - len(sequence) :] = sequence
    return padded


def _pad_groups(groups: Sequence[Sequence[Sequence[int]]], padded_length: int, pad_value: int, side: str,
                dtype: str = "int32") -> np.ndarray:
    """(B, G, T): each example's G sequences (a preference pair's two, or its choices; every
    example has as many) padded alike, so that one forward pass scores them all."""
    flat = _pad([sequence for group in groups for sequence in group], padded_length, pad_value, side, dtype)
    return flat.reshape(len(groups), -1, padded_length)
