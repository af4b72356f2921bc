"""Question-answering post-processing (flaxheads.tasks.qa.postprocess) against transformers 4.57.6's
examples/pytorch/question-answering/utils_qa.py (tests/reference/utils_qa.py) on random logits,
windows and offsets: the same answers, n-best lists (texts, logits, probabilities) and null odds, and
the same files."""

from __future__ import annotations

import json
import random
import types

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

    def log_probs(width: int) -> np.ndarray:  # best first, as the head ranks its beams
        return np.sort(np.log(np_rng.uniform(1e-4, 1, size=(n, width))), axis=1)[:, ::-1]

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


def _one_example(context: str, windows: list[tuple[list, list, list]]) -> tuple[list[dict], list[dict], tuple]:
    """One example with the given windows: (offsets, start logits, end logits) each."""
    examples = [{"id": "e", "context": context}]
    features = [{"example_id": "e", "offset_mapping": offsets} for offsets, _, _ in windows]
    starts = np.array([start for _, start, _ in windows], dtype=np.float32)
    ends = np.array([end for _, _, end in windows], dtype=np.float32)
    return examples, features, (starts, ends)


def _both(tmp_path, examples, features, predictions, **options):
    """(our result, transformers' files) for the same problem."""
    case = {"examples": examples, "features": features, "predictions": predictions}
    expected = _reference_files(tmp_path, reference.postprocess_qa_predictions, case, **options)
    return postprocess_qa_predictions(examples, features, predictions, **options), expected


def test_equal_scores_keep_transformers_order_across_and_within_windows(tmp_path):
    context = " ".join(f"w{i}" for i in range(30))
    offsets = [None, None] + [(3 * i, 3 * i + 2) for i in range(30)] + [None]
    # Logits of two levels: spans of three scores, hundreds of ties, which an unstable sort would reorder.
    start = [0.0, 0.0] + [float(i % 2) for i in range(30)] + [0.0]
    end = [0.0, 0.0] + [float(i // 2 % 2) for i in range(30)] + [0.0]
    windows = [(offsets, start, end), (offsets[:1] + offsets[3:] + [None], start, end)]

    ours, expected = _both(tmp_path, *_one_example(context, windows), n_best_size=20, max_answer_length=5)

    assert _ours_as_files(ours) == expected
    assert len({entry["probability"] for entry in ours.nbest["e"]}) == 1  # the best 20 tie


def test_the_null_score_comes_from_the_first_window_where_it_is_lowest(tmp_path):
    offsets = [None, (0, 3), (4, 7), None]
    windows = [(offsets, [1.0, 0, 0, 0], [2.0, 0, 0, 0]), (offsets, [2.0, 0, 0, 0], [1.0, 0, 0, 0]),
               (offsets, [5.0, 0, 0, 0], [5.0, 0, 0, 0])]

    ours, expected = _both(tmp_path, *_one_example("abc def", windows), version_2_with_negative=True)

    assert _ours_as_files(ours) == expected
    null = next(entry for entry in ours.nbest["e"] if entry["text"] == "")
    assert (null["start_logit"], null["end_logit"]) == (1.0, 2.0)


@pytest.mark.parametrize("threshold, answer", [(1.0, "abc"), (0.75, "")])
def test_the_null_answer_wins_only_by_more_than_the_threshold(tmp_path, threshold, answer):
    windows = [([None, (0, 3), (4, 7), None], [1.0, 0.5, -9, -9], [1.0, 0.5, -9, -9])]  # null 2.0, span "abc" 1.0

    ours, expected = _both(tmp_path, *_one_example("abc def", windows), version_2_with_negative=True,
                           null_score_diff_threshold=threshold)

    assert _ours_as_files(ours) == expected
    assert ours.answers == {"e": answer} and ours.null_odds == {"e": 1.0}


def test_a_lone_span_without_text_gives_the_empty_placeholder(tmp_path):
    windows = [([None, (0, 0), (0, 3), None], [0, 9.0, 0, 0], [0, 9.0, 0, 0])]  # best span: the zero-width token

    ours, expected = _both(tmp_path, *_one_example("abc", windows), n_best_size=1)

    assert _ours_as_files(ours) == expected
    assert ours.answers == {"e": "empty"} and [entry["text"] for entry in ours.nbest["e"]] == ["empty", ""]


def test_squad_v2_with_no_text_to_answer_scores_the_placeholder_where_transformers_fails(tmp_path):
    """Where transformers has only empty texts it fails; flaxheads puts its "empty" placeholder
    first and weighs it against the null answer as transformers does when the null answer is the
    only candidate."""
    windows = [([None, (0, 0), (0, 0), None], [0, 9.0, 8.0, 0], [0, 9.0, 8.0, 0])]  # every span is zero-width
    examples, features, predictions = _one_example("abc", windows)

    with pytest.raises(IndexError):  # transformers: `while predictions[i]["text"] == ""` runs off the list
        reference.postprocess_qa_predictions(reference.Rows(examples), features, predictions,
                                             version_2_with_negative=True)
    ours = postprocess_qa_predictions(examples, features, predictions, version_2_with_negative=True)

    assert [entry["text"] for entry in ours.nbest["e"]] == ["empty", "", "", "", ""]  # 3 spans and the null answer
    assert ours.answers == {"e": "empty"} and ours.null_odds == {"e": 0.0}  # null answer 0.0, placeholder 0.0


def test_columns_and_objects_give_what_rows_give():
    case = _case(5)
    columns = {key: [feature.get(key) for feature in case["features"]] for key in ("example_id", "offset_mapping")}
    columns |= {"input_ids": np.zeros(case["predictions"][0].shape), "not_per_window": [1]}  # the model's: not read
    example_columns = {"id": [e["id"] for e in case["examples"]], "context": [e["context"] for e in case["examples"]]}
    example_objects = [types.SimpleNamespace(id=e["id"], context=e["context"]) for e in case["examples"]]
    rows = postprocess_qa_predictions(case["examples"], case["features"], case["predictions"])

    assert postprocess_qa_predictions(example_columns, columns, case["predictions"]) == rows
    assert postprocess_qa_predictions(example_objects, columns, case["predictions"]) == rows


def _good():
    return _one_example("abc def", [([None, (0, 3), (4, 7), None], [0, 2, 1, 0], [0, 1.5, 2, 0])])


@pytest.mark.parametrize("change, message", [
    (lambda e, f, p: (e, f, p[:1]), "predictions must be a pair (start_logits, end_logits)"),
    (lambda e, f, p: (e, f + f, p), "start_logits has shape (1, 4); it needs one row of logits per feature: (2, "
                                    "seq_len) for the 2 features passed"),
    (lambda e, f, p: (e, f, (p[0], p[1][:, :3])), "start_logits (1, 4) and end_logits (1, 3) differ in shape"),
    (lambda e, f, p: (e, [{**f[0], "example_id": "x"}], p), "features[0] has example_id='x', which no example has: "
                                                            "pass the examples the features were prepared from"),
    (lambda e, f, p: (e + [{"id": "f", "context": "x"}], f, p), "1 example(s) have no feature (the first: id 'f')"),
    (lambda e, f, p: (e + e, f, p), "examples[0] and examples[1] share the id 'e'"),
    (lambda e, f, p: ([{"id": "e"}], f, p), "examples[0] has no 'context'"),
    (lambda e, f, p: (e, [{"example_id": "e"}], p), "features[0] has no 'offset_mapping'"),
])
def test_malformed_inputs_are_refused_naming_the_problem_and_the_fix(change, message):
    with pytest.raises(ValueError) as raised:
        postprocess_qa_predictions(*change(*_good()))

    assert message in str(raised.value)


@pytest.mark.parametrize("options, message", [
    ({"n_best_size": 0}, "n_best_size=0 must be a whole number of at least 1"),
    ({"max_answer_length": 2.5}, "max_answer_length=2.5 must be a whole number"),
])
def test_settings_below_one_are_refused(options, message):
    with pytest.raises(ValueError, match=message):
        postprocess_qa_predictions(*_good(), **options)


def test_beam_arrays_narrower_than_the_beams_are_refused():
    case = _beam_case(0)
    narrow = (*case["predictions"][:2], case["predictions"][2][:, :1], *case["predictions"][3:])

    with pytest.raises(ValueError) as raised:
        postprocess_qa_predictions_with_beam_search(case["examples"], case["features"], narrow,
                                                    start_n_top=case["start_n_top"], end_n_top=2)

    assert "end_top_log_probs has shape" in str(raised.value)
    assert "pass the model config's start_n_top and end_n_top" in str(raised.value)


def test_written_files_equal_transformers_byte_for_byte(tmp_path):
    case = _case(3)
    options = {"version_2_with_negative": True, "n_best_size": 5, "max_answer_length": 30}
    folder = tmp_path / "theirs"
    folder.mkdir()
    reference.postprocess_qa_predictions(reference.Rows(case["examples"]), case["features"], case["predictions"],
                                         output_dir=str(folder), prefix="eval", **options)
    ours = postprocess_qa_predictions(case["examples"], case["features"], case["predictions"], **options)

    written = write_predictions(tmp_path / "ours", ours, prefix="eval")

    assert [path.name for path in written] == ["eval_predictions.json", "eval_nbest_predictions.json",
                                               "eval_null_odds.json"]
    assert {path.name: path.read_bytes() for path in written} == {p.name: p.read_bytes() for p in folder.iterdir()}


def test_writing_predictions_never_replaces_a_file_flaxheads_did_not_write(tmp_path):
    (tmp_path / "predictions.json").write_text("mine")
    result = postprocess_qa_predictions(*_good())

    with pytest.raises(run_files.RunConflict, match="predictions.json exists and flaxheads did not record writing it"):
        write_predictions(tmp_path, result, overwrite=True)

    assert (tmp_path / "predictions.json").read_text() == "mine"
    assert not (tmp_path / "nbest_predictions.json").exists()


def test_writing_predictions_again_needs_overwrite(tmp_path):
    first = postprocess_qa_predictions(*_good())
    write_predictions(tmp_path, first)
    second = postprocess_qa_predictions(*_good(), max_answer_length=1)

    with pytest.raises(run_files.RunConflict, match="pass overwrite=True to replace it"):
        write_predictions(tmp_path, second)
    write_predictions(tmp_path, second, overwrite=True)

    assert json.loads((tmp_path / "predictions.json").read_text()) == second.answers == {"e": "abc"}
    assert first.answers == {"e": "abc def"}
    assert run_files.recorded_outputs(None, tmp_path) >= {"predictions.json", "nbest_predictions.json"}


def test_an_unfinished_run_replaces_its_own_predictions(tmp_path):
    run_files.write_run_record(tmp_path, {"complete": False})
    write_predictions(tmp_path, postprocess_qa_predictions(*_good()))

    write_predictions(tmp_path, postprocess_qa_predictions(*_good(), max_answer_length=1))

    assert json.loads((tmp_path / "predictions.json").read_text()) == {"e": "abc"}


def test_answers_for_the_metric_are_as_run_qa_formats_them():
    v1 = postprocess_qa_predictions(*_good())
    v2 = postprocess_qa_predictions(*_good(), version_2_with_negative=True)

    beams = _beam_case(4)
    beam_v2 = postprocess_qa_predictions_with_beam_search(
        beams["examples"], beams["features"], beams["predictions"], version_2_with_negative=True,
        start_n_top=beams["start_n_top"], end_n_top=beams["end_n_top"])

    assert v1.for_metric() == [{"id": "e", "prediction_text": "abc def"}]
    assert v2.for_metric() == [{"id": "e", "prediction_text": "abc def", "no_answer_probability": 0.0}]
    # run_qa_beam_search passes its null odds.
    assert beam_v2.for_metric() == [{"id": key, "prediction_text": text, "no_answer_probability": odds}
                                    for (key, text), odds in zip(beam_v2.answers.items(), beam_v2.null_odds.values())]
