"""flaxheads.training.metrics against scikit-learn and SciPy, the references it matches."""

import warnings

import numpy as np
import pytest
from scipy import stats
from sklearn import metrics as skm
from sklearn.exceptions import UndefinedMetricWarning

from flaxheads.training import metrics

SEEDS = (0, 1, 2, 3, 4)


def _single_label_batch(seed, num_examples=64, num_classes=5):
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(num_examples, num_classes)).astype(np.float32)
    labels = rng.integers(0, num_classes, size=num_examples)
    return logits, labels


def _logits_predicting(predicted, num_classes):
    """Logits whose argmax is `predicted`."""
    logits = np.zeros((len(predicted), num_classes), dtype=np.float32)
    logits[np.arange(len(predicted)), predicted] = 1.0
    return logits


def _sklearn_single_label(logits, labels):
    predicted = logits.argmax(-1)
    expected = {
        "accuracy": skm.accuracy_score(labels, predicted),
        "macro_f1": skm.f1_score(labels, predicted, average="macro"),
        "mcc": skm.matthews_corrcoef(labels, predicted),
    }
    if logits.shape[1] == 2:  # run_glue's MRPC/QQP f1: the positive class's
        for name, score in (("f1", skm.f1_score), ("precision", skm.precision_score), ("recall", skm.recall_score)):
            expected[name] = score(labels, predicted, average="binary", zero_division=0.0)
    return expected


def _sklearn_multi_label(logits, labels):
    predicted = (logits > 0).astype(int)
    labels = labels.astype(int)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UndefinedMetricWarning)
        return {
            "accuracy": skm.accuracy_score(labels, predicted),
            "micro_f1": skm.f1_score(labels, predicted, average="micro"),
            "macro_f1": skm.f1_score(labels, predicted, average="macro"),
        }


def _scipy_regression(predicted, labels):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", stats.ConstantInputWarning)
        return {
            "mse": skm.mean_squared_error(labels, predicted),
            "pearson": stats.pearsonr(predicted, labels).statistic,
            "spearman": stats.spearmanr(predicted, labels).statistic,
        }


def _assert_metrics_close(actual, expected):
    assert list(actual) == list(expected)
    for name in expected:
        print(f"{name}: ours {actual[name]!r} reference {expected[name]!r}")
        np.testing.assert_allclose(
            actual[name], expected[name], rtol=1e-10, atol=1e-12, err_msg=name
        )


# --- single-label classification ------------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
def test_single_label_metrics_match_sklearn_on_random_data(seed):
    logits, labels = _single_label_batch(seed)
    actual = metrics.compute_metrics("single_label_classification", logits, labels)
    _assert_metrics_close(actual, _sklearn_single_label(logits, labels))


@pytest.mark.parametrize("seed", SEEDS)
def test_single_label_metrics_match_sklearn_on_binary_data(seed):
    logits, labels = _single_label_batch(seed, num_examples=33, num_classes=2)
    actual = metrics.compute_metrics("single_label_classification", logits, labels)
    _assert_metrics_close(actual, _sklearn_single_label(logits, labels))


@pytest.mark.parametrize("seed", SEEDS)
def test_single_label_macro_f1_skips_classes_absent_from_labels_and_predictions(seed):
    rng = np.random.default_rng(seed)
    num_classes = 6
    # Classes 2 and 5 appear nowhere; class 4 only in predictions; class 3 only in labels.
    labels = rng.choice([0, 1, 3], size=40)
    predicted = rng.choice([0, 1, 4], size=40)
    logits = _logits_predicting(predicted, num_classes)
    actual = metrics.compute_metrics("single_label_classification", logits, labels)
    _assert_metrics_close(actual, _sklearn_single_label(logits, labels))


def test_single_label_mcc_is_zero_when_predictions_are_constant():
    labels = np.array([0, 1, 2, 1, 0, 2])
    logits = _logits_predicting(np.full(6, 1), num_classes=3)
    actual = metrics.compute_metrics("single_label_classification", logits, labels)
    assert actual["mcc"] == 0.0
    _assert_metrics_close(actual, _sklearn_single_label(logits, labels))


@pytest.mark.filterwarnings("ignore:A single label was found")
def test_single_label_mcc_is_zero_when_labels_and_predictions_are_one_class():
    labels = np.zeros(5, dtype=int)
    logits = _logits_predicting(labels, num_classes=3)
    actual = metrics.compute_metrics("single_label_classification", logits, labels)
    assert actual == {"accuracy": 1.0, "macro_f1": 1.0, "mcc": 0.0}
    _assert_metrics_close(actual, _sklearn_single_label(logits, labels))


@pytest.mark.parametrize("seed", SEEDS)
def test_single_label_metrics_ignore_rows_with_zero_example_mask(seed):
    logits, labels = _single_label_batch(seed)
    example_mask = np.random.default_rng(seed + 100).integers(0, 2, size=len(labels))
    # Masked rows carry padding garbage that must not count.
    labels = np.where(example_mask == 1, labels, -100)
    actual = metrics.compute_metrics("single_label_classification", logits, labels, example_mask)
    keep = example_mask == 1
    _assert_metrics_close(actual, _sklearn_single_label(logits[keep], labels[keep]))


def test_single_label_metrics_accept_bfloat16_logits():
    import ml_dtypes

    logits, labels = _single_label_batch(7)
    actual = metrics.compute_metrics(
        "single_label_classification", logits.astype(ml_dtypes.bfloat16), labels
    )
    expected = _sklearn_single_label(logits.astype(ml_dtypes.bfloat16).astype(np.float32), labels)
    _assert_metrics_close(actual, expected)


# --- multi-label classification -------------------------------------------------------------


def _multi_label_batch(seed, num_examples=50, num_labels=6):
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(num_examples, num_labels)).astype(np.float32)
    labels = (rng.random(size=(num_examples, num_labels)) < 0.3).astype(np.float32)
    return logits, labels


@pytest.mark.parametrize("seed", SEEDS)
def test_multi_label_metrics_match_sklearn_on_random_data(seed):
    logits, labels = _multi_label_batch(seed)
    actual = metrics.compute_metrics("multi_label_classification", logits, labels)
    _assert_metrics_close(actual, _sklearn_multi_label(logits, labels))


@pytest.mark.parametrize("seed", SEEDS)
def test_multi_label_macro_f1_counts_empty_labels_as_zero_like_sklearn(seed):
    logits, labels = _multi_label_batch(seed)
    # Label 0 is never true nor predicted (F1 is 0/0 -> 0.0); label 1 is true but never predicted.
    labels[:, 0] = 0
    logits[:, 0] = -1.0
    logits[:, 1] = -1.0
    labels[0, 1] = 1
    actual = metrics.compute_metrics("multi_label_classification", logits, labels)
    _assert_metrics_close(actual, _sklearn_multi_label(logits, labels))


def test_multi_label_micro_f1_is_zero_when_nothing_is_true_or_predicted():
    logits = -np.ones((4, 3), dtype=np.float32)
    labels = np.zeros((4, 3))
    actual = metrics.compute_metrics("multi_label_classification", logits, labels)
    assert actual == {"accuracy": 1.0, "micro_f1": 0.0, "macro_f1": 0.0}
    _assert_metrics_close(actual, _sklearn_multi_label(logits, labels))


@pytest.mark.parametrize("seed", SEEDS)
def test_multi_label_metrics_ignore_rows_with_zero_example_mask(seed):
    logits, labels = _multi_label_batch(seed)
    example_mask = np.random.default_rng(seed + 100).random(len(labels)) < 0.6
    actual = metrics.compute_metrics("multi_label_classification", logits, labels, example_mask)
    _assert_metrics_close(
        actual, _sklearn_multi_label(logits[example_mask], labels[example_mask])
    )


# --- regression -----------------------------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
def test_regression_metrics_match_sklearn_and_scipy_on_random_data(seed):
    rng = np.random.default_rng(seed)
    labels = rng.normal(size=80)
    logits = (labels + rng.normal(scale=0.7, size=80))[:, None].astype(np.float32)
    actual = metrics.compute_metrics("regression", logits, labels)
    _assert_metrics_close(actual, _scipy_regression(logits[:, 0].astype(np.float64), labels))


@pytest.mark.parametrize("seed", SEEDS)
def test_regression_spearman_averages_tied_ranks_like_scipy(seed):
    rng = np.random.default_rng(seed)
    # STS-B-like scores on a 0..5 grid: many ties in labels and predictions.
    labels = rng.integers(0, 11, size=60) / 2.0
    predicted = np.round(labels + rng.normal(scale=1.0, size=60))
    actual = metrics.compute_metrics("regression", predicted, labels)
    _assert_metrics_close(actual, _scipy_regression(predicted, labels))


def test_regression_correlations_are_nan_when_predictions_are_constant():
    labels = np.array([0.1, 0.5, 0.3, 0.9])
    predicted = np.full(4, 0.5)
    actual = metrics.compute_metrics("regression", predicted, labels)
    assert np.isnan(actual["pearson"]) and np.isnan(actual["spearman"])
    _assert_metrics_close(actual, _scipy_regression(predicted, labels))


def test_regression_correlations_are_nan_with_a_single_example():
    actual = metrics.compute_metrics("regression", np.array([[1.0]]), np.array([2.0]))
    assert actual["mse"] == 1.0
    assert np.isnan(actual["pearson"]) and np.isnan(actual["spearman"])


@pytest.mark.parametrize("seed", SEEDS)
def test_regression_metrics_ignore_rows_with_zero_example_mask(seed):
    rng = np.random.default_rng(seed)
    labels = rng.normal(size=40)
    predicted = labels + rng.normal(size=40)
    example_mask = (rng.random(40) < 0.5).astype(np.float32)
    actual = metrics.compute_metrics("regression", predicted, labels, example_mask)
    keep = example_mask == 1
    _assert_metrics_close(actual, _scipy_regression(predicted[keep], labels[keep]))


def test_regression_pearson_does_not_overflow_on_huge_values():
    labels = np.array([-5e210, 5e210, 3e200, -3e200])
    predicted = np.array([-4e210, 6e210, 1e200, -2e200])
    with np.errstate(over="ignore"):  # the mse really is inf
        actual = metrics.compute_metrics("regression", predicted, labels)
    expected = stats.pearsonr(predicted, labels).statistic
    np.testing.assert_allclose(actual["pearson"], expected, rtol=1e-12)


# --- shared behaviour -----------------------------------------------------------------------


def test_compute_metrics_rejects_unknown_problem_type():
    with pytest.raises(ValueError, match="problem_type"):
        metrics.compute_metrics("ranking", np.zeros((2, 2)), np.zeros(2))


def test_compute_metrics_rejects_a_fully_masked_batch():
    logits, labels = _single_label_batch(0, num_examples=4)
    with pytest.raises(ValueError, match="example_mask"):
        metrics.compute_metrics("single_label_classification", logits, labels, np.zeros(4))


def test_compute_metrics_rejects_mask_of_wrong_length():
    logits, labels = _single_label_batch(0, num_examples=4)
    with pytest.raises(ValueError, match="example_mask"):
        metrics.compute_metrics("single_label_classification", logits, labels, np.ones(3))


@pytest.mark.parametrize("problem_type", metrics.PROBLEM_TYPES)
def test_compute_metrics_returns_the_documented_metric_names(problem_type):
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(8, {"regression": 1, "pairwise_reward": 2}.get(problem_type, 3)))
    labels = {
        "single_label_classification": rng.integers(0, 3, size=8),
        "multi_label_classification": rng.integers(0, 2, size=(8, 3)),
        "regression": rng.normal(size=8),
        "pairwise_reward": np.zeros(8),
    }[problem_type]
    result = metrics.compute_metrics(problem_type, logits, labels)
    assert tuple(result) == metrics.METRIC_NAMES[problem_type]
    assert all(type(value) is float for value in result.values())


# --- probabilities / predictions ------------------------------------------------------------


def test_single_label_probabilities_are_a_stable_softmax():
    logits = np.array([[1000.0, 1000.0, -1000.0], [0.0, np.log(3.0), 0.0]])
    probs = metrics.probabilities("single_label_classification", logits)
    np.testing.assert_allclose(probs, [[0.5, 0.5, 0.0], [0.2, 0.6, 0.2]], atol=1e-15)


def test_multi_label_probabilities_are_a_stable_sigmoid():
    logits = np.array([[-800.0, 0.0, 800.0, np.log(3.0)]])
    probs = metrics.probabilities("multi_label_classification", logits)
    np.testing.assert_allclose(probs, [[0.0, 0.5, 1.0, 0.75]], atol=1e-15)


def test_regression_probabilities_are_the_values():
    logits = np.array([[1.5], [-2.0]])
    np.testing.assert_array_equal(metrics.probabilities("regression", logits), [1.5, -2.0])


def test_predictions_follow_the_metric_decision_rules():
    logits = np.array([[0.1, 2.0, -1.0], [3.0, -0.5, 0.0]])
    np.testing.assert_array_equal(
        metrics.predictions("single_label_classification", logits), [1, 0]
    )
    np.testing.assert_array_equal(
        metrics.predictions("multi_label_classification", logits), [[1, 1, 0], [1, 0, 0]]
    )
    np.testing.assert_array_equal(metrics.predictions("regression", logits[:, :1]), [0.1, 3.0])


# --- accumulation ---------------------------------------------------------------------------


def _batches_of(arrays, batch_size):
    num_rows = len(arrays[0])
    for start in range(0, num_rows, batch_size):
        yield tuple(array[start : start + batch_size] for array in arrays)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("problem_type", metrics.PROBLEM_TYPES)
def test_accumulator_equals_one_shot_computation(problem_type, seed):
    rng = np.random.default_rng(seed)
    num_examples = 70
    if problem_type == "single_label_classification":
        logits, labels = _single_label_batch(seed, num_examples)
    elif problem_type == "multi_label_classification":
        logits, labels = _multi_label_batch(seed, num_examples)
    elif problem_type == "pairwise_reward":
        logits, labels = rng.integers(0, 3, size=(num_examples, 2)) / 2.0, np.zeros(num_examples)  # ties
    else:
        labels = rng.integers(0, 6, size=num_examples) / 2.0  # ties
        logits = labels[:, None] + rng.normal(size=(num_examples, 1))
    example_mask = (rng.random(num_examples) < 0.8).astype(np.int32)
    accumulator = metrics.MetricAccumulator(problem_type)
    for batch in _batches_of((logits, labels, example_mask), batch_size=16):
        accumulator.add(*batch)
    assert accumulator.num_examples == example_mask.sum()
    expected = metrics.compute_metrics(problem_type, logits, labels, example_mask)
    assert accumulator.compute() == expected


def test_accumulator_weights_per_example_loss_by_example_mask():
    logits, labels = _single_label_batch(0, num_examples=6)
    accumulator = metrics.MetricAccumulator("single_label_classification")
    per_example_loss = np.array([1.0, 2.0, 3.0, 99.0])  # 99 belongs to the masked row
    accumulator.add(logits[:4], labels[:4], np.array([1, 1, 1, 0]), loss=per_example_loss)
    accumulator.add(logits[4:], labels[4:], np.array([1, 1]), loss=np.array([4.0, 5.0]))
    assert accumulator.compute()["loss"] == pytest.approx((1 + 2 + 3 + 4 + 5) / 5)


def test_accumulator_weights_scalar_batch_loss_by_unmasked_count():
    logits, labels = _single_label_batch(0, num_examples=6)
    accumulator = metrics.MetricAccumulator("single_label_classification")
    accumulator.add(logits[:4], labels[:4], np.array([1, 1, 1, 0]), loss=2.0)
    accumulator.add(logits[4:], labels[4:], np.array([1, 0]), loss=6.0)
    assert accumulator.compute()["loss"] == pytest.approx((3 * 2.0 + 1 * 6.0) / 4)


def test_accumulator_leaves_loss_out_when_none_was_given():
    logits, labels = _single_label_batch(0, num_examples=6)
    accumulator = metrics.MetricAccumulator("single_label_classification")
    accumulator.add(logits, labels)
    assert "loss" not in accumulator.compute()


def test_accumulator_accepts_jax_arrays():
    import jax.numpy as jnp

    logits, labels = _single_label_batch(3, num_examples=10)
    accumulator = metrics.MetricAccumulator("single_label_classification")
    accumulator.add(jnp.asarray(logits), jnp.asarray(labels), jnp.ones(10), loss=jnp.float32(0.5))
    expected = metrics.compute_metrics("single_label_classification", logits, labels)
    result = accumulator.compute()
    assert result.pop("loss") == pytest.approx(0.5)
    assert result == expected


def test_accumulator_reset_forgets_earlier_batches():
    logits, labels = _single_label_batch(0, num_examples=8)
    accumulator = metrics.MetricAccumulator("single_label_classification")
    accumulator.add(logits[:4], labels[:4], loss=9.0)
    accumulator.reset()
    accumulator.add(logits[4:], labels[4:], loss=1.0)
    expected = metrics.compute_metrics("single_label_classification", logits[4:], labels[4:])
    assert accumulator.compute() == {**expected, "loss": 1.0}


def test_accumulator_compute_without_examples_raises():
    with pytest.raises(ValueError):
        metrics.MetricAccumulator("regression").compute()


# --- higher_is_better -----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["accuracy", "macro_f1", "micro_f1", "mcc", "pearson", "spearman"])
def test_higher_is_better_for_scores(name):
    assert metrics.higher_is_better(name)


@pytest.mark.parametrize("name", ["mse", "loss", "eval/loss"])
def test_lower_is_better_for_errors_and_loss(name):
    assert not metrics.higher_is_better(name)


def test_higher_is_better_rejects_unknown_metric():
    with pytest.raises(ValueError, match="accuracyy"):
        metrics.higher_is_better("accuracyy")


@pytest.mark.filterwarnings("ignore:A single label was found")
def test_binary_precision_and_recall_are_zero_where_sklearn_divides_by_zero():
    labels = np.array([0, 0, 0, 1])
    logits = _logits_predicting(np.zeros(4, dtype=int), num_classes=2)  # never predicts the positive class
    actual = metrics.compute_metrics("single_label_classification", logits, labels)
    assert (actual["f1"], actual["precision"], actual["recall"]) == (0.0, 0.0, 0.0)
    _assert_metrics_close(actual, _sklearn_single_label(logits, labels))
