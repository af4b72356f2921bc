"""`flaxheads.pipeline("token-classification", ...)` (alias "ner"): transformers' token-classification
pipeline over a flaxheads `TokenClassifier`, in memory or saved, giving the same entities with the
same scores, its forward passes batched and bucketed through `flaxheads.inference.TokenScorer`.

    ner = flaxheads.pipeline("token-classification", model="out", aggregation_strategy="simple")
    ner("Ada Lovelace was born in London")
    # [{"entity_group": "PER", "score": 0.98, "word": "ada lovelace", "start": 0, "end": 12}, ...]
    ner(long_texts, stride=32)           # texts longer than the model reads, in overlapping windows

The rules are those of transformers' `pipelines/token_classification.py` (5.x), one function each
here: special tokens are skipped; each token's scores are the softmax of its logits; a token is a
word's continuation (`is_subword`) when its text is longer or shorter than the token (a tokenizer
with a continuing-subword prefix, WordPiece's "##"), else when no space precedes it; "none"
answers per token, "simple" groups tokens, "first" / "average" / "max" decide per word first (the
first token's label, the mean scores, the most confident token) and then group; grouping joins a
token to the one before when their labels name the same entity (B-/I- prefixes stripped) and it
is not a B-; `ignore_labels` (default "O") are dropped; windows' entities that overlap keep the
longer one (the more confident on a tie).

Deliberate differences from transformers:
- A text longer than the model reads at once is refused, naming `stride=`, where transformers
  cuts it off without a word (or, when its tokenizer allows more tokens than the model has
  positions, fails inside the model); with `stride` it is read in windows of that length
  overlapping by `stride` tokens, as transformers' `stride=` does.
- Scores are Python floats (transformers gives numpy float32 scalars of the same values, which
  `json.dumps` refuses).
- An unknown aggregation strategy is a ValueError naming the five (transformers: a KeyError), and
  a stride that leaves a window no room to advance a ValueError naming the most it may be
  (transformers' tokenizer panics).
- No `offset_mapping=` argument (offsets a slow tokenizer cannot give), and no datasets or
  generators as input: a str or a list.
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from typing import Any, Sequence

import numpy as np

from flaxheads.tasks.token.inference import TokenScorer
from flaxheads.inference import pipeline_model
from flaxheads.names import PAD_TO_MULTIPLE_OF
from flaxheads.tasks.token.model import TokenClassifier
from flaxheads.tokenizer import longest_input

AGGREGATION_STRATEGIES = ("none", "simple", "first", "average", "max")
"""What `aggregation_strategy` may name (transformers' `AggregationStrategy` values)."""
WORD_STRATEGIES = ("first", "average", "max")
"""The strategies that decide per word: they need a fast tokenizer's offsets."""
DEFAULT_IGNORE_LABELS = ("O",)


def token_classification_pipeline(model: TokenClassifier | str | os.PathLike | None = None, tokenizer: Any = None,
                                  *, aggregation_strategy: str = "none", ignore_labels: Sequence[str] | None = None,
                                  stride: int | None = None, batch_size: int = 64,
                                  pad_to_multiple_of: int = PAD_TO_MULTIPLE_OF) -> TokenClassificationPipeline:
    """A token classifier answering as `transformers.pipeline("token-classification", model=...,
    tokenizer=..., aggregation_strategy=..., ignore_labels=..., stride=...)`: what
    `flaxheads.pipeline("token-classification", ...)` builds.

    `model`: a `TokenClassifier`, or the folder of a trained one (refused, UntrainedModel, when
    its token head was never trained: a bare model's head would be new). `tokenizer`: a
    transformers tokenizer or its folder; optional with a model folder that holds the model's
    tokenizer, required with an in-memory model. `aggregation_strategy`: one of
    `AGGREGATION_STRATEGIES` (the word strategies need a fast tokenizer); `ignore_labels`: labels
    left out of the answers (None: "O"); `stride`: read texts longer than the model's input in
    windows overlapping by this many tokens (not with "none"). Windows are
    `batch_size` to a forward pass, padded to multiples of `pad_to_multiple_of` tokens (0: powers
    of two). Each may be changed per call (`__call__`).

    Raises ValueError for a missing or foreign tokenizer, a folder without a tokenizer or a
    trained token head (UntrainedModel), a model of another task (naming the pipeline task that
    reads it), and settings transformers refuses.
    """
    model, tokenizer, source = pipeline_model(model, tokenizer, TokenClassifier)
    return TokenClassificationPipeline(model, tokenizer, aggregation_strategy=aggregation_strategy,
                                       ignore_labels=ignore_labels, stride=stride, batch_size=batch_size,
                                       source=source, pad_to_multiple_of=pad_to_multiple_of)


@dataclasses.dataclass(frozen=True)
class Settings:
    """How a call reads its texts and answers."""

    aggregation_strategy: str
    ignore_labels: tuple[str, ...]
    stride: int | None


class TokenClassificationPipeline:
    """Finds the entities of texts with an in-memory model and tokenizer; see
    `token_classification_pipeline` and `__call__`."""

    def __init__(self, model: TokenClassifier, tokenizer, *, aggregation_strategy: str = "none",
                 ignore_labels: Sequence[str] | None = None, stride: int | None = None, batch_size: int = 64,
                 source: str = "the model", pad_to_multiple_of: int = PAD_TO_MULTIPLE_OF):
        self.model, self.source = model, source
        self.scorer = TokenScorer(model, tokenizer, max_seq_length=longest_input(model.config.backbone, tokenizer),
                                  batch_size=batch_size, source=source, pad_to_multiple_of=pad_to_multiple_of)
        self.tokenizer = self.scorer.tokenizer
        self.max_length = self.scorer.max_seq_length
        """The most tokens (special ones included) the model reads at once; None: no limit."""
        # transformers' test for a tokenizer whose tokens tell a word's start from its continuation.
        backend = getattr(self.tokenizer, "_tokenizer", None)
        self.word_aware = bool(backend and getattr(backend.model, "continuing_subword_prefix", None))
        self.settings = self._settings(aggregation_strategy, ignore_labels, stride)

    def __call__(self, inputs, *, aggregation_strategy: str | None = None, ignore_labels: Sequence[str] | None = None,
                 stride: int | None = None, is_split_into_words: bool = False, delimiter: str | None = None):
        """The entities of one text (a str: a list of dicts) or of several (a list of str: a list
        of lists), as transformers gives them:

        - "none": per token not ignored, {"entity", "score", "index", "word", "start", "end"}
          (`index`: the token's position, special tokens counted; `word`: the token).
        - otherwise, per group of tokens, {"entity_group", "score", "word", "start", "end"}
          (`score`: the mean of the group's; `word`: its tokens as a string).

        `start`/`end` are character offsets into the text (None with a slow tokenizer). The
        pipeline's `aggregation_strategy`, `ignore_labels` and `stride` hold unless given here.
        With `is_split_into_words`, `inputs` is a sentence as a list of words (or a list of such
        sentences; either way the answer is a list of lists, as transformers'), joined by
        `delimiter` (default " ") for the offsets and the words' text.

        Raises ValueError for no input, a text longer than the model reads at once without a
        `stride` (naming it), a text that gives no tokens, and settings transformers refuses;
        FloatingPointError for non-finite scores.
        """
        settings = self._settings(
            self.settings.aggregation_strategy if aggregation_strategy is None else aggregation_strategy,
            self.settings.ignore_labels if ignore_labels is None else ignore_labels,
            self.settings.stride if stride is None else stride,
        )
        sentences, single = _sentences(inputs, is_split_into_words)
        if is_split_into_words and not self.tokenizer.is_fast:
            raise ValueError("is_split_into_words=True is only supported with fast tokenizers.")
        texts = [_joined(s, " " if delimiter is None else delimiter) if is_split_into_words else (s, None)
                 for s in sentences]
        windows = self._windows(sentences, [text for text, _ in texts], settings.stride, is_split_into_words)
        flat = [window for text_windows in windows for window in text_windows]
        names = [name for name in ("input_ids", "attention_mask", "token_type_ids") if name in flat[0]]
        logits = iter(self.scorer.logits({name: [window[name] for window in flat] for name in names}))
        answers = []
        for (text, word_spans), text_windows in zip(texts, windows):
            answers.append(self._entities(text, word_spans, [(w, next(logits)) for w in text_windows], settings))
        return answers[0] if single else answers

    # -----------------------------------------------------------------------------------------
    # Settings and tokenisation

    def _settings(self, aggregation_strategy, ignore_labels, stride) -> Settings:
        """The settings of a call, refused as transformers refuses them (its messages)."""
        strategy = _strategy_name(aggregation_strategy)
        if strategy in WORD_STRATEGIES and not self.tokenizer.is_fast:
            raise ValueError('Slow tokenizers cannot handle subwords. Please set the `aggregation_strategy` option to '
                             '`"simple"` or use a fast tokenizer.')
        if stride is not None:
            if strategy == "none":
                raise ValueError('`stride` was provided to process all the text but `aggregation_strategy="none"`, '
                                 "please select another one instead.")
            if not self.tokenizer.is_fast:
                raise ValueError("`stride` was provided to process all the text but you're using a slow tokenizer. "
                                 "Please use a fast tokenizer.")
            room = None if self.max_length is None else (
                self.max_length - self.tokenizer.num_special_tokens_to_add(pair=False))
            if not isinstance(stride, (int, np.integer)) or stride < 0 or (room is not None and stride >= room):
                raise ValueError(f"stride={stride!r}: windows overlap by `stride` tokens, at least 0 and below the "
                                 f"{room} text tokens a window of {self.max_length} holds after the special tokens")
            stride = int(stride)
        if isinstance(ignore_labels, str):
            raise ValueError(f"ignore_labels={ignore_labels!r}: give a list of labels, e.g. [{ignore_labels!r}]")
        ignore = DEFAULT_IGNORE_LABELS if ignore_labels is None else tuple(ignore_labels)
        return Settings(strategy, ignore, stride)

    def _windows(self, sentences: list, texts: list[str], stride: int | None, split_into_words: bool) -> list[list[dict]]:
        """Per text, its windows: each the tokenizer's columns for one forward pass, with
        `special_tokens_mask`, `offset_mapping` (None for a slow tokenizer) and `word_ids` (words
        given). One window per text unless `stride` is given; a longer text is refused."""
        fast = self.tokenizer.is_fast
        cut = fast and self.max_length is not None
        encoded = self.tokenizer(
            sentences, is_split_into_words=split_into_words, truncation=cut, max_length=self.max_length if cut else None,
            stride=stride or 0, return_overflowing_tokens=cut, return_special_tokens_mask=True,
            return_offsets_mapping=fast,
        )
        text_of_row = encoded["overflow_to_sample_mapping"] if cut else range(len(texts))
        windows: list[list[dict]] = [[] for _ in texts]
        for row, text in enumerate(text_of_row):
            window = {name: encoded[name][row] for name in encoded if name != "overflow_to_sample_mapping"}
            window.setdefault("offset_mapping", None)
            window["word_ids"] = encoded.word_ids(row) if split_into_words else None
            windows[text].append(window)
        for text, text_windows in enumerate(windows):
            length = len(text_windows[0]["input_ids"])
            # Cut by the tokenizer, a longer text has several windows; uncut (a slow tokenizer), one too long.
            several = len(text_windows) > 1 if cut else self.max_length is not None and length > self.max_length
            if several and stride is None:
                raise ValueError(self._too_long(text, texts[text]))
            if length == 0:
                raise ValueError(f"text {text} ({texts[text]!r}) gives no tokens at all, so the model would have "
                                 "nothing to read (transformers fails on it too); remove it, or give it text")
        return windows

    def _too_long(self, index: int, text: str) -> str:
        fix = (f"pass stride= (how many tokens the windows overlap by, e.g. {max(1, self.max_length // 4)}) with "
               f"aggregation_strategy 'simple', 'first', 'average' or 'max' to read it whole in overlapping windows, "
               "as transformers' stride= does" if self.tokenizer.is_fast else
               "load the model's fast tokenizer and pass stride= to read it whole in overlapping windows")
        return (f"text {index} ({text[:40]!r}{'...' if len(text) > 40 else ''}) is longer than the {self.max_length} "
                f"tokens {self.source} reads at once, and transformers' pipeline would cut it off there without a "
                f"word: {fix}, or shorten it")

    # -----------------------------------------------------------------------------------------
    # From logits to entities (transformers' postprocess)

    def _entities(self, text: str, word_spans, windows: list[tuple[dict, np.ndarray]],
                  settings: Settings) -> list[dict[str, Any]]:
        strategy, entities = settings.aggregation_strategy, []
        for window, logits in windows:
            pre = self._pre_entities(text, window, _softmax(logits), strategy, word_spans)
            entities += [entity for entity in self._aggregate(pre, strategy)
                         if entity.get("entity") not in settings.ignore_labels
                         and entity.get("entity_group") not in settings.ignore_labels]
        if len(windows) > 1:
            entities = _without_overlaps(entities)
        return [{key: float(value) if key == "score" else value for key, value in entity.items()}
                for entity in entities]

    def _pre_entities(self, text: str, window: dict, scores: np.ndarray, strategy: str, word_spans) -> list[dict]:
        """transformers' `gather_pre_entities`: per token that is not special, its token, scores,
        character span, position and whether it continues the word before it."""
        offsets, ids = window["offset_mapping"], window["input_ids"]
        if strategy in WORD_STRATEGIES and offsets is not None and not self.word_aware:
            warnings.warn("Tokenizer does not support real words, using fallback heuristic", UserWarning)
        pre = []
        for index, token_scores in enumerate(scores):
            if window["special_tokens_mask"][index]:
                continue
            word = self.tokenizer.convert_ids_to_tokens(int(ids[index]))
            start = end = None
            is_subword = False
            if offsets is not None:
                start, end = (int(x) for x in offsets[index])
                if word_spans is not None and window["word_ids"][index] is not None:
                    # Words given apart: their offsets count from the word's own start.
                    shift = word_spans[window["word_ids"][index]][0]
                    start, end = start + shift, end + shift
                word_text = text[start:end]
                if self.word_aware:
                    is_subword = len(word) != len(word_text)
                else:
                    is_subword = start > 0 and " " not in text[start - 1:start + 1]
                if int(ids[index]) == self.tokenizer.unk_token_id:
                    word, is_subword = word_text, False
            pre.append({"word": word, "scores": token_scores, "start": start, "end": end, "index": index,
                        "is_subword": is_subword})
        return pre

    def _aggregate(self, pre: list[dict], strategy: str) -> list[dict]:
        """transformers' `aggregate`: per token ("none", "simple") or per word, then grouped."""
        if strategy in ("none", "simple"):
            entities = []
            for token in pre:
                best = token["scores"].argmax()
                entities.append({"entity": self._label(best), "score": token["scores"][best], "index": token["index"],
                                 "word": token["word"], "start": token["start"], "end": token["end"]})
        else:
            entities = [self._word_entity(tokens, strategy) for tokens in _words(pre)]
        return entities if strategy == "none" else self._groups(entities)

    def _word_entity(self, tokens: list[dict], strategy: str) -> dict:
        """transformers' `aggregate_word`: one label and score for a word's tokens."""
        if strategy == "first":
            scores = tokens[0]["scores"]
        elif strategy == "max":
            scores = max(tokens, key=lambda token: token["scores"].max())["scores"]
        else:  # "average"
            scores = np.nanmean(np.stack([token["scores"] for token in tokens]), axis=0)
        best = scores.argmax()
        return {"entity": self._label(best), "score": scores[best],
                "word": self.tokenizer.convert_tokens_to_string([token["word"] for token in tokens]),
                "start": tokens[0]["start"], "end": tokens[-1]["end"]}

    def _groups(self, entities: list[dict]) -> list[dict]:
        """transformers' `group_entities`: runs of tokens (or words) naming the same entity, a
        B- label starting a new one."""
        groups, run = [], []
        for entity in entities:
            if run:
                bi, tag = _tag(entity["entity"])
                if not (tag == _tag(run[-1]["entity"])[1] and bi != "B"):
                    groups.append(self._group(run))
                    run = []
            run.append(entity)
        if run:
            groups.append(self._group(run))
        return groups

    def _group(self, run: list[dict]) -> dict:
        """transformers' `group_sub_entities`: the first label's entity name, the mean score."""
        return {"entity_group": run[0]["entity"].split("-", 1)[-1],
                "score": np.mean(np.nanmean([entity["score"] for entity in run])),
                "word": self.tokenizer.convert_tokens_to_string([entity["word"] for entity in run]),
                "start": run[0]["start"], "end": run[-1]["end"]}

    def _label(self, class_id) -> str:
        return self.model.config.label_names[int(class_id)]


def _strategy_name(strategy) -> str:
    """"none", "simple", ... from a name in any case, or transformers' `AggregationStrategy`."""
    name = str(getattr(strategy, "value", strategy)).lower()
    if name not in AGGREGATION_STRATEGIES:
        raise ValueError(f"aggregation_strategy={strategy!r}: choose one of {AGGREGATION_STRATEGIES}")
    return name


def _sentences(inputs, split_into_words: bool) -> tuple[list, bool]:
    """(the texts, or sentences of words, whether `inputs` was a single one), read as
    transformers reads them: a str or a list of str; with `split_into_words` a list of words
    or a list of such lists. A tuple is refused, as transformers refuses it."""
    if isinstance(inputs, tuple):
        raise ValueError("the pipeline does not read a tuple: give several texts (or sentences of words) as a list, "
                         "as transformers' pipeline does")
    if split_into_words:
        if isinstance(inputs, list) and inputs and all(isinstance(word, str) for word in inputs):
            return [inputs], False  # one sentence, answered as a list of one, as transformers answers it
        if isinstance(inputs, list) and inputs and all(
                isinstance(words, list) and words and all(isinstance(word, str) for word in words) for words in inputs):
            return inputs, False
        raise ValueError("When `is_split_into_words=True`, `sentence` must be a list of tokens (words, str), or "
                         "`inputs` a list of such lists.")
    if isinstance(inputs, str):
        return [inputs], True
    if isinstance(inputs, list) and inputs:
        if not all(isinstance(text, str) for text in inputs):
            raise ValueError("When `is_split_into_words=False`, `sentence` must be an untokenized string.")
        return inputs, False
    raise ValueError("At least one input is required.")


def _joined(words: list[str], delimiter: str) -> tuple[str, list[tuple[int, int]]]:
    """(the words joined by `delimiter`, each word's character span in it)."""
    spans, position = [], 0
    for word in words:
        spans.append((position, position + len(word)))
        position += len(word) + len(delimiter)
    return delimiter.join(words), spans


def _softmax(logits: np.ndarray) -> np.ndarray:
    """Per token, the softmax of float32 logits, computed as transformers' pipeline computes it."""
    shifted = np.exp(logits - np.max(logits, axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)


def _words(pre: list[dict]) -> list[list[dict]]:
    """transformers' `aggregate_words` grouping: a word is a token and the subwords after it."""
    words = []
    for token in pre:
        if words and token["is_subword"]:
            words[-1].append(token)
        else:
            words.append([token])
    return words


def _tag(label: str) -> tuple[str, str]:
    """("B" or "I", entity name) of a label: B-X and I-X name X; any other label is an I- of itself."""
    if label.startswith(("B-", "I-")):
        return label[0], label[2:]
    return "I", label


def _without_overlaps(entities: list[dict]) -> list[dict]:
    """transformers' `aggregate_overlapping_entities`: of entities from overlapping windows that
    start inside another, the longer one stays (the more confident on equal lengths)."""
    if not entities:
        return entities
    entities = sorted(entities, key=lambda entity: entity["start"])
    kept, previous = [], entities[0]
    for entity in entities:
        if previous["start"] <= entity["start"] < previous["end"]:
            length, previous_length = entity["end"] - entity["start"], previous["end"] - previous["start"]
            if length > previous_length or length == previous_length and entity["score"] > previous["score"]:
                previous = entity
        else:
            kept.append(previous)
            previous = entity
    kept.append(previous)
    return kept


__all__ = [
    "AGGREGATION_STRATEGIES",
    "DEFAULT_IGNORE_LABELS",
    "Settings",
    "TokenClassificationPipeline",
    "WORD_STRATEGIES",
    "token_classification_pipeline",
]
