"""Answers from a question-answering model's logits, as transformers' run_qa.py makes them.

`postprocess_qa_predictions(examples, features, (start_logits, end_logits))` is transformers
4.57.6's `examples/pytorch/question-answering/utils_qa.py` function of that name:

- each feature (a window of an example's context) proposes the spans pairing its `n_best_size`
  highest start logits with its `n_best_size` highest end logits, kept when both tokens lie in the
  context (their offsets are not None), the end is not before the start, the span holds at most
  `max_answer_length` tokens and, when the feature gives `token_is_max_context`, the start token
  has its most context in this window; a span's score is its start logit plus its end logit;
- an example's `n_best_size` best spans over all its windows form its n-best list, each with the
  softmax of the scores over the list as its "probability";
- SQuAD v2 (`version_2_with_negative=True`): the null answer scores the CLS logits (index 0) of
  the window where they sum lowest; it joins the n-best list (appended if it did not make it),
  and the example answers "" when the null score exceeds the best non-empty span's score by more
  than `null_score_diff_threshold`. The difference is the example's null odds (null_odds.json);
- with no span at all, the answer is the placeholder "empty" (upstream's, kept for equal scores).

`postprocess_qa_predictions_with_beam_search` is its sibling for XLNet's full head
(`XLNetForQuestionAnswering`), whose outputs are already the top start positions and, for each,
the top end positions: spans come from those beams, scores add their log-probabilities, and the
null odds are the lowest answer-class logit over the example's windows.

Both return a `QAPredictions` (answers, n-best lists, null odds) and write nothing;
`write_predictions` writes run_qa.py's predictions.json, nbest_predictions.json and null_odds.json.
Every answer, probability and null odds equals transformers' on the same inputs
(`tests/test_qa_postprocess.py` compares them on random logits, windows and offsets), except where
transformers fails: an example with every candidate text empty under SQuAD v2 (upstream raises
IndexError; here the "empty" placeholder leads its list), and an example that no feature belongs
to, which is refused here (upstream answers "empty", or takes the previous example's null score).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from flaxheads import atomic

PREDICTIONS_FILE = "predictions.json"
NBEST_FILE = "nbest_predictions.json"
NULL_ODDS_FILE = "null_odds.json"
FEATURE_FIELDS = ("example_id", "offset_mapping")
"""What post-processing reads of a feature (a window), beside the optional "token_is_max_context"."""
EMPTY_ANSWER = "empty"
"""run_qa's answer for an example none of whose windows proposes a span."""


@dataclass(frozen=True)
class QAPredictions:
    """What post-processing finds for each example, by example id, in the examples' order."""

    answers: dict[str, str]
    """The answer text ("" for no answer under SQuAD v2): predictions.json."""
    nbest: dict[str, list[dict[str, Any]]]
    """The n-best list, best first: {"start_logit", "end_logit", "text", "probability"} (the beam
    search's spans give "start_log_prob", "end_log_prob"): nbest_predictions.json."""
    null_odds: dict[str, float] | None
    """SQuAD v2: the null score minus the best non-empty span's (the beam search: the lowest
    answer-class logit), null_odds.json; None without `version_2_with_negative`."""
    no_answer_probabilities: dict[str, float] | None = None
    """SQuAD v2: what run_qa passes the squad_v2 metric as each answer's "no_answer_probability":
    0.0 (run_qa.py), or the null odds after the beam search (run_qa_beam_search.py)."""

    def for_metric(self) -> list[dict[str, Any]]:
        """The answers as `flaxheads.tasks.qa.metrics` (and `evaluate`'s squad metrics) take them, as
        run_qa.py and run_qa_beam_search.py format them: [{"id", "prediction_text"}], under SQuAD v2
        with "no_answer_probability" (`no_answer_probabilities`)."""
        if self.no_answer_probabilities is None:
            return [{"id": key, "prediction_text": text} for key, text in self.answers.items()]
        return [{"id": key, "prediction_text": text, "no_answer_probability": self.no_answer_probabilities[key]}
                for key, text in self.answers.items()]


def postprocess_qa_predictions(
    examples: Sequence[Mapping[str, Any]] | Mapping[str, Sequence[Any]],
    features: Sequence[Mapping[str, Any]] | Mapping[str, Sequence[Any]],
    predictions: tuple[np.ndarray, np.ndarray],
    version_2_with_negative: bool = False,
    n_best_size: int = 20,
    max_answer_length: int = 30,
    null_score_diff_threshold: float = 0.0,
) -> QAPredictions:
    """The answers a start/end-logits model gives `examples`, as run_qa.py's post-processing finds them.

    `examples`: rows with "id" and "context" (mappings, a datasets.Dataset, or objects with those
    attributes, as `QAExample`s), or those columns. `features`: a row (or column entry) per window,
    with "example_id" and "offset_mapping" (per token a (start, end) pair of character offsets into
    the context, None where the token is not part of it), optionally "token_is_max_context"
    ({str(token index): bool}), as run_qa.py's `prepare_validation_features` makes them (other
    columns, the model's inputs, are not read). `predictions`: (start_logits, end_logits), each
    (n_features, seq_len).

    Raises ValueError naming the problem and its fix for predictions that are not two arrays of one
    shape with a row per feature, a feature whose example is not among `examples`, an example no
    feature belongs to, examples sharing an id, and `n_best_size` or `max_answer_length` below 1.
    """
    if not isinstance(predictions, (tuple, list)) or len(predictions) != 2:
        raise ValueError("predictions must be a pair (start_logits, end_logits), each (n_features, seq_len); for "
                         "XLNetForQuestionAnswering's five outputs call postprocess_qa_predictions_with_beam_search")
    examples = _rows(examples, "examples", ("id", "context"))
    features = _rows(features, "features", FEATURE_FIELDS, ("token_is_max_context",))
    all_start, all_end = (np.asarray(logits) for logits in predictions)
    _check_logits({"start_logits": all_start, "end_logits": all_end}, len(features))
    if all_start.shape != all_end.shape:
        raise ValueError(f"start_logits {all_start.shape} and end_logits {all_end.shape} differ in shape: pass the "
                         "two outputs of the same forward pass")
    _check_at_least_one(n_best_size=n_best_size, max_answer_length=max_answer_length)
    answers, nbest, null_odds = {}, {}, {} if version_2_with_negative else None
    for example, feature_indices in _features_per_example(examples, features):
        spans, null = [], None
        for index in feature_indices:
            start_logits, end_logits = all_start[index], all_end[index]
            # The window whose CLS logits sum lowest gives the null score: every window must agree
            # that the example has no answer. Strictly lower, so the first such window wins a tie.
            null_score = start_logits[0] + end_logits[0]
            if null is None or null["score"] > null_score:
                null = {"offsets": (0, 0), "score": null_score, "start_logit": start_logits[0],
                        "end_logit": end_logits[0]}
            spans.extend(_window_spans(start_logits, end_logits, features[index], n_best_size, max_answer_length))
        if version_2_with_negative:
            spans.append(null)
        best = _best(spans, n_best_size)
        if version_2_with_negative and not any(span["offsets"] == (0, 0) for span in best):
            best.append(null)
        context = example["context"]
        entries = [{"start_logit": span["start_logit"], "end_logit": span["end_logit"],
                    "text": context[span["offsets"][0]:span["offsets"][1]]} for span in best]
        scores = [span["score"] for span in best]
        nothing = not entries or (len(entries) == 1 and entries[0]["text"] == "")
        if nothing or (version_2_with_negative and not any(entry["text"] for entry in entries)):
            entries.insert(0, {"text": EMPTY_ANSWER, "start_logit": 0.0, "end_logit": 0.0})
            scores.insert(0, 0.0)
        _add_probabilities(entries, scores)
        key = example["id"]
        if version_2_with_negative:
            best_text = next(entry for entry in entries if entry["text"] != "")
            # In the logits' own dtype, as transformers computes it, so that a tie with the threshold falls alike.
            difference = null["score"] - best_text["start_logit"] - best_text["end_logit"]
            null_odds[key] = float(difference)
            answers[key] = "" if difference > null_score_diff_threshold else best_text["text"]
        else:
            answers[key] = entries[0]["text"]
        nbest[key] = [_as_json(entry) for entry in entries]
    return QAPredictions(answers, nbest, null_odds, None if null_odds is None else dict.fromkeys(null_odds, 0.0))


def postprocess_qa_predictions_with_beam_search(
    examples: Sequence[Mapping[str, Any]] | Mapping[str, Sequence[Any]],
    features: Sequence[Mapping[str, Any]] | Mapping[str, Sequence[Any]],
    predictions: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    version_2_with_negative: bool = False,
    n_best_size: int = 20,
    max_answer_length: int = 30,
    start_n_top: int = 5,
    end_n_top: int = 5,
) -> QAPredictions:
    """The answers XLNet's full question-answering head gives `examples`, as run_qa_beam_search.py finds them.

    `predictions`: the head's (start_top_log_probs, start_top_index: (n_features, start_n_top),
    end_top_log_probs, end_top_index: (n_features, start_n_top * end_n_top), cls_logits:
    (n_features,)), `start_n_top`/`end_n_top` the model config's. The i-th start beam pairs with end
    beams i * end_n_top ... i * end_n_top + end_n_top - 1; spans are kept as in
    `postprocess_qa_predictions`. The answer is the best span's text, even under SQuAD v2 (where the
    null odds are the lowest `cls_logits` of the example's windows, for a threshold to be chosen on
    them); a window list without any span answers "" with null odds -2e-6, as transformers does.

    Raises ValueError as `postprocess_qa_predictions` does, and for beam arrays narrower than
    `start_n_top` / `start_n_top * end_n_top`.
    """
    if not isinstance(predictions, (tuple, list)) or len(predictions) != 5:
        raise ValueError("predictions must be XLNetForQuestionAnswering's five outputs (start_top_log_probs, "
                         "start_top_index, end_top_log_probs, end_top_index, cls_logits); for start and end logits "
                         "call postprocess_qa_predictions")
    examples = _rows(examples, "examples", ("id", "context"))
    features = _rows(features, "features", FEATURE_FIELDS, ("token_is_max_context",))
    names = ("start_top_log_probs", "start_top_index", "end_top_log_probs", "end_top_index", "cls_logits")
    arrays = dict(zip(names, (np.asarray(array) for array in predictions)))
    _check_at_least_one(n_best_size=n_best_size, max_answer_length=max_answer_length, start_n_top=start_n_top,
                        end_n_top=end_n_top)
    _check_beams(arrays, len(features), start_n_top, end_n_top)
    answers, nbest, null_odds = {}, {}, {} if version_2_with_negative else None
    for example, feature_indices in _features_per_example(examples, features):
        spans, min_null_score = [], None
        for index in feature_indices:
            null_score = arrays["cls_logits"][index]
            if min_null_score is None or null_score < min_null_score:
                min_null_score = null_score
            spans.extend(_beam_spans(arrays, index, features[index], start_n_top, end_n_top, max_answer_length,
                                      n_best_size))
        best = _best(spans, n_best_size)
        context = example["context"]
        entries = [{"start_log_prob": span["start_logit"], "end_log_prob": span["end_logit"],
                    "text": context[span["offsets"][0]:span["offsets"][1]]} for span in best]
        scores = [span["score"] for span in best]
        if not entries:
            # transformers' placeholder, keys and all: its null odds replace the windows' CLS logits.
            min_null_score = -2e-6
            entries, scores = [{"text": "", "start_logit": -1e-6, "end_logit": -1e-6}], [min_null_score]
        _add_probabilities(entries, scores)
        key = example["id"]
        answers[key] = entries[0]["text"]
        if version_2_with_negative:
            null_odds[key] = float(min_null_score)
        nbest[key] = [_as_json(entry) for entry in entries]
    return QAPredictions(answers, nbest, null_odds, None if null_odds is None else dict(null_odds))


def output_names(prefix: str | None = None, *, null_odds: bool = False) -> list[str]:
    """The files `write_predictions` writes: predictions.json and nbest_predictions.json (and
    null_odds.json), each `<prefix>_...` with a prefix, as run_qa.py names them ("eval", "predict")."""
    names = [PREDICTIONS_FILE, NBEST_FILE] + ([NULL_ODDS_FILE] if null_odds else [])
    return names if prefix is None else [f"{prefix}_{name}" for name in names]


def write_predictions(output_dir: str | os.PathLike, result: QAPredictions, *, prefix: str | None = None,
                      overwrite: bool = False) -> list[Path]:
    """Writes `result` into `output_dir` (created if missing) as run_qa.py does, byte for byte:
    predictions.json (id -> answer), nbest_predictions.json and, under SQuAD v2, null_odds.json
    (`output_names(prefix)`). Each file is written atomically (a temporary file and a rename) and
    recorded as flaxheads' in the folder's scoring record, so that clearing the run removes it.
    Returns the paths written.

    Never replaces a file flaxheads did not record writing (RunConflict: move it away, or choose
    another output_dir), nor, without `overwrite=True`, one a finished run or an earlier call wrote;
    while the folder's run is unfinished, its own files are replaced.
    """
    # Imported here: the run records live with training (below the tasks), whose package imports jax,
    # which post-processing itself never needs.
    from flaxheads.training import run_files

    output_dir = Path(output_dir)
    atomic.require_folder(output_dir, argument="output_dir")
    names = output_names(prefix, null_odds=result.null_odds is not None)
    record = run_files.read_run(output_dir)
    ours = run_files.recorded_outputs(record, output_dir)
    strangers = [name for name in names if os.path.lexists(output_dir / name) and name not in ours]
    if strangers:
        raise run_files.RunConflict(
            f"{output_dir / strangers[0]} exists and flaxheads did not record writing it: move it away, or choose "
            "another output_dir")
    existing = [name for name in names if os.path.lexists(output_dir / name)]
    if existing and not overwrite and not (record and record.get("complete") is False):
        raise run_files.RunConflict(f"{output_dir / existing[0]} exists; pass overwrite=True to replace it, or choose "
                                    "another output_dir")
    output_dir.mkdir(parents=True, exist_ok=True)
    scoring = run_files.read_scoring_record(output_dir) or {}
    earlier = [name for name in scoring.get("outputs") or () if isinstance(name, str)]
    # Recorded before the files exist: a kill between the two leaves a record of a missing file, never a file
    # flaxheads wrote but would take for the user's.
    run_files.write_record(output_dir / run_files.SCORING_RECORD, "scoring",
                           {"outputs": sorted(set(earlier) | set(names))})
    contents = [result.answers, result.nbest] + ([result.null_odds] if result.null_odds is not None else [])
    return [atomic.write_text(output_dir / name, json.dumps(content, indent=4) + "\n")
            for name, content in zip(names, contents)]


def _window_spans(start_logits: np.ndarray, end_logits: np.ndarray, feature: Mapping[str, Any], n_best_size: int,
                  max_answer_length: int) -> list[dict[str, Any]]:
    """The best `n_best_size` spans one window proposes (`_best_of_window`)."""
    starts = np.argsort(start_logits)[-1:-n_best_size - 1:-1]
    ends = np.argsort(end_logits)[-1:-n_best_size - 1:-1]
    rows, columns = np.nonzero(_allowed(starts[:, None], ends[None, :], feature, max_answer_length))
    starts, ends = starts[rows], ends[columns]  # row-major: by start (best first), then end, as transformers loops
    return _best_of_window(feature, starts, ends, start_logits[starts], end_logits[ends], n_best_size)


def _beam_spans(arrays: dict[str, np.ndarray], index: int, feature: Mapping[str, Any], start_n_top: int,
                end_n_top: int, max_answer_length: int, n_best_size: int) -> list[dict[str, Any]]:
    """The best `n_best_size` spans one window's beams propose: start beam i with end beams
    i * end_n_top ... (i + 1) * end_n_top - 1."""
    end_beams = np.arange(start_n_top)[:, None] * end_n_top + np.arange(end_n_top)[None, :]
    # int64 as transformers' int(): run_qa_beam_search gathers the indices into float arrays.
    starts = arrays["start_top_index"][index][:start_n_top, None].astype(np.int64)
    ends = arrays["end_top_index"][index][end_beams].astype(np.int64)
    rows, columns = np.nonzero(_allowed(starts, ends, feature, max_answer_length))
    end_beams = end_beams[rows, columns]
    return _best_of_window(feature, starts[rows, 0], ends[rows, columns], arrays["start_top_log_probs"][index][rows],
                           arrays["end_top_log_probs"][index][end_beams], n_best_size)


def _best_of_window(feature: Mapping[str, Any], starts: np.ndarray, ends: np.ndarray, start_scores: np.ndarray,
                    end_scores: np.ndarray, n_best_size: int) -> list[dict[str, Any]]:
    """The `n_best_size` best of one window's spans (in transformers' order: ties keep it), as
    {"offsets", "score", "start_logit", "end_logit"} with numpy scalars. Only a window's n best can
    be among its example's n best, and a stable sort keeps equal scores in order, so the example's
    list is the one transformers builds from every span."""
    scores = start_scores + end_scores  # elementwise in the logits' dtype, as transformers adds two scalars
    top = np.argsort(-scores, kind="stable")[:n_best_size]
    offsets = feature["offset_mapping"]
    return [{"offsets": (offsets[start][0], offsets[end][1]), "score": scores[k], "start_logit": start_scores[k],
             "end_logit": end_scores[k]}
            for k, start, end in zip(top.tolist(), starts[top].tolist(), ends[top].tolist())]


def _allowed(starts: np.ndarray, ends: np.ndarray, feature: Mapping[str, Any], max_answer_length: int) -> np.ndarray:
    """Which (start, end) token pairs (broadcast) make an answer: both tokens in the context, the end
    not before the start, at most `max_answer_length` tokens, and the start where the window gives it
    its most context (when the feature says, with "token_is_max_context")."""
    offsets = feature["offset_mapping"]
    most_context = feature.get("token_is_max_context")

    def in_context(token: int) -> bool:
        return token < len(offsets) and offsets[token] is not None and len(offsets[token]) >= 2

    def may_start(token: int) -> bool:
        return in_context(token) and (most_context is None or bool(most_context.get(str(token), False)))

    start_ok = np.array([may_start(token) for token in starts.ravel().tolist()], bool).reshape(starts.shape)
    end_ok = np.array([in_context(token) for token in ends.ravel().tolist()], bool).reshape(ends.shape)
    length = ends - starts + 1
    return start_ok & end_ok & (length >= 1) & (length <= max_answer_length)


def _best(spans: list[dict[str, Any]], n_best_size: int) -> list[dict[str, Any]]:
    """The `n_best_size` highest-scoring spans, best first; equal scores keep their order (Python's
    stable `sorted(..., reverse=True)`, as transformers sorts)."""
    return sorted(spans, key=lambda span: span["score"], reverse=True)[:n_best_size]


def _add_probabilities(entries: list[dict[str, Any]], scores: list[Any]) -> None:
    """Each entry's softmax over `scores`, in the scores' dtype (numpy's, from the same list as
    transformers builds it, so that float32 logits give float32 probabilities as there)."""
    scores = np.array(scores)
    exp_scores = np.exp(scores - np.max(scores))
    for probability, entry in zip(exp_scores / exp_scores.sum(), entries):
        entry["probability"] = probability


def _as_json(entry: dict[str, Any]) -> dict[str, Any]:
    """`entry` with numpy numbers as Python floats, ready for JSON."""
    return {key: value if isinstance(value, str) else float(value) for key, value in entry.items()}


def _rows(table: Sequence[Any] | Mapping[str, Sequence[Any]], name: str, required: tuple[str, ...],
          optional: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """`table`'s `required` and `optional` fields as a list of dicts, one per row. `table` is rows
    (mappings, a datasets.Dataset, or objects with those attributes, as `QAExample`s) or columns
    (a dict of lists, a tokenizer's BatchEncoding: its other columns are not read). ValueError
    naming a missing field."""
    wanted = required + optional
    if isinstance(table, Mapping):
        missing = [key for key in required if key not in table]
        if missing:
            raise ValueError(f"{name} has no column {missing[0]!r}: give it columns (or rows) with {required}")
        columns = {key: list(table[key]) for key in wanted if key in table}
        lengths = {key: len(values) for key, values in columns.items()}
        if len(set(lengths.values())) > 1:
            raise ValueError(f"{name}' columns differ in length ({lengths}): give each column one entry per row")
        count = next(iter(lengths.values()))
        return [{key: values[i] for key, values in columns.items()} for i in range(count)]
    rows = []
    for i, row in enumerate(table):
        if isinstance(row, Mapping):
            fields = {key: row[key] for key in wanted if key in row}
        else:
            fields = {key: getattr(row, key) for key in wanted if hasattr(row, key)}
        missing = [key for key in required if key not in fields]
        if missing:
            raise ValueError(f"{name}[{i}] has no {missing[0]!r}: each row needs {required}")
        rows.append(fields)
    return rows


def _features_per_example(examples: list[Mapping[str, Any]], features: list[Mapping[str, Any]]):
    """(example, the indices of its features) for each example, in the examples' order."""
    index_of: dict[Any, int] = {}
    for i, example in enumerate(examples):
        if example["id"] in index_of:
            raise ValueError(f"examples[{index_of[example['id']]}] and examples[{i}] share the id {example['id']!r}: "
                             "give each example its own id (its features name it in example_id)")
        index_of[example["id"]] = i
    per_example: list[list[int]] = [[] for _ in examples]
    for i, feature in enumerate(features):
        example = index_of.get(feature["example_id"])
        if example is None:
            raise ValueError(f"features[{i}] has example_id={feature['example_id']!r}, which no example has: pass the "
                             "examples the features were prepared from")
        per_example[example].append(i)
    alone = [example["id"] for example, indices in zip(examples, per_example) if not indices]
    if alone:
        raise ValueError(f"{len(alone)} example(s) have no feature (the first: id {alone[0]!r}), so nothing answers "
                         "them: pass every feature prepared from the examples, or only the examples whose features "
                         "you pass")
    return zip(examples, per_example)


def _check_logits(logits: dict[str, np.ndarray], n_features: int) -> None:
    for name, array in logits.items():
        if array.ndim != 2 or len(array) != n_features:
            raise ValueError(f"{name} has shape {array.shape}; it needs one row of logits per feature: "
                             f"({n_features}, seq_len) for the {n_features} features passed")


def _check_beams(arrays: dict[str, np.ndarray], n_features: int, start_n_top: int, end_n_top: int) -> None:
    widths = {"start_top_log_probs": start_n_top, "start_top_index": start_n_top,
              "end_top_log_probs": start_n_top * end_n_top, "end_top_index": start_n_top * end_n_top}
    for name, width in widths.items():
        array = arrays[name]
        if array.ndim != 2 or len(array) != n_features or array.shape[1] < width:
            raise ValueError(f"{name} has shape {array.shape}; with start_n_top={start_n_top}, end_n_top={end_n_top} "
                             f"it needs ({n_features}, {width}) for the {n_features} features passed: pass the "
                             "model config's start_n_top and end_n_top")
    if arrays["cls_logits"].shape != (n_features,):
        raise ValueError(f"cls_logits has shape {arrays['cls_logits'].shape}; it needs one logit per feature: "
                         f"({n_features},)")


def _check_at_least_one(**values: int) -> None:
    for name, value in values.items():
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name}={value!r} must be a whole number of at least 1")
