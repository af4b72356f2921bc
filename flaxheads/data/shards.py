"""Data shards on several processes: which rows a process tokenises, the token counts every
process needs of the whole split, the checks that make the cut possible, and the views of a
batch the train and eval steps take (see `batching` for how global batches take the shards).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import NamedTuple

import datasets
import jax
import numpy as np
from jax.experimental import multihost_utils

from flaxheads.data.batching import example_lengths, num_batches, process_rows, process_shards, shard_bounds
from flaxheads.data.task import TaskData
from flaxheads.data.tokenization import tokenize_split


class OwnSplit(NamedTuple):
    """A split as this process holds it."""

    rows: datasets.Dataset
    """This process's rows of the split (those of its data shards), tokenised."""
    lengths: np.ndarray
    """Token count of every example of the whole split, the same on every process."""
    origins: datasets.Dataset | None = None
    """For rows made from the whole split (`RowMaker.whole_split`: windows), the origin columns
    of every row of the whole split (token classification: `word_ids` and `sentence`), by which
    each row's predictions merge back into its example; None for rows one per example."""


def check_data_shards(data_shards: int, task: TaskData, train_batch: int, eval_batch: int, *,
                      unit: str = "examples") -> None:
    """ValueError naming data_shards unless each process can read only its own shards; the
    batches count `unit` (packed rows, when packed)."""
    processes = jax.process_count()
    if data_shards % processes:
        raise ValueError(
            f"--data_shards {data_shards} must be a multiple of the process count {processes}, so that each "
            f"process reads and tokenises only its own shards of the data: set it to {processes} (or a multiple)"
        )
    for name, size in (("train", train_batch), ("eval", eval_batch)):
        if size % data_shards:
            raise ValueError(
                f"--data_shards {data_shards} must divide the global {name} batch of {size} {unit}: each shard "
                "fills an equal part of every batch"
            )
    for name, split in task.splits.items():
        if len(split) < data_shards:
            raise ValueError(f"--data_shards {data_shards} is more than the {len(split)} examples of the {name} split")


def tokenize_own_shards(task: TaskData, tokenizer, max_seq_length: int, *, data_shards: int = 1,
                        splits: tuple[str, ...] | None = None, cache_dir: Path | None = None) -> dict[str, OwnSplit]:
    """Every split of `task` (or those named in `splits`), of which this process tokenises only
    the rows of its data shards; prints what each process holds."""
    index, count = jax.process_index(), jax.process_count()
    shards = process_shards(data_shards, index, count)
    own, counts = {}, []
    for name, split in task.splits.items():
        if splits is not None and name not in splits:
            continue
        if task.rows is not None and task.rows.whole_split:
            own[name] = _own_rows_of_whole_split(task, name, tokenizer, max_seq_length, data_shards)
            counts.append(f"{len(own[name].rows)} of {len(own[name].lengths)} {name}")
            continue
        rows = process_rows(len(split), data_shards, index, count)
        # The whole split is not re-selected, so that it keeps its tokenisation cache.
        selected = split if len(rows) == len(split) else split.select(rows)
        if task.rows is None:
            tokenized = tokenize_split(selected, tokenizer, max_seq_length, cache_dir=cache_dir)
        else:
            own_task = task if selected is split else dataclasses.replace(
                task, splits=datasets.DatasetDict({**task.splits, name: selected}))
            tokenized = task.rows.tokenize(own_task, name, tokenizer, max_seq_length, cache_dir=cache_dir)
        lengths = gather_lengths(example_lengths(tokenized), len(split), data_shards)
        own[name] = OwnSplit(tokenized, lengths)
        counts.append(f"{len(rows)} of {len(split)} {name}")
    print(f"process {index}/{count} tokenized {', '.join(counts)} examples "
          f"(shards {shards.start}-{shards.stop - 1} of {data_shards})")
    return own


def _own_rows_of_whole_split(task: TaskData, split: str, tokenizer, max_seq_length: int,
                             data_shards: int) -> OwnSplit:
    """A split whose rows are known only once all of it is tokenised (an example may become
    several rows, windows): every process tokenises all of it (uncached) and keeps its shards'
    rows of them, and the origin columns of every row."""
    tokenized = task.rows.tokenize(task, split, tokenizer, max_seq_length)
    lengths = example_lengths(tokenized)
    rows = process_rows(len(tokenized), data_shards, jax.process_index(), jax.process_count())
    return OwnSplit(tokenized if len(rows) == len(tokenized) else tokenized.select(rows), lengths,
                    tokenized.select_columns(list(task.rows.origin_columns)))


def gather_lengths(own_lengths: np.ndarray, num_examples: int, num_shards: int) -> np.ndarray:
    """Token counts of every example of a split, from each process's counts of its own rows: a
    collective every process takes part in (a single process holds every row already)."""
    count = jax.process_count()
    if count == 1:
        return own_lengths
    rows_by_process = [process_rows(num_examples, num_shards, p, count) for p in range(count)]
    # process_allgather stacks arrays of one shape: each process pads its counts to the longest.
    padded = np.zeros(max(map(len, rows_by_process)), np.int32)
    padded[: len(own_lengths)] = own_lengths
    gathered = np.asarray(multihost_utils.process_allgather(padded))
    lengths = np.empty(num_examples, np.int64)
    for p, rows in enumerate(rows_by_process):
        lengths[rows.start : rows.stop] = gathered[p, : len(rows)]
    return lengths


def accumulation_view(batch: dict[str, np.ndarray], accum: int) -> dict[str, np.ndarray]:
    """(accum * B, ...) -> (accum, B, ...): micro-batch i is rows [i*B, (i+1)*B)."""
    return {k: v.reshape(accum, v.shape[0] // accum, *v.shape[1:]) for k, v in batch.items()}


def eval_example_order(num_examples: int, num_shards: int, global_batch_size: int) -> np.ndarray:
    """The split index of each real row (`example_mask` 1) of an `eval_batches` pass, in the
    order the pass yields them (global batches, each's rows across every process): how to put
    per-row outputs back in dataset order. The identity when `num_shards` is 1."""
    bounds = shard_bounds(num_examples, num_shards)
    part = global_batch_size // num_shards
    order = []
    for batch_index in range(num_batches(num_examples, global_batch_size)):
        for first, end in zip(bounds[:-1], bounds[1:]):
            start = first + batch_index * part
            order.append(np.arange(start, min(start + part, end)))
    return np.concatenate(order)
