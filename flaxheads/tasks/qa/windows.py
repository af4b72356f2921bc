"""QA examples as the windows a model reads: transformers' examples/pytorch/question-answering/
run_qa.py pre-processing (`prepare_train_features`, `prepare_validation_features`, v4.57.6).

Each example is tokenised as the pair (question, context), or (context, question) for a tokenizer
that pads on the left (run_qa's `pad_on_right`), with the question's leading whitespace stripped.
Only the context is truncated ("only_second", or "only_first"); a context longer than a window
overflows into further windows of `max_seq_length` tokens, each repeating the last `doc_stride`
context tokens of the one before, all of them kept (`example_index` says whose each window is).
Windows are padded to `max_seq_length` as run_qa pads by default (`pad_to_max_length=True`), or
left unpadded to be padded per batch (`pad_features`).

Training windows are labelled with the tokens where the first answer starts and ends; a window
that does not hold the whole answer, and an example without one, with the CLS index. Validation
windows keep their example's id and each token's character span in the context, None for tokens
outside the context, which post-processing turns back into answer text.

Where flaxheads differs from run_qa, on purpose (labels only; the windows are identical):
- An answer that starts in a window's last context token is labelled there. run_qa's start loop
  walks past the context's end (the next token, [SEP], has offsets (0, 0)) and labels the last
  token of the row: the padding, or the final [SEP] (its comment says "we could go after the last
  offset"). The end loop likewise stops at the window's first context token.
- The CLS index is looked for among the real tokens only (attention mask 1): the first
  `cls_token_id`, else the first `bos_token_id` (a model without CLS: Llama's <s>), else the first
  real token (GPT-2 adds neither: its first token). run_qa looks through the padding too, so where
  the pad id is the CLS or BOS id (GPT-2 padded with its end-of-text token, which is also its BOS)
  it labels the first padding token, and labels otherwise when padding later; for every tokenizer
  whose pad id is neither (BERT, RoBERTa, ...) both give the same index.
- A question that leaves no room for the context, or a `doc_stride` as large as the room left, is
  refused before tokenising (`check_windows_fit`); the tokenizers library would raise or abort.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from flaxheads.tasks.qa.data import QAExample

INPUT_COLUMNS = ("input_ids", "attention_mask", "token_type_ids")
"""The model inputs a window may have (token_type_ids where the tokenizer makes them)."""
LABEL_COLUMNS = ("start_positions", "end_positions")


def train_features(examples: Sequence[QAExample], tokenizer, *, max_seq_length: int = 384, doc_stride: int = 128,
                   pad_to_max_length: bool = True) -> dict:
    """run_qa.py's `prepare_train_features` for `examples`, with a fast `tokenizer`: one row per
    window, columns `input_ids`, `attention_mask`, `token_type_ids` (where the tokenizer makes
    them), `start_positions`, `end_positions` (the first answer's tokens, or the CLS index:
    module docstring) and `example_index` (the example each window is of, run_qa's
    `overflow_to_sample_mapping`). With `pad_to_max_length` each input column is an int32 array
    (windows, max_seq_length) padded on the tokenizer's side; without, a list of int32 arrays of
    their own lengths, positions counted in them (`pad_features` pads them). Label columns are
    int32 arrays (windows,). Raises ValueError as `check_windows_fit` does, for a tokenizer that
    is not fast or (with padding) has no pad token, and for a context with no token."""
    encoded, pad_on_right = _encode(examples, tokenizer, max_seq_length, doc_stride, pad_to_max_length)
    starts, ends = [], []
    for window, example_index in enumerate(encoded["overflow_to_sample_mapping"]):
        start, end = _answer_tokens(encoded, window, examples[example_index], tokenizer, pad_on_right)
        starts.append(start)
        ends.append(end)
    features = _inputs(encoded, pad_to_max_length)
    features["start_positions"] = np.asarray(starts, np.int32)
    features["end_positions"] = np.asarray(ends, np.int32)
    return features


def validation_features(examples: Sequence[QAExample], tokenizer, *, max_seq_length: int = 384,
                        doc_stride: int = 128, pad_to_max_length: bool = True, with_labels: bool = False) -> dict:
    """run_qa.py's `prepare_validation_features`: the windows of `train_features` with, instead of
    labels, `example_id` (a list of each window's example id) and `offset_mapping` (a list per
    window of each token's (start, end) character span in the context, None for the question,
    special and padding tokens); `example_index` as `train_features`. `with_labels` adds
    `start_positions` and `end_positions` as `train_features` gives them (for a loss on
    validation data; run_qa keeps none)."""
    encoded, pad_on_right = _encode(examples, tokenizer, max_seq_length, doc_stride, pad_to_max_length)
    context_index = 1 if pad_on_right else 0
    ids, offsets, starts, ends = [], [], [], []
    for window, example_index in enumerate(encoded["overflow_to_sample_mapping"]):
        sequence_ids = encoded.sequence_ids(window)
        ids.append(examples[example_index].id)
        offsets.append([tuple(span) if sequence_ids[k] == context_index else None
                        for k, span in enumerate(encoded["offset_mapping"][window])])
        if with_labels:
            start, end = _answer_tokens(encoded, window, examples[example_index], tokenizer, pad_on_right)
            starts.append(start)
            ends.append(end)
    features = _inputs(encoded, pad_to_max_length)
    features["example_id"], features["offset_mapping"] = ids, offsets
    if with_labels:
        features["start_positions"] = np.asarray(starts, np.int32)
        features["end_positions"] = np.asarray(ends, np.int32)
    return features


def check_windows_fit(examples: Sequence[QAExample], tokenizer, *, max_seq_length: int, doc_stride: int) -> None:
    """ValueError naming the example with the longest question when a window of `max_seq_length`
    tokens has no room for the context beside its question and the special tokens, or when
    `doc_stride` is not below the context tokens a window holds (the next window would not
    advance), saying which setting to raise or lower. (The tokenizers library would raise
    "Sequence to truncate too short", or abort the process on the stride.)"""
    if doc_stride < 0:
        raise ValueError(f"doc_stride={doc_stride} is negative; give the number of context tokens windows share "
                         "(run_qa's default is 128)")
    special = tokenizer.num_special_tokens_to_add(pair=True)
    lengths = [len(ids) for ids in tokenizer([e.question.lstrip() for e in examples], add_special_tokens=False)
               ["input_ids"]]
    longest = int(np.argmax(lengths))
    question, example = lengths[longest], examples[longest]
    room = max_seq_length - special - question
    need = question + special + doc_stride + 1
    if room > doc_stride:
        return
    too_long = sum(1 for length in lengths if max_seq_length - special - length <= doc_stride)
    named = f"the question of example {example.id!r} is {question} tokens" + (
        f" (and {too_long - 1} other question{'s' if too_long > 2 else ''} too long)" if too_long > 1 else "")
    if room < 1:
        raise ValueError(f"{named}: with the {special} special tokens of a pair, max_seq_length={max_seq_length} "
                         f"leaves no token of the context beside it. Pass max_seq_length={need} or more "
                         f"(--max_seq_length), or shorten the question")
    raise ValueError(f"{named}: a window of max_seq_length={max_seq_length} holds {room} context tokens beside it and "
                     f"its {special} special tokens, and doc_stride={doc_stride} must be below that for the next "
                     f"window to move on. Pass doc_stride={max(room - 1, 0)} or less (--doc_stride), or "
                     f"max_seq_length={need} or more (--max_seq_length), or shorten the question")


def pad_features(features: Mapping, *, pad_token_id: int, padding_side: str = "right", length: int | None = None,
                 pad_token_type_id: int = 0) -> dict:
    """`features` (of `train_features` / `validation_features`, padded or not) with every window
    padded to `length` (None: the longest) on `padding_side`: `input_ids` with `pad_token_id`,
    `attention_mask` with 0, `token_type_ids` with `pad_token_type_id`, `offset_mapping` with None;
    left padding moves `start_positions` and `end_positions` by the padding added (a collator that
    pads on the left without moving them, as run_qa's `DataCollatorWithPadding` with
    `pad_to_max_length=False`, would point every label at the wrong token). Input columns come
    back as int32 arrays (windows, length). Raises ValueError for a window longer than `length`."""
    if padding_side not in ("right", "left"):
        raise ValueError(f"padding_side={padding_side!r}: give 'right' or 'left'")
    rows = [np.asarray(row) for row in features["input_ids"]]
    lengths = np.asarray([len(row) for row in rows], np.int32)
    length = int(lengths.max(initial=0)) if length is None else length
    if len(rows) and lengths.max() > length:
        raise ValueError(f"a window is {int(lengths.max())} tokens, longer than length={length}; pass a length of at "
                         "least the longest window (None pads to it)")
    fills = {"input_ids": pad_token_id, "attention_mask": 0, "token_type_ids": pad_token_type_id}
    added = length - lengths
    padded = dict(features)
    for name, fill in fills.items():
        if name in features:
            padded[name] = np.stack([_pad_row(np.asarray(row, np.int32), n, fill, padding_side)
                                     for row, n in zip(features[name], added)]) if len(rows) else \
                np.zeros((0, length), np.int32)
    if "offset_mapping" in features:
        padded["offset_mapping"] = [[None] * n + list(row) if padding_side == "left" else list(row) + [None] * n
                                    for row, n in zip(features["offset_mapping"], added)]
    if padding_side == "left":
        for name in LABEL_COLUMNS:
            if name in features:
                padded[name] = (np.asarray(features[name]) + added).astype(np.int32)
    return padded


def _pad_row(row: np.ndarray, n: int, fill: int, side: str) -> np.ndarray:
    padding = np.full(n, fill, np.int32)
    return np.concatenate([padding, row] if side == "left" else [row, padding])


# -- internals ------------------------------------------------------------------------------------


def _encode(examples: Sequence[QAExample], tokenizer, max_seq_length: int, doc_stride: int, pad: bool):
    """(the tokenizer's BatchEncoding of every window, pad_on_right), as run_qa tokenises."""
    if not examples:
        raise ValueError("no examples to make windows of: give at least one QAExample")
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError(f"{type(tokenizer).__name__} is not a fast tokenizer, and QA windows need its offsets; load "
                         "it with transformers.AutoTokenizer.from_pretrained(..., use_fast=True)")
    if pad and tokenizer.pad_token_id is None:
        raise ValueError(f"{type(tokenizer).__name__} has no pad token to pad windows to max_seq_length with; load it "
                         "with flaxheads.tokenizer.load_tokenizer (which gives it the model's), set "
                         "tokenizer.pad_token, or pass pad_to_max_length=False and pad with pad_features")
    check_windows_fit(examples, tokenizer, max_seq_length=max_seq_length, doc_stride=doc_stride)
    pad_on_right = tokenizer.padding_side == "right"
    questions = [e.question.lstrip() for e in examples]  # run_qa: leading whitespace only takes room
    contexts = [e.context for e in examples]
    encoded = tokenizer(questions if pad_on_right else contexts, contexts if pad_on_right else questions,
                        truncation="only_second" if pad_on_right else "only_first", max_length=max_seq_length,
                        stride=doc_stride, return_overflowing_tokens=True, return_offsets_mapping=True,
                        padding="max_length" if pad else False)
    context_index = 1 if pad_on_right else 0
    for window, example_index in enumerate(encoded["overflow_to_sample_mapping"]):
        if context_index not in encoded.sequence_ids(window):
            raise ValueError(f"the context of example {examples[example_index].id!r} has no token for the tokenizer "
                             f"(it reads {examples[example_index].context[:60]!r}); give it text, or remove it")
    return encoded, pad_on_right


def _inputs(encoded, pad: bool) -> dict:
    columns = {}
    for name in INPUT_COLUMNS:
        if name in encoded:
            rows = encoded[name]
            columns[name] = np.asarray(rows, np.int32) if pad else [np.asarray(row, np.int32) for row in rows]
    columns["example_index"] = np.asarray(encoded["overflow_to_sample_mapping"], np.int32)
    return columns


def cls_index(input_ids: Sequence[int], attention_mask: Sequence[int], tokenizer) -> int:
    """Where a window without its answer is labelled: the first real token (attention mask 1)
    that is the tokenizer's CLS, else its BOS, else the first real token (module docstring)."""
    real = [k for k, mask in enumerate(attention_mask) if mask]
    for special in (tokenizer.cls_token_id, tokenizer.bos_token_id):
        if special is not None:
            found = next((k for k in real if input_ids[k] == special), None)
            if found is not None:
                return found
    return real[0] if real else 0


def _answer_tokens(encoded, window: int, example: QAExample, tokenizer, pad_on_right: bool) -> tuple[int, int]:
    """(start, end) token positions of `example`'s first answer in `window`, or the CLS index
    twice when the window does not hold the whole answer or there is none."""
    input_ids = encoded["input_ids"][window]
    cls = cls_index(input_ids, encoded.encodings[window].attention_mask, tokenizer)
    if not example.answerable:
        return cls, cls
    start_char = example.answer_starts[0]
    end_char = start_char + len(example.answer_texts[0])
    offsets = encoded["offset_mapping"][window]
    context_index = 1 if pad_on_right else 0
    context = [k for k, sequence in enumerate(encoded.sequence_ids(window)) if sequence == context_index]
    first, last = context[0], context[-1]
    if not (offsets[first][0] <= start_char and offsets[last][1] >= end_char):
        return cls, cls
    start = first
    while start <= last and offsets[start][0] <= start_char:  # run_qa: `start < len(offsets)` (docstring)
        start += 1
    end = last
    while end >= first and offsets[end][1] >= end_char:
        end -= 1
    return start - 1, end + 1


__all__ = ["INPUT_COLUMNS", "LABEL_COLUMNS", "check_windows_fit", "cls_index", "pad_features", "train_features",
           "validation_features"]
