"""Question-answering post-processing (flaxheads.tasks.qa.postprocess) against transformers 4.57.6's
examples/pytorch/question-answering/utils_qa.py (tests/reference/utils_qa.py) on random logits,
windows and offsets: the same answers, n-best lists (texts, logits, probabilities) and null odds, and
the same files."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
from reference import utils_qa as reference

from flaxheads.tasks.qa import postprocess
from flaxheads.tasks.qa.postprocess import (
    postprocess_qa_predictions,
    postprocess_qa_predictions_with_beam_search,
    write_predictions,
)
from flaxheads.training import run_files

WORDS = ["the", "a", "Cat", "naïve", "café", "東京", "x", "an", "river", "1,200", "(b)", "—", "don't", "ß"]


def _context(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 25)))


def _tokens(rng: random.Random, context: str, zero_width: bool) -> list[tuple[int, int]]:
    """Character spans covering `context` in pieces of 1 to 4 characters (a subword tokenizer's
    offsets), the first sometimes zero-width at (0, 0), as some tokenizers give a leading marker."""
    spans, position = [], 0
    if zero_width and rng.random() < 0.5:
        spans.append((0, 0))
    while position < len(context):
        if context[position] == " ":
            position += 1
            continue
        width = min(rng.randint(1, 4), len(context) - position)
        spans.append((position, position + width))
        position += width
    return spans


def _features(rng: random.Random, examples: list[dict], seq_len: int, zero_width: bool = False,
              max_context: bool = False, as_lists: bool = False) -> list[dict]:
    """run_qa-style windows: [CLS] question [SEP] context window [SEP] padding, with None offsets
    outside the context, the windows overlapping by a random stride, several per long context."""
    features = []
    for example in examples:
        tokens = _tokens(rng, example["context"], zero_width)
        question = rng.randint(1, 4)
        room = seq_len - question - 3
        stride = rng.randint(0, room - 1)
        first = 0
        while True:
            window = tokens[first:first + room]
            offsets = [None] * (question + 2) + [list(t) if as_lists else t for t in window] + [None]
            if rng.random() < 0.5:  # padded to the full length, or not (dynamic padding)
                offsets += [None] * (seq_len - len(offsets))
            feature = {"example_id": example["id"], "offset_mapping": offsets}
            if max_context:
                feature["token_is_max_context"] = {str(i): rng.random() < 0.7 for i in range(len(offsets))
                                                   if offsets[i] is not None}
            features.append(feature)
            if first + room >= len(tokens):
                break
            first += room - stride
    rng.shuffle(features)  # features need not follow their examples' order
    return features


def _logits(np_rng: np.random.Generator, shape: tuple[int, int], dtype, ties: bool) -> np.ndarray:
    logits = np_rng.normal(size=shape).astype(dtype) * 3
    return np.round(logits, 1) if ties else logits  # rounded: many equal scores, whose order must match


def _case(seed: int) -> dict:
    """A random post-processing problem: examples, their windows and logits, and the settings."""
    rng, np_rng = random.Random(seed), np.random.default_rng(seed)
    examples = [{"id": f"q{seed}-{i}", "context": _context(rng), "question": "?"} for i in range(rng.randint(1, 6))]
    seq_len = rng.randint(8, 24)
    features = _features(rng, examples, seq_len, zero_width=rng.random() < 0.3, max_context=rng.random() < 0.2,
                         as_lists=rng.random() < 0.5)
    dtype = rng.choice([np.float32, np.float64])
    ties = rng.random() < 0.3
    return {
        "examples": examples, "features": features,
        "predictions": (_logits(np_rng, (len(features), seq_len), dtype, ties),
                        _logits(np_rng, (len(features), seq_len), dtype, ties)),
        "version_2_with_negative": rng.random() < 0.5,
        "n_best_size": rng.choice([1, 2, 5, 20]),
        "max_answer_length": rng.choice([1, 3, 30]),
        "null_score_diff_threshold": rng.choice([0.0, 0.0, -1.0, 2.5]),
    }


def _reference_files(tmp_path, function, case: dict, **options) -> dict | None:
    """What transformers' function writes for `case`: {file name: parsed JSON}; None where it
    fails (SQuAD v2 with no non-empty text: IndexError)."""
    folder = tmp_path / f"reference-{len(list(tmp_path.iterdir()))}"
    folder.mkdir()
    try:
        function(reference.Rows(case["examples"]), case["features"], case["predictions"], output_dir=str(folder),
                 **options)
    except IndexError:
        return None
    return {path.name: path.read_text() for path in folder.iterdir()}


def _ours_as_files(result) -> dict:
    names = postprocess.output_names(null_odds=result.null_odds is not None)
    contents = [result.answers, result.nbest] + ([result.null_odds] if result.null_odds is not None else [])
    return {name: json.dumps(content, indent=4) + "\n" for name, content in zip(names, contents)}


def _assert_same_as_transformers(tmp_path, seeds) -> int:
    compared = 0
    for seed in seeds:
        case = _case(seed)
        options = {key: case[key] for key in ("version_2_with_negative", "n_best_size", "max_answer_length",
                                              "null_score_diff_threshold")}
        expected = _reference_files(tmp_path, reference.postprocess_qa_predictions, case, **options)
        if expected is None:
            continue
        ours = postprocess_qa_predictions(case["examples"], case["features"], case["predictions"], **options)
        assert _ours_as_files(ours) == expected, f"seed {seed}"
        compared += 1
    return compared


def test_answers_nbest_and_null_odds_equal_transformers_on_random_windows(tmp_path):
    assert _assert_same_as_transformers(tmp_path, range(40)) >= 35


@pytest.mark.slow
def test_answers_nbest_and_null_odds_equal_transformers_on_many_random_windows(tmp_path):
    assert _assert_same_as_transformers(tmp_path, range(40, 1040)) >= 900


def test_the_random_cases_hold_what_the_comparison_must_see():
    """The generator makes what the rules are about: several windows per example, answers and
    no-answers under SQuAD v2, placeholders, probabilities below 1, ties."""
    seen = {"several windows": 0, "null answer": 0, "span answer": 0, "empty placeholder": 0, "ties": 0}
    for seed in range(40):
        case = _case(seed)
        options = {key: case[key] for key in ("version_2_with_negative", "n_best_size", "max_answer_length",
                                              "null_score_diff_threshold")}
        ours = postprocess_qa_predictions(case["examples"], case["features"], case["predictions"], **options)
        ids = [feature["example_id"] for feature in case["features"]]
        seen["several windows"] += len(ids) > len(set(ids))
        seen["null answer"] += case["version_2_with_negative"] and "" in ours.answers.values()
        seen["span answer"] += any(text not in ("", "empty") for text in ours.answers.values())
        seen["empty placeholder"] += "empty" in ours.answers.values()
        seen["ties"] += len(np.unique(case["predictions"][0])) < case["predictions"][0].size
    assert all(count >= 3 for count in seen.values()), seen


def _beam_case(seed: int) -> dict:
    rng, np_rng = random.Random(seed), np.random.default_rng(seed)
    examples = [{"id": f"b{seed}-{i}", "context": _context(rng)} for i in range(rng.randint(1, 5))]
    seq_len = rng.randint(8, 20)
    features = _features(rng, examples, seq_len, zero_width=rng.random() < 0.3, max_context=rng.random() < 0.2)
    start_n_top, end_n_top = rng.choice([1, 2, 5]), rng.choice([1, 3, 5])
    n = len(features)
    # run_qa_beam_search gathers the indices into float64 arrays; the model gives integers.
    index_dtype = rng.choice([np.int64, np.float64])
    log_probs = lambda width: np.sort(np.log(np_rng.uniform(1e-4, 1, size=(n, width))), axis=1)[:, ::-1]
    return {
        "examples": examples, "features": features,
        "predictions": (log_probs(start_n_top).astype(np.float32),
                        np_rng.integers(0, seq_len, size=(n, start_n_top)).astype(index_dtype),
                        log_probs(start_n_top * end_n_top).astype(np.float32),
                        np_rng.integers(0, seq_len, size=(n, start_n_top * end_n_top)).astype(index_dtype),
                        np_rng.normal(size=n).astype(np.float32)),
        "version_2_with_negative": rng.random() < 0.5, "n_best_size": rng.choice([1, 3, 20]),
        "max_answer_length": rng.choice([1, 4, 30]), "start_n_top": start_n_top, "end_n_top": end_n_top,
    }


def _assert_beam_same_as_transformers(tmp_path, seeds) -> None:
    for seed in seeds:
        case = _beam_case(seed)
        options = {key: case[key] for key in ("version_2_with_negative", "n_best_size", "max_answer_length",
                                              "start_n_top", "end_n_top")}
        expected = _reference_files(tmp_path, reference.postprocess_qa_predictions_with_beam_search, case, **options)
        ours = postprocess_qa_predictions_with_beam_search(case["examples"], case["features"], case["predictions"],
                                                            **options)
        assert _ours_as_files(ours) == expected, f"seed {seed}"


def test_beam_search_answers_nbest_and_null_odds_equal_transformers_on_random_beams(tmp_path):
    _assert_beam_same_as_transformers(tmp_path, range(30))


@pytest.mark.slow
def test_beam_search_answers_nbest_and_null_odds_equal_transformers_on_many_random_beams(tmp_path):
    _assert_beam_same_as_transformers(tmp_path, range(30, 1030))
