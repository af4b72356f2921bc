"""Temperature scaling: the fitted temperature is the log-loss minimum (scipy's bounded search
agrees), the scores are the textbook ones (scikit-learn's log-loss and Brier score, ECE by its
definition), folding divides every head's logits exactly, and a run with calibrate=True exports
a calibrated model whose predicted classes are the uncalibrated ones."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.optimize
import sklearn.metrics
from flax import nnx

import flaxheads
from flaxheads import problem
from flaxheads.heads import HEAD_NAMES
from flaxheads.training import calibration
from flaxheads.training.config import TrainConfig
from flaxheads.tasks.runs import train


def _overconfident(rng: np.random.Generator, n: int, k: int, scale: float):
    """Labels drawn from softmax(z); the model's logits are scale * z (over-confident for scale > 1)."""
    z = rng.normal(size=(n, k)) * 1.5
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    labels = np.array([rng.choice(k, p=row) for row in p])
    return scale * z, labels


def test_the_fitted_temperature_undoes_overconfidence_and_is_the_log_loss_minimum():
    logits, labels = _overconfident(np.random.default_rng(0), 4000, 3, scale=2.5)

    t = calibration.fit_temperature(logits, labels, problem.SINGLE_LABEL)

    assert t == pytest.approx(2.5, rel=0.08)
    best = scipy.optimize.minimize_scalar(
        lambda log_t: sklearn.metrics.log_loss(labels, scipy.special.softmax(logits / np.exp(log_t), axis=1)),
        bounds=calibration.LOG_T_RANGE, method="bounded", options={"xatol": 1e-9})
    assert np.log(t) == pytest.approx(best.x, abs=1e-4)
    before = calibration.calibration_scores(logits, labels, problem.SINGLE_LABEL)
    after = calibration.calibration_scores(logits, labels, problem.SINGLE_LABEL, t)
    assert after["log_loss"] < before["log_loss"] and after["ece"] < before["ece"] / 2


def test_multi_label_temperature_minimises_the_mean_binary_cross_entropy():
    rng = np.random.default_rng(1)
    z = rng.normal(size=(3000, 4)) * 2
    labels = (rng.random(z.shape) < 1 / (1 + np.exp(-z))).astype(np.float32)
    logits = 0.4 * z  # under-confident: the temperature comes out below 1

    t = calibration.fit_temperature(logits, labels, problem.MULTI_LABEL)

    assert t == pytest.approx(0.4, rel=0.08)
    p = 1 / (1 + np.exp(-logits / t))
    scores = calibration.calibration_scores(logits, labels, problem.MULTI_LABEL, t)
    assert scores["log_loss"] == pytest.approx(sklearn.metrics.log_loss(labels.ravel(), p.ravel()), rel=1e-9)
    assert scores["brier"] == pytest.approx(sklearn.metrics.brier_score_loss(labels.ravel(), p.ravel()), rel=1e-9)


def test_single_label_scores_are_the_textbook_ones():
    rng = np.random.default_rng(2)
    logits, labels = rng.normal(size=(500, 4)) * 3, rng.integers(0, 4, size=500)
    p = scipy.special.softmax(logits, axis=1)

    scores = calibration.calibration_scores(logits, labels, problem.SINGLE_LABEL)

    assert scores["log_loss"] == pytest.approx(sklearn.metrics.log_loss(labels, p, labels=range(4)), rel=1e-9)
    assert scores["brier"] == pytest.approx(np.mean(np.sum((p - np.eye(4)[labels]) ** 2, axis=1)), rel=1e-12)
    confidence, correct = p.max(axis=1), p.argmax(axis=1) == labels
    expected = 0.0
    for lo in np.arange(15) / 15:  # the definition, bin by bin: (lo, lo + 1/15]
        inside = (confidence > lo) & (confidence <= lo + 1 / 15)
        if inside.any():
            expected += inside.sum() / len(labels) * abs(correct[inside].mean() - confidence[inside].mean())
    assert scores["ece"] == pytest.approx(expected, abs=1e-12)


def test_ece_of_a_small_case_by_hand():
    # bin (0.6, 0.667]: two predictions, confidence 0.65 each, one right -> |0.5 - 0.65| * 2/3
    # bin (0.933, 1]: one prediction, confidence 1.0, right -> 0
    ece = calibration.expected_calibration_error(np.array([0.65, 0.65, 1.0]), np.array([1, 0, 1]))
    assert ece == pytest.approx(0.15 * 2 / 3)


@pytest.mark.parametrize(("labels", "problem_type", "named"), [
    (np.zeros(40, np.int64), problem.SINGLE_LABEL, r"every example is of class 0"),
    (np.zeros((40, 3)), problem.MULTI_LABEL, r"every label of every example is absent"),
    (np.arange(29) % 2, problem.SINGLE_LABEL, r"which has 29 example\(s\): too few to fit it on \(at least 30"),
])
def test_validation_labels_no_temperature_can_be_fitted_on_are_refused_with_the_fix(labels, problem_type, named):
    # One class: the log-loss falls without end as T shrinks; the fit landed on 0.05 and the export answered that
    # class for every text with near certainty.
    logits = np.random.default_rng(0).normal(size=(len(labels), 3))

    with pytest.raises(ValueError, match=named + r".*with every class, or leave calibrate out"):
        calibration.calibrate(logits, labels, problem_type)


def test_a_temperature_at_its_search_bound_is_reported_at_the_bound_with_a_warning():
    rng = np.random.default_rng(3)
    labels = rng.integers(0, 3, size=60)
    separable = np.eye(3)[labels] * 4.0 + rng.normal(size=(60, 3)) * 0.1  # every answer right: the lower T, the better

    report = calibration.calibrate(separable, labels, problem.SINGLE_LABEL)

    assert report["temperature"] == pytest.approx(np.exp(calibration.LOG_T_RANGE[0]), rel=1e-3)
    assert report["at_bound"] == "lower" and "at the lower end of its search range" in report["warning"]
    logits, labels = _overconfident(rng, 600, 3, scale=2.5)
    fitted = calibration.calibrate(logits, labels, problem.SINGLE_LABEL)
    assert fitted["at_bound"] is None and "warning" not in fitted


@pytest.mark.parametrize("problem_type", [problem.REGRESSION, problem.PAIRWISE_REWARD])
def test_problem_types_without_class_probabilities_are_refused(problem_type):
    with pytest.raises(ValueError, match=f"calibrate .* {problem_type} has none.*leave calibrate out"):
        calibration.fit_temperature(np.zeros((3, 1)), np.zeros(3), problem_type)


@pytest.mark.parametrize("head", HEAD_NAMES)
def test_folding_divides_every_heads_logits_by_the_temperature(hf_checkpoint, head):
    checkpoint = hf_checkpoint("BertModel", num_hidden_layers=4)  # concat_last4 needs four layers
    model = flaxheads.from_pretrained(checkpoint.path, head=head, num_labels=3, seed=1)
    ids = jnp.array([[1, 23, 20, 17, 31, 2], [1, 75, 2, 0, 0, 0]])
    mask = (ids != 0).astype(jnp.int32)
    before = np.asarray(model(input_ids=ids, attention_mask=mask))
    graphdef, params = nnx.split(model)

    calibrated = nnx.merge(graphdef, calibration.folded(graphdef, params, 2.5))

    after = np.asarray(calibrated(input_ids=ids, attention_mask=mask))
    np.testing.assert_allclose(after, before / 2.5, rtol=1e-5, atol=1e-6)
    # the original weights are untouched
    np.testing.assert_array_equal(np.asarray(model(input_ids=ids, attention_mask=mask)), before)


def test_folding_takes_the_read_only_host_copies_the_best_model_is_kept_as(hf_checkpoint):
    model = flaxheads.from_pretrained(hf_checkpoint("BertModel").path, num_labels=3, seed=1)
    ids = jnp.array([[1, 23, 20, 17, 31, 2]])
    before = np.asarray(model(input_ids=ids))
    graphdef, params = nnx.split(model)
    host = jax.tree.map(np.asarray, params)  # load_best_model_at_end's weights (TrainLoop.best_params)
    assert not any(leaf.flags.writeable for leaf in jax.tree.leaves(host))

    calibrated = nnx.merge(graphdef, calibration.folded(graphdef, host, 2.5))

    np.testing.assert_allclose(np.asarray(calibrated(input_ids=ids)), before / 2.5, rtol=1e-5, atol=1e-6)


@pytest.mark.slow  # a tiny training run
def test_a_calibrated_run_exports_calibrated_logits_and_reports_before_and_after(tiny_bert, snippets_csv, tmp_path):
    settings = dict(model_name_or_path=str(tiny_bert), train_file=str(snippets_csv["train"]),
                    validation_file=str(snippets_csv["validation"]), text_column="sentence", max_seq_length=32,
                    per_device_train_batch_size=16, learning_rate=1e-3, max_steps=8, disable_tqdm=True, seed=3)
    plain = train(TrainConfig(**settings, output_dir=str(tmp_path / "plain")))
    calibrated = train(TrainConfig(**settings, output_dir=str(tmp_path / "calibrated"), calibrate=True))

    report = calibrated["calibration"]
    t = report["temperature"]
    assert report["after"]["log_loss"] <= report["before"]["log_loss"]
    assert report["before"]["log_loss"] == pytest.approx(plain["validation"]["loss"], rel=1e-5)
    assert calibrated["validation"]["loss"] == pytest.approx(report["after"]["log_loss"], rel=1e-5)
    assert calibrated["validation"]["accuracy"] == plain["validation"]["accuracy"]
    assert json.loads((tmp_path / "calibrated" / "results.json").read_text())["calibration"] == report
    assert calibrated["report"] == ["report/training_curves.png", "report/confusion_matrix.png",
                                    "report/per_class_f1.png", "report/reliability.png"]
    assert all((tmp_path / "calibrated" / name).is_file() for name in calibrated["report"])
    assert "report/reliability.png" not in plain["report"]
    ids = jnp.array([[101, 2023, 2003, 1037, 3231, 102]])
    mask = jnp.ones_like(ids)
    plain_logits = flaxheads.from_pretrained(tmp_path / "plain")(input_ids=ids, attention_mask=mask)
    calibrated_logits = flaxheads.from_pretrained(tmp_path / "calibrated")(input_ids=ids, attention_mask=mask)
    np.testing.assert_allclose(np.asarray(calibrated_logits), np.asarray(plain_logits) / t, rtol=1e-5, atol=1e-6)


def test_calibrate_without_labelled_validation_data_is_refused_before_training(tiny_bert, snippets_csv, tmp_path):
    with pytest.raises(ValueError, match="calibrate=True fits its temperature on the labelled validation split"):
        train(TrainConfig(model_name_or_path=str(tiny_bert), train_file=str(snippets_csv["train"]),
                          text_column="sentence", output_dir=str(tmp_path), max_steps=1, calibrate=True))


def test_a_run_whose_validation_split_has_one_class_is_refused_before_training(tiny_bert, snippets_csv, tmp_path):
    import csv

    with open(snippets_csv["train"], newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    one_class = [row for row in rows if row["label"] == rows[0]["label"]][:40]
    with open(tmp_path / "validation.csv", "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(one_class)

    with pytest.raises(ValueError, match=rf"calibrate=True fits its temperature on the validation split, and every "
                                         rf"example is of class '{rows[0]['label']}'"):
        train(TrainConfig(model_name_or_path=str(tiny_bert), train_file=str(snippets_csv["train"]),
                          validation_file=str(tmp_path / "validation.csv"), text_column="sentence",
                          output_dir=str(tmp_path / "run"), max_steps=1, calibrate=True))
    assert not (tmp_path / "run").exists()


@pytest.mark.slow  # a tiny training run
def test_a_run_whose_temperature_lands_on_its_bound_warns_and_results_json_says_so(tiny_bert, snippets_csv, tmp_path,
                                                                                   monkeypatch, capsys):
    # The search's own end, whatever the tiny run's logits: what the run does with a fit that stopped there.
    monkeypatch.setattr(calibration, "fit_temperature", lambda *args: float(np.exp(calibration.LOG_T_RANGE[0])))
    results = train(TrainConfig(model_name_or_path=str(tiny_bert), train_file=str(snippets_csv["train"]),
                                validation_file=str(snippets_csv["validation"]), text_column="sentence",
                                max_seq_length=32, max_steps=2, disable_tqdm=True, output_dir=str(tmp_path / "run"),
                                calibrate=True))

    saved = json.loads((tmp_path / "run" / "results.json").read_text())["calibration"]
    assert saved["at_bound"] == "lower" and saved == results["calibration"]
    err = capsys.readouterr().err
    assert "warning: calibrate: the temperature 0.05 is at the lower end of its search range" in err
    assert "leave calibrate out" in saved["warning"]
