"""`flaxheads.pipeline("multiple-choice", ...)`: a multiple-choice model (SWAG, RACE) answering per
example the choice it picks and the probability of each, as `flaxheads predict` answers a row of a
choice file. transformers has no multiple-choice pipeline; this one reads examples as its
`run_swag.py` does and answers in the words `predict` uses.

    mc = flaxheads.pipeline("multiple-choice", model="out")
    mc({"context": "She opened the door", "choices": ["and walked in.", "and ate the door."]})
    # {"label": 0, "choice": "and walked in.", "probabilities": [0.91, 0.09]}
    mc([{"context": ..., "question": "He", "choices": [...]}, ...])   # a list of answers

Each choice is read as the pair (context, choice), truncated longest first to `max_seq_length`
tokens, as training and `predict` read it; with a `question` (SWAG's `sent2`, the start every
choice continues) the second text is `f"{question} {choice}"`. A choice's score does not depend on
the other choices: each is its own sequence, so the choices of all examples are scored as rows of
one list, shortest first (rows of like length share a forward pass), and examples may have
different numbers of choices. The probabilities are the softmax of an example's scores over its
own choices.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

import numpy as np

from flaxheads import data, problem
from flaxheads.data.tokenization import tokenize_texts
from flaxheads.inference import (
    check_batch_size, compiled_forward, padding, pipeline_model, readable_texts, refuse_non_finite,
    rows_per_batch,
)
from flaxheads.names import PAD_TO_MULTIPLE_OF
from flaxheads.tasks.choice.model import MultipleChoice
from flaxheads.tokenizer import check_room_for_text, check_tokenizer_fits, fitting_max_length, for_model, longest_input
from flaxheads.training import metrics as metrics_lib

FIELDS = ("context", "question", "choices")
"""What an example may hold: `context` and `choices` (at least two), `question` optionally."""


def multiple_choice_pipeline(model: MultipleChoice | str | os.PathLike | None = None, tokenizer: Any = None, *,
                             max_seq_length: int | None = None, batch_size: int = 64,
                             pad_to_multiple_of: int = PAD_TO_MULTIPLE_OF) -> MultipleChoicePipeline:
    """A multiple-choice model answering each example as `flaxheads predict` answers a row of a
    choice file: what `flaxheads.pipeline("multiple-choice", ...)` builds.

    `model`: a `MultipleChoice`, or the folder of a trained one (refused, UntrainedModel, when
    its head was never trained). `tokenizer`: a transformers tokenizer or its folder; optional
    with a model folder that holds the model's tokenizer, required with an in-memory model. Each
    (context, choice) pair is truncated longest first to `max_seq_length` tokens (None: the
    model's position limit, else the tokenizer's), and choices are scored `batch_size` to a
    forward pass, padded to multiples of `pad_to_multiple_of` tokens (0: powers of two; the
    answers are the same either way).

    Raises ValueError for a missing or foreign tokenizer, a folder without a tokenizer or a
    trained head (UntrainedModel), and a model of another task (naming the pipeline that reads it).
    """
    model, tokenizer, source = pipeline_model(model, tokenizer, MultipleChoice)
    return MultipleChoicePipeline(model, tokenizer, max_seq_length=max_seq_length, batch_size=batch_size,
                                  source=source, pad_to_multiple_of=pad_to_multiple_of)


class MultipleChoicePipeline:
    """Picks a choice per example with an in-memory model and tokenizer; see
    `multiple_choice_pipeline` and `__call__`."""

    def __init__(self, model: MultipleChoice, tokenizer, *, max_seq_length: int | None = None, batch_size: int = 64,
                 source: str = "the model", pad_to_multiple_of: int = PAD_TO_MULTIPLE_OF):
        self.model = model
        if max_seq_length is None:
            max_seq_length = longest_input(model.config.backbone, tokenizer)
        if max_seq_length is None:
            raise ValueError(f"{source} sets no longest input: give max_seq_length= (each choice is cut to it, as "
                             "training cut it)")
        self.scorer = ChoiceScorer(model, tokenizer, max_seq_length=max_seq_length, batch_size=batch_size,
                                   source=source, pad_to_multiple_of=pad_to_multiple_of)
        self.tokenizer = self.scorer.tokenizer

    def __call__(self, inputs) -> dict[str, Any] | list[dict[str, Any]]:
        """Per example (a dict {"context", "choices", "question"?}, or a list of them: a list of
        answers) {"label": the index of the choice picked, "choice": the text read as that
        choice, "probabilities": one per choice, in order}, as `flaxheads predict` gives them.

        Raises ValueError naming the example (its index) and the field for an example that is no
        such dict, fewer than two choices, and a context, question or choice that is blank or no
        str; FloatingPointError naming the examples whose scores are not finite.
        """
        single = isinstance(inputs, dict)
        examples = [inputs] if single else inputs
        if not isinstance(examples, (list, tuple)) or not examples:
            raise ValueError('the pipeline takes an example {"context": ..., "choices": [...]} or a non-empty list of '
                             f"them; got {type(inputs).__name__}")
        contexts, choices = zip(*(_read(i, example) for i, example in enumerate(examples)))
        answers = []
        for example_choices, logits in zip(choices, self.scorer.logits(list(contexts), list(choices))):
            p = metrics_lib.probabilities(problem.SINGLE_LABEL, logits[None, :])[0]  # softmax over its own choices
            chosen = int(np.argmax(p))
            answers.append({"label": chosen, "choice": example_choices[chosen], "probabilities": [float(x) for x in p]})
        return answers[0] if single else answers


def _read(index: int, example) -> tuple[str, list[str]]:
    """(context, the second text of each choice) of one example, as `tasks.choice.data` reads a row."""
    where = f"example {index}"
    if not isinstance(example, dict) or "context" not in example or "choices" not in example \
            or not set(example) <= set(FIELDS):
        raise ValueError(f'{where} must be a dict {{"context": ..., "choices": [...]}} (and optionally "question", the '
                         f"start every choice continues), not {_short(example)}")
    (context,) = readable_texts([example["context"]], f"{where}'s context")
    choices = example["choices"]
    if isinstance(choices, str) or not isinstance(choices, Sequence) or len(choices) < 2:
        raise ValueError(f"{where}'s choices must be a list of two texts or more, not {_short(choices)}")
    choices = readable_texts(choices, f"{where}'s choices")
    question = example.get("question")
    if question is None:
        return context, choices
    (question,) = readable_texts([question], f"{where}'s question")
    return context, [f"{question} {choice}" for choice in choices]  # run_swag.py's second text


def _short(value, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class ChoiceScorer:
    """Scores of (context, choice) pairs from an in-memory `MultipleChoice`: each pair tokenised
    as training tokenises it (`tokenize_texts`: truncated longest first), the pairs of all
    examples sorted by length and batched `batch_size` rows to a forward pass (fewer for fewer,
    a power of two), each row one example of one choice, padded to a length bucket
    (`pad_to_multiple_of`; 0: powers of two), so the forward pass compiles once per (bucket,
    rows). The model runs in eval mode from a copy, over every local device
    (`inference.data_parallel`)."""

    def __init__(self, model: MultipleChoice, tokenizer, *, max_seq_length: int, batch_size: int = 64,
                 source: str = "the model", pad_to_multiple_of: int = PAD_TO_MULTIPLE_OF):
        check_batch_size(batch_size)
        backbone = model.config.backbone
        check_tokenizer_fits(tokenizer, backbone, source)
        self.tokenizer, self.batch_size, self.source = for_model(tokenizer, backbone), batch_size, source
        self.max_seq_length = fitting_max_length(backbone, max_seq_length)
        check_room_for_text(self.tokenizer, self.max_seq_length, pairs=True)
        self.batch_format = data.BatchFormat(max_seq_length=self.max_seq_length, pad_to_multiple_of=pad_to_multiple_of,
                                             **padding(tokenizer, backbone))

        def forward(model, *arrays):  # each (rows, seq) array read as (rows, 1 choice, seq)
            logits_B1 = model(*(None if x_BT is None else x_BT[:, None, :] for x_BT in arrays))
            return logits_B1[:, 0]

        self._params, self._forward = compiled_forward(model, forward)

    def logits(self, contexts: list[str], choices: list[list[str]]) -> list[np.ndarray]:
        """Per example, in order, the (its choices,) float32 logits of its choices. Raises
        FloatingPointError naming the (0-based) examples whose scores are not finite."""
        firsts = [context for context, example in zip(contexts, choices) for _ in example]
        seconds = [choice for example in choices for choice in example]
        tokenized = tokenize_texts(firsts, self.tokenizer, self.max_seq_length, seconds)
        lengths = data.example_lengths(tokenized)
        order = np.argsort(lengths, kind="stable")  # rows of like length share a forward pass
        tokenized = tokenized.select(order)
        scores = []
        for batch in data.eval_batches(tokenized, self.batch_format,
                                       global_batch_size=rows_per_batch(len(order), self.batch_size)):
            logits = self._forward(self._params, batch["input_ids"], batch["attention_mask"],
                                   batch.get("token_type_ids"))
            scores.append(np.asarray(logits)[batch["example_mask"] > 0])
        flat = np.empty(len(order), np.float32)
        flat[order] = np.concatenate(scores)
        per_example = np.split(flat, np.cumsum([len(example) for example in choices])[:-1])
        refuse_non_finite(np.array([np.isfinite(row).all() for row in per_example]), self.source, "example(s)")
        return per_example


__all__ = ["ChoiceScorer", "MultipleChoicePipeline", "multiple_choice_pipeline"]
