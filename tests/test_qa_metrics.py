"""SQuAD metrics (flaxheads.tasks.qa.metrics) against the official evaluation scripts as evaluate 0.4.6
wraps them (tests/reference/squad_v1.py, tests/reference/squad_v2.py), on random answers built from
adversarial pieces: articles, ASCII and Unicode punctuation, Unicode letters whose case changes
their length, every kind of whitespace, empty answers, unanswerable questions, several gold answers."""

from __future__ import annotations

import random
import types

import numpy as np
import pytest
from reference import squad_v1, squad_v2

from flaxheads.tasks.qa import metrics

PIECES = ["a", "an", "the", "A", "An", "THE", "The", "anthem", "theatre", "a.", "the,", "(the)", "an-", "aN",
          ".", ",", "!", "?", "'", '"', "-", "—", "–", "“", "”", "’", "«", "»", "(", ")", "$", "%", "…", "¿",
          "1,000", "3.14", "1/2", "café", "CAFÉ", "cafe\u0301", "naïve", "İstanbul", "ß", "STRASSE", "Σίσυφος",
          "ΣΊΣΥΦΟΣ", "東京", "ｔｈｅ", "ﬁsh", "cat", "Cat", "cats", "dog", "cat's", "cat-dog", "e.g.", "U.S.", "\u200b",
          "", "", ""]
SEPARATORS = ["", " ", " ", " ", "  ", "\t", "\n", "\u00a0", "\u2009", "\u3000", "\r\n"]


def _text(rng: random.Random, max_pieces: int = 5) -> str:
    pieces = [rng.choice(PIECES) for _ in range(rng.randint(0, max_pieces))]
    return "".join(piece + rng.choice(SEPARATORS) for piece in pieces).strip(rng.choice(["", " ", "\n"]))


def _perturbed(rng: random.Random, text: str) -> str:
    """`text` as a model might almost give it: other case, an article or punctuation more, a word
    less or repeated, other whitespace."""
    change = rng.randrange(7)
    if change == 0:
        return text.upper() if rng.random() < 0.5 else text.lower()
    if change == 1:
        return rng.choice(["the ", "A ", "an\t"]) + text
    if change == 2:
        return text + rng.choice([".", "!", " ,", "”", " the"])
    words = text.split()
    if change == 3 and words:
        words.pop(rng.randrange(len(words)))
        return " ".join(words)
    if change == 4 and words:
        return " ".join(words + [rng.choice(words)])
    if change == 5:
        return "\u00a0".join(words)
    return text


def _questions(rng: random.Random, answerable_only: bool) -> tuple[list[dict], list[dict]]:
    """(references, predictions) in evaluate's form: gold answers 0 to 3 (1 to 3 for v1), some the
    same, some normalising to nothing; predictions copied, perturbed, random or empty."""
    references, predictions = [], []
    for i in range(rng.randint(1, 12)):
        golds = [_text(rng) for _ in range(rng.randint(1 if answerable_only else 0, 3))]
        if len(golds) > 1 and rng.random() < 0.2:
            golds[1] = golds[0]
        references.append({"id": f"q{i}", "answers": {"text": golds, "answer_start": [0] * len(golds)}})
        source = rng.random()
        if golds and source < 0.35:
            answer = rng.choice(golds)
        elif golds and source < 0.7:
            answer = _perturbed(rng, rng.choice(golds))
        elif source < 0.85:
            answer = _text(rng)
        else:
            answer = ""
        predictions.append({"id": f"q{i}", "prediction_text": answer})
    rng.shuffle(predictions)
    return references, predictions


def _probability(rng: random.Random) -> float:
    """A no-answer probability: ties, the threshold itself, above it, and float64 values that
    float32 rounds (0.1) or merges (0.3 and 0.30000001)."""
    return rng.choice([rng.random(), round(rng.random(), 1), 1.0, 1.5, 0.0, 0.1, 0.3, 0.30000001, -2.0])


def _v2_case(seed: int) -> tuple[list[dict], list[dict]]:
    rng = random.Random(seed)
    references, predictions = _questions(rng, answerable_only=False)
    for prediction in predictions:
        prediction["no_answer_probability"] = _probability(rng)
    if rng.random() < 0.2:  # a prediction for a question the references lack: ignored
        predictions.append({"id": "extra", "prediction_text": "cat", "no_answer_probability": _probability(rng)})
    return references, predictions


def _as_evaluate_stores(predictions: list[dict]) -> list[dict]:
    """evaluate keeps no_answer_probability as float32 (its datasets feature) before the script sees it."""
    return [{**p, "no_answer_probability": float(np.float32(p["no_answer_probability"]))} for p in predictions]


def _typed(result: dict) -> list:
    """The result's items in order, each value with its type (a total is an int, a threshold a float)."""
    return [(key, type(value), value) for key, value in result.items()]


def _assert_v1_equal(seeds) -> None:
    for seed in seeds:
        rng = random.Random(seed)
        references, predictions = _questions(rng, answerable_only=True)
        if rng.random() < 0.2:
            predictions = predictions[1:]  # a question without a prediction scores 0
        expected = squad_v1.compute(predictions, references)
        assert _typed(metrics.squad(predictions, references)) == _typed(expected), f"seed {seed}"


def _assert_v2_equal(seeds) -> None:
    for seed in seeds:
        references, predictions = _v2_case(seed)
        expected = squad_v2.compute(_as_evaluate_stores(predictions), references)
        assert _typed(metrics.squad_v2(predictions, references)) == _typed(expected), f"seed {seed}"


def test_squad_v1_equals_the_official_script_on_adversarial_answers(capsys):
    _assert_v1_equal(range(150))


@pytest.mark.slow
def test_squad_v1_equals_the_official_script_on_many_adversarial_answers(capsys):
    _assert_v1_equal(range(150, 4150))


def test_squad_v2_equals_the_official_script_on_adversarial_answers():
    _assert_v2_equal(range(150))


@pytest.mark.slow
def test_squad_v2_equals_the_official_script_on_many_adversarial_answers():
    _assert_v2_equal(range(150, 4150))


def test_normalize_answer_equals_the_official_one_on_adversarial_text():
    rng = random.Random(0)
    texts = [_text(rng, max_pieces=8) for _ in range(2000)]

    assert [metrics.normalize_answer(text) for text in texts] == [squad_v2.normalize_answer(text) for text in texts]
    assert [metrics.normalize_answer(text) for text in texts] == [squad_v1.normalize_answer(text) for text in texts]


def test_normalize_answer_drops_ascii_punctuation_and_articles_but_keeps_unicode_punctuation():
    assert metrics.normalize_answer("The  Cat's\u00a0(a) hat!") == "cats hat"
    assert metrics.normalize_answer("“the” Theatre — an\tAnthem") == "“ ” theatre — anthem"


def test_the_random_cases_hold_what_the_comparison_must_see():
    """The generator makes what the rules are about: exact and partial matches, misses, unanswerable
    questions answered and not, gold texts that normalise to nothing, probabilities over the threshold."""
    seen = {"exact": 0, "partial": 0, "miss": 0, "NoAns right": 0, "NoAns wrong": 0, "gold of nothing": 0,
            "over threshold": 0}
    for seed in range(150):
        references, predictions = _v2_case(seed)
        answers = {p["id"]: p for p in predictions}
        for reference in references:
            golds, answer = reference["answers"]["text"], answers[reference["id"]]
            f1 = max((metrics.f1(answer["prediction_text"], gold) for gold in golds or [""]), default=0)
            seen["exact"] += f1 == 1 and bool(golds)
            seen["partial"] += 0 < f1 < 1
            seen["miss"] += f1 == 0
            seen["NoAns right"] += not golds and answer["prediction_text"] == ""
            seen["NoAns wrong"] += not golds and answer["prediction_text"] != ""
            seen["gold of nothing"] += bool(golds) and not any(metrics.normalize_answer(g) for g in golds)
            seen["over threshold"] += answer["no_answer_probability"] > 1.0
    assert all(count >= 10 for count in seen.values()), seen


def test_plain_dicts_score_as_evaluates_rows():
    references, predictions = _v2_case(7)
    golds = {r["id"]: r["answers"]["text"] for r in references}
    answers = {p["id"]: p["prediction_text"] for p in predictions}
    probabilities = {p["id"]: p["no_answer_probability"] for p in predictions}

    assert metrics.squad_v2(answers, golds, no_answer_probabilities=probabilities) == metrics.squad_v2(
        predictions, references)
    answerable = {key: texts for key, texts in golds.items() if texts}
    assert metrics.squad(answers, answerable) == metrics.squad(
        predictions, [r for r in references if r["answers"]["text"]])


def test_squad_json_answer_lists_and_example_objects_score_as_evaluates_answer_columns():
    references, predictions = _v2_case(3)
    nested = [{"id": r["id"], "answers": [{"text": t, "answer_start": 0} for t in r["answers"]["text"]]}
              for r in references]
    objects = [types.SimpleNamespace(id=r["id"], answers=r["answers"], context="") for r in references]

    assert metrics.squad_v2(predictions, nested) == metrics.squad_v2(predictions, references)
    assert metrics.squad_v2(predictions, objects) == metrics.squad_v2(predictions, references)


def test_squad_v2_without_probabilities_takes_zero_as_run_qa_passes():
    references, predictions = _v2_case(11)
    bare = [{"id": p["id"], "prediction_text": p["prediction_text"]} for p in predictions]

    assert metrics.squad_v2(bare, references) == squad_v2.compute(
        [{**p, "no_answer_probability": 0.0} for p in bare], references)


def test_squad_v1_scores_a_question_without_prediction_zero_and_says_so(capsys):
    references = [{"id": "a", "answers": {"text": ["cat"], "answer_start": [0]}},
                  {"id": "b", "answers": {"text": ["dog"], "answer_start": [0]}}]

    assert metrics.squad([{"id": "a", "prediction_text": "the cat"}], references) == {"exact_match": 50.0, "f1": 50.0}
    note = "1 of the 2 questions have no prediction (the first: 'b'); SQuAD v1.1 scores them 0"
    assert note in capsys.readouterr().err


@pytest.mark.parametrize("call, message", [
    (lambda: metrics.squad({"a": "x"}, {"a": []}), "has no gold answer, which SQuAD v1.1 cannot score: score data "
                                                    "with unanswerable questions with squad_v2"),
    (lambda: metrics.squad_v2({"a": "x"}, {"a": ["x"], "b": []}), "1 of the 2 questions have no prediction (the "
                                                                   "first: 'b')"),
    (lambda: metrics.squad({}, {}), "references is empty"),
    (lambda: metrics.squad_v2([{"id": "a", "prediction_text": "x"}] * 2, {"a": ["x"]}), "predictions[1] repeats the "
                                                                                         "id 'a'"),
    (lambda: metrics.squad({"a": "x"}, [{"id": "a", "answers": {"text": ["x"]}}] * 2), "references[1] repeats the id"),
    (lambda: metrics.squad([{"id": "a", "text": "x"}], {"a": ["x"]}), "each prediction is {'id': ..., "
                                                                       "'prediction_text': ...}"),
    (lambda: metrics.squad({"a": None}, {"a": ["x"]}), "predictions['a'] is None, not a string"),
    (lambda: metrics.squad({"a": "x"}, [{"id": "a", "answers": "x"}]), "give the gold answers as {'text': [...]}"),
    (lambda: metrics.squad_v2([{"id": "a", "prediction_text": "x", "no_answer_probability": "high"}], {"a": ["x"]}),
     "no_answer_probability'] is 'high', not a number"),
])
def test_malformed_inputs_are_refused_naming_the_problem_and_the_fix(call, message):
    with pytest.raises(ValueError) as raised:
        call()

    assert message in str(raised.value)
