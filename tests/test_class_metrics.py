"""The per-class report against scikit-learn on the same predictions, and in a run's results."""

from __future__ import annotations

import json

import numpy as np
import pytest
from sklearn import metrics as sk

from flaxheads import problem
from flaxheads.training import class_metrics

RNG = np.random.default_rng(7)


def _single_label(num_classes: int, n: int = 60):
    labels = RNG.integers(0, num_classes, n)
    logits = RNG.normal(size=(n, num_classes)) + 1.5 * np.eye(num_classes)[labels]
    logits[:5] = np.round(logits[:5])  # some tied scores
    return logits, labels


@pytest.mark.parametrize("num_classes", [2, 4])
def test_single_label_report_equals_scikit_learns(num_classes):
    logits, labels = _single_label(num_classes)
    names = [f"c{i}" for i in range(num_classes)]
    predicted = logits.argmax(-1)

    ours = class_metrics.report(problem.SINGLE_LABEL, logits, labels, names)

    p, r, f, s = sk.precision_recall_fscore_support(labels, predicted, labels=range(num_classes), zero_division=0)
    for i, name in enumerate(names):
        assert ours["per_class"][name] == pytest.approx({"precision": p[i], "recall": r[i], "f1": f[i], "support": s[i]})
    for average, key in (("macro", "macro_avg"), ("weighted", "weighted_avg")):
        ap, ar, af, _ = sk.precision_recall_fscore_support(labels, predicted, average=average, zero_division=0)
        assert (ours[key]["precision"], ours[key]["recall"], ours[key]["f1"]) == pytest.approx((ap, ar, af))
    assert ours["confusion_matrix"] == sk.confusion_matrix(labels, predicted, labels=range(num_classes)).tolist()
    if num_classes == 2:
        positive = np.exp(logits[:, 1]) / np.exp(logits).sum(-1)
        assert ours["roc_auc"] == pytest.approx(sk.roc_auc_score(labels, positive))
        assert ours["pr_auc"] == pytest.approx(sk.average_precision_score(labels, positive))
    else:
        assert "roc_auc" not in ours


def test_multi_label_report_equals_scikit_learns_and_names_an_undefined_auc():
    truth = RNG.random((50, 3)) < 0.4
    truth[:, 2] = False  # a label never positive: its AUC is undefined
    logits = RNG.normal(size=(50, 3)) + 2 * truth
    logits[:4] = np.round(logits[:4])
    names = ["a", "b", "c"]

    ours = class_metrics.report(problem.MULTI_LABEL, logits, truth.astype(np.float32), names)

    p, r, f, s = sk.precision_recall_fscore_support(truth, logits > 0, zero_division=0)
    for i, name in enumerate(names):
        assert [ours["per_class"][name][k] for k in ("precision", "recall", "f1", "support")] == pytest.approx(
            [p[i], r[i], f[i], s[i]])
    for c, name in enumerate(names[:2]):
        assert ours["per_class"][name]["roc_auc"] == pytest.approx(sk.roc_auc_score(truth[:, c], logits[:, c]))
        assert ours["per_class"][name]["pr_auc"] == pytest.approx(sk.average_precision_score(truth[:, c], logits[:, c]))
    assert ours["per_class"]["c"]["roc_auc"] is None and ours["per_class"]["c"]["pr_auc"] is None
    assert ours["roc_auc"] == pytest.approx(sk.roc_auc_score(truth[:, :2], logits[:, :2], average="macro"))


def test_regression_has_no_class_report():
    assert class_metrics.report(problem.REGRESSION, np.zeros((3, 1)), np.zeros(3), ["LABEL_0"]) == {}


@pytest.mark.slow
def test_a_run_writes_the_report_of_each_scored_split_into_results_json(tiny_bert, snippets_csv, tmp_path):
    from flaxheads.training.config import TrainConfig
    from flaxheads.tasks.runs import train

    train(TrainConfig(model_name_or_path=str(tiny_bert), train_file=str(snippets_csv["train"]),
                      validation_file=str(snippets_csv["validation"]), test_file=str(snippets_csv["validation"]),
                      text_column="sentence", output_dir=str(tmp_path), max_seq_length=32, max_steps=2,
                      per_device_train_batch_size=16, save_steps=2, disable_tqdm=True))

    results = json.loads((tmp_path / "results.json").read_text())
    report = results["reports"]["validation"]
    assert set(report["per_class"]) == {"negative", "positive"}
    assert sum(map(sum, report["confusion_matrix"])) == 32 == report["macro_avg"]["support"]
    assert report["weighted_avg"]["recall"] == pytest.approx(results["validation"]["accuracy"])
    assert results["reports"]["test"] == report  # the same file, the same weights
