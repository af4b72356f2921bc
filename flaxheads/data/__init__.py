"""Data pipeline: labelled text -> tokenised splits -> padded, bucketed numpy batches.

    task = load_builtin("sms_spam", seed=0)            # or load_local_files(train_file=...)
    tokenized = tokenize_task(task, tokenizer, max_seq_length=128)
    batch_format = BatchFormat.for_task(task, tokenizer, max_seq_length=128)
    train = TrainBatches(tokenized["train"], batch_format, global_batch_size=32, seed=0)
    for batch in eval_batches(tokenized["validation"], batch_format, global_batch_size=64): ...

Several processes, each reading only its data shards: process p tokenises
`split.select(process_rows(len(split), S, p, P))` and passes those rows with `num_shards=S`,
`process_index=p`, `process_count=P` and `lengths` (`example_lengths` of every example, gathered):
`tokenize_own_shards` does this for every split of a task.
"""

from flaxheads.data.batching import (
    BatchFormat,
    DataPosition,
    TrainBatches,
    batches_per_epoch,
    bucket_for,
    bucket_lengths,
    epoch_order,
    eval_batches,
    example_lengths,
    num_batches,
    process_rows,
    process_shards,
)
from flaxheads.data.builtin import (
    BUILTIN_DATASETS,
    load_builtin,
    movie_snippets,
    movie_snippets_regression,
    sms_spam,
    trec6,
)
from flaxheads.data.files import load_local_files, load_named_dataset
from flaxheads.data.in_memory import InMemoryTask, SplitData, as_dataset, load_in_memory
from flaxheads.data.labels import encode_labels
from flaxheads.data.packing import RowPlan, default_max_segments
from flaxheads.data.shards import (
    OwnSplit,
    accumulation_view,
    check_data_shards,
    eval_example_order,
    gather_lengths,
    tokenize_own_shards,
)
from flaxheads.data.sources import load_task
from flaxheads.data.splits import split_dataset
from flaxheads.data.task import MULTI_LABEL, REGRESSION, SINGLE_LABEL, TaskData
from flaxheads.data.tokenization import tokenize_split, tokenize_task

__all__ = [
    "BUILTIN_DATASETS",
    "BatchFormat",
    "DataPosition",
    "InMemoryTask",
    "MULTI_LABEL",
    "OwnSplit",
    "REGRESSION",
    "RowPlan",
    "SINGLE_LABEL",
    "SplitData",
    "TaskData",
    "TrainBatches",
    "accumulation_view",
    "batches_per_epoch",
    "as_dataset",
    "bucket_for",
    "bucket_lengths",
    "check_data_shards",
    "default_max_segments",
    "encode_labels",
    "epoch_order",
    "eval_batches",
    "eval_example_order",
    "example_lengths",
    "gather_lengths",
    "load_builtin",
    "load_in_memory",
    "load_local_files",
    "load_named_dataset",
    "load_task",
    "movie_snippets",
    "movie_snippets_regression",
    "num_batches",
    "process_rows",
    "process_shards",
    "sms_spam",
    "split_dataset",
    "tokenize_own_shards",
    "tokenize_split",
    "tokenize_task",
    "trec6",
]
