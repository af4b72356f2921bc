"""Labelled text from local CSV/TSV, JSON/JSONL or Parquet files, or from a named `datasets` set.

Whatever the source column names, the result has the canonical columns `text`, optional
`text_pair` and `label` (see `TaskData`); labels are encoded by `flaxheads.data.labels`.
"""

from __future__ import annotations

import bz2
import codecs
import csv
import functools
import gzip
import io
import json
import lzma
import pathlib
from collections.abc import Iterator, Sequence

import datasets

from flaxheads.data.labels import check_label_kinds, encode_labels, is_missing
from flaxheads.data.pairs import pair_column_map, pair_task, reads_as_pairs
from flaxheads.data.places import LINE, RECORD, RowPlaces, in_python
from flaxheads.data.task import CHOSEN, LABEL, REJECTED, TEXT, TEXT_PAIR, TaskData

# File suffix -> (datasets packaged builder, builder options).
_FORMATS = {
    ".csv": ("csv", {}),
    ".tsv": ("csv", {"delimiter": "\t"}),
    ".json": ("json", {}),
    ".jsonl": ("json", {}),
    ".parquet": ("parquet", {}),
}
# Compression suffix -> (command that decompresses to stdout, command that compresses stdin).
_COMPRESSION_COMMANDS = {
    ".gz": ("zcat", "gzip"),
    ".bz2": ("bzcat", "bzip2"),
    ".xz": ("xzcat", "xz"),
    ".zst": ("zstdcat", "zstd"),
}
_COMPRESSION_SUFFIXES = tuple(_COMPRESSION_COMMANDS)
_UTF8_CHECK_CHUNK_BYTES = 1 << 20
_SPLIT_FLAGS = {"train": "--train_file", "validation": "--validation_file", "test": "--test_file"}


def load_local_files(
    *,
    train_file: str | pathlib.Path | None,
    validation_file: str | pathlib.Path | None = None,
    test_file: str | pathlib.Path | None = None,
    text_column: str = "text",
    text_pair_column: str | None = None,
    label_column: str = "label",
    problem_type: str | None = None,
    num_labels: int | None = None,
    cache_dir: str | pathlib.Path | None = None,
    chosen_column: str = "chosen",
    rejected_column: str = "rejected",
    class_names: Sequence[str] | None = None,
) -> TaskData:
    """Reads each given file as one split; the format follows the suffix (.csv .tsv .json .jsonl
    .parquet, optionally compressed, e.g. .csv.gz).

    `cache_dir` is where `datasets` keeps its Arrow copy of the files (its default cache if None).
    Raises FileNotFoundError naming a missing path, and ValueError for an unknown suffix, an
    unreadable or empty file, a text file that is not UTF-8 (naming the byte, its position and
    line), a JSON label column mixing types (naming the first label of another type than most),
    a missing column (naming it, the columns present and the flag to change), a missing text, or
    a bad label (see `encode_labels`). Rows are named by their line, or by their record in a
    JSON array or Parquet file (`flaxheads.data.places`).

    Preference pairs (`chosen_column`, `rejected_column`; see `flaxheads.data.pairs`) are read
    when `problem_type` is "pairwise_reward", or, without a problem type, when the train file has
    both pair columns and no `text_column`.

    Without a train_file (scoring a trained model), `class_names` are the model's classes in id
    order, which the labels are read against (`encode_labels`), and the first file given stands in
    for the train split (as `word_task` does).
    """
    files = {"train": train_file, "validation": validation_file, "test": test_file}
    splits = {
        name: read_split(name, pathlib.Path(path), cache_dir, label_column)
        for name, path in files.items()
        if path
    }
    if not splits:
        raise ValueError("no data files: give a train_file, a validation_file or a test_file")
    places = {name: file_places(pathlib.Path(files[name]), f"{_SPLIT_FLAGS[name]} {files[name]}") for name in splits}
    if "train" not in splits:
        if class_names is None:
            raise ValueError(f"no train_file: the classes come from the train file; give one, or class_names (a "
                             f"trained model's) to read {' and '.join(f'{n}_file' for n in splits)} alone")
        # The first file stands in for the train split every TaskData has (never trained on: scoring only).
        # Last, so that a bad label is reported in its own file's split first.
        first = next(iter(splits))
        files["train"], splits = files[first], {**splits, "train": splits[first]}
        places["train"] = places[first]
    pairs = reads_as_pairs(splits["train"].column_names, problem_type=problem_type, text_column=text_column,
                           chosen_column=chosen_column, rejected_column=rejected_column)
    canonical = datasets.DatasetDict({
        name: canonical_columns(split, _columns(pairs, split, text_column, text_pair_column, label_column,
                                                chosen_column, rejected_column), f"{name} file {files[name]}",
                                places[name])
        for name, split in splits.items()
    })
    if pairs:
        return pair_task(canonical, num_labels=num_labels, given=problem_type is not None, places=places)
    return encode_labels(canonical, problem_type=problem_type, num_labels=num_labels, class_names=class_names,
                         places=places)


def load_named_dataset(
    name: str,
    *,
    config_name: str | None = None,
    text_column: str = "text",
    text_pair_column: str | None = None,
    label_column: str = "label",
    problem_type: str | None = None,
    num_labels: int | None = None,
    cache_dir: str | pathlib.Path | None = None,
    chosen_column: str = "chosen",
    rejected_column: str = "rejected",
) -> TaskData:
    """`datasets.load_dataset(name, config_name)` (the `--dataset_name` path), keeping its
    `train`, `validation` and `test` splits. Needs the data set in the local `datasets` cache or
    a reachable hub; errors from `datasets` pass through unchanged.
    """
    loaded = datasets.load_dataset(name, config_name, cache_dir=cache_dir)
    if "train" not in loaded:
        raise ValueError(f"data set {name} has no 'train' split; its splits are {sorted(loaded)}")
    pairs = reads_as_pairs(loaded["train"].column_names, problem_type=problem_type, text_column=text_column,
                           chosen_column=chosen_column, rejected_column=rejected_column)
    places = {split: in_python(f"the {split} split of {name}") for split in loaded}
    canonical = datasets.DatasetDict({
        split: canonical_columns(loaded[split], _columns(pairs, loaded[split], text_column, text_pair_column,
                                                         label_column, chosen_column, rejected_column),
                                 f"{split} split of {name}", places[split])
        for split in ("train", "validation", "test")
        if split in loaded
    })
    if pairs:
        return pair_task(canonical, num_labels=num_labels, given=problem_type is not None, places=places)
    return encode_labels(canonical, problem_type=problem_type, num_labels=num_labels, places=places)


def _columns(pairs: bool, split: datasets.Dataset, text_column: str, text_pair_column: str | None,
             label_column: str, chosen_column: str, rejected_column: str) -> dict[str, tuple[str, str]]:
    """The columns to read from `split`: preference pairs' (and their margins), or texts and labels."""
    if pairs:
        return pair_column_map(chosen_column, rejected_column, flags=True, column_names=split.column_names)
    return _column_map(text_column, text_pair_column, label_column)


def _column_map(
    text_column: str, text_pair_column: str | None, label_column: str
) -> dict[str, tuple[str, str]]:
    """canonical name -> (source column, the flag that names it)."""
    columns = {TEXT: (text_column, "--text_column"), LABEL: (label_column, "--label_column")}
    if text_pair_column:
        columns[TEXT_PAIR] = (text_pair_column, "--text_pair_column")
    return columns


def _format_of(path: pathlib.Path) -> tuple[str, dict]:
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] in _COMPRESSION_SUFFIXES:
        suffixes.pop()
    if not suffixes or suffixes[-1] not in _FORMATS:
        raise ValueError(f"cannot tell the format of {path}; use one of the suffixes {sorted(_FORMATS)}")
    return _FORMATS[suffixes[-1]]


def read_split(split_name: str, path: pathlib.Path, cache_dir, label_column: str) -> datasets.Dataset:
    """The rows of one file, as `load_local_files` reads each (its errors name the file by the
    flag of `split_name`: --train_file, --validation_file, --test_file)."""
    flag = _SPLIT_FLAGS[split_name]
    if not path.is_file():
        raise FileNotFoundError(f"{flag} {path}: no such file")
    builder, options = _format_of(path)
    if path.stat().st_size == 0:
        raise ValueError(f"{flag} {path} is empty")
    if builder != "parquet":
        # datasets' readers fail on other encodings with a bare UnicodeDecodeError, or later
        # when a string is first read; a check here can name the byte and the fix.
        _check_utf8(path, flag)
    try:
        split = datasets.load_dataset(
            builder, data_files={split_name: str(path)}, split=split_name, cache_dir=cache_dir, **options
        )
    except Exception as error:  # datasets raises several types for unreadable files.
        if "corresponds to no data" in str(error):
            raise ValueError(f"{flag} {path} has no rows") from error
        if builder == "json":
            # A label type that changes after the first chunk makes pyarrow's cast fail.
            check_label_kinds(_json_labels(path, label_column), file_places(path, f"{flag} {path}"), label_column,
                              "--label_column")
        raise ValueError(f"{flag} {path} could not be read as {builder}: {error}") from error
    if len(split) == 0:
        raise ValueError(f"{flag} {path} has no rows")
    if label_column in split.column_names and _holds_json(split.features[label_column]):
        # Mixed types within the first chunk: datasets keeps them as raw JSON values.
        check_label_kinds(split[label_column], file_places(path, f"{flag} {path}"), label_column, "--label_column")
    return split


def file_places(path: pathlib.Path, source: str) -> RowPlaces:
    """How messages name the rows of the file at `path` as `read_split` reads it (`source`: the
    file as they name it): by the line each starts on, or by record in a JSON array or Parquet
    file (`flaxheads.data.places`)."""
    builder, options = _format_of(path)
    if builder == "parquet" or (builder == "json" and _is_json_array(path)):
        return RowPlaces(source, RECORD)
    return RowPlaces(source, LINE, functools.partial(_first_lines, path, builder, options.get("delimiter", ",")))


def _is_json_array(path: pathlib.Path) -> bool:
    with _open_bytes(path) as stream:
        return stream.read(1024).lstrip(codecs.BOM_UTF8 + b" \t\r\n").startswith(b"[")


def _first_lines(path: pathlib.Path, builder: str, delimiter: str) -> list[int]:
    """The line (from 1) each row of a CSV, TSV or JSON Lines file starts on, rows counted as
    datasets reads them: blank lines (only whitespace) are no row, nor is a CSV's header."""
    with _open_bytes(path) as raw, io.TextIOWrapper(raw, encoding="utf-8-sig", newline="") as text:
        if builder == "json":
            return [number for number, line in enumerate(text, start=1) if line.strip()]
        reader = csv.reader(text, delimiter=delimiter)
        starts, end, header = [], 0, True
        try:
            for fields in reader:
                start, end = end + 1, reader.line_num
                if not fields or (len(fields) == 1 and not fields[0].strip()):
                    continue  # pandas skips blank lines
                if header:
                    header = False
                else:
                    starts.append(start)
        except csv.Error as error:  # a cell past csv's size limit, say: rows are then named by record
            raise ValueError(str(error)) from error
        return starts


def _open_bytes(path: pathlib.Path):
    """The file's content as a binary stream, decompressed as its suffix says."""
    suffix = path.suffix.lower()
    if suffix == ".zst":
        try:
            import zstandard  # optional; datasets needs it for .zst files too
        except ImportError:
            raise ValueError(f"reading {path} needs the zstandard package: pip install zstandard") from None
        return zstandard.open(path, "rb")
    return {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open}.get(suffix, open)(path, "rb")


def _check_utf8(path: pathlib.Path, flag: str) -> None:
    """Raises ValueError naming the first byte that is not UTF-8, its position and line, and
    the command that re-encodes the file. Reads the file in chunks: any size fits in memory."""
    position, lines, pending = 0, 0, b""  # position: of pending[0] in the (decompressed) content
    try:
        with _open_bytes(path) as stream:
            while chunk := stream.read(_UTF8_CHECK_CHUNK_BYTES):
                data = pending + chunk
                # A multi-byte character cut by the chunk end stays pending until the next chunk.
                consumed = _utf8_prefix_length(data, path, flag, position, lines, final=False)
                lines += data.count(b"\n", 0, consumed)
                position += consumed
                pending = data[consumed:]
    except (OSError, EOFError, lzma.LZMAError) as error:
        if path.suffix.lower() not in _COMPRESSION_SUFFIXES:
            raise ValueError(f"{flag} {path} could not be read: {error}") from error
        raise ValueError(
            f"{flag} {path} could not be decompressed ({error}); check that the file is complete and "
            f"that its suffix {path.suffix} names its compression"
        ) from error
    _utf8_prefix_length(pending, path, flag, position, lines, final=True)


def _utf8_prefix_length(data: bytes, path, flag: str, position: int, lines: int, *, final: bool) -> int:
    try:
        return codecs.utf_8_decode(data, "strict", final)[1]
    except UnicodeDecodeError as error:
        raise ValueError(not_utf8_message(path, flag, data, error, position, lines)) from None


def not_utf8_message(path, flag, data: bytes, error: UnicodeDecodeError, position: int, lines: int) -> str:
    start = error.start
    line = lines + data.count(b"\n", 0, start) + 1
    context = data[max(data.rfind(b"\n", 0, start) + 1, start - 40) : start + 20].split(b"\n")[0]
    where = "of the decompressed content " if path.suffix.lower() in _COMPRESSION_SUFFIXES else ""
    utf16 = position == 0 and data[:2] in (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)
    source_encoding = "utf-16" if utf16 else "latin-1"
    guess = " (it starts with a UTF-16 byte-order mark)" if utf16 else ""
    windows = "" if utf16 else " (use -f cp1252 for files saved on Windows)"
    return (
        f"{flag} {path} is not UTF-8{guess}: byte 0x{data[start]:02x} at position {position + start} "
        f"{where}(line {line}: {context!r}) is not valid UTF-8 ({error.reason}). Re-save the file as "
        f"UTF-8, e.g. `{_reencode_command(path, source_encoding)}`{windows}, and pass the new file "
        f"to {flag}"
    )


def _reencode_command(path: pathlib.Path, source_encoding: str) -> str:
    compression = _COMPRESSION_COMMANDS.get(path.suffix.lower())
    suffix = "".join(path.suffixes[-2:]) if compression else path.suffix
    target = path.with_name(path.name[: -len(suffix)] + ".utf8" + suffix)
    iconv = f"iconv -f {source_encoding} -t utf-8"
    if compression is None:
        return f"{iconv} {path} > {target}"
    decompress, compress = compression
    return f"{decompress} {path} | {iconv} | {compress} > {target}"


def _holds_json(feature) -> bool:
    """True for datasets' `Json` feature, which its JSON reader gives a column of mixed types."""
    if isinstance(feature, (datasets.List, datasets.LargeList)):
        return _holds_json(feature.feature)
    return isinstance(feature, datasets.Json)


def _json_labels(path: pathlib.Path, label_column: str) -> Iterator:
    """The label of each record of a JSON Lines file or JSON array, in order (None if absent).
    Ends early, without raising, at the first line that is not JSON."""
    is_array = _is_json_array(path)
    with _open_bytes(path) as stream:
        try:
            # datasets also reads a JSON array whole; JSON Lines go one line at a time.
            records = json.load(stream) if is_array else (json.loads(line) for line in stream if line.strip())
            for record in records:
                yield record.get(label_column) if isinstance(record, dict) else None
        except ValueError:
            return


class MissingColumn(ValueError):
    """A column the reader was told to read (or reads by default) is not in the data."""


def canonical_columns(
    split: datasets.Dataset, columns: dict[str, tuple[str, str]], where: str, places: RowPlaces | None = None
) -> datasets.Dataset:
    """`split`'s `columns` (canonical name -> (source column, what names it)) under their
    canonical names, texts as strings. `where` names the split in messages, `places` its rows
    (default: by index, as data held in Python). Raises MissingColumn for a column `split`
    lacks, and ValueError for a missing text, naming where it is."""
    places = places or in_python(f"the {where}")
    for source, flag in columns.values():
        if source not in split.column_names:
            raise MissingColumn(
                f"column {source!r} (set by {flag}) is not in the {where}; its columns are "
                f"{split.column_names}. Pass {flag} with one of them."
            )
    sources = [source for source, _ in columns.values()]
    split = split.select_columns(sources).rename_columns(
        {source: canonical for canonical, (source, _) in columns.items() if source != canonical}
    )
    for canonical in (TEXT, TEXT_PAIR, CHOSEN, REJECTED):
        if canonical in split.column_names:
            split = _as_text(split, canonical, columns[canonical], places)
    return split


def _as_text(
    split: datasets.Dataset, column: str, source_and_flag: tuple[str, str], places: RowPlaces
) -> datasets.Dataset:
    source, flag = source_and_flag
    for row, text in enumerate(split[column]):
        if is_missing(text):
            raise ValueError(f"the text in column {source!r} ({flag}) is missing at {places.at(row)}; give every row "
                             "its text, or remove the row")
    if split.features[column] != datasets.Value("string"):
        # CSV readers type a column of digits as numbers; the tokenizer needs strings.
        split = split.cast_column(column, datasets.Value("string"))
    return split
