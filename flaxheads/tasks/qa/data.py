"""Extractive question-answering data (SQuAD v1.1 and v2.0): per example a question, the context
that holds its answer, and the answers as texts with the character each starts at.

| file                                         | holds                                                          |
|----------------------------------------------|----------------------------------------------------------------|
| .json, SQuAD's own nested format             | {"data": [{"title", "paragraphs": [{"context", "qas": [{"id",  |
|                                              | "question", "answers": [{"text", "answer_start"}],             |
|                                              | "is_impossible" (v2), "plausible_answers" (v2, not read)}]}]}]} |
| .json, flat (the `datasets` squad format)    | a list of records, or {"data": [records]} as run_qa.py reads   |
|                                              | it, or JSON Lines: {"id", "title" (optional), "question",     |
|                                              | "context", "answers": {"text": [...], "answer_start": [...]}}  |
| .jsonl                                       | the flat records, one per line                                 |
| .csv, .tsv                                   | columns id, title (optional), question, context, and either   |
|                                              | `answers` (a cell holding the JSON, or Python, dict above) or |
|                                              | `answer_text` and `answer_start` (a cell holding one answer,  |
|                                              | a JSON list of several, or nothing: no answer)                 |

A record's `answers` may also be a list of {"text", "answer_start"} dicts (the nested format's).
A flat file without any `id` gives its examples the ids "0", "1", ... (their order); a file where
only some records have one is refused. Ids are read as strings.

Every answer is checked against its context: `context[answer_start:answer_start + len(text)]`
must be the text. Nothing is moved to make an answer fit (a span shifted by a guess trains the
model on the wrong words): an answer that is not where its answer_start says is refused, saying
where the text does occur (the nearest place, "off by one?"), or that the start counts bytes of
UTF-8 rather than characters, when it does. Also refused, each naming the file, the example's id,
its place (a line of JSON Lines, CSV or TSV, a record of a JSON array, or the article, paragraph
and question of the nested format: `flaxheads.data.places`) and the fix: an empty question,
context or answer text, an answer_start that is not a whole number or lies outside the context,
answer text and answer_start lists of different lengths, an id used twice in a file, and, unless
`version_2_with_negative`, a question with no answer (SQuAD v1 has none; v2 marks them
`is_impossible`, which must agree with the answers).

Questions are kept as written; the pre-processing strips their leading whitespace as run_qa.py
does (`flaxheads.tasks.qa.windows`).
"""

from __future__ import annotations

import ast
import csv
import dataclasses
import json
import math
import pathlib
import re
from collections.abc import Iterable, Mapping, Sequence

from flaxheads.data.places import INDEX, LINE, RECORD, RowPlaces

QUESTION = "question"
CONTEXT = "context"
ANSWERS = "answers"
ANSWER_TEXT = "answer_text"
ANSWER_START = "answer_start"
SUFFIXES = (".json", ".jsonl", ".csv", ".tsv")
"""The files `read_qa_file` reads."""
V2_FIX = "pass version_2_with_negative=True if the data has unanswerable questions (SQuAD v2)"


@dataclasses.dataclass(frozen=True)
class QAExample:
    """One question about one context, with its answers (none: unanswerable, or not given)."""

    id: str
    question: str
    context: str
    answer_texts: tuple[str, ...] = ()
    answer_starts: tuple[int, ...] = ()
    """The character of `context` each answer starts at, one per text."""
    title: str | None = None

    @property
    def answers(self) -> dict[str, list]:
        """{"text": [...], "answer_start": [...]}: the `datasets` squad column, as run_qa.py and
        the squad metrics read it."""
        return {"text": list(self.answer_texts), "answer_start": list(self.answer_starts)}

    @property
    def answerable(self) -> bool:
        return bool(self.answer_texts)


def read_qa_file(path: str | pathlib.Path, *, version_2_with_negative: bool = False, labelled: bool | None = None,
                 source: str | None = None) -> list[QAExample]:
    """The examples of the QA file at `path` (.json nested or flat, .jsonl, .csv, .tsv: the module
    docstring's table), checked as it says. `labelled`: whether every example must have answer
    fields (True), whether they are ignored (False: data to predict), or whichever the file says
    (None: labelled when any record has them). `source`: how messages name the file (default: the
    path). Raises FileNotFoundError for a missing file and ValueError, naming the file, the example
    and the fix, for an unknown suffix, unreadable content and the bad data the docstring lists."""
    path = pathlib.Path(path)
    source = source or str(path)
    suffix = path.suffix.lower()
    if suffix not in SUFFIXES:
        raise ValueError(f"{source}: cannot read question-answering data from a {suffix or 'suffix-less'} file; give "
                         f"one of {', '.join(SUFFIXES)} (the formats of flaxheads.tasks.qa.data)")
    if not path.is_file():
        raise FileNotFoundError(f"{source}: no such file")
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as error:
        raise ValueError(f"{source} is not UTF-8 ({error}); save it as UTF-8") from None
    if not text.strip():
        raise ValueError(f"{source} is empty: give it question-answering examples")
    if suffix in (".csv", ".tsv"):
        records, places = _csv_records(text, "\t" if suffix == ".tsv" else ",", source)
        return _flat_examples(records, places, version_2_with_negative, labelled, text_cells=True)
    if suffix == ".jsonl":
        records, places = _json_lines(text, source)
        return _flat_examples(records, places, version_2_with_negative, labelled)
    try:
        content = json.loads(text)
    except json.JSONDecodeError as error:
        if error.msg != "Extra data":
            raise ValueError(f"{source} is not JSON: {error.msg} at line {error.lineno}, column {error.colno}"
                             ) from None
        records, places = _json_lines(text, source)  # JSON Lines saved as .json, as datasets' to_json writes
        return _flat_examples(records, places, version_2_with_negative, labelled)
    return qa_examples(content, version_2_with_negative=version_2_with_negative, labelled=labelled,
                       places=RowPlaces(source, RECORD))


def qa_examples(data, *, version_2_with_negative: bool = False, labelled: bool | None = None,
                source: str = "the data", places: RowPlaces | None = None) -> list[QAExample]:
    """The examples of QA data held in Python: SQuAD's nested {"data": [articles]} (or the list of
    articles), flat records (a list of dicts, {"data": [records]}, a dict of columns or a
    `datasets.Dataset`), checked as `read_qa_file` checks a file. `source`: how messages name the
    data; `places`: how they name its rows (default: by index)."""
    places = places or RowPlaces(source, INDEX)
    if isinstance(data, Mapping) and "data" in data and not _is_columns(data):
        data = data["data"]
    if isinstance(data, Mapping):
        if not _is_columns(data):
            raise ValueError(f"{places.source} holds an object without a 'data' list, question and context columns; "
                             "give SQuAD's {\"data\": [...]}, a list of records, or a dict of columns")
        names = list(data)
        lengths = {name: len(data[name]) for name in names if isinstance(data[name], (list, tuple))}
        if len(set(lengths.values())) > 1 or len(lengths) < len(names):
            raise ValueError(f"the columns of {places.source} differ in length ({lengths}, and not lists: "
                             f"{[n for n in names if n not in lengths]}); give every column one value per example")
        data = [dict(zip(names, row)) for row in zip(*(data[name] for name in names))]
    if isinstance(data, (str, bytes)) or not hasattr(data, "__iter__"):
        raise ValueError(f"{places.source} holds {_short(data)}, not examples; give SQuAD's {{\"data\": [...]}}, a "
                         "list of records, or a dict of columns")
    records = list(data)
    if not records:
        raise ValueError(f"{places.source} has no examples: give it question-answering examples")
    if all(isinstance(record, Mapping) and "paragraphs" in record for record in records):
        return _nested_examples(records, places.source, version_2_with_negative, labelled)
    return _flat_examples(records, places, version_2_with_negative, labelled)


def _is_columns(data: Mapping) -> bool:
    return all(isinstance(data.get(name), (list, tuple)) for name in (QUESTION, CONTEXT))


def examples_as_columns(examples: Sequence[QAExample]) -> dict[str, list]:
    """The examples as the `datasets` squad columns: id, title, question, context and answers
    ({"text": [...], "answer_start": [...]} per example), what run_qa.py's functions read."""
    return {"id": [e.id for e in examples], "title": [e.title for e in examples],
            QUESTION: [e.question for e in examples], CONTEXT: [e.context for e in examples],
            ANSWERS: [e.answers for e in examples]}


# -- detection ------------------------------------------------------------------------------------


def looks_like_qa_columns(column_names: Iterable[str], *, labelled: bool = True) -> bool:
    """Whether a split with `column_names` reads as QA data: a question and a context column,
    and (with `labelled`) answers (an `answers` column, or `answer_start`)."""
    names = set(column_names)
    has_answers = ANSWERS in names or ANSWER_START in names
    return QUESTION in names and CONTEXT in names and (has_answers or not labelled)


def looks_like_qa_file(path: str | pathlib.Path, *, labelled: bool = True) -> bool:
    """Whether the file at `path` holds QA data, read from its first 64 KiB: SQuAD's nested JSON
    (an object with "data", "paragraphs" and "qas"), or flat records / CSV columns for which
    `looks_like_qa_columns` holds. False for other suffixes and unreadable files."""
    path = pathlib.Path(path)
    suffix = path.suffix.lower()
    if suffix not in SUFFIXES or not path.is_file():
        return False
    try:
        with open(path, encoding="utf-8-sig", errors="replace") as f:
            head = f.read(65536)
    except OSError:
        return False
    if suffix in (".csv", ".tsv"):
        header = next(csv.reader([head.split("\n", 1)[0]], delimiter="\t" if suffix == ".tsv" else ","), [])
        return looks_like_qa_columns(header, labelled=labelled)
    text = head.lstrip()
    if text.startswith("{") and all(f'"{key}"' in text for key in ("data", "paragraphs", "qas")):
        return True
    data = (re.search(r'"data"\s*:\s*\[', text) if text.startswith("{") else None) or re.match(r"\[", text)
    start = data.end() if data else 0
    try:
        record, _ = json.JSONDecoder().raw_decode(text[start:].lstrip())
    except ValueError:
        return False
    return isinstance(record, dict) and looks_like_qa_columns(record, labelled=labelled)


# -- readers --------------------------------------------------------------------------------------


def _json_lines(text: str, source: str) -> tuple[list, RowPlaces]:
    records, lines = [], []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as error:
            raise ValueError(f"line {number} of {source} is not JSON ({error.msg}, column {error.colno}); JSON Lines "
                             "hold one JSON object per line") from None
        lines.append(number)
    return records, RowPlaces(source, LINE, lambda: lines)


def _csv_records(text: str, delimiter: str, source: str) -> tuple[list, RowPlaces]:
    reader = csv.reader(text.splitlines(keepends=True), delimiter=delimiter)
    header, records, lines, end = None, [], [], 0
    try:
        for fields in reader:
            start, end = end + 1, reader.line_num
            if not fields or (len(fields) == 1 and not fields[0].strip()):
                continue
            if header is None:
                header = [name.strip() for name in fields]
                continue
            if len(fields) != len(header):
                raise ValueError(f"line {start} of {source} has {len(fields)} fields and the header {len(header)} "
                                 f"({header}); quote cells that hold the delimiter {delimiter!r}")
            records.append(dict(zip(header, fields)))
            lines.append(start)
    except csv.Error as error:
        raise ValueError(f"{source} could not be read as CSV near line {end + 1}: {error}") from None
    if not records:
        raise ValueError(f"{source} has a header and no rows: give it question-answering examples")
    return records, RowPlaces(source, LINE, lambda: lines)


def _nested_examples(articles: list, source: str, version_2: bool, labelled: bool | None) -> list[QAExample]:
    """SQuAD's nested format: each question read as a flat record and named by its place."""
    records, names = [], []
    for a, article in enumerate(articles, start=1):
        title = article.get("title")
        for p, paragraph in enumerate(_listed(article, "paragraphs", f"article {a} of {source}"), start=1):
            place = f"article {a}{f' ({title!r})' if title else ''}, paragraph {p}"
            where = f"{place} of {source}"
            if not isinstance(paragraph, Mapping):
                raise ValueError(f"{where} is {type(paragraph).__name__}, not an object with 'context' and 'qas'")
            for q, qa in enumerate(_listed(paragraph, "qas", where), start=1):
                if not isinstance(qa, Mapping):
                    raise ValueError(f"{where}, question {q} is {type(qa).__name__}, not an object")
                records.append({**qa, "title": title, CONTEXT: paragraph.get(CONTEXT)})
                names.append(f"{place}, question {q}")
    places = _NamedPlaces(source, names)
    if not records:
        raise ValueError(f"{source} has no questions: give its paragraphs 'qas'")
    return _flat_examples(records, places, version_2, labelled, ids_required=True)


class _NamedPlaces(RowPlaces):
    """Places named by a list: the nested format's article, paragraph and question."""

    def __init__(self, source: str, names: list[str]):
        super().__init__(source, RECORD)
        self._names = names

    def row(self, row: int) -> str:
        return self._names[row]


def _listed(record: Mapping, key: str, where: str) -> list:
    value = record.get(key)
    if not isinstance(value, list):
        raise ValueError(f"{where} has no {key!r} list (found {type(value).__name__}); SQuAD's format is "
                         '{"data": [{"title", "paragraphs": [{"context", "qas": [{"id", "question", "answers"}]}]}]}')
    return value


def _flat_examples(records: list, places: RowPlaces, version_2: bool, labelled: bool | None, *,
                   text_cells: bool = False, ids_required: bool = False) -> list[QAExample]:
    for row, record in enumerate(records):
        if not isinstance(record, Mapping):
            raise ValueError(f"{places.at(row)} is {type(record).__name__}, not a record with question, context and "
                             "answers")
    with_ids = [row for row, record in enumerate(records) if not _blank(record.get("id"))]
    if ids_required or with_ids:
        has_id = set(with_ids)
        missing = next((row for row in range(len(records)) if row not in has_id), None)
        if missing is not None:
            raise ValueError(f"{places.at(missing)} has no id and other examples have one; give every example a "
                             "unique id (post-processing matches predictions to examples by id)")
    if labelled is None:
        labelled = any(_has_answer_fields(record) for record in records)
    examples, seen = [], {}
    for row, record in enumerate(records):
        example_id = str(record["id"]).strip() if with_ids else str(row)
        where = f"{places.at(row)} (id {example_id!r})"
        if example_id in seen:
            raise ValueError(f"{where}: the id is also the id of {places.row(seen[example_id])}; ids must be unique "
                             "(post-processing matches predictions to examples by id): give it another")
        seen[example_id] = row
        question = _text(record, QUESTION, where)
        context = _text(record, CONTEXT, where)
        texts, starts = _answers(record, where, labelled, text_cells)
        for text, start in zip(texts, starts):
            _check_answer(text, start, context, where)
        _check_answerable(record, texts, where, version_2, labelled)
        title = record.get("title")
        examples.append(QAExample(example_id, question, context, tuple(texts), tuple(starts),
                                  None if _blank(title) else str(title)))
    return examples


def _blank(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value)) or (
        isinstance(value, str) and not value.strip())


def _has_answer_fields(record: Mapping) -> bool:
    return ANSWERS in record or ANSWER_START in record or ANSWER_TEXT in record


def _text(record: Mapping, field: str, where: str) -> str:
    value = record.get(field)
    if isinstance(value, str) and value.strip():
        return value
    if field not in record:
        shown = "missing"
    elif _blank(value) or isinstance(value, str):
        shown = "empty"
    else:
        shown = f"{type(value).__name__} {_short(value)}, not text"
    raise ValueError(f"{where}: the {field} is {shown}; give every example a {field}, or remove the example")


def _answers(record: Mapping, where: str, labelled: bool, text_cells: bool) -> tuple[list[str], list[int]]:
    if not labelled or (not _has_answer_fields(record) and _impossible(record)):
        return [], []
    if ANSWERS in record:
        answers = record[ANSWERS]
        if text_cells and _blank(answers):
            return [], []  # an empty cell: no answer, as empty answer_text and answer_start cells
        if text_cells and isinstance(answers, str):
            answers = _parsed_cell(answers, where, ANSWERS, '{"text": ["Denver Broncos"], "answer_start": [177]}')
        if isinstance(answers, list) and all(isinstance(a, Mapping) for a in answers):  # the nested format's list
            texts = [a.get("text") for a in answers]
            starts = [a.get(ANSWER_START) for a in answers]
        elif isinstance(answers, Mapping) and "text" in answers and ANSWER_START in answers:
            texts, starts = _as_list(answers["text"]), _as_list(answers[ANSWER_START])
        else:
            raise ValueError(f"{where}: answers holds {_short(answers)}; give {{\"text\": [...], \"answer_start\": "
                             "[...]}} (an empty list each for no answer), or a list of {\"text\", \"answer_start\"}")
    elif ANSWER_TEXT in record and ANSWER_START in record:
        texts, starts = _cell_list(record[ANSWER_TEXT], text_cells), _cell_list(record[ANSWER_START], text_cells)
    else:
        raise ValueError(f"{where} has no answers: give it an 'answers' field ({{\"text\": [...], \"answer_start\": "
                         "[...]}}) or 'answer_text' and 'answer_start', as the other examples; or read the data as "
                         "data to predict (labelled=False)")
    if len(texts) != len(starts):
        raise ValueError(f"{where}: {len(texts)} answer text(s) and {len(starts)} answer_start(s); give one "
                         "answer_start per answer text")
    for text in texts:
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"{where}: an answer text is {_short(text)}; give each answer its text as it reads in "
                             "the context, or an empty answer list for a question without an answer")
    return texts, [_start(start, where) for start in starts]


def _parsed_cell(cell: str, where: str, column: str, example: str):
    for parse in (json.loads, ast.literal_eval):  # a JSON cell, or a Python one as pandas writes a dict of lists
        try:
            return parse(cell)
        except (ValueError, SyntaxError):
            continue
    raise ValueError(f"{where}: the {column!r} cell {_short(cell)} is neither JSON nor a Python literal; write it as "
                     f"JSON, e.g. {example}")


def _as_list(value) -> list:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _cell_list(value, text_cells: bool) -> list:
    """An answer_text / answer_start value: one answer, a list of several, or nothing (no answer)."""
    if _blank(value):
        return []
    if text_cells and isinstance(value, str) and value.strip().startswith("["):
        try:
            return list(json.loads(value))
        except ValueError:
            pass
    return _as_list(value)


def _start(value, where: str) -> int:
    if isinstance(value, str) and re.fullmatch(r"\s*\d+\s*", value):
        value = int(value)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{where}: answer_start {_short(value)} is not a whole number; give the index of the "
                         "answer's first character in the context, counted from 0")
    return value


def _check_answer(text: str, start: int, context: str, where: str) -> None:
    """Raises ValueError unless `text` is at `start` of `context`, saying where it is instead."""
    end = start + len(text)
    if start < 0 or end > len(context):
        found = _where_found(text, start, context)
        raise ValueError(f"{where}: the answer {_short(text)} at answer_start {start} runs outside the context, which "
                         f"is {len(context)} characters long{found}; give the index of the answer's first character "
                         "in the context, counted from 0, or remove the answer")
    if context[start:end] == text:
        return
    found = _where_found(text, start, context)
    raise ValueError(f"{where}: the answer {_short(text)} is not at answer_start {start}: the context there reads "
                     f"{_short(context[start:end])}{found}. Give the index of the answer's "
                     "first character in the context (Python's context.index(text) counts as SQuAD does), or remove "
                     "the answer; flaxheads moves no answer to where it guesses it is")


def _where_found(text: str, start: int, context: str) -> str:
    encoded, answer = context.encode("utf-8"), text.encode("utf-8")
    if encoded[start:start + len(answer)] == answer:
        return (f"; it is there counting bytes of UTF-8, and answer_start must count characters, not bytes (it is "
                f"{len(encoded[:start].decode('utf-8', errors='ignore'))} here)")
    found = [m.start() for m in re.finditer(re.escape(text), context)]
    if found:
        nearest = min(found, key=lambda at: abs(at - start))
        offset = nearest - start
        hint = " (off by one?)" if abs(offset) == 1 else ""
        others = f" (and {len(found) - 1} other place{'s' if len(found) > 2 else ''})" if len(found) > 1 else ""
        return f"; the text occurs at {nearest}{others}, {abs(offset)} {'after' if offset > 0 else 'before'} it{hint}"
    if text.lower() in context.lower() or text.strip() in context:
        return "; the context holds it only with other case or spaces"
    return "; the text occurs nowhere in the context"


def _check_answerable(record: Mapping, texts: list, where: str, version_2: bool, labelled: bool) -> None:
    if not labelled:
        return
    impossible = _impossible(record)
    if impossible and texts:
        raise ValueError(f"{where}: is_impossible is true and the question has {len(texts)} answer(s); SQuAD v2 keeps "
                         "an unanswerable question's answers empty (its guesses in plausible_answers): make them agree")
    if impossible is False and not texts and "is_impossible" in record:
        raise ValueError(f"{where}: is_impossible is false and the question has no answer; give it its answers, or "
                         "set is_impossible to true")
    if not texts and not version_2:
        raise ValueError(f"{where} has no answer, and SQuAD v1 data answers every question: {V2_FIX} "
                         "(--version_2_with_negative), or give it its answer")


def _impossible(record: Mapping) -> bool | None:
    """A record's is_impossible (SQuAD v2's mark of an unanswerable question), None without one."""
    impossible = record.get("is_impossible")
    if isinstance(impossible, str):  # a CSV cell
        return impossible.strip().lower() in ("true", "1", "yes") if impossible.strip() else None
    return None if impossible is None else bool(impossible)


def _short(value, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 4] + "...'"


__all__ = [
    "ANSWERS",
    "CONTEXT",
    "QUESTION",
    "SUFFIXES",
    "QAExample",
    "examples_as_columns",
    "looks_like_qa_columns",
    "looks_like_qa_file",
    "qa_examples",
    "read_qa_file",
]
