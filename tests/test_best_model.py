"""The best model and early stopping, as transformers' Trainer names them: load_best_model_at_end
exports the best evaluation's weights and says which step; early stopping stops after
`early_stopping_patience` evaluations without an improvement, and a resumed run stops exactly
where an uninterrupted one does."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from flaxheads.training import scoring
from flaxheads.training.config import TrainConfig
from flaxheads.tasks.runs import train
from runs import stopped_after_saving

pytestmark = pytest.mark.slow  # tiny training runs


def _config(model: Path, data: dict[str, Path], output_dir: Path, **overrides) -> TrainConfig:
    settings = dict(
        model_name_or_path=str(model), train_file=str(data["train"]), validation_file=str(data["validation"]),
        text_column="sentence", output_dir=str(output_dir), max_seq_length=32, per_device_train_batch_size=16,
        per_device_eval_batch_size=32, learning_rate=1e-3, max_steps=6, logging_steps=1, save_steps=1,
        eval_strategy="steps", eval_steps=1, disable_tqdm=True, seed=3,
    )
    return TrainConfig(**{**settings, **overrides})


@pytest.fixture
def scripted_accuracy(monkeypatch):
    """Validation accuracies in the given order, one per evaluation (the loss stays real)."""
    real = scoring.SplitScorer.scores

    def script(values):
        evaluations = iter(values)

        def scores(self, split, params, *, max_batches=None):
            result = real(self, split, params, max_batches=max_batches)
            return {**result, "accuracy": next(evaluations)} if split == "validation" else result

        monkeypatch.setattr(scoring.SplitScorer, "scores", scores)

    return script


def test_early_stopping_stops_after_the_patience_and_says_so(tiny_bert, snippets_csv, tmp_path, scripted_accuracy):
    scripted_accuracy([0.5, 0.7, 0.7, 0.69, 0.9, 0.9, 0.9])

    results = train(_config(tiny_bert, snippets_csv, tmp_path, early_stopping_patience=2))

    # step 2 improves, 3 and 4 do not: stopped at 4 (and 5's 0.9 never comes)
    assert results["steps"] == 4 and results["stopped_early"] == {"step": 4, "patience": 2}
    assert results["best"]["step"] == 2 and results["best"]["value"] == 0.7


def test_an_improvement_within_the_threshold_does_not_reset_the_patience(tiny_bert, snippets_csv, tmp_path,
                                                                         scripted_accuracy):
    scripted_accuracy([0.5, 0.505, 0.509, 0.9, 0.9, 0.9, 0.9])

    results = train(_config(tiny_bert, snippets_csv, tmp_path, early_stopping_patience=2,
                            early_stopping_threshold=0.01))

    assert results["stopped_early"]["step"] == 3
    assert results["best"]["step"] == 3  # still the best, though not by enough to count


def test_a_resumed_run_stops_early_where_an_uninterrupted_one_does(tiny_bert, snippets_csv, tmp_path,
                                                                  scripted_accuracy, monkeypatch):
    scripted_accuracy([0.5, 0.7, 0.7, 0.69, 0.9, 0.9])
    with stopped_after_saving(3):
        train(_config(tiny_bert, snippets_csv, tmp_path, early_stopping_patience=2))
    scripted_accuracy([0.69, 0.9, 0.9])  # the evaluations of steps 4, 5, 6

    results = train(_config(tiny_bert, snippets_csv, tmp_path, early_stopping_patience=2))

    assert results["stopped_early"]["step"] == 4 and results["best"]["step"] == 2


@pytest.mark.parametrize("interrupted", [False, True])
def test_load_best_model_at_end_exports_the_best_evaluations_weights(tiny_bert, snippets_csv, tmp_path,
                                                                     scripted_accuracy, monkeypatch, interrupted):
    """Interrupted after the best step, the resumed run no longer holds the best weights in
    memory: they come back from best_model/."""
    scripted_accuracy([0.5, 0.8, 0.6, 0.7, 0.6, 0.6, 0.8])  # the last: the best weights re-scored
    if interrupted:
        with stopped_after_saving(3):
            train(_config(tiny_bert, snippets_csv, tmp_path, load_best_model_at_end=True))
        scripted_accuracy([0.7, 0.6, 0.6, 0.8])

    results = train(_config(tiny_bert, snippets_csv, tmp_path, load_best_model_at_end=True))

    assert results["exported_step"] == 2 == results["best"]["step"] and results["steps"] == 6
    exported, best = load_file(tmp_path / "model.safetensors"), load_file(tmp_path / "best_model" / "model.safetensors")
    assert sorted(exported) == sorted(best)
    assert all(np.array_equal(exported[name], best[name]) for name in best)
    last = json.loads((tmp_path / "results.json").read_text())
    assert last["exported_step"] == 2


def test_a_best_model_from_checkpoints_after_the_resume_point_is_never_exported(
        tiny_bert, snippets_csv, tmp_path, scripted_accuracy, capsys):
    """resume_from_checkpoint=2 abandons steps 3 and 4, whose best evaluation best_model/ holds; the
    resumed trajectory improves on step 2 no more, and its best weights (step 2's) are gone."""
    scripted_accuracy([0.5, 0.6, 0.9, 0.95, 0.95])
    with stopped_after_saving(4):
        train(_config(tiny_bert, snippets_csv, tmp_path, load_best_model_at_end=True, save_total_limit=6))
    abandoned = load_file(tmp_path / "best_model" / "model.safetensors")
    scripted_accuracy([0.1] * 10)

    results = train(_config(tiny_bert, snippets_csv, tmp_path, load_best_model_at_end=True, save_total_limit=6,
                            learning_rate=5e-4, resume_from_checkpoint="2"))

    assert results["best"]["step"] == 2 and results["exported_step"] == 6
    assert f"{tmp_path / 'best_model'} does not hold the weights of step 2" in capsys.readouterr().err
    exported = load_file(tmp_path / "model.safetensors")
    assert any(not np.array_equal(exported[name], abandoned[name]) for name in abandoned)


def test_resuming_with_another_metric_for_the_best_model_is_refused_naming_it(tiny_bert, snippets_csv, tmp_path):
    from flaxheads.training.checkpoints import CheckpointMismatch

    with stopped_after_saving(2):
        train(_config(tiny_bert, snippets_csv, tmp_path))

    for resume in (None, "2"):
        with pytest.raises(CheckpointMismatch, match='selection.metric_for_best_model: "accuracy" in the folder, '
                                                     '"macro_f1" now'):
            train(_config(tiny_bert, snippets_csv, tmp_path, metric_for_best_model="macro_f1",
                          resume_from_checkpoint=resume))


def test_without_load_best_the_last_weights_are_exported(tiny_bert, snippets_csv, tmp_path, scripted_accuracy):
    scripted_accuracy([0.5, 0.8, 0.6, 0.7, 0.6, 0.6])

    results = train(_config(tiny_bert, snippets_csv, tmp_path))

    exported, best = load_file(tmp_path / "model.safetensors"), load_file(tmp_path / "best_model" / "model.safetensors")
    assert "exported_step" not in results
    assert any(not np.array_equal(exported[name], best[name]) for name in best)


@pytest.mark.parametrize("settings, named", [
    (dict(metric_for_best_model="pearson"), r"metric_for_best_model='pearson' is not a metric of single_label"),
    (dict(load_best_model_at_end=True, validation_file=None), r"load_best_model_at_end=True follow the validation split"),
])
def test_best_model_settings_that_cannot_work_are_refused_before_training(tiny_bert, snippets_csv, tmp_path,
                                                                          settings, named):
    with pytest.raises(ValueError, match=named):
        train(_config(tiny_bert, snippets_csv, tmp_path, **settings))
    assert not (tmp_path / "metrics.jsonl").exists()


@pytest.mark.parametrize("settings, named", [
    (dict(early_stopping_patience=2, eval_strategy="no", eval_steps=None), r"turns off"),
    (dict(early_stopping_threshold=0.1), r"early_stopping_patience=None leaves off"),
    (dict(load_best_model_at_end=True, lora_r=2, lora_target_modules=("query",)), r"best LoRA adapters"),
])
def test_best_model_flags_that_contradict_are_refused_naming_both(settings, named):
    with pytest.raises(ValueError, match=named):
        TrainConfig(**settings)
