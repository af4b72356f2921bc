"""Local data files that cannot be used as they are, and labels whose problem type is ambiguous:
each error names the file or split, the row or byte, and the fix. Also the one-sentence reason
every `TaskData` gives for its problem type (the trainer prints it), so that it never changes
silently."""

from __future__ import annotations

import gzip
import json
import re

import pytest

from flaxheads.data import MULTI_LABEL, REGRESSION, SINGLE_LABEL, load_builtin, load_local_files
from flaxheads.data import files as data_files


def _load(tmp_path, **kwargs):
    return load_local_files(cache_dir=tmp_path / "cache", **kwargs)


def _write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _write_csv(path, rows, header="text,label"):
    path.write_text("\n".join([header, *rows]) + "\n")
    return path


# ---------------------------------------------------------------------------------------------
# Files that are not UTF-8

LATIN1_FILES = {
    "csv": b"text,label\nfine,0\ncaf\xe9,1\n",
    "tsv": b"text\tlabel\nfine\t0\ncaf\xe9\t1\n",
    "json": b'[{"text": "fine", "label": 0},\n {"text": "caf\xe9", "label": 1}]',
    "jsonl": b'{"text": "fine", "label": 0}\n{"text": "caf\xe9", "label": 1}\n',
}


@pytest.mark.parametrize("suffix", sorted(LATIN1_FILES))
def test_latin1_file_error_names_the_file_the_byte_its_position_and_line_and_iconv(tmp_path, suffix):
    content = LATIN1_FILES[suffix]
    path = tmp_path / f"train.{suffix}"
    path.write_bytes(content)

    with pytest.raises(ValueError) as error:
        _load(tmp_path, train_file=path)

    message = str(error.value)
    print(message)
    position = content.index(b"\xe9")
    assert f"--train_file {path} is not UTF-8: byte 0xe9 at position {position} " in message
    line = content[:position].count(b"\n") + 1
    assert f"(line {line}: " in message
    assert f"iconv -f latin-1 -t utf-8 {path} > {tmp_path / f'train.utf8.{suffix}'}" in message


@pytest.mark.parametrize("flag", ["validation_file", "test_file"])
def test_non_utf8_evaluation_file_error_names_its_flag(tmp_path, flag):
    train = _write_csv(tmp_path / "train.csv", ["a,0", "b,1"])
    other = tmp_path / "other.csv"
    other.write_bytes(LATIN1_FILES["csv"])

    with pytest.raises(ValueError, match=rf"--{flag} {re.escape(str(other))} is not UTF-8: byte 0xe9"):
        _load(tmp_path, train_file=train, **{flag: other})


def test_non_utf8_byte_past_the_first_chunk_is_located_in_the_whole_file(tmp_path, monkeypatch):
    monkeypatch.setattr(data_files, "_UTF8_CHECK_CHUNK_BYTES", 7)  # many chunks, cutting "é" in two
    lines = ["text,label", *[f"caf\u00e9 {i},{i % 2}" for i in range(5)]]
    content = "\n".join(lines).encode() + b"\nna\xefve,0\n"
    path = tmp_path / "train.csv"
    path.write_bytes(content)

    position = content.index(b"\xef")
    with pytest.raises(ValueError, match=rf"byte 0xef at position {position} \(line 7: "):
        _load(tmp_path, train_file=path)


def test_utf8_characters_cut_by_chunk_ends_are_accepted(tmp_path, monkeypatch):
    monkeypatch.setattr(data_files, "_UTF8_CHECK_CHUNK_BYTES", 3)
    path = _write_csv(tmp_path / "train.csv", ["caf\u00e9 \u2603 \U0001f600,0", "na\u00efve,1"])

    task = _load(tmp_path, train_file=path)

    assert task.splits["train"]["text"][:] == ["caf\u00e9 \u2603 \U0001f600", "na\u00efve"]


def test_truncated_utf8_character_at_the_end_of_the_file_is_reported(tmp_path):
    path = tmp_path / "train.csv"
    path.write_bytes(b"text,label\na,0\nb,1\xc3")

    with pytest.raises(ValueError, match=r"byte 0xc3 at position 18 .*unexpected end of data"):
        _load(tmp_path, train_file=path)


def test_compressed_non_utf8_file_error_gives_a_pipeline_that_recompresses(tmp_path):
    path = tmp_path / "train.csv.gz"
    path.write_bytes(gzip.compress(LATIN1_FILES["csv"]))

    with pytest.raises(ValueError) as error:
        _load(tmp_path, train_file=path)

    message = str(error.value)
    assert "byte 0xe9 at position 21 of the decompressed content" in message
    assert f"zcat {path} | iconv -f latin-1 -t utf-8 | gzip > {tmp_path / 'train.utf8.csv.gz'}" in message


def test_truncated_compressed_file_error_says_it_could_not_be_decompressed(tmp_path):
    path = tmp_path / "train.csv.gz"
    path.write_bytes(gzip.compress(b"text,label\na,0\n" * 100)[:30])

    with pytest.raises(ValueError, match=r"--train_file .*train\.csv\.gz could not be decompressed .*complete"):
        _load(tmp_path, train_file=path)


def test_utf16_file_error_says_utf16_and_converts_from_it(tmp_path):
    path = tmp_path / "train.csv"
    path.write_bytes("text,label\nfine,0\n".encode("utf-16"))

    with pytest.raises(ValueError, match=r"not UTF-8 \(it starts with a UTF-16 byte-order mark\).*iconv -f utf-16"):
        _load(tmp_path, train_file=path)


# ---------------------------------------------------------------------------------------------
# JSON label columns mixing types


@pytest.mark.parametrize(
    ("labels", "types"),
    [
        ([1, 0, "pos", 1], r"most labels \(3 of 4\) are numbers \(e\.g\. 1 at {1}\), but {3} holds a string \('pos'\)"),
        ([["a"], ["b"], "c"], r"are lists of strings \(e\.g\. \['a'\] at {1}\), but {3} holds a string \('c'\)"),
        ([1, [1, 2]], r"are numbers \(e\.g\. 1 at {1}\), but {2} holds a list of numbers \(\[1, 2\]\)"),
        ([["a"], [1]], r"are lists of strings \(e\.g\. \['a'\] at {1}\), but {2} holds a list of numbers"),
        ([0, True], r"are numbers \(e\.g\. 0 at {1}\), but {2} holds a boolean \(True\)"),
        (["pos", 1, 1, 0], r"most labels \(3 of 4\) are numbers \(e\.g\. 1 at {2}\), but {1} holds a string"),
    ],
    ids=["number-then-string", "lists-then-string", "number-then-list", "list-element-types", "bool",
         "the-odd-one-first"],
)
@pytest.mark.parametrize("suffix", ["jsonl", "json"])
def test_mixed_label_types_error_names_the_file_the_label_of_another_type_than_most_and_both_types(
    tmp_path, suffix, labels, types
):
    records = [{"text": f"t{i}", "label": label} for i, label in enumerate(labels)]
    path = tmp_path / f"train.{suffix}"
    if suffix == "json":  # a JSON array has no lines: its records are counted from 1
        path.write_text(json.dumps(records))
        place = "record {}"
    else:  # JSON Lines: the line, as an editor shows it
        _write_jsonl(path, records)
        place = "line {}"

    with pytest.raises(ValueError) as error:
        _load(tmp_path, train_file=path)

    message = str(error.value)
    print(message)
    assert f"the label column 'label' (--label_column) of --train_file {path} mixes types" in message
    assert re.search(types.format(*[place.format(n) for n in range(5)]), message)
    assert "Give every label one type" in message and "problem_type='regression'" in message


@pytest.mark.slow
def test_mixed_label_types_past_the_readers_first_chunk_are_found(tmp_path):
    # datasets reads JSON Lines in 10 MiB chunks and fails to cast a later chunk to the first's type.
    path = tmp_path / "train.jsonl"
    with path.open("w") as f:
        f.write('{"text": "a", "label": 1}\n' * 450_000)
        f.write('{"text": "b", "label": "pos"}\n')

    with pytest.raises(ValueError, match=r"are numbers \(e\.g\. 1 at line 1\), but line 450001 holds a string"):
        _load(tmp_path, train_file=path)


def test_labels_in_a_renamed_column_are_checked_under_its_name(tmp_path):
    path = _write_jsonl(tmp_path / "train.jsonl", [{"text": "a", "y": "pos"}, {"text": "b", "y": 3}])

    with pytest.raises(ValueError, match=r"label column 'y' \(--label_column\).*line 2 holds a number \(3\)"):
        _load(tmp_path, train_file=path, label_column="y")


def test_missing_labels_and_empty_lists_do_not_count_as_another_type(tmp_path):
    records = [{"text": "a", "label": []}, {"text": "b", "label": ["x"]}, {"text": "c", "label": ["y", "x"]}]
    task = _load(tmp_path, train_file=_write_jsonl(tmp_path / "train.jsonl", records))
    assert task.problem_type == MULTI_LABEL

    with_null = _write_jsonl(tmp_path / "null.jsonl", [{"text": "a", "label": None}, {"text": "b", "label": 1}])
    with pytest.raises(ValueError, match=f"the label is missing at line 1 of --train_file {with_null}"):
        _load(tmp_path, train_file=with_null)


# ---------------------------------------------------------------------------------------------
# Float labels: class ids or scores, never decided silently


def test_one_non_integer_float_among_class_ids_is_refused_with_both_ways_on(tmp_path):
    train = _write_csv(tmp_path / "train.csv", ["a,0", "b,1", "c,2", "d,0.5"])

    with pytest.raises(ValueError) as error:
        _load(tmp_path, train_file=train)

    message = str(error.value)
    print(message)
    assert (f"mostly whole numbers (75%, e.g. 0.0 at line 2 of --train_file {train}) with some other values (first: "
            f"0.5 at line 5 of --train_file {train})") in message
    assert "problem_type='regression'" in message and f"fix the label 0.5 at line 5 of --train_file {train}" in message


def test_scores_that_are_mostly_fractional_stay_regression_even_where_one_is_whole(tmp_path):
    train = _write_csv(tmp_path / "train.csv", ["a,3.1", "b,-2.4", "c,-3.0", "d,0.4"])

    task = _load(tmp_path, train_file=train)

    assert task.problem_type == REGRESSION
    assert task.problem_type_reason.startswith("regression: the label column holds non-integer floats (e.g. 3.1")
    assert "25% are whole numbers" in task.problem_type_reason


def test_mixed_float_labels_with_regression_given_are_scores(tmp_path):
    train = _write_csv(tmp_path / "train.csv", ["a,0", "b,1", "c,2", "d,0.5"])

    task = _load(tmp_path, train_file=train, problem_type=REGRESSION)

    assert (task.problem_type, task.splits["train"]["label"][:]) == (REGRESSION, [0.0, 1.0, 2.0, 0.5])
    assert task.problem_type_reason == "regression: set by problem_type"


def test_a_non_integer_float_in_another_split_is_refused_naming_that_split(tmp_path):
    train = _write_csv(tmp_path / "train.csv", ["a,0.0", "b,1.0"])
    valid = _write_csv(tmp_path / "valid.csv", ["c,1.0", "d,1.5"])

    with pytest.raises(ValueError, match=r"first: 1\.5 at line 3 of --validation_file .*valid\.csv.*"
                                         r"problem_type='regression'"):
        _load(tmp_path, train_file=train, validation_file=valid)


@pytest.mark.parametrize(
    "write",
    [
        lambda path: _write_csv(path.with_suffix(".csv"), ["a,0.0", "b,2.0", "c,1.0"]),
        lambda path: _write_jsonl(
            path.with_suffix(".jsonl"), [{"text": t, "label": y} for t, y in [("a", 0), ("b", 2.0), ("c", 1)]]
        ),
    ],
    ids=["csv-floats", "jsonl-1-and-1.0"],
)
def test_whole_number_floats_are_class_ids_and_the_reason_says_how_to_get_scores(tmp_path, write):
    train = write(tmp_path / "train")
    task = _load(tmp_path, train_file=train)

    assert (task.problem_type, task.num_labels, task.splits["train"]["label"][:]) == (SINGLE_LABEL, 3, [0, 2, 1])
    first_line = 2 if train.suffix == ".csv" else 1  # a CSV's header is line 1
    assert task.problem_type_reason == (
        "single_label_classification: the label column holds floats that are all whole numbers "
        f"(e.g. 0.0 at line {first_line} of --train_file {train}), read as class ids in [0, 3); "
        "problem_type='regression' reads them as scores instead"
    )


def test_floats_none_of_them_whole_are_regression_and_the_reason_points_at_one(tmp_path):
    train = _write_csv(tmp_path / "train.csv", ["a,0.25", "b,-1.5"])

    task = _load(tmp_path, train_file=train)

    assert task.problem_type == REGRESSION
    assert task.problem_type_reason == ("regression: the label column holds non-integer floats (e.g. 0.25 at line 2 of "
                                        f"--train_file {train})")


# ---------------------------------------------------------------------------------------------
# The reason for every other problem type


@pytest.mark.parametrize(
    ("records", "kwargs", "reason"),
    [
        (
            [{"text": "a", "label": "positive"}, {"text": "b", "label": "negative"}],
            {},
            "single_label_classification: the label column holds strings (2 names: negative, positive)",
        ),
        (
            [{"text": "a", "label": 0}, {"text": "b", "label": 3}],
            {},
            "single_label_classification: the label column holds integers, read as class ids in [0, 4)",
        ),
        (
            [{"text": "a", "label": True}, {"text": "b", "label": False}],
            {},
            "single_label_classification: the label column holds booleans, read as class ids 0 (false) "
            "and 1 (true)",
        ),
        (
            [{"text": "a", "label": ["news", "tech"]}, {"text": "b", "label": []}],
            {},
            "multi_label_classification: the label column holds lists of strings (2 names: news, tech)",
        ),
        (
            [{"text": "a", "label": [0, 1, 1]}, {"text": "b", "label": [1, 0, 0]}],
            {},
            "multi_label_classification: the label column holds lists of 3 0/1 integers, read as "
            "multi-hot rows",
        ),
        (
            [{"text": "a", "label": [0, 4]}, {"text": "b", "label": [1]}],
            {},
            "multi_label_classification: the label column holds lists of integers, read as class ids in [0, 5)",
        ),
        (
            [{"text": "a", "label": 1}, {"text": "b", "label": 5}],
            {"problem_type": REGRESSION},
            "regression: set by problem_type",
        ),
    ],
    ids=["strings", "ints", "bools", "name-lists", "multi-hot", "id-lists", "given"],
)
def test_problem_type_reason_says_what_the_label_column_holds(tmp_path, records, kwargs, reason):
    task = _load(tmp_path, train_file=_write_jsonl(tmp_path / "train.jsonl", records), **kwargs)

    assert task.problem_type_reason == reason
    assert task.problem_type_reason.startswith(f"{task.problem_type}: ")


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        (
            "movie_snippets_regression",
            "regression: the built-in movie_snippets_regression label is the mean human sentiment score "
            "(-4 to 4)",
        ),
        (
            "sms_spam",
            "single_label_classification: the built-in sms_spam labels each message (2 names: ham, spam)",
        ),
    ],
    ids=["movie_snippets_regression", "sms_spam"],
)
def test_builtin_data_sets_give_their_reason(name, reason):
    assert load_builtin(name).problem_type_reason == reason


@pytest.mark.parametrize("flag", ["validation_file", "test_file"])
def test_an_evaluation_file_without_a_train_file_is_refused_not_replaced_by_the_builtin_data(tmp_path, flag):
    from flaxheads.data import load_task

    scored = _write_csv(tmp_path / "mine.csv", ["good,1", "bad,0"])
    with pytest.raises(ValueError, match=rf"{flag}=.*mine.csv without a train_file.*--train_file"):
        load_task(**{flag: scored}, dataset="movie_snippets")


def test_evaluation_files_alone_read_their_labels_against_a_trained_models_classes(tmp_path):
    from flaxheads.data import load_task

    # The files lack "neutral": their names, or class ids, still index the model's classes.
    validation = _write_csv(tmp_path / "validation.csv", ["good,positive", "bad,negative", "fine,positive"])
    test = _write_csv(tmp_path / "test.csv", ["good,2", "bad,0"])
    task = load_task(validation_file=validation, test_file=validation, class_names=("negative", "neutral", "positive"))
    # The first file stands in for the train split every task has (as for word files read alone).
    assert sorted(task.splits) == ["test", "train", "validation"] and task.num_labels == 3
    assert task.id2label == {0: "negative", 1: "neutral", 2: "positive"}
    assert task.splits["validation"]["label"] == [2, 0, 2]
    task = load_task(test_file=test, class_names=("negative", "neutral", "positive"))
    assert task.splits["test"]["label"] == [2, 0] and task.num_labels == 3

    other = _write_csv(tmp_path / "other.csv", ["good,great"])
    with pytest.raises(ValueError, match=r"label 'great' at line 2 of --validation_file .*other\.csv is not one of the "
                                         r"model's classes \['negative', 'neutral', 'positive'\]"):
        load_task(validation_file=other, class_names=("negative", "neutral", "positive"))
    with pytest.raises(ValueError, match=r"label 2 at line 2 of --test_file .*test\.csv is outside \[0, 2\)"):
        load_task(test_file=test, class_names=("negative", "positive"))
