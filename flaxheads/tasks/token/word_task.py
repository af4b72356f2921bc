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

import datasets

from flaxheads.tasks.token import tags as tags_lib
from flaxheads.conversion.table import TOKEN_CLASSIFICATION
from flaxheads.data.batching import ExampleFormat
from flaxheads.data.in_memory import InMemoryTask
from flaxheads.tasks.token.subwords import tokenize_word_split
from flaxheads.data.task import LABEL, TaskData
from flaxheads.tasks.token.word_files import (
    CONLL_SUFFIXES, RECORD_SUFFIXES, TOKENS_COLUMN, WordSplit, read_word_file, word_split, words_in_memory,
)

TOKENS = "tokens"
"""The words column of a token-classification `TaskData` split."""


@dataclasses.dataclass(frozen=True)
class WordTask:
    splits: Mapping[str, WordSplit]
    """"train", and "validation" and "test" where given."""
    label_names: tuple[str, ...]
    """The tag of each label id: as given, else the train split's distinct tags, sorted."""
    scheme: str
    """One of `flaxheads.tasks.token.tags.SCHEMES`."""
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
    *, train_file: str | pathlib.Path | None = None, validation_file: str | pathlib.Path | None = None,
    test_file: str | pathlib.Path | None = None, label_names: Sequence[str] | None = None, scheme: str | None = None,
    **read_options,
) -> WordTask:
    """Each given file read as one split (`flaxheads.tasks.token.word_files.read_word_file`, which
    takes `read_options` such as `tag_column` or `tags_column`), then `word_task` (without a
    train_file, `label_names` are needed: a trained model's tags)."""
    files = {"train": train_file, "validation": validation_file, "test": test_file}
    splits = {name: read_word_file(path, label_names=label_names, **read_options)
              for name, path in files.items() if path is not None}
    return word_task(splits, label_names=label_names, scheme=scheme)


def word_task(splits: Mapping[str, WordSplit], *, label_names: Sequence[str] | None = None,
              scheme: str | None = None) -> WordTask:
    """`splits` checked as one task. The label names are `label_names` (then the train split may
    be left out: the first split stands in for it), else the sorted distinct tags of the train
    split; the scheme is `scheme`, else detected from the train tags and label names
    (`flaxheads.tasks.token.tags.detect_scheme`). Raises ValueError for a missing train split, a tag of
    any split outside the label names (validation and test may not hold tags train lacks), and a
    tag sequence the scheme does not allow (`flaxheads.tasks.token.tags.check_tags`), naming file, sentence,
    line and word."""
    if "train" not in splits:
        if label_names is None or not splits:
            raise ValueError(f"a word task needs a 'train' split, whose tags are the label names; got {sorted(splits)}: "
                             "give one, or pass label_names (a trained model's id2label) to read the others alone")
        # The first split stands in for the train split every TaskData has (label names given).
        splits = {"train": next(iter(splits.values())), **splits}
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


@dataclasses.dataclass(frozen=True)
class WordLabelling:
    """A word task and how its word tags become subword labels (`subwords.tokenize_words`)."""

    task: WordTask
    label_all_tokens: bool = False
    """Label a word's later subwords with its tag too (B- turned into I-), as run_ner.py's flag;
    default: only its first subword (the others are ignored by the loss)."""
    stride: int | None = None
    """Tokens two windows of a sentence longer than max_seq_length share; None: `default_stride`."""

    def stride_for(self, max_seq_length: int, special_tokens: int) -> int:
        """The stride in effect for rows of `max_seq_length` tokens, `special_tokens` of them special."""
        if self.stride is not None:
            return self.stride
        return default_stride(max_seq_length, special_tokens)


def default_stride(max_seq_length: int, special_tokens: int) -> int:
    """A quarter of the row (32 tokens of 128), below the room the special tokens leave."""
    return max(0, min(max_seq_length // 4, max_seq_length - special_tokens - 1))


PROBLEM = "token_classification"
"""How messages name what token-classification labels are (a tag per word)."""
TOKEN_EXAMPLES = ExampleFormat(
    token_labels=True,
    unpacked_because="token classification: each sentence (or window of one) is a row of its own")
"""An example is a row of tokens with a label per token (-100 where not scored)."""


class WordRows:
    """Token-classification rows (`TaskData.rows`): each sentence tokenised with its words' tags
    on its subwords, a long one cut into windows (`subwords.tokenize_word_split`); each row keeps
    the `word_ids` and `sentence` that merge its predictions back into words."""

    whole_split = True
    origin_columns = ("word_ids", "sentence")

    def tokenize(self, task: TaskData, split: str, tokenizer, max_seq_length: int, *, cache_dir=None):
        return tokenize_word_split(task, split, tokenizer, max_seq_length)


WORD_ROWS = WordRows()


def token_task_data(task: WordTask, *, label_all_tokens: bool = False, stride: int | None = None) -> TaskData:
    """`task` as the `TaskData` the Trainer takes: per split a `tokens` column (words) and a
    `label` column (tag ids), task token classification, the tags as id2label; its `source` is the
    `WordLabelling` (the word task and how its tags go onto subwords)."""
    splits = datasets.DatasetDict({
        name: datasets.Dataset.from_dict({TOKENS: split.tokens, LABEL: task.tag_ids(name)})
        for name, split in task.splits.items()
    })
    return TaskData(splits, None, task.num_labels, dict(enumerate(task.label_names)),
                    problem_type_reason=f"{PROBLEM}: word tags, scheme {task.scheme_reason}",
                    rows=WORD_ROWS, task=TOKEN_CLASSIFICATION, example_format=TOKEN_EXAMPLES,
                    source=WordLabelling(task, label_all_tokens, stride))


def words_beside(task: TaskData, split: str, sentences) -> InMemoryTask:
    """`sentences` held in Python (`word_files.words_in_memory`: (tokens, tags), a Dataset with a
    tokens and a tags column, ...) as the split `split` of a token-classification task with
    `task`'s tags, scheme and subword labelling. Without tags the split is unlabelled: to predict,
    not score. ValueError as `word_split` and `word_task` check (a tag outside `task`'s, naming the
    sentence and word)."""
    labelling = task.source
    names, scheme = labelling.task.label_names, labelling.task.scheme
    tokens, tags, class_names = words_in_memory(sentences)
    if tags is None:
        # Every word's tag is a placeholder (the first name), never scored, so nothing checks it.
        placeholder = word_split(tokens, [[names[0]] * len(words) for words in tokens])
        words = WordTask({"train": placeholder, split: placeholder}, names, scheme, labelling.task.scheme_reason)
    else:
        words = word_task({split: word_split(tokens, tags, label_names=class_names or names)}, label_names=names,
                          scheme=scheme)
    return InMemoryTask(token_task_data(words, label_all_tokens=labelling.label_all_tokens, stride=labelling.stride),
                        frozenset() if tags is not None else frozenset({split}), (split,))


def looks_like_word_file(path: str | pathlib.Path, text_column: str = "text") -> bool:
    """Whether `path` holds words and tags (token classification) rather than texts and labels:
    a CoNLL or CoNLL-U suffix (.tsv: see `_tsv_holds_words`), or JSON / JSON Lines / CSV whose
    first record has a `tokens` column and no `text_column`."""
    path = pathlib.Path(path)
    suffix = path.suffix.lower()
    if suffix == ".conllu" or (suffix in CONLL_SUFFIXES and suffix != ".tsv"):
        return True
    if suffix not in (*RECORD_SUFFIXES, ".tsv") or not path.is_file():
        return False
    with open(path, encoding="utf-8-sig", errors="replace") as f:
        head = f.read(65536)
    first = head.lstrip()
    if suffix == ".tsv":
        return _tsv_holds_words(first, text_column)
    if suffix == ".csv":
        header = first.split("\n", 1)[0]
        return TOKENS_COLUMN in [c.strip().strip('"') for c in header.split(",")] and text_column not in header
    # JSON: the first record's keys, cheaply (a record is an object with a "tokens" key)
    return f'"{TOKENS_COLUMN}"' in first[:4096] and f'"{text_column}"' not in first[:4096]


def _tsv_holds_words(head: str, text_column: str) -> bool:
    """Whether the start of a .tsv file is CoNLL columns (a word and its tags per line) rather
    than a table of texts: yes with a -DOCSTART- line; else, when its first line names
    `text_column` (a table's header, or a sentence whose first token is that word), when most
    lines start with a single word (a text has spaces; a token seldom does) and a blank line
    parts sentences; without such a first line, when either holds."""
    lines = head.split("\n")
    if len(lines) > 1:
        lines.pop()  # the last may be cut by the read
    filled = [i for i, line in enumerate(lines) if line.strip()]
    if not filled:
        return False
    first_fields = [field.strip() for field in lines[filled[0]].split("\t")]
    if any(lines[i].split("\t", 1)[0].strip() == "-DOCSTART-" for i in filled):
        return True
    single_words = 2 * sum(" " not in lines[i].split("\t", 1)[0].strip() for i in filled) > len(filled)
    parts_sentences = len(filled) < filled[-1] - filled[0] + 1  # a blank line between two filled ones
    if text_column in first_fields:
        return single_words and parts_sentences
    return single_words or parts_sentences


__all__ = ["PROBLEM", "TOKENS", "TOKEN_EXAMPLES", "WORD_ROWS", "WordLabelling", "WordRows", "WordTask", "default_stride",
           "load_word_files", "looks_like_word_file", "token_task_data", "word_task", "words_beside"]
