"""The training loss's class weights and label smoothing: exact against PyTorch's losses (and a
NumPy reference of the formula), through the train step, with errors that name the setting."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers

import flaxheads
from flaxheads import problem
from flaxheads.training.config import TrainConfig

RNG = np.random.default_rng(0)
LOGITS = RNG.normal(size=(7, 3)).astype(np.float32) * 3
LABELS = np.array([0, 2, 1, 2, 2, 0, 1])
WEIGHTS = (0.5, 2.0, 1.25)


def _weighted(logits, labels, problem_type, **options) -> float:
    numerators, denominators = problem.weighted_loss_terms(logits, labels, problem_type, **options)
    return float(np.sum(numerators) / np.sum(denominators))


@pytest.mark.parametrize("weights", [None, WEIGHTS])
@pytest.mark.parametrize("smoothing", [0.0, 0.1, 0.3])
def test_single_label_loss_equals_pytorch_cross_entropy_with_weights_and_smoothing(weights, smoothing):
    expected = torch.nn.CrossEntropyLoss(weight=None if weights is None else torch.tensor(weights),
                                         label_smoothing=smoothing)(torch.tensor(LOGITS), torch.tensor(LABELS))
    ours = _weighted(LOGITS, LABELS, problem.SINGLE_LABEL, class_weights=weights, label_smoothing=smoothing)

    # The formula, in NumPy: (1 - e) w[y] (-log p_y) + e/C sum_c w_c (-log p_c), over sum w[y].
    log_p = LOGITS - np.log(np.exp(LOGITS).sum(-1, keepdims=True))
    w = np.ones(3) if weights is None else np.asarray(weights)
    numerator = (1 - smoothing) * w[LABELS] * -log_p[np.arange(7), LABELS] + smoothing / 3 * -(log_p * w).sum(-1)
    reference = numerator.sum() / w[LABELS].sum()
    print(f"weights={weights} smoothing={smoothing}: ours {ours:.7f}, torch {float(expected):.7f}")
    np.testing.assert_allclose(ours, float(expected), rtol=1e-6)
    np.testing.assert_allclose(ours, reference, rtol=1e-6)


def test_label_smoothing_alone_is_the_trainers_label_smoother():
    from transformers.trainer_pt_utils import LabelSmoother

    expected = LabelSmoother(epsilon=0.2)({"logits": torch.tensor(LOGITS)}, torch.tensor(LABELS))

    np.testing.assert_allclose(_weighted(LOGITS, LABELS, problem.SINGLE_LABEL, label_smoothing=0.2), float(expected),
                               rtol=1e-6)


def test_multi_label_positive_weights_equal_pytorchs_bce_with_logits():
    labels = (RNG.random((7, 3)) < 0.4).astype(np.float32)
    expected = torch.nn.BCEWithLogitsLoss(pos_weight=torch.tensor(WEIGHTS))(torch.tensor(LOGITS), torch.tensor(labels))

    np.testing.assert_allclose(_weighted(LOGITS, labels, problem.MULTI_LABEL, class_weights=WEIGHTS), float(expected),
                               rtol=1e-6)


def test_without_options_the_terms_are_the_plain_loss():
    numerators, denominators = problem.weighted_loss_terms(LOGITS, LABELS, problem.SINGLE_LABEL)
    np.testing.assert_array_equal(numerators, problem.per_example_loss(LOGITS, LABELS, problem.SINGLE_LABEL))
    assert np.all(np.asarray(denominators) == 1)


def test_balanced_weights_are_scikit_learns_and_negatives_over_positives_for_multi_label():
    from sklearn.utils.class_weight import compute_class_weight

    labels = np.array([0, 0, 0, 0, 1, 2, 2])
    expected = compute_class_weight("balanced", classes=np.arange(3), y=labels)
    np.testing.assert_allclose(problem.balanced_class_weights(labels, problem.SINGLE_LABEL, 3), expected)
    multi = np.array([[1, 0], [1, 1], [0, 0], [1, 0]])
    assert problem.balanced_class_weights(multi, problem.MULTI_LABEL, 2) == (1 / 3, 3.0)
    with pytest.raises(ValueError, match="class 2 has no training example"):
        problem.balanced_class_weights(np.array([0, 1, 1]), problem.SINGLE_LABEL, 3)


@pytest.mark.slow
def test_the_train_step_reports_the_weighted_smoothed_loss_of_the_whole_batch(tiny_bert):
    """Split into micro-batches or not, the step's loss is sum(numerators) / sum(denominators) over
    the real examples of the batch: the objective PyTorch computes on the same batch."""
    import jax
    import jax.numpy as jnp
    import optax
    from flax import nnx

    from flaxheads.training.step import TrainState, make_train_step

    model = flaxheads.from_pretrained(tiny_bert, num_labels=3, seed=1)
    rng = np.random.default_rng(3)
    ids = rng.integers(1000, 2000, (8, 6)).astype(np.int32)
    batch = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids),
             "labels": np.array([0, 1, 2, 2, 0, 1, 1, 2]), "example_mask": np.array([1, 1, 1, 1, 1, 1, 0, 1], np.float32)}
    model.eval()
    logits = np.asarray(model(jnp.asarray(ids), jnp.asarray(batch["attention_mask"]), jnp.asarray(batch["token_type_ids"])))
    real = batch["example_mask"] > 0
    expected = torch.nn.CrossEntropyLoss(weight=torch.tensor(WEIGHTS), label_smoothing=0.1)(
        torch.tensor(logits[real]), torch.tensor(batch["labels"][real]))
    graphdef, params = nnx.split(model)
    tx = optax.sgd(0.0)
    step = jax.jit(make_train_step(graphdef, tx, optax.constant_schedule(0.0), problem.SINGLE_LABEL,
                                   class_weights=WEIGHTS, label_smoothing=0.1))
    for accum in (1, 2):
        stacked = {k: v.reshape(accum, -1, *v.shape[1:]) for k, v in batch.items()}

        _, metrics = step(TrainState(jnp.int32(0), params, tx.init(params)), stacked, jax.random.key(0))

        print(f"accum {accum}: step loss {float(metrics['loss']):.7f}, torch {float(expected):.7f}")
        np.testing.assert_allclose(float(metrics["loss"]), float(expected), rtol=2e-6)


@pytest.mark.parametrize("settings, data, named", [
    (dict(class_weights="1,2,3"), "binary", r"class_weights='1,2,3' gives 3 weight\(s\) but the data has 2 classes"),
    (dict(class_weights="balanced"), "scores", r"class_weights='balanced' weights classes, but the data reads as regression"),
    (dict(label_smoothing_factor=0.1), "scores", r"label_smoothing_factor=0.1 smooths single-label targets"),
])
def test_settings_that_do_not_fit_the_data_are_refused_before_training(tiny_bert, settings, data, named):
    texts = ["a fine film", "dull", "great", "tedious"]
    labels = ["pos", "neg", "pos", "neg"] if data == "binary" else [0.5, -1.5, 2.25, 0.1]
    model = flaxheads.from_pretrained(tiny_bert, num_labels=2 if data == "binary" else 1)
    with pytest.raises(ValueError, match=named):
        flaxheads.Trainer(model, TrainConfig(output_dir=None, max_steps=1, **settings), train_dataset=(texts, labels),
                          tokenizer=transformers.AutoTokenizer.from_pretrained(tiny_bert))


def test_class_weights_are_part_of_the_run_identity(tiny_bert):
    texts, labels = ["a fine film", "dull", "great", "tedious"], ["pos", "neg", "pos", "pos"]
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_bert)

    def identity(**settings):
        trainer = flaxheads.Trainer(flaxheads.from_pretrained(tiny_bert, num_labels=2),
                                    TrainConfig(output_dir=None, max_steps=1, **settings),
                                    train_dataset=(texts, labels), tokenizer=tokenizer)
        return trainer.identity["trained"]

    assert "objective" not in identity()
    assert identity(class_weights="balanced")["objective"] == {"class_weights": [2.0, 2 / 3]}
    assert identity(label_smoothing_factor=0.1)["objective"] == {"label_smoothing": 0.1}


@pytest.mark.parametrize("task_name, terms", [("token-classification", "token_loss_terms"),
                                               ("multiple-choice", "choice_loss_terms")])
def test_each_task_has_one_loss_path_its_model_and_its_train_step_share(task_name, terms, monkeypatch):
    """A task's model `.loss` and its objective (what the train step computes) both go through one
    function of the task's loss terms: the same object in both modules, and replaced in either
    module, the one that looks it up there changes."""
    import importlib

    import jax.numpy as jnp

    from flaxheads import tasks

    task = tasks.TASKS[task_name]
    model_module = importlib.import_module(task.model_class.__module__)
    objective_module = importlib.import_module(type(task.objective(None, {})).__module__)
    if task_name == "token-classification":
        logits = jnp.asarray(RNG.normal(size=(2, 5, 3)), jnp.float32)
        labels = jnp.asarray([[0, 2, -100, 1, 1], [2, -100, -100, 0, 1]])
    else:
        logits, labels = jnp.asarray(LOGITS), jnp.asarray(LABELS)
    model = task.model_class.__new__(task.model_class)  # `.loss` reads no parameter
    numerators, denominators = task.objective(None, {}).loss_terms(logits, labels)
    mean = float(numerators.sum() / denominators.sum())

    assert getattr(objective_module, terms) is getattr(model_module, terms)
    assert float(model.loss(logits, labels)) == pytest.approx(mean)
    one = getattr(model_module, terms)
    doubled = lambda *args, **kwargs: (2 * one(*args, **kwargs)[0], one(*args, **kwargs)[1])  # noqa: E731
    monkeypatch.setattr(model_module, terms, doubled)
    monkeypatch.setattr(objective_module, terms, doubled)
    assert float(model.loss(logits, labels)) == pytest.approx(2 * mean)
    assert float(task.objective(None, {}).loss_terms(logits, labels)[0].sum()) == pytest.approx(2 * float(numerators.sum()))
