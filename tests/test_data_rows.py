"""The shape of a data set, row by row: where a message says a row is (one way of counting for
every reader, `flaxheads.data.places`), which way most rows decide for the whole column (names or
class ids, multi-hot rows or id lists, the number of choices) with the odd row refused where it
is, and data held in Python checked before Arrow stores it (None, NaN, wrong kinds, pandas)."""

from __future__ import annotations

import gzip
import json
import math

import datasets
import pytest

from flaxheads.data import MULTI_LABEL, SINGLE_LABEL, choice_task, load_in_memory, load_local_files


def _load(tmp_path, **kwargs):
    return load_local_files(cache_dir=tmp_path / "cache", **kwargs)


def _memory(train, **kwargs):
    return load_in_memory({"train": train}, **kwargs).task


# ---------------------------------------------------------------------------------------------
# Where a row is: the line an editor shows, the record of a file without lines, the index in Python

# Line 1 the header, 3 blank, 4-5 one quoted cell over two lines, 6 only spaces: the odd label is on line 8.
CSV_WITH_BLANK_AND_MULTI_LINE_ROWS = 'text,label\na,0\n\n"two\nlines",1\n   \nb,1\nc,pos\nd,0\n'


def test_a_csv_row_is_named_by_the_line_an_editor_shows_header_blank_lines_and_cell_lines_counted(tmp_path):
    path = tmp_path / "train.csv"
    path.write_text(CSV_WITH_BLANK_AND_MULTI_LINE_ROWS)

    with pytest.raises(ValueError, match=rf"the labels of --train_file {path} are mostly class ids \(4 of 5, e\.g\. "
                                         r"'0' at line 2\), but line 8 holds the name 'pos'"):
        _load(tmp_path, train_file=path)


def test_a_compressed_csv_row_is_named_by_its_line_too(tmp_path):
    path = tmp_path / "train.csv.gz"
    path.write_bytes(gzip.compress(CSV_WITH_BLANK_AND_MULTI_LINE_ROWS.encode()))

    with pytest.raises(ValueError, match=r"but line 8 holds the name 'pos'"):
        _load(tmp_path, train_file=path)


def test_a_json_lines_row_is_named_by_its_line_blank_lines_counted(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text('{"text": "a", "label": 0}\n\n  \n{"text": "b", "label": null}\n')

    with pytest.raises(ValueError, match=rf"the label is missing at line 4 of --train_file {path} \(None\)"):
        _load(tmp_path, train_file=path)


@pytest.mark.parametrize("suffix", ["json", "parquet"])
def test_a_row_of_a_file_without_lines_is_named_by_its_record_counted_from_one(tmp_path, suffix):
    records = [{"text": "a", "label": 0}, {"text": "b", "label": 1}, {"text": None, "label": 1}]
    path = tmp_path / f"train.{suffix}"
    if suffix == "json":
        path.write_text(json.dumps(records, indent=2))  # an array over many lines: its records are counted
    else:
        datasets.Dataset.from_list(records).to_parquet(path)

    with pytest.raises(ValueError, match=rf"the text in column 'text' \(--text_column\) is missing at record 3 of "
                                         rf"--train_file {path}"):
        _load(tmp_path, train_file=path)


def test_a_row_of_data_in_python_is_named_by_its_index_counted_from_zero():
    with pytest.raises(ValueError, match=r"label 5 at index 2 of the train data is outside \[0, 2\)"):
        _memory((["a", "b", "c"], [0, 1, 5]), num_labels=2)


# ---------------------------------------------------------------------------------------------
# Column-wide decisions: what most labels are, the odd one refused where it is


def test_a_name_among_class_ids_in_a_csv_is_refused_not_read_as_a_column_of_names(tmp_path):
    path = tmp_path / "train.csv"
    path.write_text("text,label\na,0\nb,1\nc,1\nd,pos\n")

    with pytest.raises(ValueError, match=r"mostly class ids \(3 of 4.*line 5 holds the name 'pos': give it the "
                                         r"class id"):
        _load(tmp_path, train_file=path)


def test_a_class_id_among_names_is_refused_not_read_as_a_class_of_its_own():
    with pytest.raises(ValueError, match=r"mostly class names \(3 of 4, e\.g\. 'pos' at index 0\), but index 3 holds "
                                         r"the number '1'"):
        _memory((["a", "b", "c", "d"], ["pos", "neg", "pos", "1"]))


def test_class_names_of_digits_alone_are_still_names():
    task = _memory((["a", "b", "c"], ["3", "1", "3"]))

    assert (task.problem_type, task.id2label) == (SINGLE_LABEL, {0: "1", 1: "3"})


@pytest.mark.parametrize("odd_first", [False, True], ids=["odd-last", "odd-first"])
def test_a_multi_hot_row_of_another_length_is_refused_not_read_as_class_ids(odd_first):
    labels = [[0, 1, 0], [1, 0, 0], [0, 0, 1], [1, 1]]
    if odd_first:
        labels = labels[::-1]
    odd = labels.index([1, 1])

    with pytest.raises(ValueError, match=rf"the multi-hot label at index {odd} of the train data has 2 entries, but "
                                         r"most rows have 3: give it 3"):
        _memory((["a", "b", "c", "d"], labels))


def test_a_multi_hot_row_holding_another_value_than_0_or_1_is_refused():
    with pytest.raises(ValueError, match=r"the multi-hot label at index 3 of the train data holds 2, but multi-hot "
                                         r"rows hold 0 and 1"):
        _memory((["a", "b", "c", "d"], [[0, 1, 0], [1, 0, 0], [0, 0, 1], [1, 2, 0]]))


def test_soft_multi_hot_rows_take_the_length_most_rows_have_not_the_first_rows():
    with pytest.raises(ValueError, match=r"the multi-hot label at index 0 of the train data has 2 entries, but most "
                                         r"rows have 3"):
        _memory((["a", "b", "c"], [[0.5, 0.5], [0.2, 0.3, 0.5], [1.0, 0.0, 0.0]]))


def test_lists_of_class_ids_of_different_lengths_are_still_class_ids():
    task = _memory((["a", "b", "c"], [[0, 2], [1], [3, 0, 1]]))

    assert (task.problem_type, task.num_labels) == (MULTI_LABEL, 4)
    assert task.splits["train"]["label"][0] == [1.0, 0.0, 1.0, 0.0]


@pytest.mark.parametrize(("labels", "odd"), [([0, 1, 1, "pos"], r"index 3 holds a string \('pos'\)"),
                                             (["pos", 1, 1, 0], r"index 0 holds a string \('pos'\)"),
                                             ([["a"], ["b"], "c"], r"index 2 holds a string \('c'\)")],
                         ids=["name-last", "name-first", "list-and-string"])
def test_labels_in_python_of_another_type_than_most_are_refused_naming_the_index(labels, odd):
    with pytest.raises(ValueError, match=rf"the label column 'label' \(label_column=\) of the train data mixes types.*"
                                         rf"{odd}"):
        _memory(([f"t{i}" for i in range(len(labels))], labels))


@pytest.mark.parametrize("missing", [None, math.nan], ids=["None", "NaN"])
def test_a_missing_label_in_python_is_refused_not_read_as_a_value(missing):
    with pytest.raises(ValueError, match=rf"the label is missing at index 2 of the train data \({missing!r}\)"):
        _memory((["a", "b", "c"], [0, 1, missing]))


def test_a_label_that_is_no_label_is_refused_naming_its_index():
    with pytest.raises(ValueError, match=r"holds a dict at index 1 of the train data \(\{'x': 1\}\)"):
        _memory((["a", "b"], [0, {"x": 1}]))


# ---------------------------------------------------------------------------------------------
# Texts and containers held in Python


@pytest.mark.parametrize(("text", "problem"), [(None, r"is missing at index 1 of the train data \(None\)"),
                                               (math.nan, r"is missing at index 1 of the train data \(nan\)"),
                                               (3, r"at index 1 of the train data is an int \(3\), not a str"),
                                               ({"x": 1}, r"at index 1 of the train data is a dict"),
                                               (["b"], r"at index 1 of the train data is a list \(\['b'\]\)")],
                         ids=["None", "NaN", "int", "dict", "list"])
@pytest.mark.parametrize("form", ["tuple", "dict", "rows"])
def test_a_text_that_is_missing_or_no_str_is_refused_naming_its_index(text, problem, form):
    texts, labels = ["a", text, "c"], [0, 1, 0]
    data = {"tuple": (texts, labels), "dict": {"text": texts, "label": labels},
            "rows": [{"text": t, "label": y} for t, y in zip(texts, labels)]}[form]

    with pytest.raises(ValueError, match=rf"the text in column 'text' {problem}"):
        _memory(data)


@pytest.mark.parametrize("form", ["tuple", "dict"])
def test_columns_of_different_lengths_are_refused_naming_both(form):
    data = (["a", "b"], [0]) if form == "tuple" else {"text": ["a", "b"], "label": [0]}

    with pytest.raises(ValueError, match=r"the columns of the train data differ in length \('text': 2, 'label': 1\)"):
        _memory(data)


@pytest.mark.parametrize(("rows", "problem"), [
    ([{"text": "a", "label": 0}, None], r"index 1 of the train data is None, not a row dict"),
    ([("a", 0), ("b", 1)], r"index 0 of the train data is \('a', 0\) \(a tuple\).*give the data as a tuple of lists"),
    ([1, 2], r"index 0 of the train data is 1 \(an int\), not a row dict or a text"),
], ids=["None-row", "pairs", "numbers"])
def test_a_list_item_that_is_no_row_is_refused_naming_its_index(rows, problem):
    with pytest.raises(ValueError, match=problem):
        _memory(rows)


def test_a_column_a_later_row_dict_has_is_read_not_dropped():
    with pytest.raises(ValueError, match=r"the label is missing at index 0 of the train data"):
        _memory([{"text": "a"}, {"text": "b", "label": 1}])


@pytest.mark.parametrize(("data", "problem"), [
    (5, r"the train data is an int \(5\): data is a datasets\.Dataset"),
    ((["a", "b"], None), r"item 1 \(label\) of the tuple of the train data is None, not a list of values"),
    ({"text": "a", "label": 0}, r"column 'text' of the train data is a str \('a'\), not a list of values"),
    (([], []), r"the train data has no rows"),
    (datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": ["a"]})}),
     r"the train data is a DatasetDict of the splits \['train'\]: pass one split, e.g. dataset\['train'\]"),
], ids=["int", "None-in-a-tuple", "one-row-as-a-dict", "no-rows", "DatasetDict"])
def test_data_that_holds_no_rows_is_refused_with_a_value_error_saying_what_to_give(data, problem):
    with pytest.raises(ValueError, match=problem):
        _memory(data)


def test_a_pandas_data_frame_is_read_as_its_columns():
    pandas = pytest.importorskip("pandas")
    frame = pandas.DataFrame({"text": ["a", "b", "c"], "label": ["pos", "neg", "pos"]}, index=[10, 11, 12])

    task = _memory(frame)

    assert task.splits["train"]["text"] == ["a", "b", "c"] and task.splits["train"]["label"] == [1, 0, 1]


def test_a_missing_text_in_a_pandas_data_frame_is_refused_naming_its_position():
    pandas = pytest.importorskip("pandas")

    with pytest.raises(ValueError, match=r"the text in column 'text' is missing at index 1 of the train data"):
        _memory(pandas.DataFrame({"text": ["a", None, "c"], "label": [0, 1, 0]}))


# ---------------------------------------------------------------------------------------------
# Multiple choice: every choice counted as given, the count most rows have


def _choice_rows(choices_per_row, label=0):
    return [{"context": f"c{i}", "choices": choices, "label": label} for i, choices in enumerate(choices_per_row)]


def test_an_empty_choice_in_a_list_is_refused_not_dropped_before_the_count_check():
    rows = _choice_rows([["a", "b", "c", "d", "e"]] * 3, label=4)
    rows[0]["choices"] = ["a", "", "c", "d", "e"]  # dropped, the row would have 4 and label 4 another ending

    with pytest.raises(ValueError, match=r"index 0 of the train data: the choice 'choices\[1\]' is empty; give every "
                                         r"choice its text"):
        choice_task({"train": rows})


def test_an_empty_numbered_choice_cell_is_refused_naming_its_line(tmp_path):
    from flaxheads.data import load_choice_files

    path = tmp_path / "train.csv"
    path.write_text("sent1,ending0,ending1,ending2,label\nx,a,b,c,0\n\ny,a,,c,2\n")

    with pytest.raises(ValueError, match=rf"line 4 of {path}: the choice 'ending1' is empty"):
        load_choice_files(train_file=path)


def test_the_number_of_choices_is_the_one_most_rows_have_not_the_first_rows():
    rows = _choice_rows([["a", "b"], ["a", "b", "c"], ["a", "b", "c"], ["a", "b", "c"]])

    with pytest.raises(ValueError, match=r"index 0 of the train data has 2 choices and most rows have 3"):
        choice_task({"train": rows})


def test_choice_labels_of_a_csv_column_read_as_floats_are_choice_indices(tmp_path):
    from flaxheads.data import load_choice_files

    path = tmp_path / "train.csv"
    path.write_text("sent1,ending0,ending1,label\nx,a,b,1\ny,a,b,\n")  # the blank label makes the column floats

    with pytest.raises(ValueError, match=rf"line 3 of {path} has no label in 'label'"):
        load_choice_files(train_file=path)
