"""Problem types: losses equal the ones transformers' classifiers compute, labels are checked with
messages that say what was expected and which setting to change."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
import torch

import flaxheads
from flaxheads import MULTI_LABEL, REGRESSION, SINGLE_LABEL, problem

BATCH = 6


def random_logits(num_labels: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(BATCH, num_labels)).astype(np.float32) * 3


def assert_loss_matches(ours, theirs: torch.Tensor, what: str) -> None:
    print(f"{what}: flaxheads {float(ours):.7f} torch {float(theirs):.7f}")
    np.testing.assert_allclose(float(ours), float(theirs), rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------------------------------------
# Losses equal transformers' (the torch losses its *ForSequenceClassification uses)


def test_regression_loss_with_one_label_equals_torch_mse():
    logits = random_logits(1)
    labels = np.random.default_rng(1).normal(size=(BATCH,)).astype(np.float32)

    ours = problem.loss(jnp.asarray(logits), jnp.asarray(labels), problem_type=None, num_labels=1)

    # transformers squeezes both sides when num_labels == 1
    theirs = torch.nn.MSELoss()(torch.from_numpy(logits).squeeze(), torch.from_numpy(labels).squeeze())
    assert_loss_matches(ours, theirs, "regression, 1 target")


def test_regression_loss_with_several_targets_equals_torch_mse():
    logits = random_logits(3)
    labels = np.random.default_rng(1).normal(size=(BATCH, 3)).astype(np.float32)

    ours = problem.loss(jnp.asarray(logits), jnp.asarray(labels), problem_type=REGRESSION, num_labels=3)

    theirs = torch.nn.MSELoss()(torch.from_numpy(logits), torch.from_numpy(labels))
    assert_loss_matches(ours, theirs, "regression, 3 targets")


@pytest.mark.parametrize("num_labels", [2, 5])
def test_single_label_loss_equals_torch_cross_entropy(num_labels):
    logits = random_logits(num_labels)
    labels = np.random.default_rng(1).integers(0, num_labels, BATCH)

    ours = problem.loss(jnp.asarray(logits), jnp.asarray(labels), problem_type=None, num_labels=num_labels)

    theirs = torch.nn.CrossEntropyLoss()(torch.from_numpy(logits), torch.from_numpy(labels))
    assert_loss_matches(ours, theirs, f"single-label, {num_labels} classes")


def test_multi_label_loss_equals_torch_bce_with_logits():
    logits = random_logits(4)
    labels = np.random.default_rng(1).integers(0, 2, (BATCH, 4)).astype(np.float32)

    ours = problem.loss(jnp.asarray(logits), jnp.asarray(labels), problem_type=None, num_labels=4)

    theirs = torch.nn.BCEWithLogitsLoss()(torch.from_numpy(logits), torch.from_numpy(labels))
    assert_loss_matches(ours, theirs, "multi-label")


def test_bfloat16_logits_are_upcast_before_the_loss():
    logits = random_logits(3)
    labels = np.arange(BATCH) % 3

    ours = problem.loss(jnp.asarray(logits, jnp.bfloat16), jnp.asarray(labels), problem_type=None, num_labels=3)

    assert ours.dtype == jnp.float32
    expected = torch.nn.CrossEntropyLoss()(torch.from_numpy(logits).bfloat16().float(), torch.from_numpy(labels))
    assert_loss_matches(ours, expected, "single-label from bfloat16 logits")


@pytest.mark.parametrize(
    ("num_labels", "labels"),
    [
        (1, np.linspace(-1, 1, BATCH).astype(np.float32)),
        (3, np.arange(BATCH) % 3),
        (3, (np.arange(BATCH * 3).reshape(BATCH, 3) % 2).astype(np.float32)),
    ],
    ids=["regression", "single_label", "multi_label"],
)
def test_example_mask_averages_over_real_examples_only(num_labels, labels):
    logits = random_logits(num_labels)
    example_mask = np.array([1, 1, 0, 1, 0, 1])
    real = example_mask == 1

    masked = problem.loss(
        jnp.asarray(logits), jnp.asarray(labels), problem_type=None, num_labels=num_labels,
        example_mask=jnp.asarray(example_mask),
    )
    subset = problem.loss(
        jnp.asarray(logits[real]), jnp.asarray(labels[real]), problem_type=None, num_labels=num_labels
    )

    np.testing.assert_allclose(float(masked), float(subset), rtol=1e-6)


def test_example_mask_of_all_zeros_gives_zero_loss_not_nan():
    loss = problem.loss(
        jnp.asarray(random_logits(3)), jnp.zeros(BATCH, jnp.int32), problem_type=None, num_labels=3,
        example_mask=jnp.zeros(BATCH),
    )

    assert float(loss) == 0.0


# ---------------------------------------------------------------------------------------------
# Inference of the problem type (transformers' rule)


@pytest.mark.parametrize(
    ("num_labels", "labels", "expected"),
    [
        (1, np.zeros(BATCH, np.float32), REGRESSION),
        (1, np.zeros(BATCH, np.int32), REGRESSION),
        (3, np.zeros(BATCH, np.int32), SINGLE_LABEL),
        (3, np.zeros(BATCH, np.int64), SINGLE_LABEL),
        (3, np.zeros((BATCH, 3), np.float32), MULTI_LABEL),
    ],
    ids=["one-label-float", "one-label-int", "int32", "int64", "float-multi-hot"],
)
def test_problem_type_is_inferred_as_transformers_does(num_labels, labels, expected):
    assert problem.infer_problem_type(num_labels, jnp.asarray(labels)) == expected
    resolved = problem.check_labels(jnp.asarray(labels), num_labels=num_labels, problem_type=None, batch_size=BATCH)
    assert resolved == expected


def test_explicit_problem_type_overrides_inference():
    labels = jnp.asarray(np.zeros((BATCH, 3), np.int32))

    assert problem.check_labels(labels, num_labels=3, problem_type=MULTI_LABEL, batch_size=BATCH) == MULTI_LABEL


def test_regression_accepts_column_labels_for_one_target():
    labels = jnp.zeros((BATCH, 1))

    assert problem.check_labels(labels, num_labels=1, problem_type=None, batch_size=BATCH) == REGRESSION


# ---------------------------------------------------------------------------------------------
# Label errors


def test_float_class_ids_with_two_labels_say_the_shape_and_suggest_integers_or_regression():
    labels = jnp.asarray([0.0, 1.0, 1.0, 0.0, 1.0, 0.0])

    with pytest.raises(ValueError) as err:
        problem.check_labels(labels, num_labels=2, problem_type=None, batch_size=BATCH)

    message = str(err.value)
    assert "expects multi-hot float labels of shape (6, 2)" in message
    assert "got labels of shape (6,)" in message
    assert "integer labels" in message and "num_labels=1" in message


def test_float_labels_with_single_label_problem_type_ask_for_integer_class_ids():
    labels = jnp.asarray(np.zeros(BATCH, np.float32))

    with pytest.raises(ValueError, match=r"expects integer class ids of shape \(6,\).*float32"):
        problem.check_labels(labels, num_labels=3, problem_type=SINGLE_LABEL, batch_size=BATCH)


def test_class_id_out_of_range_names_the_id_and_num_labels():
    labels = jnp.asarray([0, 1, 2, 7, 1, 0])

    with pytest.raises(ValueError, match=r"class id 7 is outside \[0, 3\) for num_labels=3.*at least 8"):
        problem.check_labels(labels, num_labels=3, problem_type=None, batch_size=BATCH)


def test_negative_class_id_is_refused():
    with pytest.raises(ValueError, match=r"class id -1"):
        problem.loss(jnp.zeros((BATCH, 3)), jnp.asarray([0, 1, -1, 0, 1, 2]), problem_type=None, num_labels=3)


def test_multi_hot_width_mismatch_says_to_set_num_labels():
    labels = jnp.zeros((BATCH, 4))

    with pytest.raises(ValueError, match=r"num_labels=3 expects .*\(6, 3\), got labels of shape \(6, 4\).*width"):
        problem.check_labels(labels, num_labels=3, problem_type=None, batch_size=BATCH)


def test_single_label_class_ids_of_wrong_shape_suggest_multi_label():
    labels = jnp.zeros((BATCH, 3), jnp.int32)

    with pytest.raises(ValueError, match=r"class ids of shape \(6,\).*multi_label_classification"):
        problem.check_labels(labels, num_labels=3, problem_type=SINGLE_LABEL, batch_size=BATCH)


def test_regression_labels_of_wrong_shape_name_the_expected_shapes():
    with pytest.raises(ValueError, match=r"expects float labels of shape \(6,\) or \(6, 1\)"):
        problem.check_labels(jnp.zeros((BATCH, 2)), num_labels=1, problem_type=None, batch_size=BATCH)


def test_single_label_with_one_label_suggests_regression():
    with pytest.raises(ValueError, match=r"needs num_labels >= 2.*'regression'"):
        problem.check_problem_type(SINGLE_LABEL, 1)


def test_loss_checks_labels_before_computing():
    with pytest.raises(ValueError, match="class id 3"):
        problem.loss(jnp.zeros((BATCH, 3)), jnp.full((BATCH,), 3), problem_type=None, num_labels=3)


def test_model_loss_uses_the_problem_type_its_checkpoint_records(hf_checkpoint):
    checkpoint = hf_checkpoint("BertForSequenceClassification", num_labels=3, problem_type=MULTI_LABEL)
    model = flaxheads.from_pretrained(checkpoint.path)
    logits = random_logits(3)
    multi_hot = np.array([[1, 0, 1]] * BATCH)  # integer multi-hot: inference alone would say single-label

    ours = model.loss(jnp.asarray(logits), jnp.asarray(multi_hot))

    theirs = torch.nn.BCEWithLogitsLoss()(torch.from_numpy(logits), torch.from_numpy(multi_hot).float())
    assert_loss_matches(ours, theirs, "multi-label via model.loss")


# ---------------------------------------------------------------------------------------------
# One definition: every module checks a problem type through flaxheads.problem


def _refusers():
    import datasets

    from flaxheads.data.batching import BatchFormat
    from flaxheads.data.labels import encode_labels
    from flaxheads.data.task import TaskData
    from flaxheads.training import metrics

    splits = datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": ["a"], "label": [0]})})
    return {
        "ClassifierConfig": lambda p: flaxheads.ClassifierConfig(
            backbone=flaxheads.EncoderConfig(), head="cls", problem_type=p),
        "TaskData": lambda p: TaskData(splits, p, 1, {0: "LABEL_0"}),
        "BatchFormat": lambda p: BatchFormat(max_seq_length=8, pad_token_id=0, problem_type=p),
        "encode_labels": lambda p: encode_labels(splits, problem_type=p),
        "MetricAccumulator": metrics.MetricAccumulator,
        "compute_metrics": lambda p: metrics.compute_metrics(p, np.zeros((2, 2)), np.zeros(2)),
        "probabilities": lambda p: metrics.probabilities(p, np.zeros((2, 2))),
        "per_example_loss": lambda p: problem.per_example_loss(jnp.zeros((2, 2)), jnp.zeros(2, jnp.int32), p),
    }


@pytest.mark.parametrize("where", list(_refusers()))
def test_every_module_refuses_an_unknown_problem_type_with_the_same_message(where):
    expected = f"unknown problem_type='ordinal'; choose one of {problem.PROBLEM_TYPES}"

    with pytest.raises(ValueError) as refused:
        _refusers()[where]("ordinal")

    assert str(refused.value) == expected


@pytest.mark.parametrize(
    "problem_type, num_labels, resolved",
    [(None, 1, REGRESSION), (None, 2, SINGLE_LABEL), (None, 5, SINGLE_LABEL), (MULTI_LABEL, 3, MULTI_LABEL),
     (REGRESSION, 2, REGRESSION)],
)
def test_resolved_problem_type_is_the_set_one_else_the_default_for_num_labels(problem_type, num_labels, resolved):
    assert problem.resolved_problem_type(problem_type, num_labels) == resolved


def test_resolved_problem_type_checks_the_set_one():
    with pytest.raises(ValueError, match=r"needs num_labels >= 2"):
        problem.resolved_problem_type(SINGLE_LABEL, 1)


def test_by_problem_type_picks_the_argument_named_after_the_problem_type():
    picks = {p: problem.by_problem_type(p, single_label="s", multi_label="m", regression="r", pairwise_reward="p")
             for p in problem.PROBLEM_TYPES}
    assert picks == {SINGLE_LABEL: "s", MULTI_LABEL: "m", REGRESSION: "r", problem.PAIRWISE_REWARD: "p"}
    with pytest.raises(ValueError, match="pairwise_reward.*not supported here"):
        problem.by_problem_type(problem.PAIRWISE_REWARD, single_label="s", multi_label="m", regression="r")
    with pytest.raises(ValueError, match="unknown problem_type=None"):
        problem.by_problem_type(None, single_label="s", multi_label="m", regression="r")
