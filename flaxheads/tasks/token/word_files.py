"""Word-level tagged data (NER, POS) from files: one list of words and one of tags per sentence.

| reader              | files                                   | a sentence is                                   |
|---------------------|-----------------------------------------|-------------------------------------------------|
| `read_conll`        | CoNLL columns (.conll .txt .tsv .iob)   | lines of "token ... tag", ended by a blank line |
| `read_conllu`       | Universal Dependencies (.conllu)        | word lines of FORM and UPOS (or XPOS)           |
| `read_word_records` | .json (array or JSON Lines), .jsonl,    | one record with a tokens list and a tags list   |
|                     | .csv                                    |                                                 |

`read_word_file` picks the reader by suffix. CoNLL files: columns are separated by tabs where
every word line has one (then spaces stay inside tokens: "New York\tB-LOC"), else by runs of
spaces and tabs (CoNLL-2003's), never by other white space (a no-break space stays inside its
token); every word line has as many columns as most of them, so a space that cuts a token in two
is refused, not read as a column. The token is in column 0 and the tag in the last one unless
chosen; `-DOCSTART-` lines, trailing whitespace, CRLF line ends and a UTF-8 byte-order mark are
skipped. CoNLL-U's `_` (no value) is no tag: refused. CSV cells hold a JSON list
(`["EU", "rejects"]`), a Python list as pandas writes it (`['EU', 'rejects']`) or words separated
by spaces (`EU rejects`). Tags are strings, or integer ids with `label_names` (the tag of each
id, as a `datasets` ClassLabel holds them).

Every error is a ValueError that names the file, the sentence and the word (counted from 1) and,
where the format has lines, the line as an editor shows it (`flaxheads.data.places`), and says
what to change. Nothing is dropped or merged to make a sentence fit: tokens and tags are counted
as they are.
"""

from __future__ import annotations

import ast
import codecs
import csv
import dataclasses
import io
import json
import pathlib
import re
from collections import Counter
from collections.abc import Mapping, Sequence

import datasets

from flaxheads.data.files import not_utf8_message

TOKENS_COLUMN = "tokens"
TAGS_COLUMNS = ("ner_tags", "tags")
"""The tags column `read_word_records` takes when none is named: the first of these present."""
CONLL_SUFFIXES = (".conll", ".txt", ".tsv", ".iob", ".iob2", ".bio", ".bioes")
RECORD_SUFFIXES = (".json", ".jsonl", ".csv")
DOCSTART = "-DOCSTART-"


@dataclasses.dataclass(frozen=True)
class WordSplit:
    """Sentences of words and their tags (strings), as read from `source`."""

    tokens: list[list[str]]
    tags: list[list[str]]
    source: str = "the given sentences"
    """The file they came from, for messages."""
    lines: list[list[int]] | None = None
    """The line of the file each word is on (1-based; a record's line for JSON Lines and CSV),
    or None where the format has no lines (a JSON array, sentences in memory)."""

    def __len__(self) -> int:
        return len(self.tokens)

    def where(self, sentence: int, word: int | None = None) -> str:
        """"<source>, sentence 3, word 2 ('Paris', line 17)" for 0-based `sentence` and `word`."""
        place = f"{self.source}, sentence {sentence + 1}"
        details = []
        if word is not None:
            place += f", word {word + 1}"
            if word < len(self.tokens[sentence]):
                details.append(repr(self.tokens[sentence][word]))
        if self.lines is not None and self.lines[sentence]:
            line_of = self.lines[sentence]
            details.append(f"line {line_of[min(word or 0, len(line_of) - 1)]}")
        return place + (f" ({', '.join(details)})" if details else "")


def word_split(tokens: Sequence[Sequence[str]], tags: Sequence[Sequence], *, label_names: Sequence[str] | None = None,
               source: str = "the given sentences") -> WordSplit:
    """Sentences in memory (a `datasets` split's columns, say) as a checked `WordSplit`: the same
    checks and messages as the file readers. A sentence's tokens and tags are lists (a str is
    refused: its letters are no words)."""
    split = WordSplit([_sentence_list(t, source, i, "tokens") for i, t in enumerate(tokens)],
                      [_sentence_list(t, source, i, "tags") for i, t in enumerate(tags)], source)
    if len(split.tokens) != len(split.tags):
        raise ValueError(f"{source}: {len(split.tokens)} token lists and {len(split.tags)} tag lists; give one of each "
                         "per sentence")
    return _checked(split, label_names)


def _sentence_list(values, source: str, sentence: int, what: str) -> list:
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) and not hasattr(values, "tolist"):
        words = " (split each sentence into its words: text.split())" if isinstance(values, str) else ""
        raise ValueError(f"{source}, sentence {sentence + 1}: the {what} are {type(values).__name__} {_short(values)}, "
                         f"not a list (one entry per word){words}")
    return values.tolist() if hasattr(values, "tolist") else list(values)


def words_in_memory(split, *, tokens_column: str = TOKENS_COLUMN, tags_column: str | None = None
                    ) -> tuple[list, list | None, Sequence[str] | None]:
    """The sentences of `split` held in Python, as (token lists, tag lists or None when it gives
    no tags, the tag name of each integer id when a `datasets` ClassLabel says so, else None).

    `split`: a `(tokens, tags)` tuple (`(tokens,)` or a list of token lists alone: sentences to
    tag), or a `datasets.Dataset`, a dict of columns or a list of row dicts with `tokens_column`
    and a tags column (`tags_column`; default: the first of `TAGS_COLUMNS` present, none: no
    tags), as `read_word_records` reads a file's records. ValueError naming a missing column, or
    for another kind of object."""
    if isinstance(split, tuple):
        if len(split) not in (1, 2):
            raise ValueError(f"a tuple of sentences is (tokens, tags) or (tokens,); got {len(split)} items")
        for item, what in zip(split, ("tokens", "tags")):
            if isinstance(item, (str, bytes)) or not isinstance(item, Sequence) and not hasattr(item, "tolist"):
                raise ValueError(f"the {what} of a (tokens, tags) tuple are {type(item).__name__} {_short(item)}, not "
                                 "a list with one list per sentence")
        return list(split[0]), list(split[1]) if len(split) == 2 else None, None
    if isinstance(split, datasets.Dataset):
        columns = split.to_dict()
    elif isinstance(split, Mapping):
        columns = {name: list(values) for name, values in split.items()}
    else:
        if isinstance(split, (str, bytes)) or split is None or not hasattr(split, "__iter__"):
            raise ValueError(f"sentences must be a (tokens, tags) tuple, a list of token lists, or a datasets.Dataset, "
                             f"a dict of columns or a list of row dicts; got {type(split).__name__}")
        rows = list(split)
        if rows and all(isinstance(row, Mapping) for row in rows):
            columns = {name: [row.get(name) for row in rows] for name in rows[0]}
        elif rows and all(isinstance(row, Sequence) and not isinstance(row, str) for row in rows):
            return rows, None, None
        else:
            texts = " of texts: split each sentence into its words" if rows and isinstance(rows[0], str) else ""
            raise ValueError("sentences must be a (tokens, tags) tuple, a list of token lists, or a datasets.Dataset, "
                            f"a dict of columns or a list of row dicts with a {tokens_column!r} column; got "
                            f"{type(split).__name__}{texts}")
    if tokens_column not in columns:
        raise ValueError(f"the sentences have no column {tokens_column!r} (the words); their columns are "
                         f"{sorted(columns)}")
    if tags_column is None:
        tags_column = next((c for c in TAGS_COLUMNS if c in columns), None)
        if tags_column is None:
            return list(columns[tokens_column]), None, None
    elif tags_column not in columns:
        raise ValueError(f"the sentences have no column {tags_column!r} (set by tags_column); their columns are "
                         f"{sorted(columns)}")
    class_names = None
    if isinstance(split, datasets.Dataset):  # tag ids of a List(ClassLabel) column are named by it
        feature = getattr(split.features[tags_column], "feature", None)
        class_names = feature.names if isinstance(feature, datasets.ClassLabel) else None
    return list(columns[tokens_column]), list(columns[tags_column]), class_names


def read_word_file(path: str | pathlib.Path, **options) -> WordSplit:
    """The reader for the suffix of `path` (see the module table), given `options`: `.conllu`
    -> `read_conllu`, .json/.jsonl/.csv -> `read_word_records`, other suffixes -> `read_conll`."""
    suffix = pathlib.Path(path).suffix.lower()
    if suffix == ".conllu":
        return read_conllu(path, **options)
    if suffix in RECORD_SUFFIXES:
        return read_word_records(path, **options)
    return read_conll(path, **options)


# ---------------------------------------------------------------------------------------------
# CoNLL columns


def read_conll(
    path: str | pathlib.Path, *, token_column: int = 0, tag_column: int = -1, separator: str | None = None,
    label_names: Sequence[str] | None = None,
) -> WordSplit:
    """Sentences of a CoNLL column file: a word per line, its token in `token_column` and its
    tag in `tag_column` (negative counts from the last column), columns split on `separator`, or
    (`separator=None`) on tabs where every word line has one, else on runs of spaces and tabs; a
    line of only whitespace ends a sentence. Lines whose token is `-DOCSTART-` end a sentence and
    are skipped. Integer tags need `label_names`. Raises ValueError naming the line for a line
    without those columns or with another number of columns than most lines (a space inside a
    token), an empty token or tag, and a file that is empty, not UTF-8 or has no sentence."""
    path = pathlib.Path(path)
    lines = _text_lines(path)
    split, tabs = _column_splitter(lines, separator)
    counts = Counter(len(split(line)) for line in lines if line.strip() and not _is_docstart(line))
    most = counts.most_common(1)[0][0] if counts else 0

    def read_word(line: str, number: int, sentence: int, word: int):
        if _is_docstart(line):
            return _END
        columns = split(line)
        if len(columns) != most and len(columns) > 1:
            where = f"{path}, sentence {sentence + 1}, word {word + 1} (line {number})"
            cut = ("a space inside a token cuts it in two: separate the columns with tabs (which keep spaces inside "
                   "tokens) on every line" if not tabs else "a tab inside a token, or a column missing: fix the line")
            raise ValueError(f"{where}: the line has {len(columns)} columns and most lines have {most} "
                             f"({line[:60]!r}); {cut}, or remove the line")
        return _conll_columns(columns, token_column, tag_column, path, number, sentence, word)

    return _checked(_sentences(path, read_word, lines), label_names)


def _is_docstart(line: str) -> bool:
    return line.lstrip(" \t").startswith(DOCSTART) and line.split(None, 1)[0] == DOCSTART


def _column_splitter(lines: Sequence[str], separator: str | None):
    """(how a CoNLL line splits into columns, whether on tabs alone): on `separator` (each
    column stripped of spaces), or on tabs when every word line holds one between its columns,
    else on runs of spaces and tabs; never on other white space, so a no-break space (U+00A0)
    stays inside its token."""
    if separator is not None:
        return (lambda line: [column.strip(" ") for column in line.rstrip(" \r").split(separator)]), separator == "\t"
    words = [line.rstrip(" \t") for line in lines if line.strip() and not _is_docstart(line)]
    if words and all("\t" in line for line in words):
        return (lambda line: [column.strip(" ") for column in line.rstrip(" \t").split("\t")]), True
    return (lambda line: _SPACES.split(line.strip(" \t\n\r\f\v"))), False


_SPACES = re.compile(r"[ \t\n\r\f\v]+")
"""ASCII white space: what separates words and columns (str.split would also cut at a no-break space)."""


_END = object()
"""What a line reader returns for a line that ends the sentence before it (CoNLL's -DOCSTART-)."""


def _sentences(path: pathlib.Path, read_word, text_lines: Sequence[str] | None = None) -> WordSplit:
    """The sentences of a file with a word per line and blank lines (only whitespace) between
    sentences: `read_word(line, line number, sentence index, word index)` returns the line's
    (token, tag), None to skip the line, or `_END` to end the sentence there. `text_lines`: the
    file's lines, where the caller has read them."""
    tokens, tags, lines = [], [], []
    sentence: tuple[list, list, list] = ([], [], [])
    for number, line in enumerate(_text_lines(path) if text_lines is None else text_lines, start=1):
        word = _END if not line.strip() else read_word(line, number, len(tokens), len(sentence[0]))
        if word is _END:
            _close(sentence, tokens, tags, lines)
            sentence = ([], [], [])
        elif word is not None:
            sentence[0].append(word[0])
            sentence[1].append(word[1])
            sentence[2].append(number)
    _close(sentence, tokens, tags, lines)
    return WordSplit(tokens, tags, str(path), lines)


def _close(sentence, tokens: list, tags: list, lines: list) -> None:
    if sentence[0]:
        tokens.append(sentence[0])
        tags.append(sentence[1])
        lines.append(sentence[2])


def _conll_columns(columns: list[str], token_column: int, tag_column: int, path, line: int, sentence: int,
                   word: int) -> tuple[str, str]:
    where = f"{path}, sentence {sentence + 1}, word {word + 1} (line {line})"
    if len(columns) == 1:
        raise ValueError(
            f"{where}: the line has one column ({columns[0]!r}) and so no tag. Each line holds a token and its tag "
            "(and maybe other columns) separated by spaces or tabs, and a blank line ends a sentence"
        )
    try:
        return columns[token_column], columns[tag_column]
    except IndexError:
        raise ValueError(
            f"{where}: the line has {len(columns)} columns, too few for token_column={token_column} and "
            f"tag_column={tag_column} (0-based, negative from the last column); choose columns every line has"
        ) from None


def _text_lines(path: pathlib.Path) -> list[str]:
    """The file's lines, without line ends (LF or CRLF) or a leading byte-order mark."""
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    data = path.read_bytes()
    if not data.strip():
        raise ValueError(f"{path} is empty")
    try:
        text = codecs.decode(data, "utf-8-sig")
    except UnicodeDecodeError as error:
        start = 3 if data.startswith(codecs.BOM_UTF8) else 0
        error.start += start
        raise ValueError(not_utf8_message(path, "path", data, error, 0, 0)) from None
    # Only \n ends a line: str.splitlines would also split inside a token at \x1c, \x85 or \u2028.
    return [line.removesuffix("\r") for line in text.split("\n")]


# ---------------------------------------------------------------------------------------------
# CoNLL-U


def read_conllu(path: str | pathlib.Path, *, tag_field: str = "upos", label_names: Sequence[str] | None = None
                ) -> WordSplit:
    """Sentences of a Universal Dependencies file: each word's FORM and its `tag_field` ("upos",
    column 4, or "xpos", column 5). Comment lines (#), multiword-token lines (ids such as 3-4)
    and empty nodes (ids such as 5.1) are skipped: the words are the syntactic words UD tags.
    Raises ValueError naming the line of a word line without ten tab-separated columns, or whose
    tag is `_` (no value: never read as a tag of its own)."""
    fields = {"upos": 3, "xpos": 4}
    if tag_field not in fields:
        raise ValueError(f"tag_field={tag_field!r}; choose one of {sorted(fields)}")
    path = pathlib.Path(path)

    def read_word(line: str, number: int, sentence: int, word: int):
        if line.startswith("#"):
            return None
        columns = line.split("\t")
        if len(columns) != 10:
            raise ValueError(
                f"{path}, sentence {sentence + 1} (line {number}): a CoNLL-U word line has 10 tab-separated "
                f"columns, this one {len(columns)}: {line[:60]!r}"
            )
        if "-" in columns[0] or "." in columns[0]:
            return None
        if columns[fields[tag_field]] == "_":
            raise ValueError(
                f"{path}, sentence {sentence + 1}, word {word + 1} ({columns[1]!r}, line {number}): the "
                f"{tag_field.upper()} column is _ (no value), which is no tag; give the word its tag, or read the "
                f"tags of another column (tag_field={next(f for f in fields if f != tag_field)!r})"
            )
        return columns[1], columns[fields[tag_field]]

    return _checked(_sentences(path, read_word), label_names)


# ---------------------------------------------------------------------------------------------
# JSON, JSON Lines, CSV records


def read_word_records(
    path: str | pathlib.Path, *, tokens_column: str = TOKENS_COLUMN, tags_column: str | None = None,
    label_names: Sequence[str] | None = None,
) -> WordSplit:
    """Sentences of a .json (an array of objects, or JSON Lines), .jsonl or .csv file, one record
    each: a list of words in `tokens_column` and of tags in `tags_column` (by default the first of
    `TAGS_COLUMNS` the records have). Raises ValueError naming the record's line for malformed
    JSON, a missing column (listing those present), a cell that is not a list, lists of different
    lengths, an empty token or tag, and integer tags without `label_names` or outside them."""
    path = pathlib.Path(path)
    suffix = path.suffix.lower()
    if suffix not in RECORD_SUFFIXES:
        raise ValueError(f"cannot tell the format of {path}; record files end in one of {RECORD_SUFFIXES}")
    text = "\n".join(_text_lines(path))
    records = _csv_records(text, path) if suffix == ".csv" else _json_records(text, path)
    if not records:
        raise ValueError(f"{path} holds no record")
    if tags_column is None:
        tags_column = next((c for c in TAGS_COLUMNS if c in records[0][1]), None)
        if tags_column is None:
            raise ValueError(f"{path} has none of the tag columns {TAGS_COLUMNS}; its columns are "
                             f"{sorted(records[0][1])}. Pass tags_column with the one that holds the tags")
    tokens, tags, lines = [], [], []
    for index, (line, record) in enumerate(records):
        where = f"{path}, sentence {index + 1}" + (f" (line {line})" if line else "")
        for column, option in ((tokens_column, "tokens_column"), (tags_column, "tags_column")):
            if column not in record:
                raise ValueError(f"{where} has no column {column!r} (set by {option}); its columns are "
                                 f"{sorted(record)}. Pass {option} with one of them")
        tokens.append(_as_list(record[tokens_column], where, tokens_column, suffix))
        tags.append(_as_list(record[tags_column], where, tags_column, suffix))
        lines.append([line] * max(len(tokens[-1]), 1) if line else [])
    has_lines = any(line for line, _ in records)
    return _checked(WordSplit(tokens, tags, str(path), lines if has_lines else None), label_names)


def _json_records(text: str, path: pathlib.Path) -> list[tuple[int | None, dict]]:
    """(line or None, object) of each record of a JSON array or of JSON Lines."""
    if text.lstrip().startswith("["):
        try:
            records = json.loads(text)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path} is not valid JSON: {error.msg} at line {error.lineno}, column {error.colno}. "
                             "A .json file holds one array of records, or one record per line") from None
        found = [(None, record) for record in records]
    else:
        found = []
        for number, line in enumerate(text.split("\n"), start=1):
            if not line.strip():
                continue
            try:
                found.append((number, json.loads(line)))
            except json.JSONDecodeError as error:
                raise ValueError(
                    f"{path}, sentence {len(found) + 1} (line {number}) is not valid JSON: {error.msg} at column "
                    f"{error.colno}. Each line holds one record, e.g. "
                    '{"tokens": ["EU", "rejects"], "ner_tags": ["B-ORG", "O"]}'
                ) from None
    for index, (line, record) in enumerate(found):
        if not isinstance(record, dict):
            where = f"sentence {index + 1}" + (f" (line {line})" if line else "")
            raise ValueError(f"{path}, {where} is a {type(record).__name__}, not a record "
                             '({"tokens": [...], "ner_tags": [...]})')
    return found


def _csv_records(text: str, path: pathlib.Path) -> list[tuple[int, dict]]:
    """(line where the row starts, row) of each CSV row under its header (blank lines are no
    row). ValueError naming the line of a row with more or fewer cells than the header."""
    reader = csv.reader(io.StringIO(text))
    header, records, end = None, [], 0
    for cells in reader:
        start, end = end + 1, reader.line_num
        if not cells or (len(cells) == 1 and not cells[0].strip()):
            continue
        if header is None:
            header = cells
        elif len(cells) != len(header):
            raise ValueError(
                f"{path}, sentence {len(records) + 1} (line {start}) has {len(cells)} cells and the header "
                f"{len(header)} ({', '.join(header)}); quote a cell that holds a comma, e.g. "
                '"[""EU"", ""rejects""]", or write its words separated by spaces'
            )
        else:
            records.append((start, dict(zip(header, cells))))
    return records


def _as_list(value, where: str, column: str, suffix: str) -> list:
    """A record's cell as a list: JSON gives lists; a CSV cell holds a JSON or Python list, or
    words separated by spaces."""
    if suffix == ".csv" and isinstance(value, str):
        value = _parse_csv_cell(value, where, column)
    if not isinstance(value, list):
        raise ValueError(f"{where}: column {column!r} holds {type(value).__name__} {_short(value)}, not a list "
                         "(one entry per word)")
    return value


def _parse_csv_cell(cell: str, where: str, column: str):
    stripped = cell.strip()
    if not stripped.startswith("["):
        return _SPACES.split(stripped.strip(" \t\n\r\f\v")) if stripped else []  # a no-break space stays in its word
    try:
        return json.loads(stripped)
    except json.JSONDecodeError:
        pass
    try:
        return ast.literal_eval(stripped)  # pandas writes lists as Python reprs: ['EU', 'rejects']
    except (ValueError, SyntaxError):
        raise ValueError(
            f"{where}: column {column!r} starts like a list but is neither JSON nor a Python list: {_short(cell)}. "
            'Write lists as JSON (["EU", "rejects"]) or words separated by spaces (EU rejects)'
        ) from None


def _short(value, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# ---------------------------------------------------------------------------------------------
# Checks every reader shares


def _checked(split: WordSplit, label_names: Sequence[str] | None) -> WordSplit:
    """`split` with integer tags named; ValueError for the first sentence that is empty or whose
    token and tag lists differ in length, an empty token or tag, a tag of the wrong type, or no
    sentence at all."""
    if not split.tokens:
        raise ValueError(f"{split.source} holds no sentence")
    names = list(label_names) if label_names is not None else None
    tags = []
    for sentence, (words, sentence_tags) in enumerate(zip(split.tokens, split.tags)):
        if not words:
            raise ValueError(f"{split.where(sentence)} has no words; remove it")
        if len(words) != len(sentence_tags):
            raise ValueError(
                f"{split.where(sentence)} has {len(words)} tokens and {len(sentence_tags)} tags; give every token "
                f"one tag (tokens {_short(words)}, tags {_short(sentence_tags)})"
            )
        for word, token in enumerate(words):
            if not isinstance(token, str) or not token.strip():
                raise ValueError(f"{split.where(sentence, word)}: the token is empty, only whitespace or not a string ({token!r}); "
                                 "remove the word or give it its text")
        tags.append([_tag_name(tag, names, split, sentence, word) for word, tag in enumerate(sentence_tags)])
    return dataclasses.replace(split, tags=tags)


def _tag_name(tag, names: list[str] | None, split: WordSplit, sentence: int, word: int) -> str:
    if isinstance(tag, str) and not isinstance(tag, bool):
        if not tag.strip():
            raise ValueError(f"{split.where(sentence, word)}: the tag is empty; give every word a tag (O outside "
                             "entities)")
        return tag
    if isinstance(tag, int) and not isinstance(tag, bool):
        if names is None:
            raise ValueError(f"{split.where(sentence, word)}: the tag is the integer {tag}; pass label_names, the "
                             "tag name of each id (a datasets ClassLabel's names), to read integer tags")
        if not 0 <= tag < len(names):
            raise ValueError(f"{split.where(sentence, word)}: the tag id {tag} is outside label_names, which name "
                             f"ids 0 to {len(names) - 1}")
        return names[tag]
    raise ValueError(f"{split.where(sentence, word)}: the tag {tag!r} is a {type(tag).__name__}; tags are strings, "
                     "or integer ids with label_names")


__all__ = [
    "WordSplit",
    "read_conll",
    "read_conllu",
    "read_word_file",
    "read_word_records",
    "word_split",
    "words_in_memory",
]
