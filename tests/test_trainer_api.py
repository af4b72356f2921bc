"""The in-memory `flaxheads.Trainer` and the run_glue settings of TrainConfig (do_train, do_eval,
eval_strategy, do_predict, report_to, warmup_steps, train_sampling_strategy), on a tiny BERT."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import datasets
import numpy as np
import pytest
import transformers

import flaxheads
from flaxheads import data
from flaxheads.model import UntrainedModel
from flaxheads.training.checkpoints import CheckpointMismatch
from flaxheads.tasks.runs import train


def _rows(path: Path) -> tuple[list[str], list[str]]:
    with open(path, encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    return [r["sentence"] for r in rows], [r["label"] for r in rows]


def _args(**overrides) -> flaxheads.TrainConfig:
    settings = dict(output_dir=None, dataset=None, text_column="sentence", max_seq_length=32,
                    per_device_train_batch_size=8, per_device_eval_batch_size=16, learning_rate=1e-3, max_steps=8,
                    warmup_ratio=0.0, logging_steps=4, disable_tqdm=True, seed=3)
    return flaxheads.TrainConfig(**{**settings, **overrides})


@pytest.fixture(scope="module")
def tokenizer(tiny_bert):
    return transformers.AutoTokenizer.from_pretrained(tiny_bert)


@pytest.fixture(scope="module")
def snippets(snippets_csv):
    return {split: _rows(path) for split, path in snippets_csv.items()}


def _model(tiny_bert, **options):
    return flaxheads.from_pretrained(tiny_bert, num_labels=2, **options)


def _logits(model, tokenizer, texts):
    enc = tokenizer(texts, padding=True, truncation=True, max_length=32, return_tensors="np")  # as the Trainer reads them
    return np.asarray(model(enc["input_ids"], enc["attention_mask"], enc["token_type_ids"]))


@pytest.fixture(scope="module")
def in_memory_run(tiny_bert, tokenizer, snippets, tmp_path_factory):
    """Lists of texts and labels, output_dir=None, run from an empty working directory."""
    model = _model(tiny_bert)
    texts = snippets["train"][0][:8]
    calls = []

    def compute_metrics(prediction):
        calls.append(prediction)
        return {"examples_seen": float(len(prediction.predictions))}

    trainer = flaxheads.Trainer(model, _args(), train_dataset=snippets["train"], eval_dataset=snippets["train"],
                                tokenizer=tokenizer, compute_metrics=compute_metrics)
    before = trainer.evaluate()
    cwd = tmp_path_factory.mktemp("empty_cwd")
    previous = os.getcwd()
    os.chdir(cwd)
    try:
        output = trainer.train()
    finally:
        os.chdir(previous)
    return dict(model=model, output=output, before=before, calls=calls, cwd=cwd, texts=texts, trainer=trainer)


@pytest.mark.slow  # a training run
def test_in_memory_training_lowers_the_loss(in_memory_run):
    before, after = in_memory_run["before"]["loss"], in_memory_run["output"].metrics["validation"]["loss"]
    print("train-data loss before", before, "after", after)
    assert after < before


@pytest.mark.slow  # a training run
def test_in_memory_training_returns_a_model_whose_logits_changed(in_memory_run, tokenizer):
    texts = in_memory_run["texts"]
    initial = _logits(in_memory_run["model"], tokenizer, texts)
    trained = _logits(in_memory_run["output"].model, tokenizer, texts)
    print("max logit change", np.abs(trained - initial).max())
    assert np.abs(trained - initial).max() > 1e-3


@pytest.mark.slow  # a training run
def test_in_memory_run_without_output_dir_writes_nothing(in_memory_run):
    assert list(in_memory_run["cwd"].iterdir()) == []


@pytest.mark.slow  # a training run
def test_compute_metrics_gets_logits_and_labels_and_its_entries_join_the_metrics(in_memory_run, snippets):
    prediction = in_memory_run["calls"][-1]
    n = len(snippets["train"][0])
    assert prediction.predictions.shape == (n, 2) and prediction.label_ids.shape == (n,)
    assert in_memory_run["output"].metrics["validation"]["examples_seen"] == n


@pytest.mark.slow  # a training run
def test_trained_model_carries_the_class_names_of_the_data(in_memory_run):
    assert in_memory_run["output"].model.config.label_names == ("negative", "positive")


@pytest.mark.slow  # a training run
def test_predict_on_texts_alone_returns_logits_in_order_without_labels(in_memory_run, tokenizer):
    trainer, texts = in_memory_run["trainer"], in_memory_run["texts"]
    logits, label_ids, metrics = trainer.predict(texts)
    assert label_ids is None and metrics == {}
    np.testing.assert_allclose(logits, _logits(in_memory_run["output"].model, tokenizer, texts), atol=1e-5)


@pytest.mark.slow  # a training run
def test_trainer_takes_a_datasets_dataset(tiny_bert, tokenizer, snippets):
    texts, labels = snippets["validation"]
    dataset = datasets.Dataset.from_dict({"sentence": texts, "label": labels})
    trainer = flaxheads.Trainer(_model(tiny_bert), _args(max_steps=1), train_dataset=dataset, eval_dataset=dataset,
                                tokenizer=tokenizer)
    output = trainer.train()
    assert output.metrics["steps"] == 1 and set(output.metrics["validation"]) >= {"accuracy", "loss"}


def test_a_model_with_another_number_of_labels_is_refused_naming_num_labels(tiny_bert, tokenizer, snippets):
    model = flaxheads.from_pretrained(tiny_bert, num_labels=3)
    with pytest.raises(ValueError, match=r"3 labels but the data has 2.*num_labels=2"):
        flaxheads.Trainer(model, _args(), train_dataset=snippets["train"], tokenizer=tokenizer)


def test_a_model_set_up_for_another_problem_type_is_refused_naming_problem_type(tiny_bert, tokenizer):
    model = flaxheads.from_pretrained(tiny_bert, num_labels=2, problem_type="multi_label_classification")
    with pytest.raises(ValueError, match=r"set up for multi_label_classification.*problem_type="):
        flaxheads.Trainer(model, _args(problem_type="single_label_classification"),
                          train_dataset={"sentence": ["a", "b"], "label": [0, 1]}, tokenizer=tokenizer)


def test_a_missing_column_names_the_column_and_the_parameter(tiny_bert, tokenizer):
    with pytest.raises(ValueError, match=r"'sentence' \(set by text_column=\).*\['text', 'label'\]"):
        flaxheads.Trainer(_model(tiny_bert), _args(), train_dataset={"text": ["a", "b"], "label": [0, 1]},
                          tokenizer=tokenizer)


@pytest.mark.slow  # a training run
def test_do_train_false_scores_the_given_model_and_leaves_it_unchanged(tiny_bert, tokenizer, snippets):
    model = _model(tiny_bert)
    trainer = flaxheads.Trainer(model, _args(do_train=False), eval_dataset=snippets["validation"],
                                tokenizer=tokenizer)
    output = trainer.train()
    texts = snippets["validation"][0][:4]
    assert output.metrics["steps"] == 0 and "accuracy" in output.metrics["validation"]
    np.testing.assert_array_equal(_logits(output.model, tokenizer, texts), _logits(model, tokenizer, texts))


def test_do_train_false_refuses_a_model_without_a_trained_classifier(tiny_bert, snippets_csv, tmp_path):
    cfg = flaxheads.TrainConfig(model_name_or_path=str(tiny_bert), train_file=str(snippets_csv["train"]),
                                validation_file=str(snippets_csv["validation"]), text_column="sentence",
                                output_dir=str(tmp_path / "out"), do_train=False, max_seq_length=32)
    with pytest.raises(UntrainedModel, match="do_train"):
        train(cfg)


# ---------------------------------------------------------------------------------------------
# A run in an output folder: warmup, evaluation schedule, predictions, report_to, identity


@pytest.fixture(scope="module")
def folder_run(tiny_bert, tokenizer, snippets, tmp_path_factory):
    out = tmp_path_factory.mktemp("folder_run")
    texts, labels = snippets["validation"]
    args = _args(output_dir=str(out), max_steps=6, warmup_steps=4, logging_steps=1, eval_strategy="steps",
                 eval_steps=3, do_predict=True, report_to="none", save_steps=100)
    trainer = flaxheads.Trainer(_model(tiny_bert), args, train_dataset=snippets["train"],
                                eval_dataset=(texts, labels), test_dataset=texts[:5], tokenizer=tokenizer)
    return dict(out=out, output=trainer.train(), args=args, texts=texts)


def _records(out: Path, split: str) -> list[dict]:
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in lines if r["split"] == split]


@pytest.mark.slow  # a training run
def test_warmup_steps_ramp_the_learning_rate_over_that_many_steps(folder_run):
    rates = [r["learning_rate"] for r in _records(folder_run["out"], "train")]
    print("learning rates", rates)
    np.testing.assert_allclose(rates[:5], [0.0, 2.5e-4, 5e-4, 7.5e-4, 1e-3], rtol=1e-5)


@pytest.mark.slow  # a training run
def test_eval_strategy_steps_evaluates_every_eval_steps(folder_run):
    assert [r["step"] for r in _records(folder_run["out"], "eval")] == [3, 6]


@pytest.mark.slow  # a training run
def test_report_to_none_writes_no_tensorboard_events(folder_run):
    assert not (folder_run["out"] / "tensorboard").exists()
    assert (folder_run["out"] / "metrics.jsonl").is_file()


@pytest.mark.slow  # a training run
def test_do_predict_writes_index_and_label_name_per_test_example(folder_run):
    lines = (folder_run["out"] / "predict_results.txt").read_text().splitlines()
    assert lines[0] == "index\tprediction" and len(lines) == 6
    assert [line.split("\t")[0] for line in lines[1:]] == ["0", "1", "2", "3", "4"]
    assert {line.split("\t")[1] for line in lines[1:]} <= {"negative", "positive"}
    assert [line.split("\t")[1] for line in lines[1:]] == folder_run["output"].predictions


@pytest.mark.slow  # a training run
def test_a_changed_warmup_is_named_as_a_difference(folder_run, tiny_bert, tokenizer, snippets):
    import dataclasses

    args = dataclasses.replace(folder_run["args"], warmup_steps=2)
    texts, labels = snippets["validation"]
    trainer = flaxheads.Trainer(_model(tiny_bert), args, train_dataset=snippets["train"],
                                eval_dataset=(texts, labels), test_dataset=texts[:5], tokenizer=tokenizer)
    with pytest.raises(CheckpointMismatch, match="warmup_steps: 4 in the folder, 2 now"):
        trainer.train()


@pytest.mark.slow  # a training run
def test_a_changed_sampling_strategy_is_named_as_a_difference(folder_run, tiny_bert, tokenizer, snippets):
    import dataclasses

    args = dataclasses.replace(folder_run["args"], train_sampling_strategy="sequential")
    texts, labels = snippets["validation"]
    trainer = flaxheads.Trainer(_model(tiny_bert), args, train_dataset=snippets["train"],
                                eval_dataset=(texts, labels), test_dataset=texts[:5], tokenizer=tokenizer)
    with pytest.raises(CheckpointMismatch, match="sampling"):
        trainer.train()


@pytest.mark.slow  # a training run
def test_the_same_in_memory_run_again_reports_itself_complete(folder_run, tiny_bert, tokenizer, snippets):
    texts, labels = snippets["validation"]
    trainer = flaxheads.Trainer(_model(tiny_bert), folder_run["args"], train_dataset=snippets["train"],
                                eval_dataset=(texts, labels), test_dataset=texts[:5], tokenizer=tokenizer)
    output = trainer.train()
    assert output.metrics["already_complete"] and output.metrics["steps"] == 6


@pytest.mark.slow  # a training run
def test_do_eval_false_scores_no_validation_split(tiny_bert, tokenizer, snippets):
    trainer = flaxheads.Trainer(_model(tiny_bert), _args(max_steps=2, do_eval=False),
                                train_dataset=snippets["train"], eval_dataset=snippets["validation"],
                                tokenizer=tokenizer)
    assert "validation" not in trainer.train().metrics


# ---------------------------------------------------------------------------------------------
# Sequential sampling


def _indexed(n: int) -> datasets.Dataset:
    return datasets.Dataset.from_dict({"input_ids": [[1, 2]] * n, "attention_mask": [[1, 1]] * n,
                                       "labels": list(range(n)), "length": [2] * n})


def test_sequential_sampling_yields_the_examples_in_the_given_order_every_epoch():
    stream = data.TrainBatches(_indexed(10), data.BatchFormat(max_seq_length=16, pad_token_id=0),
                               global_batch_size=4, seed=0, sampling="sequential")
    seen = [next(stream) for _ in range(6)]
    labels = [b["labels"][b["example_mask"] == 1].tolist() for b in seen]
    assert labels == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]] * 2


def test_sequential_stream_resumed_from_a_position_yields_the_same_batches():
    fmt = data.BatchFormat(max_seq_length=16, pad_token_id=0)
    stream = data.TrainBatches(_indexed(10), fmt, global_batch_size=4, sampling="sequential")
    for _ in range(4):
        next(stream)
    resumed = data.TrainBatches(_indexed(10), fmt, global_batch_size=4, sampling="sequential",
                                start=data.DataPosition.from_dict(stream.position.to_dict()))
    assert next(resumed)["labels"].tolist() == next(stream)["labels"].tolist()


def test_eval_example_order_puts_sharded_rows_back_in_dataset_order():
    # 5 examples, 2 shards ([0, 3), [3, 5)), global batches of 4: batch 0 holds 0, 1 | 3, 4; batch 1 holds 2.
    assert data.eval_example_order(5, 2, 4).tolist() == [0, 1, 3, 4, 2]


# ---------------------------------------------------------------------------------------------
# The run identity


def _identity(**overrides):
    from flaxheads.training import run_dir

    task = data.load_in_memory({"train": (["a", "b"], [0, 1])}).task
    return run_dir.run_identity(_args(**overrides), task, {"model_type": "bert"}, "cls", 8, total_steps=10,
                                model="sha256:model", tokenizer="tokenizer", best_metric="accuracy")


def test_the_identity_records_sampling_only_where_group_by_length_does_not_say_it():
    assert "sampling" not in _identity()["trained"]  # earlier runs' checkpoint identities still match
    assert "sampling" not in _identity(group_by_length=False)["trained"]
    assert _identity(train_sampling_strategy="sequential")["trained"]["sampling"] == "sequential"


def test_the_identity_records_the_warmup_steps_in_effect():
    assert _identity(warmup_ratio=0.25)["settings"]["warmup_steps"] == 3
    assert _identity(warmup_steps=4)["settings"]["warmup_steps"] == 4


def test_a_run_recorded_before_warmup_steps_existed_is_still_the_same_run(tmp_path):
    from flaxheads.training import run_dir

    identity = _identity()
    older = {"trained": identity["trained"],
             "settings": {k: v for k, v in identity["settings"].items() if k != "warmup_steps"}}
    run_dir.write_run(tmp_path, older, complete=False, model_name="m")
    assert run_dir.check_folder(tmp_path, identity, explicit_resume=False) is not None


def _identity_following_validation(**overrides):
    from flaxheads.training import run_dir

    task = data.load_in_memory({"train": (["a", "b"], [0, 1]), "validation": (["a", "b"], [0, 1])}).task
    return run_dir.run_identity(_args(**overrides), task, {"model_type": "bert"}, "cls", 8, total_steps=10,
                                model="sha256:model", tokenizer="tokenizer",
                                best_metric=overrides.get("metric_for_best_model") or "accuracy")


@pytest.mark.parametrize("change, named", [
    (dict(metric_for_best_model="loss"), 'selection.metric_for_best_model: "accuracy" in the folder, "loss" now'),
    (dict(greater_is_better=False), "selection.greater_is_better: true in the folder, false now"),
    (dict(load_best_model_at_end=True), "selection.load_best_model_at_end"),
    (dict(early_stopping_patience=3), "selection.early_stopping"),
])
def test_what_picks_the_best_weights_may_change_on_no_resume_not_even_an_explicit_one(tmp_path, change, named):
    from flaxheads.training import run_dir

    run_dir.write_run(tmp_path, _identity_following_validation(), complete=False, model_name="m")

    with pytest.raises(CheckpointMismatch, match=named) as err:
        run_dir.check_folder(tmp_path, _identity_following_validation(**change), explicit_resume=True)
    assert "resume_from_checkpoint=STEP" not in str(err.value)  # a checkpoint's best was picked by the old one


@pytest.mark.parametrize("change", [dict(calibrate=True), dict(learning_rate=5e-4)])
def test_calibrate_may_change_on_an_explicit_resume_only(tmp_path, change):
    """calibrate acts on the final weights after training: an explicit resume may change it, a re-run may not."""
    from flaxheads.training import run_dir

    run_dir.write_run(tmp_path, _identity_following_validation(), complete=False, model_name="m")

    assert run_dir.check_folder(tmp_path, _identity_following_validation(**change), explicit_resume=True)
    with pytest.raises(CheckpointMismatch, match=next(iter(change))):
        run_dir.check_folder(tmp_path, _identity_following_validation(**change), explicit_resume=False)


def test_a_run_recorded_before_content_fingerprints_is_still_the_same_run(tmp_path):
    """Earlier run.json files named the model by its path, had no tokenizer entry, and named data files."""
    from flaxheads.training import run_dir

    identity = _identity()
    trained = {**identity["trained"], "model": "path/to/model"}
    del trained["tokenizer"]
    run_dir.write_run(tmp_path, {"trained": trained, "settings": identity["settings"]}, complete=False, model_name="m")
    assert run_dir.check_folder(tmp_path, identity, explicit_resume=False) is not None
    assert run_dir.trained_differences(trained, identity["trained"]) == []
    assert run_dir.trained_differences({**identity["trained"], "model": "sha256:other"}, identity["trained"])
