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

Token classification (NER, POS): words and their tags, labels on subwords as run_ner.py puts them,
long sentences as overlapping windows, and predictions back to one per word:

    task = load_word_files(train_file="train.conll", validation_file="dev.conll")   # WordTask
    split = task.splits["train"]
    rows = tokenize_words(tokenizer, split.tokens, 128, tags=split.tags, label_names=task.label_names,
                          stride=32, where=split.where)
    per_word = word_predictions(predicted_ids, rows["word_ids"], rows["sentence"], [len(s) for s in split.tokens])
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
from flaxheads.data.choices import ChoiceColumns, choice_task, load_choice_files, read_choice_file
from flaxheads.data.sources import load_task
from flaxheads.data.splits import split_dataset
from flaxheads.data.subwords import IGNORE_INDEX, align_labels, tokenize_word_split, tokenize_words
from flaxheads.data.task import MULTI_LABEL, MULTIPLE_CHOICE, REGRESSION, SINGLE_LABEL, TOKEN_CLASSIFICATION, TaskData
from flaxheads.data.tokenization import tokenize_split, tokenize_task
from flaxheads.data.windows import merge_windows, plan_windows, word_predictions
from flaxheads.data.word_files import WordSplit, read_conll, read_conllu, read_word_file, read_word_records, word_split
from flaxheads.data.word_task import (
    WordLabelling, WordTask, load_word_files, looks_like_word_file, token_task_data, word_task, words_beside,
)

__all__ = [
    "BUILTIN_DATASETS",
    "ChoiceColumns",
    "MULTIPLE_CHOICE",
    "BatchFormat",
    "DataPosition",
    "IGNORE_INDEX",
    "InMemoryTask",
    "MULTI_LABEL",
    "OwnSplit",
    "REGRESSION",
    "RowPlan",
    "SINGLE_LABEL",
    "SplitData",
    "TOKEN_CLASSIFICATION",
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
