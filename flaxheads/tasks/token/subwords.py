"""Word tags onto subword tokens, as transformers' token-classification example (run_ner.py) does.

`align_labels` is run_ner.py's `tokenize_and_align_labels` loop for one sentence: special tokens
get -100 (ignored by the loss), a word's first subword gets the word's label, and its later
subwords get -100, or with `label_all_tokens` the word's label again, B-X turned into I-X where
I-X is a label (run_ner.py's `b_to_i_label`, `flaxheads.tasks.token.tags.b_to_i_label_ids`).

`tokenize_words` tokenises sentences of words with a fast tokenizer (`is_split_into_words=True`)
and, where run_ner.py truncates a long sentence and loses its last words, cuts it into
overlapping windows of whole words (`flaxheads.tasks.token.windows`), one row each.
"""

from __future__ import annotations

from collections.abc import Sequence

import datasets

from flaxheads.tasks.token import tags as tags_lib
from flaxheads.problem import IGNORE_INDEX
from flaxheads.data.task import TaskData
from flaxheads.data.tokenization import _check_max_length
from flaxheads.tasks.token.windows import WordIds, plan_windows

def align_labels(word_labels: Sequence[int], word_ids: WordIds, *, label_all_tokens: bool = False,
                 b_to_i: Sequence[int] | None = None) -> list[int]:
    """One label per token: `word_labels[w]` at the first token of word w, IGNORE_INDEX at
    special tokens (word id None) and at a word's later tokens, or, with `label_all_tokens`,
    `b_to_i[word_labels[w]]` there (the label itself when `b_to_i` is None)."""
    labels, previous = [], None
    for word in word_ids:
        if word is None:
            labels.append(IGNORE_INDEX)
        elif word != previous:
            labels.append(word_labels[word])
        elif label_all_tokens:
            label = word_labels[word]
            labels.append(b_to_i[label] if b_to_i is not None else label)
        else:
            labels.append(IGNORE_INDEX)
        previous = word
    return labels


def tokenize_words(
    tokenizer, sentences: Sequence[Sequence[str]], max_seq_length: int, *, tags: Sequence[Sequence[str]] | None = None,
    label_names: Sequence[str] | None = None, label_all_tokens: bool = False, stride: int = 0,
    where: tags_lib.Where = tags_lib.default_where,
) -> dict[str, list]:
    """Rows of token ids for sentences of words, at most `max_seq_length` tokens each, special
    tokens included: one row per sentence, or one per window of a sentence that does not fit
    (windows overlap by up to `stride` tokens of whole words; `flaxheads.tasks.token.windows`).

    Returns columns, one entry per row, rows of a sentence consecutive: `input_ids`,
    `attention_mask`, `token_type_ids` (when the tokenizer's model takes them), `word_ids` (per
    token its word's index in the sentence, None for special tokens), `sentence` (the row's
    sentence), `length`, and with `tags` (word tags; `label_names` gives their ids) `labels`
    aligned by `align_labels`. Every word is labelled in every window that holds it.

    A single word longer than a window (a long URL, say) gets a window alone, cut to
    `max_seq_length`: its first subword, which carries its label and prediction, stays; only its
    later subwords are lost (which are labelled only with `label_all_tokens`).

    Needs a fast tokenizer (one with `word_ids`). Raises ValueError for a max_seq_length outside
    the tokenizer's range or that leaves no room after the special tokens, a stride not below
    that room, a word that gives no token at all (an ideographic space, a zero-width space), and
    tags outside `label_names`, naming the sentence and word with `where` (`WordSplit.where`
    names the file and line).
    """
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError(f"tokenize_words needs a fast tokenizer (word_ids), not {type(tokenizer).__name__}: load it "
                         "with AutoTokenizer.from_pretrained(..., use_fast=True)")
    _check_max_length(tokenizer, max_seq_length)
    room = max_seq_length - tokenizer.num_special_tokens_to_add(pair=False)
    if room < 1:
        raise ValueError(f"max_seq_length={max_seq_length} leaves no room for words after the special tokens")
    if not 0 <= stride < room:
        raise ValueError(f"stride={stride} must be at least 0 and below the {room} word tokens a row of "
                         f"max_seq_length={max_seq_length} holds")
    label_ids = _label_ids(tags, label_names, sentences, where)
    b_to_i = tags_lib.b_to_i_label_ids(label_names) if tags is not None and label_all_tokens else None
    sentences = [list(words) for words in sentences]
    with_types = "token_type_ids" in tokenizer.model_input_names
    whole = _encode(tokenizer, sentences, with_types)
    plans, pending = [], []  # per sentence (windows, word token counts); words of windows to encode
    for sentence, encoding in enumerate(whole):
        # A word longer than a window (a long URL) counts as a full window: it gets one alone,
        # cut to the window's length, and keeps its first subword, which carries its label.
        counts = [min(count, room) for count in _word_token_counts(encoding["word_ids"], sentences[sentence],
                                                                      sentence, where)]
        fits = len(encoding["input_ids"]) <= max_seq_length
        windows = [(0, len(counts))] if fits else plan_windows(counts, room, stride)
        plans.append((windows, counts, fits))
        if not fits:
            pending.extend(sentences[sentence][start:end] for start, end in windows)
    encoded_windows = iter(_encode(tokenizer, pending, with_types, max_length=max_seq_length))
    rows: list[tuple[int, int, dict]] = []  # (sentence, its first word, encoding of the row)
    for sentence, (windows, counts, fits) in enumerate(plans):
        if fits:
            rows.append((sentence, 0, whole[sentence]))
            continue
        for start, end in windows:
            window = next(encoded_windows)
            _check_window(window, counts[start:end])
            rows.append((sentence, start, window))
    return _columns(rows, label_ids, label_all_tokens, b_to_i, with_types)


def _label_ids(tags, label_names, sentences, where) -> list[list[int]] | None:
    if tags is None:
        return None
    if label_names is None:
        raise ValueError("tags need label_names, the tag of each label id (WordTask.label_names)")
    if len(tags) != len(sentences):
        raise ValueError(f"{len(sentences)} sentences and {len(tags)} tag lists; give one tag list per sentence")
    tags_lib.check_known_tags(tags, label_names, where=where)
    ids = {name: i for i, name in enumerate(label_names)}
    for sentence, (words, sentence_tags) in enumerate(zip(sentences, tags)):
        if len(words) != len(sentence_tags):
            raise ValueError(f"{where(sentence, None)}: {len(words)} words and "
                             f"{len(sentence_tags)} tags; give every word one tag")
    return [[ids[tag] for tag in sentence_tags] for sentence_tags in tags]


def _encode(tokenizer, sentences: list[list[str]], with_types: bool, max_length: int | None = None) -> list[dict]:
    """Each sentence's ids, mask, token types and word ids, with special tokens, cut to
    `max_length` tokens if given."""
    if not sentences:
        return []
    encoded = tokenizer(sentences, is_split_into_words=True, truncation=max_length is not None, max_length=max_length,
                        return_attention_mask=True, return_token_type_ids=with_types)
    names = ["input_ids", "attention_mask"] + (["token_type_ids"] if with_types else [])
    return [{**{name: encoded[name][i] for name in names}, "word_ids": encoded.word_ids(i)}
            for i in range(len(sentences))]


def _word_token_counts(word_ids: WordIds, words: list[str], sentence: int, where) -> list[int]:
    counts = [0] * len(words)
    for word in word_ids:
        if word is not None:
            counts[word] += 1
    empty = next((w for w, count in enumerate(counts) if count == 0), None)
    if empty is not None:
        raise ValueError(
            f"{where(sentence, empty)}: the word {words[empty]!r} gives no token with this tokenizer, so it could get "
            "neither a label nor a prediction. Remove it, or replace it (with the tokenizer's unk_token, say)"
        )
    return counts


def _check_window(window: dict, counts: list[int]) -> None:
    got = sum(word is not None for word in window["word_ids"])
    if got != sum(counts):
        # Each word is tokenised alone under is_split_into_words; a tokenizer that looks across
        # words would make windows that do not match the plan.
        raise RuntimeError(f"a window of {len(counts)} words gave {got} word tokens, not the {sum(counts)} they "
                           "gave in their whole sentence: this tokenizer's tokens depend on the next words")


def _columns(rows, label_ids, label_all_tokens: bool, b_to_i, with_types: bool) -> dict[str, list]:
    names = ["input_ids", "attention_mask"] + (["token_type_ids"] if with_types else [])
    columns: dict[str, list] = {name: [] for name in [*names, "word_ids", "sentence", "length"]}
    if label_ids is not None:
        columns["labels"] = []
    for sentence, first_word, encoding in rows:
        word_ids = [None if word is None else word + first_word for word in encoding["word_ids"]]
        for name in names:
            columns[name].append(list(encoding[name]))
        columns["word_ids"].append(word_ids)
        columns["sentence"].append(sentence)
        columns["length"].append(len(word_ids))
        if label_ids is not None:
            columns["labels"].append(align_labels(label_ids[sentence], word_ids, label_all_tokens=label_all_tokens,
                                                  b_to_i=b_to_i))
    return columns


def tokenize_word_split(task: TaskData, split: str, tokenizer, max_seq_length: int) -> datasets.Dataset:
    """The rows of a token-classification task's `split` (`word_task.token_task_data`) as
    `tokenize_words` makes them, with the task's labelling options, as a Dataset: `input_ids`,
    `attention_mask` (`token_type_ids`), `labels` (per token, IGNORE_INDEX where not scored),
    `length`, `word_ids` (-1 for special tokens) and `sentence`. A sentence longer than
    `max_seq_length` tokens gives several rows (windows), so a split may have more rows than
    sentences. Errors name the file, sentence and word (`WordSplit.where`)."""
    labelling = task.source
    words = labelling.task.splits[split]
    stride = labelling.stride_for(max_seq_length, tokenizer.num_special_tokens_to_add(pair=False))
    columns = tokenize_words(tokenizer, words.tokens, max_seq_length, tags=words.tags,
                             label_names=labelling.task.label_names, label_all_tokens=labelling.label_all_tokens,
                             stride=stride, where=words.where)
    columns["word_ids"] = [[-1 if w is None else w for w in ids] for ids in columns["word_ids"]]
    return datasets.Dataset.from_dict(columns)


__all__ = ["IGNORE_INDEX", "align_labels", "tokenize_word_split", "tokenize_words"]
