"""Labelled text from local CSV/TSV, JSON/JSONL or Parquet files, or from a named `datasets` set.

Whatever the source column names, the result has the canonical columns `text`, optional
`text_pair` and `label` (see `TaskData`); labels are encoded by `flaxheads.data.labels`.
"""

from __future__ import annotations

import pathlib

import datasets

from flaxheads.data.labels import encode_labels
from flaxheads.data.task import LABEL, TEXT, TEXT_PAIR, TaskData

# File suffix -> (datasets packaged builder, builder options).
_FORMATS = {
    ".csv": ("csv", {}),
    ".tsv": ("csv", {"delimiter": "\t"}),
    ".json": ("json", {}),
    ".jsonl": ("json", {}),
    ".parquet": ("parquet", {}),
}
_COMPRESSION_SUFFIXES = (".gz", ".bz2", ".xz", ".zst")
_SPLIT_FLAGS = {"train": "--train_file", "validation": "--validation_file", "test": "--test_file"}


def load_local_files(
    *,
    train_file: str | pathlib.Path,
    validation_file: str | pathlib.Path | None = None,
    test_file: str | pathlib.Path | None = None,
    text_column: str = "text",
    text_pair_column: str | None = None,
    label_column: str = "label",
    problem_type: str | None = None,
    num_labels: int | None = None,
    cache_dir: str | pathlib.Path | None = None,
) -> TaskData:
    """Reads each given file as one split; the format follows the suffix (.csv .tsv .json .jsonl
    .parquet, optionally compressed, e.g. .csv.gz).

    `cache_dir` is where `datasets` keeps its Arrow copy of the files (its default cache if None).
    Raises FileNotFoundError naming a missing path, and ValueError for an unknown suffix, an
    unreadable or empty file, a missing column (naming it, the columns present and the flag
    to change), a missing text, or a bad label (see `encode_labels`).
    """
    files = {"train": train_file, "validation": validation_file, "test": test_file}
    splits = {name: _read_split(name, pathlib.Path(path), cache_dir) for name, path in files.items() if path}
    columns = _column_map(text_column, text_pair_column, label_column)
    canonical = {
        name: _canonical_columns(split, columns, f"{name} file {files[name]}")
        for name, split in splits.items()
    }
    return encode_labels(datasets.DatasetDict(canonical), problem_type=problem_type, num_labels=num_labels)


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
) -> TaskData:
    """`datasets.load_dataset(name, config_name)` (the `--dataset_name` path), keeping its
    `train`, `validation` and `test` splits. Needs the data set in the local `datasets` cache or
    a reachable hub; errors from `datasets` pass through unchanged.
    """
    loaded = datasets.load_dataset(name, config_name, cache_dir=cache_dir)
    columns = _column_map(text_column, text_pair_column, label_column)
    canonical = {
        split: _canonical_columns(loaded[split], columns, f"{split} split of {name}")
        for split in ("train", "validation", "test")
        if split in loaded
    }
    if "train" not in canonical:
        raise ValueError(f"data set {name} has no 'train' split; its splits are {sorted(loaded)}")
    return encode_labels(datasets.DatasetDict(canonical), problem_type=problem_type, num_labels=num_labels)


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


def _read_split(split_name: str, path: pathlib.Path, cache_dir) -> datasets.Dataset:
    flag = _SPLIT_FLAGS[split_name]
    if not path.is_file():
        raise FileNotFoundError(f"{flag} {path}: no such file")
    builder, options = _format_of(path)
    if path.stat().st_size == 0:
        raise ValueError(f"{flag} {path} is empty")
    try:
        split = datasets.load_dataset(
            builder, data_files={split_name: str(path)}, split=split_name, cache_dir=cache_dir, **options
        )
    except Exception as error:  # datasets raises several types for unreadable files.
        if "corresponds to no data" in str(error):
            raise ValueError(f"{flag} {path} has no rows") from error
        raise ValueError(f"{flag} {path} could not be read as {builder}: {error}") from error
    if len(split) == 0:
        raise ValueError(f"{flag} {path} has no rows")
    return split


def _canonical_columns(
    split: datasets.Dataset, columns: dict[str, tuple[str, str]], where: str
) -> datasets.Dataset:
    for source, flag in columns.values():
        if source not in split.column_names:
            raise ValueError(
                f"column {source!r} (set by {flag}) is not in the {where}; its columns are "
                f"{split.column_names}. Pass {flag} with one of them."
            )
    sources = [source for source, _ in columns.values()]
    split = split.select_columns(sources).rename_columns(
        {source: canonical for canonical, (source, _) in columns.items() if source != canonical}
    )
    for canonical in (TEXT, TEXT_PAIR):
        if canonical in split.column_names:
            split = _as_text(split, canonical, columns[canonical], where)
    return split


def _as_text(
    split: datasets.Dataset, column: str, source_and_flag: tuple[str, str], where: str
) -> datasets.Dataset:
    source, flag = source_and_flag
    for row, text in enumerate(split[column]):
        if text is None:
            raise ValueError(f"the text in column {source!r} ({flag}) is missing in row {row} of the {where}")
    if split.features[column] != datasets.Value("string"):
        # CSV readers type a column of digits as numbers; the tokenizer needs strings.
        split = split.cast_column(column, datasets.Value("string"))
    return split
