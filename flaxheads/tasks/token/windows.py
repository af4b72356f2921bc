"""Sentences longer than a model's input, as overlapping windows, and predictions back to words.

A sentence whose subword tokens do not fit in `max_seq_length` (less the special tokens) is cut
into windows of whole words (`plan_windows`) rather than truncated: each window holds as many
words as fit, and the next one starts early enough to repeat the previous window's last words, as
many as fit in `stride` tokens. (`flaxheads.tasks.token.subwords.tokenize_words` gives a single word
longer than a window a window alone, cut to the window's length.)

A word inside several windows takes its prediction from the one where it has the most context:
the largest `min(tokens before it, tokens after it)` in that window, counted at the word's first
subword, plus 0.01 times the window's length, the earliest window on a tie (`merge_windows`).
This is the rule of BERT's `run_squad.py` (`_check_is_max_context`) for document spans, applied
to words.

A word's prediction is the one at its first subword: the subword transformers' run_ner.py
labels, and the one conlleval-style word scores read.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

WordIds = Sequence[int | None]
"""Per token, the index of the word it belongs to (in its sentence), None (or < 0) for special
and padding tokens: a fast tokenizer's `word_ids()`."""


def plan_windows(word_token_counts: Sequence[int], max_tokens: int, stride: int = 0) -> list[tuple[int, int]]:
    """[start, end) word ranges covering a sentence whose words have `word_token_counts`
    subword tokens: one range when they fit in `max_tokens`, else windows of at most
    `max_tokens` tokens, each repeating the longest run of its predecessor's last words that
    fits in `stride` tokens (the overlap). Raises ValueError for a stride that leaves no room to
    advance (it must be below `max_tokens`) and for a single word longer than `max_tokens`."""
    counts = [int(c) for c in word_token_counts]
    if max_tokens < 1 or not 0 <= stride < max_tokens:
        raise ValueError(f"stride={stride} must be at least 0 and below the {max_tokens} tokens a window holds")
    too_long = next((i for i, c in enumerate(counts) if c > max_tokens), None)
    if too_long is not None:
        raise ValueError(f"word {too_long + 1} alone is {counts[too_long]} subword tokens, more than the "
                         f"{max_tokens} a window holds")
    if sum(counts) <= max_tokens:
        return [(0, len(counts))]
    offsets = np.concatenate([[0], np.cumsum(counts)])  # offsets[i]: tokens before word i
    windows, start = [], 0
    while True:
        end = start
        while end < len(counts) and offsets[end + 1] - offsets[start] <= max_tokens:
            end += 1
        windows.append((start, end))
        if end == len(counts):
            return windows
        next_start = end
        while next_start - 1 > start and offsets[end] - offsets[next_start - 1] <= stride:
            next_start -= 1
        start = next_start


def merge_windows(token_values: Sequence, word_ids: Sequence[WordIds], num_words: int | None = None) -> np.ndarray:
    """One value per word of a sentence from the windows that hold it: `token_values[w]` holds,
    per token position of window w, a predicted id or a row of logits (longer rows, padded on the
    right, are fine), and `word_ids[w]` that window's word of each position. Each word takes the
    value at its first subword in the window where it has the most context (module docstring).

    Returns (num_words,) or (num_words, C). Raises ValueError for a word no window holds, and for
    windows and word ids of different counts.
    """
    if len(token_values) != len(word_ids):
        raise ValueError(f"{len(token_values)} windows of values and {len(word_ids)} of word ids; give both per window")
    windows = [_first_subwords(ids) for ids in word_ids]
    if num_words is None:
        num_words = 1 + max((word for firsts, _ in windows for word, _, _ in firsts), default=-1)
    best = np.full(num_words, -np.inf)
    merged = None
    for values, (firsts, length) in zip(token_values, windows):
        values = np.asarray(values)
        if merged is None:
            merged = np.zeros((num_words, *values.shape[1:]), values.dtype)
        for word, context_position, row_position in firsts:
            if word >= num_words:
                raise ValueError(f"word id {word} in a window of a sentence of {num_words} words")
            score = min(context_position, length - 1 - context_position) + 0.01 * length
            if score > best[word]:
                best[word] = score
                merged[word] = values[row_position]
    missing = np.flatnonzero(best == -np.inf)
    if len(missing):
        raise ValueError(
            f"word {missing[0] + 1} of {num_words} is in no window (none of its tokens is there): the windows do not "
            "cover the sentence. Tokenise with flaxheads.tasks.token.subwords.tokenize_words, which never truncates"
        )
    return merged


def _first_subwords(word_ids: WordIds) -> tuple[list[tuple[int, int, int]], int]:
    """([(word, its first subword's position among the window's word tokens, and in the row)],
    the number of word tokens) of one window."""
    firsts, seen, content = [], set(), 0
    for row_position, word in enumerate(word_ids):
        if word is None or word < 0:
            continue
        if word not in seen:
            seen.add(word)
            firsts.append((int(word), content, row_position))
        content += 1
    return firsts, content


def word_predictions(token_values: Sequence, word_ids: Sequence[WordIds], sentence_of_row: Sequence[int],
                     words_per_sentence: Sequence[int]) -> list[np.ndarray]:
    """Per sentence, one value per word (`merge_windows` of the sentence's rows): the rows are
    `tokenize_words`' (one per window; `sentence_of_row` says whose), `token_values[r]` the
    model's predicted ids (T,) or logits (T, C) for row r, padded on the right or not. Raises
    ValueError for a sentence without rows and as `merge_windows`."""
    rows: list[list[int]] = [[] for _ in words_per_sentence]
    for row, sentence in enumerate(sentence_of_row):
        rows[sentence].append(row)
    merged = []
    for sentence, (sentence_rows, num_words) in enumerate(zip(rows, words_per_sentence)):
        if not sentence_rows:
            raise ValueError(f"sentence {sentence + 1} has no rows: give the values of every row tokenize_words made")
        merged.append(merge_windows([token_values[r] for r in sentence_rows], [word_ids[r] for r in sentence_rows],
                                    num_words))
    return merged


__all__ = ["merge_windows", "plan_windows", "word_predictions"]
