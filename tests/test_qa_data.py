"""Question-answering data: SQuAD files in every format read to the same examples, bad data refused
naming the file, the example and the fix, and run_qa.py's windows and labels
(`flaxheads.tasks.qa.windows`) equal to run_qa.py's own functions (tests/reference/run_qa_features.py)
on randomised examples, for a tokenizer padding on the right and one padding on the left."""

from __future__ import annotations

import csv
import itertools
import json
import random
import re

import numpy as np
import pytest
import transformers

from flaxheads.shipped_model import minilm_path
from flaxheads.tasks.qa import windows
from flaxheads.tasks.qa.data import (QAExample, examples_as_columns, looks_like_qa_columns, looks_like_qa_file,
                                     qa_examples, read_qa_file)
from reference.run_qa_features import prepare_train_features, prepare_validation_features

CONTEXT_1 = "Super Bowl 50 was an American football game. The Denver Broncos won it in Santa Clara."
CONTEXT_2 = "Paris is the capital of France. It has 2 million people. Café owners open early."
EXAMPLES = [
    QAExample("q1", "Who won Super Bowl 50?", CONTEXT_1, ("Denver Broncos", "The Denver Broncos"), (49, 45),
              "Super_Bowl_50"),
    QAExample("q2", "Where was it played?", CONTEXT_1, ("Santa Clara",), (74,), "Super_Bowl_50"),
    QAExample("q3", "What is the capital of France?", CONTEXT_2, ("Paris",), (0,), "Paris"),
    QAExample("q4", "Who opens early?", CONTEXT_2, ("Café owners",), (57,), "Paris"),
]


def _nested(examples: list[QAExample], *, version_2: bool = False) -> dict:
    """SQuAD's own format: articles by title, paragraphs by context."""
    articles: dict = {}
    for e in examples:
        paragraphs = articles.setdefault(e.title, {})
        qa = {"id": e.id, "question": e.question,
              "answers": [{"text": t, "answer_start": s} for t, s in zip(e.answer_texts, e.answer_starts)]}
        if version_2:
            qa["is_impossible"] = not e.answerable
            if not e.answerable:
                qa["plausible_answers"] = [{"text": "anything", "answer_start": 0}]
        paragraphs.setdefault(e.context, []).append(qa)
    return {"version": "v2.0" if version_2 else "1.1", "data": [
        {"title": title, "paragraphs": [{"context": c, "qas": qas} for c, qas in paragraphs.items()]}
        for title, paragraphs in articles.items()]}


def _flat(examples: list[QAExample]) -> list[dict]:
    return [{"id": e.id, "title": e.title, "question": e.question, "context": e.context, "answers": e.answers}
            for e in examples]


def _write_csv(path, header: list[str], rows: list[list], delimiter: str = ",") -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, delimiter=delimiter)
        writer.writerow(header)
        writer.writerows(rows)


def _write_all_formats(tmp_path, examples: list[QAExample]) -> dict:
    files = {}
    files["nested.json"] = tmp_path / "nested.json"
    files["nested.json"].write_text(json.dumps(_nested(examples)))
    files["list.json"] = tmp_path / "list.json"
    files["list.json"].write_text(json.dumps(_flat(examples)))
    files["data.json"] = tmp_path / "data.json"
    files["data.json"].write_text(json.dumps({"version": "x", "data": _flat(examples)}))
    lines = "\n".join(json.dumps(r, ensure_ascii=False) for r in _flat(examples)) + "\n"
    files["lines.jsonl"] = tmp_path / "lines.jsonl"
    files["lines.jsonl"].write_text(lines, encoding="utf-8")
    files["lines.json"] = tmp_path / "lines.json"  # JSON Lines as datasets' to_json writes them
    files["lines.json"].write_text(lines, encoding="utf-8")
    files["answers.csv"] = tmp_path / "answers.csv"
    _write_csv(files["answers.csv"], ["id", "title", "question", "context", "answers"],
               [[e.id, e.title, e.question, e.context, json.dumps(e.answers)] for e in examples])
    files["python.csv"] = tmp_path / "python.csv"  # a dict of lists as Python writes it
    _write_csv(files["python.csv"], ["id", "title", "question", "context", "answers"],
               [[e.id, e.title, e.question, e.context, repr(e.answers)] for e in examples])
    files["columns.csv"] = tmp_path / "columns.csv"
    _write_csv(files["columns.csv"], ["id", "title", "question", "context", "answer_text", "answer_start"],
               [[e.id, e.title, e.question, e.context, json.dumps(list(e.answer_texts)),
                 json.dumps(list(e.answer_starts))] if len(e.answer_texts) > 1 else
                [e.id, e.title, e.question, e.context, e.answer_texts[0], e.answer_starts[0]] for e in examples])
    files["columns.tsv"] = tmp_path / "columns.tsv"
    _write_csv(files["columns.tsv"], ["id", "title", "question", "context", "answers"],
               [[e.id, e.title, e.question, e.context, json.dumps(e.answers)] for e in examples], delimiter="\t")
    return files


# -- readers ------------------------------------------------------------------------------------


def test_every_file_format_reads_the_same_examples(tmp_path):
    files = _write_all_formats(tmp_path, EXAMPLES)
    for name, path in files.items():
        assert read_qa_file(path) == EXAMPLES, name
        assert looks_like_qa_file(path), name


def test_data_held_in_python_reads_as_the_files_do():
    import datasets

    columns = examples_as_columns(EXAMPLES)
    assert qa_examples(_nested(EXAMPLES)) == EXAMPLES
    assert qa_examples(_flat(EXAMPLES)) == EXAMPLES
    assert qa_examples(columns) == EXAMPLES
    assert qa_examples(datasets.Dataset.from_dict(columns)) == EXAMPLES


def test_data_in_python_that_is_not_examples_is_refused():
    with pytest.raises(ValueError, match=r"the columns of the data differ in length"):
        qa_examples({"question": ["a", "b"], "context": ["c"], "answers": [{"text": [], "answer_start": []}] * 2})
    with pytest.raises(ValueError, match=r"the data holds 7, not examples"):
        qa_examples(7)


def test_examples_as_columns_are_the_datasets_squad_columns():
    columns = examples_as_columns(EXAMPLES[:1])
    assert columns == {"id": ["q1"], "title": ["Super_Bowl_50"], "question": ["Who won Super Bowl 50?"],
                       "context": [CONTEXT_1],
                       "answers": [{"text": ["Denver Broncos", "The Denver Broncos"], "answer_start": [49, 45]}]}


def test_squad_v2_reads_unanswerable_questions_with_version_2_with_negative(tmp_path):
    examples = [*EXAMPLES[:2], QAExample("q9", "Who lost?", CONTEXT_1, (), (), "Super_Bowl_50")]
    path = tmp_path / "v2.json"
    path.write_text(json.dumps(_nested(examples, version_2=True)))
    assert read_qa_file(path, version_2_with_negative=True) == examples  # plausible_answers are not answers
    with pytest.raises(ValueError, match=r"article 1 \('Super_Bowl_50'\), paragraph 1, question 3 of .*v2.json "
                                         r"\(id 'q9'\) has no answer.*version_2_with_negative=True"):
        read_qa_file(path)


def test_an_unanswerable_flat_row_reads_with_version_2_with_negative(tmp_path):
    path = tmp_path / "v2.csv"
    _write_csv(path, ["id", "question", "context", "answer_text", "answer_start"],
               [["a", "Who won?", CONTEXT_1, "Denver Broncos", 49], ["b", "Who lost?", CONTEXT_1, "", ""]])
    assert [e.answerable for e in read_qa_file(path, version_2_with_negative=True)] == [True, False]
    with pytest.raises(ValueError, match=r"line 3 of .*v2.csv \(id 'b'\) has no answer.*--version_2_with_negative"):
        read_qa_file(path)


def test_an_unanswerable_question_may_leave_its_answers_out_or_empty(tmp_path):
    nested = _nested(EXAMPLES[:1], version_2=True)
    nested["data"][0]["paragraphs"][0]["qas"].append({"id": "x", "question": "Who lost?", "is_impossible": True})
    path = tmp_path / "v2.json"
    path.write_text(json.dumps(nested))
    assert [e.answerable for e in read_qa_file(path, version_2_with_negative=True)] == [True, False]
    path = tmp_path / "v2.csv"
    _write_csv(path, ["id", "question", "context", "answers"],
               [["a", "Who won?", CONTEXT_1, json.dumps(EXAMPLES[0].answers)], ["b", "Who lost?", CONTEXT_1, ""]])
    assert [e.answerable for e in read_qa_file(path, version_2_with_negative=True)] == [True, False]


def test_a_file_without_ids_numbers_its_examples_and_data_to_predict_needs_no_answers(tmp_path):
    path = tmp_path / "predict.jsonl"
    path.write_text("\n".join(json.dumps({"question": e.question, "context": e.context}) for e in EXAMPLES))
    examples = read_qa_file(path)
    assert [e.id for e in examples] == ["0", "1", "2", "3"]
    assert not any(e.answerable for e in examples)
    assert not looks_like_qa_file(path) and looks_like_qa_file(path, labelled=False)
    with pytest.raises(ValueError, match=r"line 1 of .*predict.jsonl \(id '0'\) has no answers"):
        read_qa_file(path, labelled=True)


def test_questions_keep_their_whitespace_and_windows_strip_it_as_run_qa():
    spaced = QAExample("w", "   Who won?", CONTEXT_1, ("Denver Broncos",), (49,))
    assert qa_examples([{"id": "w", "question": "   Who won?", "context": CONTEXT_1,
                         "answers": spaced.answers}])[0].question == "   Who won?"
    tokenizer = _gpt2_like()  # byte-level BPE: leading spaces would be tokens of their own
    stripped = QAExample("w", "Who won?", CONTEXT_1, ("Denver Broncos",), (49,))
    assert len(tokenizer(spaced.question)["input_ids"]) > len(tokenizer(stripped.question)["input_ids"])
    assert np.array_equal(windows.train_features([spaced], tokenizer, max_seq_length=64, doc_stride=16)["input_ids"],
                          windows.train_features([stripped], tokenizer, max_seq_length=64, doc_stride=16)["input_ids"])


# -- bad data -----------------------------------------------------------------------------------


def _jsonl(tmp_path, records: list[dict]):
    path = tmp_path / "train.jsonl"
    path.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in records) + "\n", encoding="utf-8")
    return path


def _record(**changes) -> dict:
    return {**_flat(EXAMPLES[:1])[0], **changes}


BAD_RECORDS = {
    "off by one": (_record(answers={"text": ["Denver Broncos"], "answer_start": [48]}),
                   (r"the answer 'Denver Broncos' is not at answer_start 48: the context there reads ' Denver Bronco'; "
                    r"the text occurs at 49, 1 after it \(off by one\?\)\. Give the index.*remove the answer")),
    "bytes": ({"id": "q1", "question": "Who?", "context": "Café Denver Broncos",
               "answers": {"text": ["Denver"], "answer_start": [6]}},
              (r"it is there counting bytes of UTF-8, and answer_start must count characters, not bytes "
               r"\(it is 5 here\)")),
    "nowhere": (_record(answers={"text": ["Dallas"], "answer_start": [49]}), r"the text occurs nowhere in the context"),
    "other case": (_record(answers={"text": ["denver broncos"], "answer_start": [49]}),
                   r"the context holds it only with other case or spaces"),
    "beyond": (_record(answers={"text": ["Santa Clara"], "answer_start": [200]}),
               r"at answer_start 200 runs outside the context, which is 86 characters long; the text occurs at 74"),
    "negative": (_record(answers={"text": ["Denver"], "answer_start": [-1]}), r"runs outside the context"),
    "empty question": (_record(question="  "), r"the question is empty; give every example a question"),
    "no context": (_record(context=None), r"the context is empty"),
    "number context": (_record(context=7), r"the context is int 7, not text"),
    "lengths": (_record(answers={"text": ["Denver Broncos", "Broncos"], "answer_start": [49]}),
                r"2 answer text\(s\) and 1 answer_start\(s\); give one answer_start per answer text"),
    "empty answer": (_record(answers={"text": [""], "answer_start": [3]}), r"an answer text is ''"),
    "start not a number": (_record(answers={"text": ["Denver"], "answer_start": ["x"]}),
                           r"answer_start 'x' is not a whole number"),
    "impossible with answers": (_record(is_impossible=True), r"is_impossible is true and the question has 2 answer"),
    "answers not a dict": (_record(answers="Denver"), r"answers holds 'Denver'; give \{\"text\""),
}


@pytest.mark.parametrize("case", sorted(BAD_RECORDS))
def test_bad_data_is_refused_naming_the_file_line_id_and_fix(tmp_path, case):
    record, message = BAD_RECORDS[case]
    path = _jsonl(tmp_path, [_flat(EXAMPLES[1:2])[0], record])
    with pytest.raises(ValueError, match=rf"line 2 of {re.escape(str(path))} \(id 'q1'\): .*{message}"):
        read_qa_file(path, version_2_with_negative=True)


def test_duplicate_ids_are_refused_naming_both_lines(tmp_path):
    path = _jsonl(tmp_path, _flat(EXAMPLES[:2]) + [_flat(EXAMPLES[1:2])[0]])
    with pytest.raises(ValueError, match=r"line 3 of .* \(id 'q2'\): the id is also the id of line 2; ids must be "
                                         r"unique"):
        read_qa_file(path)


def test_ids_on_some_rows_only_are_refused(tmp_path):
    record = _flat(EXAMPLES[1:2])[0]
    del record["id"]
    with pytest.raises(ValueError, match=r"line 2 of .* has no id and other examples have one"):
        read_qa_file(_jsonl(tmp_path, [_flat(EXAMPLES[:1])[0], record]))


def test_a_bad_csv_row_is_named_by_its_line_and_a_nested_question_by_its_place(tmp_path):
    path = tmp_path / "train.csv"
    _write_csv(path, ["id", "question", "context", "answer_text", "answer_start"],
               [["a", "Who won?\nTell me", CONTEXT_1, "Denver Broncos", 49], ["b", "Where?", CONTEXT_1, "Santa", 75]])
    with pytest.raises(ValueError, match=r"line 4 of .*train.csv \(id 'b'\): the answer 'Santa' is not at answer_start "
                                         r"75.*occurs at 74, 1 before it \(off by one\?\)"):
        read_qa_file(path)
    nested = _nested([EXAMPLES[0], QAExample("z", "Where?", CONTEXT_1, ("Santa",), (70,), "Super_Bowl_50")])
    path = tmp_path / "train.json"
    path.write_text(json.dumps(nested))
    with pytest.raises(ValueError, match=r"article 1 \('Super_Bowl_50'\), paragraph 1, question 2 of .*train.json "
                                         r"\(id 'z'\): the answer 'Santa' is not at answer_start 70"):
        read_qa_file(path)


@pytest.mark.parametrize("name, content, message", [
    ("train.txt", "x", r"cannot read question-answering data from a .txt file"),
    ("train.json", "{\"data\": [", r"train.json is not JSON"),
    ("train.json", "  ", r"train.json is empty"),
    ("train.json", "{\"data\": [{\"title\": \"t\", \"paragraphs\": 3}]}", r"article 1 of .* has no 'paragraphs' list"),
    ("train.csv", "id,question,context\n", r"has a header and no rows"),
])
def test_unreadable_files_are_refused_saying_why(tmp_path, name, content, message):
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(ValueError, match=message):
        read_qa_file(path)


def test_detection_tells_qa_files_from_classification_and_choice_files(tmp_path):
    classification = tmp_path / "sentiment.csv"
    _write_csv(classification, ["text", "label"], [["good", 1]])
    choice = tmp_path / "swag.jsonl"
    choice.write_text(json.dumps({"context": "He", "question": "q", "ending0": "a", "ending1": "b", "label": 0}))
    assert not looks_like_qa_file(classification) and not looks_like_qa_file(choice)
    assert not looks_like_qa_file(tmp_path / "missing.json")
    assert looks_like_qa_columns(["id", "question", "context", "answers"])
    assert looks_like_qa_columns(["question", "context", "answer_text", "answer_start"])
    assert not looks_like_qa_columns(["question", "context"]) and looks_like_qa_columns(["question", "context"],
                                                                                        labelled=False)


# -- windows: equal to run_qa.py ----------------------------------------------------------------


_TOKENIZERS: dict = {}


def _tokenizer(side: str):
    """MiniLM's WordPiece tokenizer padding on `side` ("left": run_qa reads (context, question))."""
    if side not in _TOKENIZERS:
        tokenizer = transformers.AutoTokenizer.from_pretrained(minilm_path())
        tokenizer.padding_side = side
        _TOKENIZERS[side] = tokenizer
    return _TOKENIZERS[side]


def _vocabulary() -> tuple[list[str], list[str]]:
    """MiniLM's whole words (alphabetic, ASCII and not) and its word pieces, without special tokens."""
    vocab = _tokenizer("right").get_vocab()
    words = [w for w in vocab if w.isalpha() and not w.startswith("[")]
    pieces = [w[2:] for w in vocab if w.startswith("##") and w[2:].isalpha()]
    return words, pieces


def random_examples(seed: int, count: int = 24) -> list[QAExample]:
    """Contexts of random MiniLM words (some glued to word pieces, some punctuation), some long
    enough for several windows; answers at random spans of words or of characters, some
    unanswerable; questions of random words, some with leading whitespace."""
    words, pieces = _vocabulary()
    rng = random.Random(seed)

    def word() -> str:
        token = rng.choice(words)
        if rng.random() < 0.2:
            token += rng.choice(pieces)
        return token + (rng.choice(",.;!?") if rng.random() < 0.1 else "")

    examples = []
    for i in range(count):
        tokens = [word() for _ in range(rng.choice([rng.randint(1, 12), rng.randint(10, 60), rng.randint(60, 200)]))]
        context = " ".join(tokens)
        question = " " * rng.choice([0, 0, 1, 3]) + " ".join(word() for _ in range(rng.randint(1, 8))) + "?"
        if rng.random() < 0.15:
            examples.append(QAExample(f"e{seed}-{i}", question, context, title="t"))
            continue
        if rng.random() < 0.7:  # a span of whole words
            first = rng.randrange(len(tokens))
            last = min(len(tokens), first + rng.randint(1, 6))
            start = len(" ".join(tokens[:first])) + (1 if first else 0)
            text = " ".join(tokens[first:last])
        else:  # a span of characters that starts and ends on one that is not a space
            start = rng.choice([k for k, c in enumerate(context) if c != " "])
            ends = [k for k in range(start + 1, min(len(context), start + 40) + 1) if context[k - 1] != " "]
            text = context[start:rng.choice(ends)]
        assert context[start:start + len(text)] == text
        answers = [(text, start)]
        if rng.random() < 0.3:  # a second answer, which run_qa does not train on
            answers.append((context[:1], 0))
        examples.append(QAExample(f"e{seed}-{i}", question, context, tuple(a[0] for a in answers),
                                  tuple(a[1] for a in answers), "t"))
    return examples


def _assert_windows_equal_run_qa(examples, side: str, max_seq_length: int, doc_stride: int, pad: bool) -> int:
    """Asserts train and validation windows equal run_qa's: inputs, ids, offsets, and labels except
    run_qa's one mislabelling (an answer starting in the window's last context token: module
    docstring of windows), where ours must be that token. Returns the windows compared."""
    tokenizer = _tokenizer(side)
    columns = examples_as_columns(examples)
    options = {"max_seq_length": max_seq_length, "doc_stride": doc_stride, "pad_to_max_length": pad}
    ours = windows.train_features(examples, tokenizer, **options)
    reference = prepare_train_features(columns, tokenizer, **options)
    for name in ("input_ids", "attention_mask", "token_type_ids"):
        assert [list(row) for row in ours[name]] == reference[name], name
    context_index = 1 if side == "right" else 0
    for window, (start, end) in enumerate(zip(ours["start_positions"], ours["end_positions"])):
        expected = reference["start_positions"][window], reference["end_positions"][window]
        sequence_ids = reference.sequence_ids(window)
        if expected[0] > expected[1]:  # run_qa's start walked past the context: the answer starts in its last token
            last = max(k for k, s in enumerate(sequence_ids) if s == context_index)
            assert (start, end) == (last, expected[1]), window
        else:
            assert (start, end) == expected, window
    assert list(ours["example_index"]) == _sample_mapping(columns, tokenizer, options)
    validation = windows.validation_features(examples, tokenizer, **options)
    reference = prepare_validation_features(columns, tokenizer, **options)
    assert validation["example_id"] == reference["example_id"]
    assert validation["offset_mapping"] == [[None if o is None else tuple(o) for o in row]
                                            for row in reference["offset_mapping"]]
    assert [list(row) for row in validation["input_ids"]] == reference["input_ids"]
    return len(ours["input_ids"])


def _sample_mapping(columns, tokenizer, options) -> list[int]:
    side = tokenizer.padding_side == "right"
    questions = [q.lstrip() for q in columns["question"]]
    encoded = tokenizer(questions if side else columns["context"], columns["context"] if side else questions,
                        truncation="only_second" if side else "only_first", max_length=options["max_seq_length"],
                        stride=options["doc_stride"], return_overflowing_tokens=True)
    return encoded["overflow_to_sample_mapping"]


SETTINGS = [(48, 16), (64, 0), (40, 5), (96, 40)]
"""(max_seq_length, doc_stride) pairs: windows short enough that long contexts overflow."""


@pytest.mark.parametrize("side", ["right", "left"])
def test_windows_and_labels_equal_run_qa_on_random_examples(side):
    compared = 0
    for seed, (max_seq_length, doc_stride) in enumerate(SETTINGS):
        compared += _assert_windows_equal_run_qa(random_examples(seed), side, max_seq_length, doc_stride,
                                                 pad=seed % 2 == 0)
    assert compared > 4 * 24  # long contexts did overflow into several windows


@pytest.mark.slow
@pytest.mark.parametrize("side", ["right", "left"])
def test_windows_and_labels_equal_run_qa_on_many_random_examples(side):
    rng = random.Random(side)
    for seed in range(100, 140):
        max_seq_length = rng.randint(32, 160)
        doc_stride = rng.randint(0, max_seq_length // 3)
        _assert_windows_equal_run_qa(random_examples(seed, 16), side, max_seq_length, doc_stride,
                                     pad=rng.random() < 0.5)


@pytest.mark.parametrize("side", ["right", "left"])
def test_every_label_spans_exactly_the_tokens_of_its_answer(side):
    """Independent of run_qa: a window holding the whole answer is labelled with the tokens that hold
    its first and last characters; any other window, and an unanswerable example's, with [CLS]."""
    tokenizer = _tokenizer(side)
    examples = random_examples(7) + random_examples(8)
    features = windows.validation_features(examples, tokenizer, max_seq_length=48, doc_stride=12, with_labels=True)
    labelled = 0
    for window, example_index in enumerate(features["example_index"]):
        example, offsets = examples[example_index], features["offset_mapping"][window]
        start, end = features["start_positions"][window], features["end_positions"][window]
        context = [span for span in offsets if span is not None]
        answer = (example.answer_starts[0], example.answer_starts[0] + len(example.answer_texts[0])) \
            if example.answerable else None
        if answer is None or not context[0][0] <= answer[0] < answer[1] <= context[-1][1]:
            assert start == end and features["input_ids"][window][start] == tokenizer.cls_token_id
            continue
        labelled += 1
        assert offsets[start][0] <= answer[0] < offsets[start][1]  # the token holding its first character
        assert offsets[end][0] < answer[1] <= offsets[end][1]  # ... and its last
    assert labelled > 10


@pytest.mark.parametrize("side", ["right", "left"])
def test_an_answer_in_the_windows_last_context_token_is_labelled_there(side):
    tokenizer = _tokenizer(side)
    context = "alpha beta gamma delta epsilon"
    example = QAExample("end", "which?", context, ("epsilon",), (context.index("epsilon"),))
    features = windows.train_features([example], tokenizer, max_seq_length=32, doc_stride=8)
    start, end = int(features["start_positions"][0]), int(features["end_positions"][0])
    assert tokenizer.decode(features["input_ids"][0][start:end + 1]) == "epsilon"
    reference = prepare_train_features(examples_as_columns([example]), tokenizer, max_seq_length=32, doc_stride=8)
    assert reference["start_positions"][0] != start  # run_qa labels a [PAD] or the final [SEP]


def test_long_contexts_overflow_into_windows_sharing_doc_stride_tokens():
    tokenizer = _tokenizer("right")
    context = " ".join(f"w{i}" for i in range(100))  # "w", "##0": two tokens a word, at least
    example = QAExample("long", "which?", context, ("w77",), (context.index("w77"),))
    features = windows.validation_features([example], tokenizer, max_seq_length=40, doc_stride=10, with_labels=True)
    spans = [[o for o in offsets if o is not None] for offsets in features["offset_mapping"]]
    assert len(spans) > 3 and all(len(s) == 40 - 5 for s in spans[:-1])  # [CLS] which ? [SEP] ... [SEP]
    for before, after in itertools.pairwise(spans):
        assert before[-10:] == after[:10]
    labelled = [w for w in range(len(spans)) if features["start_positions"][w] != 0]
    assert labelled and all(tokenizer.decode(features["input_ids"][w][features["start_positions"][w]:
                                                                      features["end_positions"][w] + 1]) == "w77"
                            for w in labelled)


# -- windows: refusals and padding ---------------------------------------------------------------


def test_a_question_that_leaves_no_room_for_the_context_is_refused_naming_max_seq_length():
    tokenizer = _tokenizer("right")
    long_question = " ".join(["paris"] * 30)
    examples = [EXAMPLES[0], QAExample("long", long_question, CONTEXT_1, ("Denver",), (49,))]
    with pytest.raises(ValueError, match=r"the question of example 'long' is 30 tokens: with the 3 special tokens of a "
                                         r"pair, max_seq_length=32 leaves no token of the context beside it\. Pass "
                                         r"max_seq_length=42 or more \(--max_seq_length\), or shorten the question"):
        windows.train_features(examples, tokenizer, max_seq_length=32, doc_stride=8)
    windows.train_features(examples, tokenizer, max_seq_length=42, doc_stride=8)


@pytest.mark.parametrize("side", ["right", "left"])
def test_a_doc_stride_the_window_cannot_advance_past_is_refused_naming_doc_stride(side):
    tokenizer = _tokenizer(side)
    example = QAExample("q", "one two three four five", CONTEXT_1 * 3, ("Denver",), (49,))
    with pytest.raises(ValueError, match=r"example 'q' is 5 tokens: a window of max_seq_length=20 holds 12 context "
                                         r"tokens .* doc_stride=12 must be below that.* Pass doc_stride=11 or less "
                                         r"\(--doc_stride\), or max_seq_length=21 or more"):
        windows.train_features([example], tokenizer, max_seq_length=20, doc_stride=12)
    assert len(windows.train_features([example], tokenizer, max_seq_length=20, doc_stride=11)["input_ids"]) > 1


def test_a_context_without_a_token_is_refused():
    example = QAExample("z", "why?", "\u200b\u200b", (), ())
    with pytest.raises(ValueError, match=r"the context of example 'z' has no token for the tokenizer"):
        windows.train_features([example], _tokenizer("right"), max_seq_length=32, doc_stride=8)


def test_a_tokenizer_without_pad_token_or_offsets_is_refused():
    tokenizer = _gpt2_like(pad=False)
    with pytest.raises(ValueError, match=r"has no pad token .* or pass pad_to_max_length=False"):
        windows.train_features(EXAMPLES, tokenizer, max_seq_length=64, doc_stride=16)
    unpadded = windows.train_features(EXAMPLES, tokenizer, max_seq_length=64, doc_stride=16, pad_to_max_length=False)
    assert len(unpadded["input_ids"]) == len(EXAMPLES)

    class Slow:
        is_fast = False

    with pytest.raises(ValueError, match=r"Slow is not a fast tokenizer.*use_fast=True"):
        windows.train_features(EXAMPLES, Slow(), max_seq_length=64, doc_stride=16)


@pytest.mark.parametrize("side", ["right", "left"])
def test_windows_padded_later_equal_windows_padded_to_max_length(side):
    tokenizer = _tokenizer(side)
    examples = random_examples(3)
    options = {"max_seq_length": 48, "doc_stride": 16}
    for make in (windows.train_features, windows.validation_features):
        padded = make(examples, tokenizer, **options)
        unpadded = make(examples, tokenizer, **options, pad_to_max_length=False)
        assert len({len(row) for row in unpadded["input_ids"]}) > 1
        later = windows.pad_features(unpadded, pad_token_id=tokenizer.pad_token_id, padding_side=side, length=48)
        assert set(later) == set(padded)
        for name, column in padded.items():
            if isinstance(column, np.ndarray):
                assert np.array_equal(later[name], column) and later[name].dtype == np.int32, name
            else:
                assert later[name] == column, name


def test_pad_features_refuses_a_window_longer_than_the_length():
    features = windows.train_features(EXAMPLES, _tokenizer("right"), max_seq_length=64, doc_stride=16,
                                      pad_to_max_length=False)
    with pytest.raises(ValueError, match=r"a window is \d+ tokens, longer than length=8"):
        windows.pad_features(features, pad_token_id=0, length=8)


def test_feature_columns_are_int32_arrays_a_train_step_batches():
    features = windows.train_features(EXAMPLES, _tokenizer("right"), max_seq_length=64, doc_stride=16)
    assert set(features) == {"input_ids", "attention_mask", "token_type_ids", "start_positions", "end_positions",
                             "example_index"}
    assert features["input_ids"].shape == (4, 64) and features["start_positions"].shape == (4,)
    assert all(column.dtype == np.int32 for column in features.values())
    start, end = features["start_positions"][0], features["end_positions"][0]
    assert _tokenizer("right").decode(features["input_ids"][0][start:end + 1]) == "denver broncos"


# -- the CLS index of tokenizers without [CLS] -------------------------------------------------------


def _byte_level(special: list[str]):
    from tokenizers import ByteLevelBPETokenizer

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator([e.context + " " + e.question for e in EXAMPLES] * 5, vocab_size=400,
                            special_tokens=special, show_progress=False)
    return bpe._tokenizer  # the tokenizers.Tokenizer, which transformers truncates and pads


def _gpt2_like(pad: bool = True):
    """GPT-2's shape: no [CLS], its BOS the end-of-text token it never adds, padded (as
    flaxheads.tokenizer.load_tokenizer pads it) with that same token."""
    tokenizer = transformers.GPT2TokenizerFast(tokenizer_object=_byte_level(["<|endoftext|>"]),
                                               eos_token="<|endoftext|>", bos_token="<|endoftext|>",
                                               unk_token="<|endoftext|>")
    if pad:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def _llama_like():
    """Llama's shape: no [CLS], a <s> BOS before the pair, padded with </s>."""
    from tokenizers.processors import TemplateProcessing

    bpe = _byte_level(["<s>", "</s>"])
    bpe.post_processor = TemplateProcessing(single="<s> $A", pair="<s> $A $B:1", special_tokens=[("<s>", 0)])
    return transformers.PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<s>", eos_token="</s>",
                                                pad_token="</s>")


@pytest.mark.parametrize("side", ["right", "left"])
def test_without_cls_an_unanswerable_window_is_labelled_at_bos_else_the_first_real_token(side):
    unanswerable = [QAExample("n", "Who lost?", CONTEXT_1)]
    for tokenizer, token in ((_gpt2_like(), None), (_llama_like(), "<s>")):
        tokenizer.padding_side = side
        features = windows.train_features(unanswerable, tokenizer, max_seq_length=64, doc_stride=16)
        first_real = int(np.argmax(features["attention_mask"][0]))
        assert (side == "left") == (first_real > 0)
        assert features["start_positions"][0] == features["end_positions"][0] == first_real
        if token:
            assert tokenizer.convert_ids_to_tokens(int(features["input_ids"][0][first_real])) == token
        later = windows.train_features(unanswerable, tokenizer, max_seq_length=64, doc_stride=16,
                                       pad_to_max_length=False)
        assert windows.pad_features(later, pad_token_id=tokenizer.pad_token_id, padding_side=side,
                                    length=64)["start_positions"][0] == first_real
    gpt2 = _gpt2_like()
    reference = prepare_train_features(examples_as_columns(unanswerable), gpt2, max_seq_length=64, doc_stride=16)
    assert reference["start_positions"][0] == int(np.argmin(reference["attention_mask"][0]))  # run_qa: the first pad
