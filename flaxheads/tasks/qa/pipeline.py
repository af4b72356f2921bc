"""`flaxheads.pipeline("question-answering", ...)`: transformers 4.57's question-answering pipeline
(`QuestionAnsweringPipeline`, which transformers 5 removed) over a model that gives start and end
logits, answering with the same spans, offsets and scores.

    qa = flaxheads.pipeline("question-answering", model="out")
    qa(question="Who built the tower?", context="The tower was built by Gustave Eiffel in 1889.")
    # {"score": 0.93, "start": 22, "end": 36, "answer": "Gustave Eiffel"}
    qa(question=["Who?", "When?"], context=text, top_k=3)   # a list of answers per question
    qa({"question": "Who?", "context": long_text}, max_seq_len=256, doc_stride=64)  # windows

The rules are those of transformers 4.57.6's `pipelines/question_answering.py` (its fast-tokenizer
path), one function each here:
- Each question is tokenized with its context (question first when the tokenizer pads on the
  right, else context first), the context cut into windows of `max_seq_len` tokens overlapping by
  `doc_stride` (default `min(max_seq_len // 2, 128)`; `max_seq_len` defaults to
  `min(tokenizer.model_max_length, 384)`). Windows are scored without padding, as transformers'
  default `batch_size=1` scores them.
- Per window, tokens that cannot answer (`p_mask`: the question and special tokens, not the CLS
  token) get logits -10000; start and end logits become probabilities (softmax, float32); the
  null score is the CLS token's start x end probability (the smallest over windows), and CLS is
  then zeroed; a span's score is start x end probability, for spans of at most `max_answer_len`
  tokens (`decode_spans`); the best `top_k * 2 + 10` spans (`top_k` without `align_to_words`)
  are kept.
- A span's characters are those of the words its first and last tokens fall in
  (`align_to_words`), or of the tokens themselves; spans whose text is equal ignoring case add
  their scores into one answer, across windows too. With `handle_impossible_answer` the empty
  answer {"score": null score, "start": 0, "end": 0, "answer": ""} competes. The `top_k` best
  are returned: a dict when there is one, else a list (an empty one for no input).

transformers' behaviours kept, because the answers must be its:
- `max_question_len` is not read (transformers' fast-tokenizer path never reads it): a question is
  never cut.
- With a tokenizer that pads on the left, every token of a window may answer (transformers' p_mask
  is all zeros there), so an answer may come from the question's tokens, mapped onto the
  context's characters; with `padding="max_length"`, the pads shift the token indices first.
- The filter of allowed spans compares against the 2-D `nonzero()` of the mask, which holds the
  row index 0: a span starting or ending at index 0 is never filtered out. When a window has fewer
  positive-score spans than are kept, zero-score spans reach the answers (e.g.
  {"score": 0.0, "start": 0, "end": 0, "answer": ""}).

Deliberate differences from transformers:
- Slow (Python) tokenizers are refused, naming the fast one to load (transformers reads them
  through its SQuAD feature converter, another algorithm).
- Windows the tokenizer cannot cut (a `doc_stride` at least as large as the room a window leaves
  the context after the question, or a question longer than `max_seq_len`) are a ValueError
  naming the fix, where transformers' tokenizer panics or raises a bare Exception; so are inputs
  it refuses with a KeyError or TypeError (a dict without "context", keys other than "question"
  and "context", a question that is not a str).
- `batch_size` only groups forward passes (windows of all questions together, padded on the
  right to a length bucket and cropped back): answers are those of transformers' default
  `batch_size=1`, whose larger batches pad windows together and move scores in the last bits.
- Non-finite logits are a FloatingPointError naming the question; generators, datasets,
  `SquadExample`s and the deprecated `X=`/`data=` arguments are not read: give a list.
"""

from __future__ import annotations

import dataclasses
import os
import types
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from flaxheads.inference import check_batch_size, compiled_forward, pipeline_model, rows_per_batch
from flaxheads.model import PretrainedModel
from flaxheads.tokenizer import read_tokenizer

SpanScorer = Callable[[np.ndarray, np.ndarray, "np.ndarray | None"], tuple[Any, Any]]
"""A question-answering model as the pipeline calls it: `(input_ids, attention_mask,
token_type_ids or None)`, int32 arrays (batch, sequence), to `(start_logits, end_logits)`, float
arrays (batch, sequence) (numpy, jax or anything `np.asarray` reads)."""

DEFAULT_MAX_ANSWER_LEN = 15
DEFAULT_MAX_QUESTION_LEN = 64
LONGEST_DEFAULT_WINDOW = 384
"""`max_seq_len` when not given: the tokenizer's `model_max_length`, at most this (transformers')."""
LONGEST_DEFAULT_STRIDE = 128
"""`doc_stride` when not given: half a window, at most this (transformers')."""
MASKED_LOGIT = -10000.0
"""The logit transformers gives tokens that cannot answer before the softmax."""
NULL_SCORE_START = 1000000.0
"""The null score before any window is read (transformers': large and positive)."""


def question_answering_pipeline(model: Any = None, tokenizer: Any = None, *, top_k: int = 1,
                                max_answer_len: int = DEFAULT_MAX_ANSWER_LEN, doc_stride: int | None = None,
                                max_seq_len: int | None = None, max_question_len: int = DEFAULT_MAX_QUESTION_LEN,
                                handle_impossible_answer: bool = False, align_to_words: bool = True,
                                padding: bool | str = "do_not_pad", batch_size: int = 64
                                ) -> QuestionAnsweringPipeline:
    """A question-answering model answering as `transformers.pipeline("question-answering",
    model=..., tokenizer=..., **options)` of transformers 4.57: what
    `flaxheads.pipeline("question-answering", ...)` builds.

    `model`: a flaxheads question-answering model, or the folder of a trained one (read with its
    own tokenizer unless `tokenizer` is given), or any `SpanScorer` callable (then `tokenizer` is
    required: a transformers fast tokenizer or its folder). The options are transformers' (see
    `QuestionAnsweringPipeline.__call__`), each of which a call may change; `batch_size`: windows
    per forward pass.

    Raises ValueError for a missing or slow tokenizer, a model of another task, and settings
    transformers refuses (`top_k` or `max_answer_len` below 1, `doc_stride` above `max_seq_len`).
    """
    check_batch_size(batch_size)
    if model is not None and not isinstance(model, (PretrainedModel, str, os.PathLike)) and callable(model):
        if tokenizer is None:
            raise ValueError("pipeline('question-answering', model=<a callable>) needs tokenizer=: the fast tokenizer "
                             "the model was trained with (a transformers tokenizer or its folder)")
        scorer, source = model, "the model"
        tokenizer = read_tokenizer(tokenizer) if isinstance(tokenizer, (str, os.PathLike)) else tokenizer
    else:
        model, tokenizer, source = pipeline_model(model, tokenizer, _model_class())
        scorer = model_scorer(model)
    return QuestionAnsweringPipeline(
        scorer, tokenizer, source=source, batch_size=batch_size,
        settings=Settings(top_k=top_k, max_answer_len=max_answer_len, doc_stride=doc_stride, max_seq_len=max_seq_len,
                          max_question_len=max_question_len, handle_impossible_answer=handle_impossible_answer,
                          align_to_words=align_to_words, padding=padding).checked(),
    )


def _model_class() -> type[PretrainedModel]:
    """flaxheads' question-answering model class (its folder's `model.py`)."""
    from flaxheads.tasks.qa.model import QuestionAnswering

    return QuestionAnswering


def model_scorer(model: PretrainedModel) -> SpanScorer:
    """`model` (a flaxheads question-answering model) as a `SpanScorer`: an eval-mode copy whose
    forward pass is compiled once per batch shape, over every local device (`inference.data_parallel`)."""
    params, compiled = compiled_forward(model, lambda model, *arrays: start_end_logits(model(*arrays)))
    return lambda input_ids, attention_mask, token_type_ids: compiled(params, input_ids, attention_mask,
                                                                      token_type_ids)


def start_end_logits(output) -> tuple[Any, Any]:
    """(start logits, end logits) of a model's output: a pair (or longer tuple), or an object or
    mapping with `start_logits` and `end_logits`, as transformers' `_forward` reads them."""
    if isinstance(output, dict):
        return output["start_logits"], output["end_logits"]
    if hasattr(output, "start_logits"):
        return output.start_logits, output.end_logits
    return output[0], output[1]


@dataclasses.dataclass(frozen=True)
class Settings:
    """How a call reads its questions and answers (transformers' parameters of the same names)."""

    top_k: int = 1
    max_answer_len: int = DEFAULT_MAX_ANSWER_LEN
    doc_stride: int | None = None
    """None: `min(max_seq_len // 2, 128)`."""
    max_seq_len: int | None = None
    """None: `min(tokenizer.model_max_length, 384)`."""
    max_question_len: int = DEFAULT_MAX_QUESTION_LEN
    """Not read (see the module's docstring); checked to be an int."""
    handle_impossible_answer: bool = False
    align_to_words: bool = True
    padding: bool | str = "do_not_pad"

    def checked(self) -> Settings:
        """These settings, or a ValueError naming the one transformers (or its tokenizer) refuses
        and its fix."""
        if _not_int(self.top_k) or self.top_k < 1:
            raise ValueError(f"top_k={self.top_k!r}: it is how many answers to return, an int of at least 1 "
                             "(top_k=1 gives the best answer alone)")
        if _not_int(self.max_answer_len) or self.max_answer_len < 1:
            raise ValueError(f"max_answer_len={self.max_answer_len!r}: it is the most tokens an answer may span, an "
                             f"int of at least 1 (transformers' default is {DEFAULT_MAX_ANSWER_LEN})")
        for name in ("doc_stride", "max_seq_len"):
            value = getattr(self, name)
            if value is not None and (_not_int(value) or value < (0 if name == "doc_stride" else 1)):
                raise ValueError(f"{name}={value!r}: give an int of at least {0 if name == 'doc_stride' else 1}, or "
                                 "leave it out for transformers' default")
        if _not_int(self.max_question_len):
            raise ValueError(f"max_question_len={self.max_question_len!r}: give an int (transformers' pipeline does "
                             "not read it with a fast tokenizer, so it changes no answer)")
        if (self.doc_stride is not None and self.max_seq_len is not None and self.doc_stride > self.max_seq_len):
            raise ValueError(f"doc_stride={self.doc_stride} is larger than max_seq_len={self.max_seq_len}: windows of "
                             "max_seq_len tokens overlap by doc_stride tokens; pass a doc_stride below max_seq_len, "
                             f"e.g. doc_stride={self.max_seq_len // 4}")
        return self

    def for_tokenizer(self, tokenizer) -> Settings:
        """These settings with transformers' defaults for `max_seq_len` and `doc_stride` filled in."""
        max_seq_len = self.max_seq_len
        if max_seq_len is None:
            max_seq_len = min(tokenizer.model_max_length, LONGEST_DEFAULT_WINDOW)
        doc_stride = min(max_seq_len // 2, LONGEST_DEFAULT_STRIDE) if self.doc_stride is None else self.doc_stride
        return dataclasses.replace(self, max_seq_len=max_seq_len, doc_stride=doc_stride).checked()


def _not_int(value) -> bool:
    return isinstance(value, bool) or not isinstance(value, (int, np.integer))


@dataclasses.dataclass
class Window:
    """One forward pass's worth of a question and its context: the tokenizer's columns, which
    tokens may answer, and the `tokenizers.Encoding` that maps tokens back to characters."""

    input_ids: list[int]
    attention_mask: list[int] | None
    token_type_ids: list[int] | None
    p_mask: list[int]
    """1 for a token that cannot be (part of) an answer."""
    encoding: Any


class QuestionAnsweringPipeline:
    """Answers questions about contexts with a `SpanScorer` and a fast tokenizer; see
    `question_answering_pipeline` and `__call__`."""

    def __init__(self, scorer: SpanScorer, tokenizer, *, settings: Settings | None = None, batch_size: int = 64,
                 source: str = "the model"):
        check_batch_size(batch_size)
        if not getattr(tokenizer, "is_fast", False):
            raise ValueError(
                f"the question-answering pipeline needs a fast tokenizer (its character offsets map answers back to "
                f"the context); {type(tokenizer).__name__} is a slow one: load the fast one with "
                "transformers.AutoTokenizer.from_pretrained(<folder>) and pass it as tokenizer="
            )
        self.scorer, self.tokenizer, self.batch_size, self.source = scorer, tokenizer, batch_size, source
        self.settings = (settings or Settings()).checked()
        self._model_inputs = tuple(tokenizer.model_input_names)

    def __call__(self, *args, question: str | Sequence[str] | None = None, context: str | Sequence[str] | None = None,
                 top_k: int | None = None, max_answer_len: int | None = None, doc_stride: int | None = None,
                 max_seq_len: int | None = None, max_question_len: int | None = None,
                 handle_impossible_answer: bool | None = None, align_to_words: bool | None = None,
                 padding: bool | str | None = None, topk: int | None = None):
        """The answers to one question or several, as transformers 4.57's pipeline gives them.

        Inputs, as transformers reads them: `question=` and `context=` (a str each; a list of
        questions with one context or with a context each), or positionally a dict
        {"question": ..., "context": ...}, a list of such dicts, several dicts, or a question and
        its context as two str.

        Answers: per question, {"score": float, "start": int, "end": int, "answer": str}
        (`start`/`end`: character offsets of the answer in its context), a list of the `top_k`
        best when there are several; one question (however given) answers alone, several with a
        list of their answers, in order.

        Options (the pipeline's unless given here): `top_k` answers per question (`topk`:
        transformers' deprecated name); `max_answer_len` tokens at most per answer; `max_seq_len`
        tokens per window, which overlap by `doc_stride` tokens; `handle_impossible_answer`: let
        the empty answer compete; `align_to_words`: widen answers to whole words; `padding`: the
        tokenizer's, per question; `max_question_len`: accepted, not read.

        Raises ValueError for inputs or settings transformers refuses, or windows its tokenizer
        cannot cut (naming the fix); FloatingPointError for non-finite logits.
        """
        if topk is not None and top_k is None:
            warnings.warn("topk parameter is deprecated, use top_k instead", UserWarning, stacklevel=2)
            top_k = topk
        given = dict(top_k=top_k, max_answer_len=max_answer_len, doc_stride=doc_stride, max_seq_len=max_seq_len,
                     max_question_len=max_question_len, handle_impossible_answer=handle_impossible_answer,
                     align_to_words=align_to_words, padding=padding)
        settings = dataclasses.replace(self.settings, **{k: v for k, v in given.items() if v is not None}).checked()
        settings = settings.for_tokenizer(self.tokenizer)
        examples, single = _examples(args, question, context)
        self._check_room(examples, settings)
        windows = [self._windows(q, c, settings) for q, c in examples]
        logits = iter(self._logits([w for example in windows for w in example], settings))
        answers = []
        for index, ((_, text), example_windows) in enumerate(zip(examples, windows)):
            scored = [(window, *next(logits)) for window in example_windows]
            if not all(np.isfinite(start).all() and np.isfinite(end).all() for _, start, end in scored):
                raise FloatingPointError(
                    f"{self.source} gave non-finite start or end logits for question {index} (0-based); no answer is "
                    f"given from weights that produce NaN or infinity. Check {self.source} (was its training stopped "
                    "by a non-finite loss?)")
            answers.append(self._answers(text, scored, settings))
        return answers[0] if single else answers

    # -----------------------------------------------------------------------------------------
    # Windows (transformers' preprocess)

    @property
    def _question_first(self) -> bool:
        return self.tokenizer.padding_side == "right"

    def _check_room(self, examples: list[tuple[str, str]], settings: Settings) -> None:
        """ValueError, naming the fix, for a question whose context must be cut into windows the
        tokenizer cannot cut: no room for the context beside the question, or windows that would
        overlap by as much as they hold (the tokenizer panics on both; a context that fits whole
        is not cut, and any stride is then fine, as in transformers)."""
        if not examples:
            return
        counts = self.tokenizer([text for pair in examples for text in pair], add_special_tokens=False,
                                verbose=False)["input_ids"]
        special = self.tokenizer.num_special_tokens_to_add(pair=True)
        for index in range(len(examples)):
            question, context = len(counts[2 * index]), len(counts[2 * index + 1])
            if special + question + context <= settings.max_seq_len:
                continue
            room = settings.max_seq_len - special - question
            what = (f"question {index} has {question} tokens; with the {special} special tokens, windows of "
                    f"max_seq_len={settings.max_seq_len} tokens leave")
            if room <= 0:
                raise ValueError(f"{what} no room for its context: pass a larger max_seq_len (at least "
                                 f"{special + question + 1 + settings.doc_stride}), or shorten the question "
                                 "(max_question_len does not cut it, as in transformers)")
            if settings.doc_stride >= room:
                raise ValueError(f"{what} {room} context tokens each, and doc_stride={settings.doc_stride} (how many "
                                 f"tokens they overlap by) must be below that: pass doc_stride={room // 2}, or a "
                                 f"larger max_seq_len")

    def _windows(self, question: str, context: str, settings: Settings) -> list[Window]:
        """transformers' `preprocess` (fast tokenizer): the question with its context, cut into
        windows with their p_mask."""
        first = self._question_first
        encoded = self.tokenizer(
            text=question if first else context, text_pair=context if first else question, padding=settings.padding,
            truncation="only_second" if first else "only_first", max_length=settings.max_seq_len,
            stride=settings.doc_stride, return_token_type_ids=True, return_overflowing_tokens=True,
            return_offsets_mapping=True, return_special_tokens_mask=True,
        )
        cls_token_id = self.tokenizer.cls_token_id
        windows = []
        for span in range(len(encoded["input_ids"])):
            # 1 where a token cannot answer: all but the context's tokens (transformers: 0 everywhere
            # when the context comes first); the CLS token stays 0 (models answer "no answer" there).
            p_mask = [int(sequence != 1) if first else 0 for sequence in encoded.sequence_ids(span)]
            input_ids = encoded["input_ids"][span]
            if cls_token_id is not None:
                for position in np.nonzero(np.array(input_ids) == cls_token_id)[0]:
                    p_mask[position] = 0
            windows.append(Window(
                input_ids=input_ids,
                attention_mask=encoded["attention_mask"][span] if "attention_mask" in encoded else None,
                token_type_ids=encoded["token_type_ids"][span] if "token_type_ids" in encoded else None,
                p_mask=p_mask, encoding=encoded[span],
            ))
        return windows

    # -----------------------------------------------------------------------------------------
    # Forward passes

    def _logits(self, windows: list[Window], settings: Settings) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per window, in order, its float32 (start, end) logits, one per token: windows batched
        `batch_size` at a time, longest first, padded on the right to a power-of-two length (at
        most the window length, so as few shapes as possible reach the model) and cropped back."""
        order = sorted(range(len(windows)), key=lambda i: -len(windows[i].input_ids))
        results: list[Any] = [None] * len(windows)
        pad_id = self.tokenizer.pad_token_id or 0
        with_types = "token_type_ids" in self._model_inputs
        for first in range(0, len(order), self.batch_size):
            chunk = [windows[i] for i in order[first:first + self.batch_size]]
            longest = len(chunk[0].input_ids)
            width = min(1 << (longest - 1).bit_length(), max(longest, settings.max_seq_len))
            rows = rows_per_batch(len(chunk), self.batch_size)
            input_ids = np.full((rows, width), pad_id, np.int32)
            attention_mask = np.zeros((rows, width), np.int32)
            token_type_ids = np.zeros((rows, width), np.int32)
            for row in range(rows):
                window = chunk[min(row, len(chunk) - 1)]  # rows past the windows repeat the last one
                length = len(window.input_ids)
                input_ids[row, :length] = window.input_ids
                attention_mask[row, :length] = 1 if window.attention_mask is None else window.attention_mask
                if window.token_type_ids is not None:
                    token_type_ids[row, :length] = window.token_type_ids
            start, end = self.scorer(input_ids, attention_mask, token_type_ids if with_types else None)
            start, end = (np.asarray(logits).astype(np.float32, copy=False) for logits in (start, end))
            if start.shape != input_ids.shape or end.shape != input_ids.shape:
                raise ValueError(f"{self.source} gave start and end logits of shapes {start.shape} and {end.shape} for "
                                 f"input_ids of shape {input_ids.shape}: a question-answering model gives one start "
                                 "and one end logit per token, (batch, sequence) each")
            for row, index in enumerate(order[first:first + self.batch_size]):
                length = len(windows[index].input_ids)
                results[index] = (start[row, :length], end[row, :length])
        return results

    # -----------------------------------------------------------------------------------------
    # From logits to answers (transformers' postprocess)

    def _answers(self, context: str, scored: list[tuple[Window, np.ndarray, np.ndarray]], settings: Settings):
        min_null_score = NULL_SCORE_START
        answers: list[dict[str, Any]] = []
        # Some spans are merged once aligned to words: keep more than top_k candidates then.
        candidates = settings.top_k * 2 + 10 if settings.align_to_words else settings.top_k
        sequence_index = 1 if self._question_first else 0
        for window, start, end in scored:
            attention_mask = (np.array([window.attention_mask]) if window.attention_mask is not None
                              and "attention_mask" in self._model_inputs else None)
            starts, ends, scores, min_null_score = select_starts_ends(
                start[None], end[None], np.array([window.p_mask]), attention_mask, min_null_score, candidates,
                settings.handle_impossible_answer, settings.max_answer_len)
            # Pads before the window (a left-padding tokenizer with padding=...) shift token indices.
            shift = (int(np.sum(np.array(window.input_ids) == self.tokenizer.pad_token_id))
                     if self.tokenizer.padding_side == "left" and self.tokenizer.pad_token_id is not None else 0)
            for first, last, score in zip(starts, ends, scores):
                begin, finish = _characters(window.encoding, first - shift, last - shift, sequence_index,
                                            settings.align_to_words)
                text = context[begin:finish]
                same = next((answer for answer in answers if answer["answer"].lower() == text.lower()), None)
                if same is not None:
                    same["score"] += score.item()
                else:
                    answers.append({"score": score.item(), "start": begin, "end": finish, "answer": text})
        if settings.handle_impossible_answer:
            answers.append({"score": min_null_score, "start": 0, "end": 0, "answer": ""})
        answers = sorted(answers, key=lambda answer: answer["score"], reverse=True)[:settings.top_k]
        return answers[0] if len(answers) == 1 else answers


def _characters(encoding, first: int, last: int, sequence_index: int, align_to_words: bool) -> tuple[int, int]:
    """transformers' `get_indices`: the characters from token `first` to token `last`, widened to
    their words when `align_to_words` and the tokens belong to words (else the tokens' own)."""
    if align_to_words:
        try:
            begin = encoding.word_to_chars(encoding.token_to_word(first), sequence_index=sequence_index)[0]
            finish = encoding.word_to_chars(encoding.token_to_word(last), sequence_index=sequence_index)[1]
            return begin, finish
        except Exception:  # noqa: BLE001 - transformers' rule: a token outside any word keeps its own offsets
            pass
    return encoding.offsets[first][0], encoding.offsets[last][1]


def select_starts_ends(start: np.ndarray, end: np.ndarray, p_mask: np.ndarray, attention_mask: np.ndarray | None,
                       min_null_score: float = NULL_SCORE_START, top_k: int = 1, handle_impossible_answer: bool = False,
                       max_answer_len: int = DEFAULT_MAX_ANSWER_LEN):
    """transformers' `select_starts_ends`: the `top_k` best spans of one window, (starts, ends,
    scores, the null score so far). `start`, `end`: float32 logits, `p_mask` (1: cannot answer)
    and `attention_mask`, each (1, sequence)."""
    allowed = np.abs(np.array(p_mask) - 1)
    if attention_mask is not None:
        allowed = allowed & attention_mask
    masked = allowed == 0.0
    start = np.where(masked, MASKED_LOGIT, start)
    end = np.where(masked, MASKED_LOGIT, end)
    start = np.exp(start - start.max(axis=-1, keepdims=True))
    start = start / start.sum()
    end = np.exp(end - end.max(axis=-1, keepdims=True))
    end = end / end.sum()
    if handle_impossible_answer:
        min_null_score = min(min_null_score, (start[0, 0] * end[0, 0]).item())
    start[0, 0] = end[0, 0] = 0.0
    starts, ends, scores = decode_spans(start, end, top_k, max_answer_len, allowed)
    return starts, ends, scores, min_null_score


def decode_spans(start: np.ndarray, end: np.ndarray, top_k: int, max_answer_len: int, allowed: np.ndarray):
    """transformers' `decode_spans`: the `top_k` spans of highest start x end probability, ending
    at or after their start and at most `max_answer_len` tokens long, both ends `allowed` (as
    transformers tests it: see the module's docstring), (starts, ends, scores)."""
    if start.ndim == 1:
        start = start[None]
    if end.ndim == 1:
        end = end[None]
    outer = np.matmul(np.expand_dims(start, -1), np.expand_dims(end, 1))
    candidates = np.tril(np.triu(outer), max_answer_len - 1)
    scores_flat = candidates.flatten()
    if top_k == 1:
        best = [np.argmax(scores_flat)]
    elif len(scores_flat) < top_k:
        best = np.argsort(-scores_flat)
    else:
        index = np.argpartition(-scores_flat, top_k)[0:top_k]
        best = index[np.argsort(-scores_flat[index])]
    starts, ends = np.unravel_index(best, candidates.shape)[1:]
    # nonzero() of the (1, sequence) mask is (rows, columns): the row indices (0) count as allowed.
    kept = np.isin(starts, allowed.nonzero()) & np.isin(ends, allowed.nonzero())
    starts, ends = starts[kept], ends[kept]
    return starts, ends, candidates[0, starts, ends]


# ---------------------------------------------------------------------------------------------
# Inputs (transformers' QuestionAnsweringArgumentHandler)

def _examples(args: tuple, question, context) -> tuple[list[tuple[str, str]], bool]:
    """((question, context) per input, whether the call answers one question alone), from the
    call's arguments as transformers reads them."""
    if args:
        if question is not None or context is not None:
            raise ValueError("give the questions either positionally (dicts {'question': ..., 'context': ...}) or as "
                             "question=/context=, not both")
        if len(args) == 1:
            inputs = args[0]
        elif len(args) == 2 and all(isinstance(arg, str) for arg in args):
            inputs = [{"question": args[0], "context": args[1]}]
        else:
            inputs = list(args)
    elif question is not None and context is not None:
        if isinstance(question, (list, tuple)) and isinstance(context, str):
            inputs = [{"question": one, "context": context} for one in question]
        elif isinstance(question, (list, tuple)) and isinstance(context, (list, tuple)):
            if len(question) != len(context):
                raise ValueError(f"question= has {len(question)} questions and context= {len(context)} contexts: give "
                                 "one context per question, or one context (a str) for all of them")
            inputs = [{"question": q, "context": c} for q, c in zip(question, context)]
        elif isinstance(question, str) and isinstance(context, str):
            inputs = [{"question": question, "context": context}]
        else:
            raise ValueError(f"question= is a {type(question).__name__} and context= a {type(context).__name__}: "
                             "give a str each, a list of questions with one context (a str), or two lists of equal "
                             "length")
    else:
        missing = " and ".join(name for name, value in (("question=", question), ("context=", context))
                               if value is None)
        raise ValueError(f"the question-answering pipeline needs {missing}: call it as "
                         "qa(question='Who?', context='...'), or with dicts {'question': ..., 'context': ...}")
    if isinstance(inputs, dict):
        inputs = [inputs]
    elif isinstance(inputs, (types.GeneratorType, str)) or not isinstance(inputs, (list, tuple)):
        raise ValueError(f"the pipeline reads a dict {{'question': ..., 'context': ...}}, a list of them, or "
                         f"question=/context=, not a {type(inputs).__name__}"
                         + (": give question= and context=" if isinstance(inputs, str) else ": give a list"))
    pairs = [_question_and_context(index, item) for index, item in enumerate(inputs)]
    return pairs, len(pairs) == 1


def _question_and_context(index: int, item) -> tuple[str, str]:
    if not isinstance(item, dict):
        raise ValueError(f"input {index} is a {type(item).__name__}: each input is a dict "
                         "{'question': ..., 'context': ...}")
    for key in ("question", "context"):
        if key not in item:
            raise ValueError(f"input {index} has no {key!r}: each input is a dict {{'question': ..., 'context': ...}}")
        if item[key] is None:
            raise ValueError(f"`{key}` cannot be None (input {index}): give it a str")
        if not isinstance(item[key], str):
            raise ValueError(f"`{key}` of input {index} is a {type(item[key]).__name__}: give one str per input "
                             "(several questions: a list of dicts, or question=[...])")
        if not item[key]:
            raise ValueError(f"`{key}` cannot be empty (input {index}): give it some text")
    extra = sorted(set(item) - {"question", "context"})
    if extra:
        raise ValueError(f"input {index} has keys {extra} besides 'question' and 'context', which the pipeline does "
                         "not read: leave them out")
    return item["question"], item["context"]


__all__ = [
    "QuestionAnsweringPipeline",
    "Settings",
    "SpanScorer",
    "Window",
    "decode_spans",
    "model_scorer",
    "question_answering_pipeline",
    "select_starts_ends",
    "start_end_logits",
]
