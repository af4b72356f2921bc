"""A token-classification task: train (and validation, test) sentences, the tag names a model
learns, and their scheme, checked once for every split.

    task = load_word_files(train_file="train.conll", validation_file="dev.conll")
    task.label_names     # ("B-LOC", "B-PER", "I-LOC", "I-PER", "O"): sorted train tags, as run_ner.py
    task.scheme          # "IOB2", detected (task.scheme_reason says from what) or given
    task.tag_ids("train")  # [[4, 1, 3, ...], ...] ids into label_names
"""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Mapping, Sequence

from flaxheads import tags as tags_lib
from flaxheads.data.word_files import WordSplit, read_word_file


@dataclasses.dataclass(frozen=True)
class WordTask:
    splits: Mapping[str, WordSplit]
    """"train", and "validation" and "test" where given."""
    label_names: tuple[str, ...]
    """The tag of each label id: as given, else the train split's distinct tags, sorted."""
    scheme: str
    """One of `flaxheads.tags.SCHEMES`."""
    scheme_reason: str = ""
    """Why the scheme is what it is: "set by scheme", or what detection saw."""

    @property
    def num_labels(self) -> int:
        return len(self.label_names)

    def tag_ids(self, split: str) -> list[list[int]]:
        """The label id of every word of `split`, one list per sentence."""
        ids = {name: i for i, name in enumerate(self.label_names)}
        return [[ids[tag] for tag in sentence] for sentence in self.splits[split].tags]


def load_word_files(
    *, train_file: str | pathlib.Path, validation_file: str | pathlib.Path | None = None,
    test_file: str | pathlib.Path | None = None, label_names: Sequence[str] | None = None, scheme: str | None = None,
    **read_options,
) -> WordTask:
    """Each given file read as one split (`flaxheads.data.word_files.read_word_file`, which
    takes `read_options` such as `tag_column` or `tags_column`), then `word_task`."""
    files = {"train": train_file, "validation": validation_file, "test": test_file}
    splits = {name: read_word_file(path, label_names=label_names, **read_options)
              for name, path in files.items() if path is not None}
    return word_task(splits, label_names=label_names, scheme=scheme)


def word_task(splits: Mapping[str, WordSplit], *, label_names: Sequence[str] | None = None,
              scheme: str | None = None) -> WordTask:
    """`splits` checked as one task. The label names are `label_names`, else the sorted distinct
    tags of the train split; the scheme is `scheme`, else detected from the train tags and label
    names (`flaxheads.tags.detect_scheme`). Raises ValueError for a missing train split, a tag of
    any split outside the label names (validation and test may not hold tags train lacks), and a
    tag sequence the scheme does not allow (`flaxheads.tags.check_tags`), naming file, sentence,
    line and word."""
    if "train" not in splits:
        raise ValueError(f"a word task needs a 'train' split; got {sorted(splits)}")
    train = splits["train"]
    if label_names is None:
        names = tuple(sorted({tag for sentence in train.tags for tag in sentence}))
    else:
        names = tuple(label_names)
        if len(set(names)) != len(names):
            raise ValueError(f"label_names repeat a name: {[n for n in names if names.count(n) > 1][:3]}")
    if scheme is None:
        scheme, reason = tags_lib.detect_scheme(train.tags, names)
        reason = f"{scheme}: {reason} (in {train.source})"
    else:
        reason = f"{tags_lib.check_scheme(scheme)}: set by scheme"
    for name, split in splits.items():
        tags_lib.check_known_tags(split.tags, names, where=split.where, split=f"the {name} split")
        tags_lib.check_tags(split.tags, scheme, where=split.where)
    return WordTask(dict(splits), names, scheme, reason)


__all__ = ["WordTask", "load_word_files", "word_task"]
