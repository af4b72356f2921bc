"""The models a server answers with: each folder opened once as `flaxheads predict` opens it, its
task's pipeline built over it (`flaxheads.pipeline`, so a served answer is the pipeline's), its
requests read into `Work` (the items one batch may join), and every shape its batches can take
compiled before the server says it is ready (`warm`).

A batch is one call of the pipeline on the items of several requests that share their options
(`Work.key`); each item's answer does not depend on its batch mates (padding is masked), so the
answer a client gets equals `flaxheads.pipeline(...)(its inputs)`.
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any, Callable, NamedTuple

from flaxheads import problem, tasks
from flaxheads.data.batching import HALF_OCTAVES, bucket_lengths
from flaxheads.inference import forward_devices, open_model_folder
from flaxheads.serving import requests as req
from flaxheads.tasks.qa.pipeline import DEFAULT_MAX_ANSWER_LEN
from flaxheads.serving.requests import ClientError
from flaxheads.tasks.classification.inference import TextScorer

SMALLEST_LENGTH = 16
"""The shortest padded length of a text batch (`data.batching.SMALLEST_BUCKET`)."""
AGGREGATION_STRATEGIES = ("none", "simple", "first", "average", "max")


class Work(NamedTuple):
    """What one request asks of its model's queue."""

    key: tuple
    """What the requests of one batch share (the pipeline's options)."""
    items: list
    """One entry per input; the pipeline is called on the items of a whole batch."""
    tokens: int
    """Padded tokens the items take: what counts against --max_batch_tokens."""
    finish: Callable[[list], Any]
    """The items' answers -> the JSON answer of the request."""


class ServedModel:
    """A model folder opened to serve: `name` (its routes' `model`), its `task`, its pipeline, the
    longest input it reads at once (`max_input_length`) and the rows of a forward pass
    (`batch_size`, a power of two: `max_batch_tokens` // `max_input_length`)."""

    routes: tuple[str, ...] = ("tokenize",)
    options: tuple[str, ...] = ()
    """The keyword options of `open_served` this class takes (`packing`); other classes ignore them."""
    padding: int = 0
    """How the pipeline rounds a batch's padded length (its `pad_to_multiple_of`; 0: powers of two)."""

    @classmethod
    def pipeline_options(cls, max_input_length: int | None) -> dict[str, Any]:
        """What the task's pipeline is built with: padded as `padding` says, inputs cut at
        `max_input_length` tokens (None: the model's limit)."""
        return {"pad_to_multiple_of": cls.padding, "max_seq_length": max_input_length}

    def __init__(self, name: str, folder, pipe, *, max_input_length: int, max_batch_tokens: int):
        self.name, self.folder, self.pipe = name, folder, pipe
        self.max_input_length = max_input_length
        self.batch_size = batch_size_for(max_batch_tokens, max_input_length)
        # Requests are read (and their tokens counted) on the server's event loop while the
        # worker thread tokenises with the pipeline's tokenizer: a Rust tokenizer whose
        # truncation is being set cannot be shared between threads.
        self.counting_tokenizer = copy.deepcopy(pipe.tokenizer)

    @property
    def task(self) -> str:
        raise NotImplementedError

    @staticmethod
    def longest_input(pipe) -> int | None:
        """The most tokens `pipe` reads at once (None: no limit)."""
        return pipe.scorer.max_seq_length

    def info(self) -> dict[str, Any]:
        return {"model_id": self.name, "model_path": str(self.folder), "task": self.task,
                "max_input_length": self.max_input_length, "batch_size": self.batch_size,
                "devices": [str(device) for device in forward_devices()],
                "routes": ["/" + route for route in self.routes]}

    def work(self, route: str, body: dict[str, Any], max_items: int) -> Work:
        raise NotImplementedError

    def run(self, key: tuple, items: list) -> list:
        """The answers of `items` (one per item), from one call of the pipeline (the worker's thread)."""
        raise NotImplementedError

    def warm_work(self) -> list[tuple[tuple, list]]:
        """(key, items) per call that reaches one shape a batch can take: lengths up to
        `max_input_length`, rows a power of two up to `batch_size`."""
        raise NotImplementedError

    def warm(self) -> int:
        """Compiles every shape a batch can take (with jax's persistent compilation cache on, a
        restart reads them back); returns how many calls that took."""
        calls = self.warm_work()
        for key, items in calls:
            self.run(key, items)
        return len(calls)

    def tokenize(self, body: dict[str, Any], max_items: int) -> Any:
        """POST /tokenize: per text its tokens {"id", "text", "special", "start", "stop"} (as
        text-embeddings-inference answers: a list per text, even for one)."""
        req.check_fields(body, ("inputs", "add_special_tokens", "model"))
        texts, _ = req.texts(body.get("inputs"), "inputs", max_items)
        special = req.flag(body, "add_special_tokens", True)
        tokenizer = self.counting_tokenizer
        fast = getattr(tokenizer, "is_fast", False)
        encoded = tokenizer(texts, add_special_tokens=special, return_offsets_mapping=fast)
        special_ids = set(tokenizer.all_special_ids)
        answers = []
        for i, (text, ids) in enumerate(zip(texts, encoded["input_ids"])):
            offsets = encoded["offset_mapping"][i] if fast else [None] * len(ids)
            tokens = tokenizer.convert_ids_to_tokens(ids)
            answers.append([
                {"id": token_id, "text": token if token_id in special_ids or span is None else text[span[0]:span[1]],
                 "special": token_id in special_ids, "start": None if span is None else span[0],
                 "stop": None if span is None else span[1]}
                for token_id, token, span in zip(ids, tokens, offsets)])
        return answers

    def _lengths(self, texts: list[str], pairs: list[str | None] | None = None, tokenizer=None) -> list[int]:
        """Tokens of each input, special tokens included, uncut (by `tokenizer`, else the counting
        tokenizer: each thread its own)."""
        tokenizer = tokenizer or self.counting_tokenizer
        if pairs is None or all(pair is None for pair in pairs):
            return [len(ids) for ids in tokenizer(texts, verbose=False)["input_ids"]]
        return [len(tokenizer(text, pair, verbose=False)["input_ids"]) for text, pair in zip(texts, pairs)]

    def _in_passes(self, lengths: list[int], call: Callable[[list[int]], list]) -> list:
        """The answers of inputs of `lengths` tokens, in their order: `call(group)` answers a
        group of their indices, one forward pass; the groups are cut shortest first by
        `forward_groups` (a pass pads every row to its longest input)."""
        order = sorted(range(len(lengths)), key=lengths.__getitem__)
        answers: list = [None] * len(lengths)
        start = 0
        for size in forward_groups([lengths[i] for i in order], self._padded, self.batch_size):
            group = order[start:start + size]
            start += size
            for i, answer in zip(group, call(group)):
                answers[i] = answer
        return answers

    def _padded(self, length: int) -> int:
        """The padded length of an input of `length` tokens (as the pipeline pads: `padding`)."""
        return next(b for b in bucket_lengths(self.max_input_length, self.padding, SMALLEST_LENGTH)
                    if b >= min(length, self.max_input_length))

    def _filler(self, tokens: int) -> str:
        """A text of `tokens` tokens (special ones not counted): one word that is a token of its
        own, repeated."""
        for word in ("a", "the", "x", "an", "is", "1"):
            if len(self.counting_tokenizer(" ".join([word] * 3), add_special_tokens=False)["input_ids"]) == 3:
                return " ".join([word] * max(1, tokens))
        raise ValueError(f"the tokenizer of {self.folder} reads none of 'a', 'the', 'x', 'an', 'is', '1' as one "
                         "token a word, so the server cannot build inputs of each length to compile ahead")

    def _warm_shapes(self) -> list[tuple[int, int]]:
        """(padded length, rows) of every batch a text pipeline here can run."""
        rows = [1 << i for i in range(self.batch_size.bit_length())]
        return [(length, r) for length in bucket_lengths(self.max_input_length, self.padding, SMALLEST_LENGTH)
                for r in rows]


FORWARD_COST_TOKENS = 32
"""What one more forward pass costs beyond its padded tokens (the pipeline's call, the launch),
counted in padded tokens: about what a MiniLM forward of one row of 32 tokens costs over the
same row inside a larger batch on a 2-core CPU (measured: 34 ms alone, 20 ms a row of 16)."""


def forward_groups(lengths: list[int], padded: Callable[[int], int], max_rows: int,
                   cost: int = FORWARD_COST_TOKENS) -> list[int]:
    """Sizes of the consecutive groups to cut `lengths` (tokens per input, shortest first) into,
    one forward pass each, so that the padded tokens (rows rounded up to a power of two, each
    row `padded(longest of the group)` long) plus `cost` per pass are fewest; no group has more
    than `max_rows` inputs. A batch of one call pads every row to its longest input: a batch of
    short texts and one long one pays the long one's length on every row; cut, it does not."""
    best, cut = [0] + [None] * len(lengths), [0] * (len(lengths) + 1)
    for end in range(1, len(lengths) + 1):
        width = padded(lengths[end - 1])
        for start in range(max(0, end - max_rows), end):
            total = best[start] + (1 << (end - start - 1).bit_length()) * width + cost
            if best[end] is None or total < best[end]:
                best[end], cut[end] = total, start
    sizes, end = [], len(lengths)
    while end:
        sizes.append(end - cut[end])
        end = cut[end]
    return sizes[::-1]


def batch_size_for(max_batch_tokens: int, max_input_length: int) -> int:
    """Rows of a forward pass: as many inputs of `max_input_length` tokens as `max_batch_tokens`
    holds, rounded down to a power of two (at least 1)."""
    rows = max(1, max_batch_tokens // max_input_length)
    return 1 << (rows.bit_length() - 1)


PACKED_ROW_LENGTH = 64
"""Tokens of a packed row of a served classifier (`ClassifierModel`): inputs up to this long are
packed several to a row; longer ones are padded alone. On the load test's movie snippets (27
tokens) rows of 64 cost 4-6% less CPU a padded token than rows of 128 (attention runs over
the whole row) and pad less (28.7 tokens a text against 30.7), and hold every snippet (the
longest has 58 tokens)."""
EXACT_ROW_COUNTS = 16
"""A packed pass has any number of rows up to this many; above it, powers of two and the midpoints
between them (`packed_row_counts`)."""


def packed_row_counts(max_rows: int) -> tuple[int, ...]:
    """The rows a packed pass of a served classifier may have: every count up to EXACT_ROW_COUNTS
    (a batch of 16 snippets fills 7 rows of 64: padded to 8 it would pay a row for nothing), then
    two an octave up to `max_rows` (24, 32, 48, ...)."""
    exact = tuple(range(1, min(EXACT_ROW_COUNTS, max_rows) + 1))
    return exact + tuple(count for count in bucket_lengths(max_rows, HALF_OCTAVES, EXACT_ROW_COUNTS)
                         if count > exact[-1])


class ClassifierModel(ServedModel):
    """A text classifier: /predict (every problem type; multi-label with `apply_thresholds`),
    /rerank and /reward for a model of one score per text (a cross-encoder, a regressor, a
    pairwise reward model).

    With `packing` (the default), the inputs of a batch up to PACKED_ROW_LENGTH tokens are scored
    packed several to a row (`TextScorer(packing=True)`: each attends to itself only, its
    positions restart), through the same pipeline's answers; longer ones are padded as before.
    Each input's logits equal its logits alone to float32 rounding (test_serve checks the answers
    against the unpacked pipeline's to 1e-6), for fewer padded tokens (docs/benchmarks.md)."""

    task = "text-classification"
    options = ("packing",)
    padding = HALF_OCTAVES  # two shapes an octave: a third less padding than powers of two (data.batching)

    def __init__(self, name: str, folder, pipe, *, max_input_length: int, max_batch_tokens: int, packing: bool = True):
        super().__init__(name, folder, pipe, max_input_length=max_input_length, max_batch_tokens=max_batch_tokens)
        config = self.pipe.model.config
        self.labels = config.label_names
        self.text_pair = bool(config.text_pair)
        self.problem_type = problem.resolved_problem_type(config.problem_type, config.num_labels)
        self.routes = ("predict", "tokenize") + (("rerank", "reward") if config.num_labels == 1 else ())
        self.packed_length = min(PACKED_ROW_LENGTH, self.max_input_length) if packing else 0
        self.packed_pipe = None
        if packing:
            # The same pipeline (its answers' shapes, functions and thresholds), scoring in packed rows.
            self.packed_pipe = copy.copy(self.pipe)
            rows = batch_size_for(max_batch_tokens, self.packed_length)
            self.packed_pipe.scorer = TextScorer(self.pipe.model, self.pipe.tokenizer,
                                                 max_seq_length=self.packed_length, batch_size=rows,
                                                 source=self.pipe.scorer.source, packing=True,
                                                 row_counts=packed_row_counts(rows))

    def info(self) -> dict[str, Any]:
        kind = "reranker" if "rerank" in self.routes else "classifier"
        return {**super().info(), "problem_type": self.problem_type, "text_pair": self.text_pair,
                "packed_row_length": self.packed_length or None,
                "model_type": {kind: {"id2label": dict(enumerate(self.labels)),
                                      "label2id": {label: i for i, label in enumerate(self.labels)}}}}

    def work(self, route: str, body: dict[str, Any], max_items: int) -> Work:
        if route == "predict":
            return self._predict(body, max_items)
        if route == "rerank":
            return self._rerank(body, max_items)
        return self._reward(body, max_items)

    def _predict(self, body, max_items) -> Work:
        req.check_fields(body, ("inputs", "raw_scores", "truncate", "apply_thresholds", "model"))
        items, single = req.sequences(body.get("inputs"), max_items)
        raw, truncate = req.flag(body, "raw_scores"), req.flag(body, "truncate")
        thresholds = req.flag(body, "apply_thresholds")
        if thresholds and (raw or self.problem_type != problem.MULTI_LABEL):
            raise ClientError(422, "`apply_thresholds` decides a multi-label model's labels on its sigmoid scores: "
                                   f"leave it out for this {self.problem_type} model, and with raw_scores")
        tokens = self._checked(items, truncate, "inputs", single)
        key = ("thresholds" if thresholds else "none" if raw else "default",)
        return Work(key, items, tokens, lambda answers: answers[0] if single else answers)

    def _rerank(self, body, max_items) -> Work:
        req.check_fields(body, ("query", "texts", "raw_scores", "return_text", "truncate", "model"))
        query = req.text(body.get("query"), "query")
        texts, _ = req.texts(body.get("texts"), "texts", max_items)
        if isinstance(body.get("texts"), str):
            raise ClientError(422, "`texts` must be a list of strings (the texts to rank against the query)")
        raw, truncate, return_text = (req.flag(body, name) for name in ("raw_scores", "truncate", "return_text"))
        items = [(query, text) for text in texts]
        tokens = self._checked(items, truncate, "texts", False, index_of=lambda i: f"texts[{i}]")

        def finish(answers):
            ranks = [{"index": i, "score": answer[0]["score"], **({"text": texts[i]} if return_text else {})}
                     for i, answer in enumerate(answers)]
            return sorted(ranks, key=lambda rank: rank["score"], reverse=True)

        return Work(("none" if raw else "sigmoid",), items, tokens, finish)

    def _reward(self, body, max_items) -> Work:
        req.check_fields(body, ("inputs", "truncate", "model"))
        items, single = req.sequences(body.get("inputs"), max_items)
        tokens = self._checked(items, req.flag(body, "truncate"), "inputs", single)

        def finish(answers):
            scores = [{"score": answer[0]["score"]} for answer in answers]
            return scores[0] if single else scores

        return Work(("none",), items, tokens, finish)

    def _checked(self, items, truncate: bool, field: str, single: bool, index_of=None) -> int:
        """The padded tokens of `items`; ClientError for a lone text to a model trained on pairs,
        and for an input longer than the model reads without `truncate`."""
        if self.text_pair and any(pair is None for _, pair in items):
            raise ClientError(422, f"{self.name} was trained on text pairs: send each input as [text, text_pair] "
                                   "(a lone text would be scored as something the model never saw)")
        lengths = self._lengths([text for text, _ in items], [pair for _, pair in items])
        if not truncate:
            for i, length in enumerate(lengths):
                if length > self.max_input_length:
                    where = field if single else index_of(i) if index_of else f"{field}[{i}]"
                    raise ClientError(413, f"`{where}` has {length} tokens, more than the {self.max_input_length} "
                                           f"{self.name} reads: send \"truncate\": true to cut it, or shorten it")
        return sum(self._padded(length) for length in lengths)

    def run(self, key: tuple, items: list) -> list:
        (scores,) = key
        answers: list = [None] * len(items)
        for paired in (False, True):  # the pipeline reads a list of texts, or a list of pairs
            chosen = [i for i, (_, pair) in enumerate(items) if (pair is not None) == paired]
            if not chosen:
                continue
            # Counted with the pipeline's own tokenizer: this is the worker's thread, and the
            # counting tokenizer belongs to the event loop's.
            lengths = self._lengths([items[i][0] for i in chosen], [items[i][1] for i in chosen] if paired else None,
                                    self.pipe.tokenizer)
            # An input cut (`truncate`) to max_input_length is as long as it is cut.
            lengths = [min(length, self.max_input_length) for length in lengths]
            packed = [chosen[k] for k in range(len(chosen)) if lengths[k] <= self.packed_length]
            if packed:  # one call: the scorer packs them into rows of packed_length
                for i, answer in zip(packed, self._call_pipe(scores, [items[i] for i in packed], self.packed_pipe)):
                    answers[i] = answer
            long = [k for k in range(len(chosen)) if lengths[k] > self.packed_length]
            found = self._in_passes([lengths[k] for k in long], lambda group: self._call_pipe(
                scores, [items[chosen[long[g]]] for g in group], self.pipe))
            for k, answer in zip(long, found):
                answers[chosen[k]] = answer
        return answers

    @staticmethod
    def _call_pipe(scores: str, items: list, pipe) -> list:
        inputs = [text if pair is None else {"text": text, "text_pair": pair} for text, pair in items]
        if scores == "thresholds":
            return pipe(inputs, apply_thresholds=True)
        return pipe(inputs, top_k=None, function_to_apply=None if scores == "default" else scores)

    def warm_work(self) -> list[tuple[tuple, list]]:
        """Unpacked: every (length, rows) of inputs longer than packed_length; packed: rows of
        each of `packed_row_counts`, one input filling each row."""
        shapes = [(length, rows) for length, rows in self._warm_shapes() if length > self.packed_length]
        if self.packed_length:
            shapes += [(self.packed_length, rows) for rows in self.packed_pipe.scorer.row_counts]
        return [(("default",), [self._warm_item(length)] * rows) for length, rows in shapes]

    def _warm_item(self, length: int) -> tuple[str, str | None]:
        """An input of `length` tokens, special ones included."""
        words = length - self.counting_tokenizer.num_special_tokens_to_add(pair=self.text_pair)
        if self.text_pair:
            return self._filler(words - words // 2), self._filler(words // 2)
        return self._filler(words), None


class TokenModel(ServedModel):
    """A token classifier: /token_classification, entities as
    `flaxheads.pipeline("token-classification")` answers them."""

    task = "token-classification"
    routes = ("token_classification", "tokenize")

    @staticmethod
    def pipeline_options(max_input_length: int | None) -> dict[str, Any]:
        return {"pad_to_multiple_of": 0}  # the pipeline reads up to the model's limit (longer: `stride`)

    @staticmethod
    def longest_input(pipe) -> int | None:
        return pipe.max_length

    def info(self) -> dict[str, Any]:
        labels = self.pipe.model.config.label_names
        return {**super().info(), "model_type": {"token_classifier": {"id2label": dict(enumerate(labels))}}}

    def work(self, route: str, body: dict[str, Any], max_items: int) -> Work:
        req.check_fields(body, ("inputs", "aggregation_strategy", "ignore_labels", "stride", "model"))
        texts, single = req.texts(body.get("inputs"), "inputs", max_items)
        strategy = req.choice(body, "aggregation_strategy", AGGREGATION_STRATEGIES, "none")
        ignore = body.get("ignore_labels", ["O"])
        if not isinstance(ignore, list) or not all(isinstance(label, str) for label in ignore):
            raise ClientError(422, f"`ignore_labels` must be a list of label names, e.g. [\"O\"], not {ignore!r}")
        stride = req.optional_int(body, "stride", minimum=0)
        if stride is not None:
            room = self.max_input_length - self.counting_tokenizer.num_special_tokens_to_add(pair=False)
            if strategy == "none" or stride >= room:
                raise ClientError(422, f"`stride` reads long texts in windows overlapping by that many tokens: it "
                                       f"needs an aggregation_strategy other than \"none\" and must be below {room}")
        lengths = self._lengths(texts)
        if stride is None:
            for i, length in enumerate(lengths):
                if length > self.max_input_length:
                    where = "inputs" if single else f"inputs[{i}]"
                    raise ClientError(413, f"`{where}` has {length} tokens, more than the {self.max_input_length} "
                                           f"{self.name} reads at once: send \"stride\": "
                                           f"{self.max_input_length // 4} (with an aggregation_strategy other than "
                                           "\"none\") to read it in overlapping windows, or shorten it")
        tokens = sum(self._padded(length) * -(-length // self.max_input_length) for length in lengths)
        return Work((strategy, tuple(ignore), stride), texts, tokens,
                    lambda answers: answers[0] if single else answers)

    def run(self, key: tuple, items: list) -> list:
        strategy, ignore, stride = key
        # Cut into passes of like length, as the classifier's batches (a text of several
        # windows counts as one of the model's longest input: the cut is a cost estimate).
        lengths = self._lengths(items, tokenizer=self.pipe.tokenizer)  # the worker's own tokenizer
        return self._in_passes(lengths, lambda group: self.pipe(
            [items[i] for i in group], aggregation_strategy=strategy, ignore_labels=list(ignore), stride=stride))

    def warm_work(self) -> list[tuple[tuple, list]]:
        special = self.counting_tokenizer.num_special_tokens_to_add(pair=False)
        return [(("none", ("O",), None), [self._filler(length - special)] * rows)
                for length, rows in self._warm_shapes()]


class QuestionAnsweringModel(ServedModel):
    """A question-answering model: /question_answering, answers as
    `flaxheads.pipeline("question-answering")` gives them (contexts longer than the model reads
    are read in windows, as the pipeline reads them)."""

    task = "question-answering"
    routes = ("question_answering", "tokenize")

    @staticmethod
    def pipeline_options(max_input_length: int | None) -> dict[str, Any]:
        return {"max_seq_len": max_input_length}  # its windows are padded to powers of two already

    @staticmethod
    def longest_input(pipe) -> int | None:
        return pipe.settings.for_tokenizer(pipe.tokenizer).max_seq_len

    def work(self, route: str, body: dict[str, Any], max_items: int) -> Work:
        options = ("top_k", "max_answer_len", "doc_stride", "handle_impossible_answer", "align_to_words")
        req.check_fields(body, ("inputs", *options, "model"))
        given = body.get("inputs")
        single = isinstance(given, dict)
        raw = req.items_of([given] if single else given, "inputs",
                         'an object {"question": ..., "context": ...} or a list of them', max_items)
        items = []
        for i, item in enumerate(raw):
            where = "inputs" if single else f"inputs[{i}]"
            if not isinstance(item, dict) or set(item) != {"question", "context"}:
                raise ClientError(422, f"`{where}` must be an object with exactly the fields \"question\" and "
                                       f"\"context\", not {item!r}"[:300])
            items.append((req.text(item["question"], f"{where}.question"),
                          req.text(item["context"], f"{where}.context")))
        top_k = req.optional_int(body, "top_k", minimum=1, default=1)
        max_answer_len = req.optional_int(body, "max_answer_len", minimum=1, default=DEFAULT_MAX_ANSWER_LEN)
        doc_stride = req.optional_int(body, "doc_stride", minimum=0)
        if doc_stride is not None and doc_stride >= self.max_input_length // 2:
            raise ClientError(422, f"`doc_stride` must be below {self.max_input_length // 2} (half of the "
                                   f"{self.max_input_length} tokens of a window), or left out")
        impossible, align = req.flag(body, "handle_impossible_answer"), req.flag(body, "align_to_words", True)
        lengths = self._lengths([q for q, _ in items], [c for _, c in items])
        tokens = sum(self._padded(length) * -(-length // self.max_input_length) for length in lengths)
        return Work((top_k, max_answer_len, doc_stride, impossible, align), items, tokens,
                    lambda answers: answers[0] if single else answers)

    def run(self, key: tuple, items: list) -> list:
        top_k, max_answer_len, doc_stride, impossible, align = key
        answers = self.pipe([{"question": q, "context": c} for q, c in items], top_k=top_k,
                            max_answer_len=max_answer_len, doc_stride=doc_stride,
                            handle_impossible_answer=impossible, align_to_words=align)
        return [answers] if len(items) == 1 else answers  # the pipeline answers one question alone

    def warm_work(self) -> list[tuple[tuple, list]]:
        special = self.counting_tokenizer.num_special_tokens_to_add(pair=True)
        shortest = special + 2  # a question and a context of one token each
        widths = sorted({min(1 << (length - 1).bit_length(), self.max_input_length)
                         for length in range(shortest, self.max_input_length + 1)})
        rows = [1 << i for i in range(self.batch_size.bit_length())]
        return [((1, DEFAULT_MAX_ANSWER_LEN, None, False, True), [("a", self._filler(width - special - 1))] * r)
                for width in widths for r in rows]


class ChoiceModel(ServedModel):
    """A multiple-choice model: /multiple_choice, per input the choice it picks and the
    probability of each, as `flaxheads.pipeline("multiple-choice")` (and `flaxheads predict`)
    answers them. Inputs may have different numbers of choices: each choice is a row of its own."""

    task = "multiple-choice"
    routes = ("multiple_choice", "tokenize")
    INPUT = 'an object {"context": ..., "choices": [...]} (and optionally "question") or a list of them'

    def work(self, route: str, body: dict[str, Any], max_items: int) -> Work:
        req.check_fields(body, ("inputs", "truncate", "model"))
        given = body.get("inputs")
        single = isinstance(given, dict)
        raw = req.items_of([given] if single else given, "inputs", self.INPUT, max_items)
        places = ["inputs"] if single else [f"inputs[{i}]" for i in range(len(raw))]
        items = [self._item(item, where, max_items) for item, where in zip(raw, places)]
        truncate = req.flag(body, "truncate")
        tokens = 0
        for where, (context, choices) in zip(places, items):
            for j, length in enumerate(self._lengths([context] * len(choices), list(choices))):
                if length > self.max_input_length and not truncate:
                    raise ClientError(413, f"`{where}.choices[{j}]` has {length} tokens with its context, more than "
                                           f"the {self.max_input_length} {self.name} reads: send \"truncate\": true "
                                           "to cut the longer of the two (as training cut them), or shorten it")
                tokens += self._padded(length)
        return Work(("default",), items, tokens, lambda answers: answers[0] if single else answers)

    def _item(self, item, where: str, max_items: int) -> tuple[str, tuple[str, ...]]:
        """(context, the second text of each choice) of one input, as the pipeline reads it."""
        if not isinstance(item, dict) or not {"context", "choices"} <= set(item) \
                or not set(item) <= {"context", "question", "choices"}:
            raise ClientError(422, f"`{where}` must be an object with the fields \"context\" and \"choices\" (and "
                                   f"optionally \"question\", the start every choice continues), not {item!r}"[:300])
        context = req.text(item["context"], f"{where}.context")
        choices = item["choices"]
        if not isinstance(choices, list) or len(choices) < 2:
            raise ClientError(422, f"`{where}.choices` must be a list of two texts or more (the choices to pick "
                                   f"from), not {json.dumps(choices)[:60]}")
        if len(choices) > max_items:
            raise ClientError(413, f"`{where}.choices` holds {len(choices)} choices, more than the {max_items} one "
                                   "input may hold (--max_client_batch_size): send fewer choices")
        choices = [req.text(choice, f"{where}.choices[{j}]") for j, choice in enumerate(choices)]
        if "question" in item:
            question = req.text(item["question"], f"{where}.question")
            choices = [f"{question} {choice}" for choice in choices]  # the pipeline's (run_swag.py's) second text
        return context, tuple(choices)

    def run(self, key: tuple, items: list) -> list:
        # The pipeline sorts every input's choices by length into passes of like length itself.
        return self.pipe([{"context": context, "choices": list(choices)} for context, choices in items])

    def warm_work(self) -> list[tuple[tuple, list]]:
        special = self.counting_tokenizer.num_special_tokens_to_add(pair=True)
        calls = []
        for length, rows in self._warm_shapes():
            if rows == 1 and self.batch_size > 1:
                continue  # an input has two choices or more: a pass has two rows or more (up to batch_size)
            words = length - special
            choices = (self._filler(words // 2),) * max(rows, 2)
            calls.append((("default",), [(self._filler(words - words // 2), choices)]))
        return calls


SERVED = {served.task: served for served in (ClassifierModel, TokenModel, QuestionAnsweringModel, ChoiceModel)}
"""The class that serves each task's models, by the task's name (a task without one is not served)."""


def open_served(path: str | os.PathLike, *, name: str | None = None, max_batch_tokens: int = 16384,
                max_input_length: int | None = None, packing: bool = True) -> ServedModel:
    """The model folder `path` opened to serve, its pipeline built (its weights loaded), not yet
    warmed. Refused as `flaxheads predict` refuses it: ValueError for a training run that has not
    exported (or one of its checkpoints), a folder without the model's tokenizer; UntrainedModel
    for a head never trained; ValueError for a model of a task the server does not serve.
    `max_input_length`: the most tokens an input may have (fewer shapes to compile; None: the
    model's limit; a token classifier reads up to its model's limit regardless). `packing`: a text
    classifier scores its short inputs packed several to a row (`ClassifierModel`; the answers are
    the same to float32 rounding; other tasks are not packed)."""
    folder = open_model_folder(path)  # read once, passed along
    kind = tasks.of_checkpoint(folder) or tasks.TASKS[tasks.DEFAULT]  # as predict: refused below as a classifier
    if kind.name not in SERVED:
        raise ValueError(f"{path} holds a {kind.name} model, which flaxheads serve does not answer yet; it serves "
                         f"{', '.join(SERVED)} models (flaxheads predict --model_name_or_path {path} answers it)")
    served_class = SERVED[kind.name]
    pipe = tasks.pipeline(kind.name, model=folder, **served_class.pipeline_options(max_input_length))
    longest = served_class.longest_input(pipe)
    if longest is None:
        raise ValueError(f"{path} holds a model whose positions set no longest input, and flaxheads serve compiles "
                         "every input length ahead: serve a model with a bounded input length")
    options = {option: value for option, value in {"packing": packing}.items() if option in served_class.options}
    served = served_class(name or Path(path).name, folder, pipe, max_input_length=longest,
                          max_batch_tokens=max_batch_tokens, **options)
    pipe_batch(pipe, served.batch_size)
    return served


def pipe_batch(pipe, batch_size: int) -> None:
    """Sets the rows of `pipe`'s forward passes to the server's `batch_size` (known once the
    longest input is)."""
    if hasattr(pipe, "scorer") and hasattr(pipe.scorer, "batch_size"):
        pipe.scorer.batch_size = batch_size
    if hasattr(pipe, "batch_size"):
        pipe.batch_size = batch_size
