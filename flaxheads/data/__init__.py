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

The data pipeline knows no task: a task's data (`TaskData.rows`, `TaskData.example_format`) says
how its examples become rows and what an example is in a batch. The readers of each task's own
files live in its folder (`flaxheads.tasks.token`: word files, subword labels, windows;
`flaxheads.tasks.choice`: choice files); their names are reachable here too, where they were
documented (`MOVED`).
"""

from flaxheads.data.batching import (
    BatchFormat,
    ExampleFormat,
    DataPosition,
    TrainBatches,
    batches_per_epoch,
    bucket_for,
    bucket_lengths,
    epoch_order,
    eval_batches,
    example_lengths,
    examples_of,
    fitted_batch_size,
    num_batches,
    packed_num_rows,
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
from flaxheads.data.packing import RowPlan, default_max_segments, fitted_row_length, rows_for_examples
from flaxheads.data.shards import (
    OwnSplit,
    accumulation_view,
    check_data_shards,
    eval_example_order,
    gather_lengths,
    tokenize_own_shards,
)
from flaxheads.data.splits import split_dataset
from flaxheads.data.task import MULTI_LABEL, REGRESSION, SINGLE_LABEL, RowMaker, TaskData
from flaxheads.data.tokenization import tokenize_split, tokenize_task
from flaxheads.problem import IGNORE_INDEX

MOVED: dict[str, str] = {
    **dict.fromkeys(("ChoiceColumns", "choice_task", "load_choice_files", "read_choice_file"),
                    "flaxheads.tasks.choice.data"),
    "load_task": "flaxheads.tasks.sources",
    **dict.fromkeys(("align_labels", "tokenize_word_split", "tokenize_words"), "flaxheads.tasks.token.subwords"),
    **dict.fromkeys(("merge_windows", "plan_windows", "word_predictions"), "flaxheads.tasks.token.windows"),
    **dict.fromkeys(("WordSplit", "read_conll", "read_conllu", "read_word_file", "read_word_records", "word_split"),
                    "flaxheads.tasks.token.word_files"),
    **dict.fromkeys(("WordLabelling", "WordTask", "load_word_files", "looks_like_word_file", "token_task_data",
                     "word_task", "words_beside"), "flaxheads.tasks.token.word_task"),
}
"""Names documented as `flaxheads.data.<name>` that now live in their task's folder, by the
module that defines them: `flaxheads.data.load_word_files(...)` keeps working. Library code
imports them from those modules (tests/test_architecture.py checks it): the data pipeline itself
depends on no task."""


def __getattr__(name: str):
    """A name of `MOVED`, imported from its task's module on first use."""
    if name not in MOVED:
        raise AttributeError(f"module 'flaxheads.data' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(MOVED[name]), name)
    globals()[name] = value
    return value


__all__ = [
    "BUILTIN_DATASETS",
    "ChoiceColumns",
    "BatchFormat",
    "ExampleFormat",
    "DataPosition",
    "IGNORE_INDEX",
    "InMemoryTask",
    "MULTI_LABEL",
    "OwnSplit",
    "REGRESSION",
    "RowMaker",
    "RowPlan",
    "SINGLE_LABEL",
    "SplitData",
    "TaskData",
    "TrainBatches",
    "WordSplit",
    "WordLabelling",
    "WordTask",
    "accumulation_view",
    "choice_task",
    "align_labels",
    "as_dataset",
    "batches_per_epoch",
    "bucket_for",
    "bucket_lengths",
    "check_data_shards",
    "default_max_segments",
    "encode_labels",
    "epoch_order",
    "eval_batches",
    "eval_example_order",
    "example_lengths",
    "examples_of",
    "fitted_batch_size",
    "fitted_row_length",
    "gather_lengths",
    "load_builtin",
    "load_in_memory",
    "load_local_files",
    "load_named_dataset",
    "load_choice_files",
    "load_task",
    "load_word_files",
    "looks_like_word_file",
    "merge_windows",
    "movie_snippets",
    "movie_snippets_regression",
    "num_batches",
    "packed_num_rows",
    "plan_windows",
    "process_rows",
    "process_shards",
    "read_choice_file",
    "read_conll",
    "read_conllu",
    "read_word_file",
    "read_word_records",
    "rows_for_examples",
    "sms_spam",
    "split_dataset",
    "tokenize_own_shards",
    "tokenize_split",
    "tokenize_task",
    "token_task_data",
    "tokenize_word_split",
    "tokenize_words",
    "trec6",
    "word_predictions",
    "word_split",
    "word_task",
    "words_beside",
]
