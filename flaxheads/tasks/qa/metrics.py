"""SQuAD's scores of extractive answers: v1.1 exact match and F1, and SQuAD 2.0's with unanswerable
questions, equal to the official evaluation scripts as the `evaluate` library (0.4.6) wraps them in
its "squad" and "squad_v2" metrics (`tests/test_qa_metrics.py` compares every number on random and
adversarial strings).

- `squad(predictions, references)` -> {"exact_match", "f1"}, percentages.
- `squad_v2(predictions, references)` -> {"exact", "f1", "total", "HasAns_exact", "HasAns_f1",
  "HasAns_total", "NoAns_exact", "NoAns_f1", "NoAns_total", "best_exact", "best_exact_thresh",
  "best_f1", "best_f1_thresh"} (a breakdown only when such questions exist), percentages.

Both take what `evaluate`'s `compute` takes, predictions [{"id", "prediction_text"} (+
"no_answer_probability" for v2)] and references [{"id", "answers": {"text": [...], "answer_start":
[...]}}] (answers may also be a list of {"text": ...}, as in SQuAD's JSON; a reference may be an
object with `id` and `answers`, as a `QAExample`), or plain dicts: {id: answer text} and {id: [gold
texts]} (no gold text: unanswerable).

An answer is compared after `normalize_answer` (lower case, no ASCII punctuation, no English
articles, whitespace collapsed); F1 counts the words two normalised answers share. Under v2 a
question whose gold texts all normalise to nothing (or that has none) is answered right only by an
answer that normalises to nothing; a prediction whose no-answer probability exceeds
`no_answer_threshold` counts as answering nothing; best_exact/best_f1 are the scores at the best
threshold on those probabilities (run_qa.py passes 0.0 for every answer, so its best scores equal
its plain ones; pass `QAPredictions.null_odds` as `no_answer_probabilities` to choose a threshold).
"""

from __future__ import annotations

import collections
import re
import string
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from flaxheads import notes

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCTUATION = frozenset(string.punctuation)

Predictions = Sequence[Mapping[str, Any]] | Mapping[str, str]
References = Sequence[Mapping[str, Any]] | Mapping[str, Sequence[str]]


def normalize_answer(text: str) -> str:
    """`text` lower-cased, without ASCII punctuation (string.punctuation: "—" and "“" stay), without
    the words a, an and the, its whitespace runs (any Unicode whitespace) made single spaces: the
    official scripts' normalisation."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, gold: str) -> int:
    """1 when the two answers normalise alike, else 0."""
    return int(normalize_answer(prediction) == normalize_answer(gold))


def f1(prediction: str, gold: str) -> float:
    """The F1 of the words two normalised answers share (a word counts as often as both hold it);
    an answer that normalises to nothing scores 1 against another such, else 0 (SQuAD v2's F1;
    v1.1's gives 0 in both cases)."""
    predicted, true = normalize_answer(prediction).split(), normalize_answer(gold).split()
    if not predicted or not true:
        return int(predicted == true)
    return _f1_of_words(predicted, true)


def squad(predictions: Predictions, references: References) -> dict[str, float]:
    """SQuAD v1.1's {"exact_match", "f1"} (percentages) of `predictions` against `references`, as
    `evaluate.load("squad").compute(predictions=..., references=...)` gives them: each question
    scores its best over its gold answers. A question without a prediction scores 0 (a note says how
    many); a prediction without a question is ignored.

    Raises ValueError naming the problem and its fix for no references, a question without a gold
    answer (that is SQuAD v2: `squad_v2`), ids given twice, and malformed rows.
    """
    answers, _ = _predictions(predictions, with_probabilities=False)
    golds = _references(references)
    if not golds:
        raise ValueError("references is empty: pass at least one question with its gold answers")
    unanswerable = next((key for key, texts in golds.items() if not texts), None)
    if unanswerable is not None:
        raise ValueError(f"the reference {unanswerable!r} has no gold answer, which SQuAD v1.1 cannot score: score "
                         "data with unanswerable questions with squad_v2(predictions, references)")
    _note_missing(golds, answers, "SQuAD v1.1 scores them 0")
    exact_total = f1_total = 0
    for key, texts in golds.items():
        if key not in answers:
            continue
        exact_total += max(normalize_answer(answers[key]) == normalize_answer(text) for text in texts)
        f1_total += max(_v1_f1(answers[key], text) for text in texts)
    return {"exact_match": 100.0 * exact_total / len(golds), "f1": 100.0 * f1_total / len(golds)}


def squad_v2(predictions: Predictions, references: References, *,
             no_answer_probabilities: Mapping[str, float] | None = None,
             no_answer_threshold: float = 1.0) -> dict[str, float | int]:
    """SQuAD 2.0's scores (percentages; totals as counts) of `predictions` against `references`,
    as `evaluate.load("squad_v2").compute(predictions=..., references=...)` gives them.

    A prediction's no-answer probability is its "no_answer_probability", or
    `no_answer_probabilities[id]` (the plain form; say, `QAPredictions.null_odds`), 0.0 when neither
    gives one; stored as float32, as `evaluate` stores it, so thresholds and ties fall alike. Above
    `no_answer_threshold` the prediction counts as answering nothing.

    Raises ValueError naming the problem and its fix for no references, a question without a
    prediction (the official script fails there with KeyError), ids given twice, and malformed rows.
    """
    answers, probabilities = _predictions(predictions, with_probabilities=True)
    if no_answer_probabilities is not None:
        probabilities.update({key: _float32(value, f"no_answer_probabilities[{key!r}]")
                              for key, value in no_answer_probabilities.items()})
    golds = _references(references)
    if not golds:
        raise ValueError("references is empty: pass at least one question with its gold answers")
    missing = [key for key in golds if key not in answers]
    if missing:
        raise ValueError(f"{len(missing)} of the {len(golds)} questions have no prediction (the first: "
                         f"{missing[0]!r}); SQuAD v2 scores every question: pass a prediction for each (\"\" answers "
                         "that there is none)")
    has_answer = {key: bool(texts) for key, texts in golds.items()}
    exact_raw, f1_raw = {}, {}
    for key, texts in golds.items():
        golds_left = [text for text in texts if normalize_answer(text)] or [""]
        exact_raw[key] = max(exact_match(answers[key], text) for text in golds_left)
        f1_raw[key] = max(f1(answers[key], text) for text in golds_left)
    probabilities = {key: probabilities.get(key, 0.0) for key in answers}
    exact = _threshold(exact_raw, probabilities, has_answer, no_answer_threshold)
    f1_scores = _threshold(f1_raw, probabilities, has_answer, no_answer_threshold)
    result: dict[str, float | int] = _totals(exact, f1_scores, list(golds))
    for prefix, wanted in (("HasAns", True), ("NoAns", False)):
        keys = [key for key, has in has_answer.items() if has is wanted]
        if keys:
            result.update({f"{prefix}_{name}": value for name, value in _totals(exact, f1_scores, keys).items()})
    for name, raw in (("exact", exact_raw), ("f1", f1_raw)):
        best, threshold = _best_threshold(answers, raw, probabilities, has_answer)
        result[f"best_{name}"], result[f"best_{name}_thresh"] = best, threshold
    return result


def _v1_f1(prediction: str, gold: str) -> float:
    """v1.1's F1: 0 when no word is shared, also when both answers normalise to nothing."""
    predicted, true = normalize_answer(prediction).split(), normalize_answer(gold).split()
    return _f1_of_words(predicted, true)


def _f1_of_words(predicted: list[str], true: list[str]) -> float:
    shared = sum((collections.Counter(predicted) & collections.Counter(true)).values())
    if shared == 0:
        return 0
    precision, recall = 1.0 * shared / len(predicted), 1.0 * shared / len(true)
    return (2 * precision * recall) / (precision + recall)


def _threshold(scores: dict[str, float], probabilities: dict[str, float], has_answer: dict[str, bool],
               threshold: float) -> dict[str, float]:
    """Each question's score, or, when its no-answer probability exceeds `threshold`, 1.0 for an
    unanswerable question and 0.0 for another."""
    return {key: float(not has_answer[key]) if probabilities[key] > threshold else score
            for key, score in scores.items()}


def _totals(exact: dict[str, float], f1_scores: dict[str, float], keys: list[str]) -> dict[str, float | int]:
    # Summed in the references' order, as the official script sums, so that the floats come out the same.
    return {"exact": 100.0 * sum(exact[key] for key in keys) / len(keys),
            "f1": 100.0 * sum(f1_scores[key] for key in keys) / len(keys), "total": len(keys)}


def _best_threshold(answers: dict[str, str], scores: dict[str, float], probabilities: dict[str, float],
                    has_answer: dict[str, bool]) -> tuple[float, float]:
    """The best score (percentage) over no-answer thresholds, and the threshold giving it (0.0 when
    answering nothing everywhere is as good): questions taken by rising probability (the
    predictions' order on a tie), each then answered as predicted instead of with nothing."""
    current = best = sum(1 for has in has_answer.values() if not has)
    best_threshold = 0.0
    for key in sorted(probabilities, key=lambda k: probabilities[k]):
        if key not in scores:
            continue
        if has_answer[key]:
            current += scores[key]
        elif answers[key]:
            current -= 1
        if current > best:
            best, best_threshold = current, probabilities[key]
    return 100.0 * best / len(scores), best_threshold


def _predictions(predictions: Predictions, *, with_probabilities: bool) -> tuple[dict[str, str], dict[str, float]]:
    """({id: answer text}, {id: no-answer probability as float32}) from rows or a plain dict."""
    if isinstance(predictions, Mapping):
        answers = {key: _text(value, f"predictions[{key!r}]") for key, value in predictions.items()}
        return answers, {}
    answers, probabilities = {}, {}
    for i, row in enumerate(predictions):
        if not isinstance(row, Mapping) or "id" not in row or "prediction_text" not in row:
            raise ValueError(f"predictions[{i}] is {_short(row)}; each prediction is {{'id': ..., 'prediction_text': "
                             "...}" + (" (and 'no_answer_probability')" if with_probabilities else "") +
                             ", or pass a dict {id: answer text}")
        key = row["id"]
        if key in answers:
            raise ValueError(f"predictions[{i}] repeats the id {key!r}: give each question one prediction")
        answers[key] = _text(row["prediction_text"], f"predictions[{i}]['prediction_text']")
        if with_probabilities and "no_answer_probability" in row:
            probabilities[key] = _float32(row["no_answer_probability"], f"predictions[{i}]['no_answer_probability']")
    return answers, probabilities


def _references(references: References) -> dict[str, list[str]]:
    """{id: its gold texts} from rows or a plain dict."""
    if isinstance(references, Mapping):
        return {key: _gold_texts(value, f"references[{key!r}]") for key, value in references.items()}
    golds: dict[str, list[str]] = {}
    for i, row in enumerate(references):
        if isinstance(row, Mapping) and "id" in row and "answers" in row:
            key, answers = row["id"], row["answers"]
        elif not isinstance(row, Mapping) and hasattr(row, "id") and hasattr(row, "answers"):  # a QAExample
            key, answers = row.id, row.answers
        else:
            raise ValueError(f"references[{i}] is {_short(row)}; each reference is {{'id': ..., 'answers': {{'text': "
                             "[...], 'answer_start': [...]}}}, or pass a dict {id: [gold texts]}")
        if key in golds:
            raise ValueError(f"references[{i}] repeats the id {key!r}: give each question one reference")
        golds[key] = _gold_texts(answers, f"references[{i}]['answers']")
    return golds


def _gold_texts(answers: Any, where: str) -> list[str]:
    """The gold texts of {"text": [...]}, [{"text": ...}, ...] or [text, ...]."""
    if isinstance(answers, Mapping) and "text" in answers:
        texts = answers["text"]
        texts = [texts] if isinstance(texts, str) else list(texts)
    elif isinstance(answers, Sequence) and not isinstance(answers, str):
        texts = [answer["text"] if isinstance(answer, Mapping) and "text" in answer else answer for answer in answers]
    else:
        raise ValueError(f"{where} is {_short(answers)}; give the gold answers as {{'text': [...]}}, a list of "
                         "{'text': ...}, or a list of texts ([] for an unanswerable question)")
    return [_text(text, where) for text in texts]


def _text(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{where} is {_short(value)}, not a string: answers are texts (\"\" for no answer)")
    return value


def _float32(value: Any, where: str) -> float:
    try:
        return float(np.float32(value))
    except (TypeError, ValueError):
        raise ValueError(f"{where} is {_short(value)}, not a number: give the probability that there is no answer"
                         ) from None


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _note_missing(golds: dict[str, list[str]], answers: dict[str, str], consequence: str) -> None:
    """A note on stderr, as the official script prints one, when questions have no prediction."""
    missing = [key for key in golds if key not in answers]
    if missing:
        message = (f"{len(missing)} of the {len(golds)} questions have no prediction (the first: {missing[0]!r}); "
                   f"{consequence}")
        print(f"note: {notes.worded(message)}", file=sys.stderr)
