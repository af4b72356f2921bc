"""A run never writes over what it must not, never resumes another run, and never answers from
weights or a tokenizer that are not the model's: each bad folder, re-run and fault is refused
with an error that names it, or survived with a warning."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

import flaxheads
from flaxheads.cli import main
from flaxheads.tasks.classification.inference import predict
from flaxheads.model import UntrainedModel
from flaxheads.training.checkpoints import CheckpointMismatch
from flaxheads.training.config import TrainConfig
from flaxheads.training import run_files
from flaxheads.training.run_dir import RunConflict
from flaxheads.training.run_lock import RunLock, RunLocked
from flaxheads.training.trainer import NonFiniteLoss
from flaxheads.tasks.runs import train
from runs import four_step_config, stopped_after_saving

pytestmark = pytest.mark.slow  # nearly every test trains, resumes or exports a run

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt")


_config = four_step_config
"""The settings of conftest's `finished_run` (tests/runs.py)."""


def _steps(folder: Path) -> list[int]:
    return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit()) if folder.is_dir() else []


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def finished(finished_run) -> Path:
    """A finished 4-step run (checkpoints at 2 and 4): the session's. Tests must leave it as it is."""
    return finished_run


@pytest.fixture(scope="module")
def trained_model(finished) -> Path:
    return finished


# ---------------------------------------------------------------------------------------------
# The output folder


@pytest.mark.parametrize("inside", [False, True])
def test_output_dir_that_is_or_is_inside_the_model_folder_is_refused(tiny_bert, snippets_csv, tmp_path, inside):
    model = tmp_path / "model"
    shutil.copytree(tiny_bert, model)
    before = _snapshot(model)
    output_dir = model / "run" if inside else model

    with pytest.raises(RunConflict, match="write over the checkpoint it starts from"):
        train(_config(model, snippets_csv, output_dir))
    assert _snapshot(model) == before


def test_output_dir_holding_a_model_no_run_wrote_is_refused_unless_overwrite(tiny_bert, snippets_csv, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(tiny_bert, out)
    before = _snapshot(out)

    with pytest.raises(RunConflict, match=r"overwrite_output_dir=True.*another output_dir") as err:
        train(_config(tiny_bert, snippets_csv, out))
    assert _snapshot(out) == before
    # tiny_bert's tokenizer files the export would not write: replacing the model takes moving them out
    assert "having moved out special_tokens_map.json, vocab.txt" in str(err.value)


def test_rerunning_the_same_command_reports_the_finished_run_and_changes_nothing(
        tiny_bert, snippets_csv, finished, capsys):
    before = _snapshot(finished)

    result = train(_config(tiny_bert, snippets_csv, finished))

    assert result["already_complete"] and result["steps"] == 4
    assert "already complete" in capsys.readouterr().out
    assert _snapshot(finished) == before  # results.json's seconds, metrics.jsonl, the export


@pytest.mark.parametrize("change, named", [
    (dict(learning_rate=5e-4), "learning_rate: 0.001 in the folder, 0.0005 now"),
    (dict(seed=4), "seed: 3 in the folder, 4 now"),
    (dict(max_steps=6), "max_steps: 4 in the folder, 6 now"),
    (dict(dtype="bfloat16"), "dtype"),
    (dict(head="mean"), "head"),
])
def test_rerun_with_other_settings_is_refused_naming_each_setting(tiny_bert, snippets_csv, finished, change, named):
    before = _snapshot(finished)

    with pytest.raises(CheckpointMismatch, match="overwrite_output_dir=True") as err:
        train(_config(tiny_bert, snippets_csv, finished, **change))
    print(err.value)
    assert named in str(err.value)
    # Only the training settings may change on an explicit resume: say so only then.
    assert ("resume_from_checkpoint=STEP" in str(err.value)) == (next(iter(change)) in ("learning_rate", "seed",
                                                                                        "max_steps", "dtype"))
    assert _snapshot(finished) == before


def test_rerun_with_other_data_of_the_same_name_is_refused_naming_its_hash(tiny_bert, snippets_csv, finished, tmp_path):
    data = {split: tmp_path / path.name for split, path in snippets_csv.items()}
    for split, path in snippets_csv.items():
        lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
        data[split].write_text("".join(lines[:-1]), encoding="utf-8")  # one row fewer

    with pytest.raises(CheckpointMismatch, match=r"data\.files\.train\.sha256") as err:
        train(_config(tiny_bert, data, finished))
    assert "resume_from_checkpoint" not in str(err.value)  # it would be refused too


def test_rerun_with_other_label_names_is_refused(tiny_bert, snippets_csv, finished, tmp_path):
    data = dict(snippets_csv)
    data["train"] = tmp_path / "train.csv"
    data["train"].write_text(snippets_csv["train"].read_text().replace(",positive", ",good"))
    data["validation"] = tmp_path / "validation.csv"
    data["validation"].write_text(snippets_csv["validation"].read_text().replace(",positive", ",good"))

    with pytest.raises(CheckpointMismatch, match="label_names"):
        train(_config(tiny_bert, data, finished))


def test_overwrite_output_dir_starts_over_and_keeps_the_users_own_files(tiny_bert, snippets_csv, finished, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    (out / "NOTES.md").write_text("my notes")

    result = train(_config(tiny_bert, snippets_csv, out, learning_rate=5e-4, overwrite_output_dir=True))

    assert not result.get("already_complete") and result["steps"] == 4
    assert (out / "NOTES.md").read_text() == "my notes"
    assert json.loads((out / "run.json").read_text())["identity"]["settings"]["learning_rate"] == 5e-4
    records = [json.loads(line) for line in open(out / "metrics.jsonl")]
    assert len(records) == len({(r["step"], r["split"]) for r in records})


def test_a_resumed_run_logs_each_step_once_and_counts_all_its_training_time(
        tiny_bert, snippets_csv, tmp_path, monkeypatch):
    with stopped_after_saving(2):
        train(_config(tiny_bert, snippets_csv, tmp_path))
    first_seconds = json.loads(_last_meta(tmp_path / "checkpoints"))["train_seconds"]
    result = train(_config(tiny_bert, snippets_csv, tmp_path))

    records = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    assert [r["step"] for r in records if r["split"] == "train"] == [1, 2, 3, 4]
    assert result["seconds"] > first_seconds


def _last_meta(checkpoints: Path) -> str:
    step = _steps(checkpoints)[-1]
    return next((checkpoints / str(step) / "meta").glob("*")).read_text() if (
        checkpoints / str(step) / "meta").is_dir() else (checkpoints / str(step) / "meta").read_text()


# ---------------------------------------------------------------------------------------------
# Faults: a locked folder, damaged checkpoints, non-finite losses


def test_a_second_run_on_a_locked_output_dir_refuses_at_once(tiny_bert, snippets_csv, tmp_path):
    with RunLock(tmp_path), pytest.raises(RunLocked, match=str(os.getpid())):
        train(_config(tiny_bert, snippets_csv, tmp_path))
    assert not (tmp_path / "metrics.jsonl").exists()


def test_a_damaged_newest_checkpoint_is_set_aside_and_the_run_resumes_from_the_one_before(
        tiny_bert, snippets_csv, finished, tmp_path, capsys):
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    run_files.write_run_record(out, {**run_files.read_run(out), "complete": False})
    newest = out / "checkpoints" / "4"
    for f in newest.rglob("*"):
        if f.is_file() and f.stat().st_size > 1000:
            f.write_bytes(b"\0" * f.stat().st_size)  # every large data file zeroed

    result = train(_config(tiny_bert, snippets_csv, out))

    captured = capsys.readouterr()
    assert "resuming from step 2" in captured.out
    assert "4" in captured.err and "damaged" in captured.err
    assert result["steps"] == 4
    assert list((out / "checkpoints_set_aside").iterdir())
    a, b = load_file(str(finished / "model.safetensors")), load_file(str(out / "model.safetensors"))
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


class _NanAt:
    """Makes the training loss of one step NaN, as a diverging update would."""

    def __init__(self, step: int):
        self.step, self.calls = step, 0

    def wrap(self, real):
        def step(runner, state, batch, rng):
            state, metrics = real(runner, state, batch, rng)
            self.calls += 1
            if self.calls == self.step:
                metrics = {**metrics, "loss": metrics["loss"] * np.nan}
            return state, metrics
        return step


def test_nan_stop_sets_aside_the_checkpoint_saved_after_the_last_finite_loss(
        tiny_bert, snippets_csv, tmp_path, monkeypatch):
    from flaxheads.training import parallel

    nan = _NanAt(step=4)  # step 4's loss comes from the weights of checkpoint 3
    monkeypatch.setattr(parallel.JitParallel, "step", nan.wrap(parallel.JitParallel.step))
    with pytest.raises(NonFiniteLoss) as err:
        train(_config(tiny_bert, snippets_csv, tmp_path, save_steps=1, max_steps=6))
    message = str(err.value)
    print(message)

    assert "at step 4" in message and "resume_from_checkpoint=2" in message
    assert "dtype='float32'" not in message  # the run already is float32
    assert _steps(tmp_path / "checkpoints") == [2]  # save_total_limit 2 kept 2 and 3
    assert [p.name for p in (tmp_path / "checkpoints_set_aside").iterdir()] == ["3-unconfirmed"]

    monkeypatch.undo()
    with pytest.raises(CheckpointMismatch, match="resume_from_checkpoint=STEP"):
        train(_config(tiny_bert, snippets_csv, tmp_path, save_steps=1, max_steps=6, learning_rate=5e-4))
    result = train(_config(tiny_bert, snippets_csv, tmp_path, save_steps=1, max_steps=6, learning_rate=5e-4,
                           resume_from_checkpoint="2"))
    assert result["steps"] == 6


def test_nan_stop_without_any_good_checkpoint_says_a_rerun_starts_from_pretrained(
        tiny_bert, snippets_csv, tmp_path, monkeypatch):
    from flaxheads.training import parallel

    monkeypatch.setattr(parallel.JitParallel, "step", _NanAt(step=2).wrap(parallel.JitParallel.step))
    with pytest.raises(NonFiniteLoss, match="starts from the pretrained weights") as err:
        train(_config(tiny_bert, snippets_csv, tmp_path, save_steps=1, dtype="bfloat16"))
    assert "dtype='float32'" in str(err.value)
    assert "(step None)" not in str(err.value)


def test_resume_from_checkpoint_that_does_not_exist_names_the_steps_there(tiny_bert, snippets_csv, finished):
    with pytest.raises(ValueError, match=r"2.*4"):
        train(_config(tiny_bert, snippets_csv, finished, resume_from_checkpoint="3"))


# ---------------------------------------------------------------------------------------------
# Answers: never from untrained weights, another tokenizer, or past the position limit


def test_predict_on_a_model_without_a_trained_classifier_refuses_naming_the_new_parameters(tiny_bert):
    with pytest.raises(UntrainedModel, match=r"classifier\.weight.*Fine-tune it first"):
        predict(tiny_bert, ["a fine film"])


@pytest.mark.parametrize("command", ["predict", "evaluate"])
def test_cli_refuses_an_untrained_model_with_exit_2(tiny_bert, snippets_csv, capsys, command):
    argv = ([command, "--model_name_or_path", str(tiny_bert)]
            + (["a fine film"] if command == "predict" else
               ["--train_file", str(snippets_csv["train"]), "--validation_file", str(snippets_csv["validation"]),
                "--text_column", "sentence", "--split", "validation"]))

    assert main(argv) == 2
    assert "Fine-tune it first" in capsys.readouterr().err


def test_folder_without_a_tokenizer_is_refused_naming_tokenizer_name(trained_model, tmp_path, tiny_bert):
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(trained_model / name, bare / name)

    with pytest.raises(ValueError, match="holds no tokenizer.*tokenizer_name="):
        predict(bare, ["a fine film"])
    rows = predict(bare, ["a fine film"], tokenizer_name=str(tiny_bert))
    assert rows[0]["label"] in ("negative", "positive")


def test_cli_names_the_tokenizer_flag(trained_model, tmp_path, capsys):
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(trained_model / name, bare / name)

    assert main(["predict", "--model_name_or_path", str(bare), "a fine film"]) == 2
    assert "--tokenizer_name" in capsys.readouterr().err


def test_tokenizer_with_more_tokens_than_the_model_embeds_is_refused(hf_checkpoint, trained_model, tmp_path):
    small = tmp_path / "small"
    flaxheads.from_pretrained(hf_checkpoint("BertForSequenceClassification", num_labels=2).path).save_pretrained(small)

    with pytest.raises(ValueError, match="not this model's tokenizer"):
        predict(small, ["a fine film"], tokenizer_name=str(trained_model))


def test_max_seq_length_past_the_position_limit_is_clamped_with_a_note(trained_model, capsys):
    text = "a long review " * 200  # far more than the 64 positions of the tiny model

    (row,) = predict(trained_model, [text], max_seq_length=1024)

    assert all(np.isfinite(p) for p in row["probabilities"].values())
    assert "truncated to 64 tokens" in capsys.readouterr().err


def test_non_finite_scores_are_never_printed(trained_model, tmp_path):
    broken = tmp_path / "broken"
    model = flaxheads.from_pretrained(trained_model)
    model.head.classifier.bias[...] = model.head.classifier.bias[...] * np.nan
    model.save_pretrained(broken)
    for name in TOKENIZER_FILES:
        if (trained_model / name).is_file():
            shutil.copy(trained_model / name, broken / name)

    with pytest.raises(FloatingPointError, match=r"non-finite scores for text\(s\) \[0, 1\]"):
        predict(broken, ["a fine film", "dull"])


def test_every_run_prints_its_problem_type_and_why(finished, tiny_bert, snippets_csv, capsys):
    train(_config(tiny_bert, snippets_csv, finished))

    assert "problem type single_label_classification: the label column holds strings" in capsys.readouterr().out


def test_ignore_mismatched_sizes_starts_a_new_head_for_another_label_count(
        hf_checkpoint, tiny_bert, snippets_csv, tmp_path):
    three = tmp_path / "three"
    flaxheads.from_pretrained(tiny_bert, num_labels=3).save_pretrained(three)
    for name in TOKENIZER_FILES:
        shutil.copy(tiny_bert / name, three / name)

    with pytest.raises(ValueError, match="ignore_mismatched_sizes"):
        train(_config(three, snippets_csv, tmp_path / "a", max_steps=1))
    result = train(_config(three, snippets_csv, tmp_path / "b", max_steps=1, ignore_mismatched_sizes=True))
    assert result["steps"] == 1


# ---------------------------------------------------------------------------------------------
# Files no run wrote, exports seen whole, what a run is


def _user_folder(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


@pytest.mark.parametrize("overwrite", [False, True])
def test_files_with_run_output_names_that_no_run_wrote_are_never_replaced(tiny_bert, snippets_csv, tmp_path, overwrite):
    out = _user_folder(tmp_path / "mine", {"results.json": "{}", "metrics.jsonl": "my log\n",
                                          "predict_results.txt": "mine", "checkpoints/epoch=3.ckpt": "weights",
                                          "tensorboard/events": "events"})
    before = _snapshot(out)

    with pytest.raises(RunConflict, match="no flaxheads run recorded writing there") as err:
        train(_config(tiny_bert, snippets_csv, out, do_predict=True, test_file=str(snippets_csv["validation"]),
                      overwrite_output_dir=overwrite))

    assert _snapshot(out) == before
    for name in ("results.json", "metrics.jsonl", "predict_results.txt", "checkpoints", "tensorboard"):
        assert name in str(err.value)


def test_an_adapter_folder_no_run_wrote_is_refused_before_training(tiny_bert, snippets_csv, tmp_path):
    out = _user_folder(tmp_path / "out", {"adapter/adapter_config.json": "{}", "adapter/adapter_model.safetensors": "x"})
    before = _snapshot(out)

    with pytest.raises(RunConflict, match="adapter"):
        train(_config(tiny_bert, snippets_csv, out, lora_r=2, lora_target_modules=("query",), lora_export="both"))

    assert _snapshot(out) == before and not (out / "metrics.jsonl").exists()


def test_overwrite_removes_the_earlier_runs_adapter_and_keeps_the_users_files(tiny_bert, snippets_csv, tmp_path):
    out = tmp_path / "run"
    lora = dict(lora_r=2, lora_target_modules=("query",), lora_export="both", max_steps=2, save_steps=2)
    train(_config(tiny_bert, snippets_csv, out, **lora))
    assert (out / "adapter" / "adapter_config.json").is_file()
    (out / "NOTES.md").write_text("mine")

    train(_config(tiny_bert, snippets_csv, out, max_steps=2, save_steps=2, overwrite_output_dir=True))

    assert not (out / "adapter").exists() and (out / "NOTES.md").read_text() == "mine"


def test_weights_of_another_format_the_export_would_leave_beside_are_refused_before_training(
        tiny_bert, snippets_csv, tmp_path):
    out = tmp_path / "native"
    flaxheads.from_pretrained(tiny_bert, num_labels=2).save_pretrained(out, format="flaxheads")
    before = _snapshot(out)

    with pytest.raises(RunConflict, match="flaxheads_model.safetensors.*beside"):
        train(_config(tiny_bert, snippets_csv, out, overwrite_output_dir=True))

    assert _snapshot(out) == before


def test_the_same_model_by_a_relative_or_an_absolute_path_is_the_same_run(
        tiny_bert, snippets_csv, finished, monkeypatch):
    monkeypatch.chdir(tiny_bert.parent)

    result = train(_config(Path(tiny_bert.name), snippets_csv, finished))

    assert result["already_complete"]


def test_a_kill_between_the_renames_of_an_export_leaves_a_folder_readers_refuse_until_it_is_redone(
        trained_model, tmp_path):
    """The export's files are moved in one by one; a process killed between two renames leaves the
    incomplete-marker, so predict refuses the mix of two exports instead of answering from it."""
    import subprocess
    import sys

    out = tmp_path / "export"
    shutil.copytree(trained_model, out)
    script = (
        "import os, sys, pathlib, flaxheads\n"
        "out = pathlib.Path(sys.argv[1]).resolve()\n"
        "real = os.replace\n"
        "def replace(a, b):\n"
        "    real(a, b)\n"
        "    if pathlib.Path(b).parent == out and pathlib.Path(b).name == 'config.json':\n"
        "        os._exit(9)  # killed: the new config.json is in, the new weights are not\n"
        "os.replace = replace\n"
        "model = flaxheads.from_pretrained(out, id2label=['b', 'a'])\n"
        "model.save_pretrained(out)\n"
    )
    proc = subprocess.run([sys.executable, "-c", script, str(out)], capture_output=True, text=True)
    assert proc.returncode == 9, proc.stderr[-2000:]

    with pytest.raises(ValueError, match="was being written when the writer stopped"):
        predict(out, ["a fine film"])
    flaxheads.from_pretrained(trained_model).save_pretrained(out)  # a whole export again
    assert predict(out, ["a fine film"])[0]["label"] in ("positive", "negative")


def test_predict_on_an_unexported_run_or_a_checkpoint_step_says_how_to_get_the_model(finished, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    for name in os.listdir(run):  # a run killed before its export
        if name.endswith((".json", ".safetensors", ".txt")) and name not in ("run.json", "results.json"):
            (run / name).unlink()

    assert main(["predict", "--model_name_or_path", str(run), "a fine film"]) == 2
    message = capsys.readouterr().err
    assert "has not exported its model yet" in message and "resumes from the newest checkpoint" in message
    assert main(["predict", "--model_name_or_path", str(run / "checkpoints" / "4"), "a fine film"]) == 2
    assert "checkpoint step 4 of the training run" in capsys.readouterr().err


def test_python_errors_name_python_arguments_and_the_command_line_its_flags(tiny_bert, snippets_csv, finished, capsys):
    with pytest.raises(CheckpointMismatch) as err:
        train(_config(tiny_bert, snippets_csv, finished, seed=9))
    assert "overwrite_output_dir=True" in str(err.value) and "--overwrite_output_dir" not in str(err.value)
    assert TrainConfig().output_dir is None  # an in-memory Trainer writes nothing unless told where

    code = main(["train", "--model_name_or_path", str(tiny_bert), "--train_file", str(snippets_csv["train"]),
                 "--text_column", "sentence", "--output_dir", str(finished), "--max_steps", "4", "--seed", "9"])
    assert code == 2 and "--overwrite_output_dir" in capsys.readouterr().err


def test_max_seq_length_that_leaves_no_room_for_text_is_refused(tiny_bert, snippets_csv, tmp_path):
    with pytest.raises(ValueError, match="max_seq_length=2 leaves no room for text.*2 special token"):
        train(_config(tiny_bert, snippets_csv, tmp_path, max_seq_length=2))
    assert not tmp_path.joinpath("metrics.jsonl").exists()


def test_a_training_set_of_mostly_one_class_gets_a_warning_naming_the_share(tiny_bert, snippets_csv, tmp_path, capsys):
    rows = snippets_csv["train"].read_text().splitlines()
    skewed = [rows[0]] + [r for r in rows[1:] if r.endswith(",positive")] * 3 + [
        next(r for r in rows[1:] if r.endswith(",negative"))]
    (tmp_path / "train.csv").write_text("\n".join(skewed) + "\n")

    train(_config(tiny_bert, {"train": tmp_path / "train.csv", "validation": snippets_csv["validation"]},
                  tmp_path / "out", max_steps=1, save_steps=1))

    assert re.search(r"warning: 9\d\.\d% of the \d+ train examples are 'positive'", capsys.readouterr().err)


def test_the_bar_counts_each_step_once_when_evaluations_and_saves_come_between(tiny_bert, snippets_csv, tmp_path, capsys):
    train(_config(tiny_bert, snippets_csv, tmp_path, max_steps=8, logging_steps=2, eval_steps=4, save_steps=4,
                  eval_strategy="steps", disable_tqdm=False))

    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("train  step")]
    steps = [int(re.search(r"step (\d+)/8", line).group(1)) for line in lines]
    assert steps == [1, 2, 4, 6, 8], lines  # the first step, then every logging step: never past 8
    assert "loss (mean of last 20 steps)" in lines[0] and all(" loss " in line for line in lines[1:])


def test_non_finite_validation_scores_stop_the_run_and_never_become_the_best_model(
        tiny_bert, snippets_csv, tmp_path, monkeypatch):
    from flaxheads.training import scoring

    real = scoring.SplitScorer._outputs
    calls = []

    def nan_at_the_second_evaluation(self, split, params):
        logits, labels, losses = real(self, split, params)
        calls.append(split)
        if len(calls) == 2:
            logits = logits.copy()
            logits[0, 0] = np.nan  # argmax would still "predict" a class for this row
        return logits, labels, losses

    monkeypatch.setattr(scoring.SplitScorer, "_outputs", nan_at_the_second_evaluation)
    config = _config(tiny_bert, snippets_csv, tmp_path, eval_strategy="steps", eval_steps=2)
    # Every evaluation through the full predictions (where `_outputs` is), as with compute_metrics.
    monkeypatch.setattr(scoring.SplitScorer, "scores",
                        lambda self, split, params, max_batches=None: self.predict(split, params).metrics)
    best_after_step_2 = {}

    real_export = scoring.SplitScorer.export

    def export(self, params, directory, **options):
        real_export(self, params, directory, **options)
        best_after_step_2.update(_snapshot(directory))

    monkeypatch.setattr(scoring.SplitScorer, "export", export)
    with pytest.raises(NonFiniteLoss, match="non-finite validation scores"):
        train(config)

    exported = {name: data for name, data in _snapshot(tmp_path / "best_model").items()
                if name != run_files.BEST_RECORD}  # written after the export, saying which evaluation it is
    assert exported == best_after_step_2  # the step-2 export, untouched
    assert not (tmp_path / "config.json").exists()  # no final export from those weights


def test_evaluate_refuses_non_finite_scores_and_reports_no_metric(trained_model, snippets_csv, tmp_path, capsys):
    broken = tmp_path / "broken"
    model = flaxheads.from_pretrained(trained_model)
    model.head.classifier.bias[...] = model.head.classifier.bias[...] * np.nan
    model.save_pretrained(broken)
    for name in TOKENIZER_FILES:
        if (trained_model / name).is_file():
            shutil.copy(trained_model / name, broken / name)

    code = main(["evaluate", "--model_name_or_path", str(broken), "--train_file", str(snippets_csv["train"]),
                 "--validation_file", str(snippets_csv["validation"]), "--text_column", "sentence",
                 "--split", "validation"])

    captured = capsys.readouterr()
    assert code == 2 and "non-finite logits" in captured.err and "accuracy" not in captured.out


def test_evaluate_matches_classes_by_name_and_refuses_other_classes(trained_model, snippets_csv, tmp_path):
    from flaxheads.data import load_task
    from flaxheads.tasks.classification.inference import evaluate

    renamed = {split: tmp_path / f"{split}.csv" for split in snippets_csv}
    for split, path in snippets_csv.items():  # "negative" -> "zz_negative": it now sorts after "positive"
        renamed[split].write_text(path.read_text().replace(",negative", ",zz_negative"))
    same = load_task(train_file=snippets_csv["train"], validation_file=snippets_csv["validation"],
                     text_column="sentence")
    other = load_task(train_file=renamed["train"], validation_file=renamed["validation"], text_column="sentence")

    with pytest.raises(ValueError, match=r"the data's classes \['positive', 'zz_negative'\] are not the model's"):
        evaluate(trained_model, other, "validation", max_seq_length=32)
    swapped_task = dataclasses.replace(same, id2label={0: "positive", 1: "negative"}, splits=type(same.splits)({
        name: split.map(lambda row: {"label": 1 - row["label"]}) for name, split in same.splits.items()}))
    assert evaluate(trained_model, swapped_task, "validation", max_seq_length=32) == pytest.approx(
        evaluate(trained_model, same, "validation", max_seq_length=32))


@pytest.mark.parametrize("settings, named", [
    (dict(param_dtype="bfloat16", dtype="float32"), r"dtype='float32' contradicts param_dtype='bfloat16'"),
    (dict(bf16=True, dtype="float32"), r"dtype='float32' contradicts bf16=True"),
    (dict(lora_export="both"), r"lora_export='both' exports LoRA adapters, but lora_r=0"),
    (dict(lora_target_modules=("query",)), r"lora_target_modules names layers .* but lora_r=0"),
    (dict(overwrite_output_dir=True, resume_from_checkpoint="2"), r"overwrite_output_dir=True .* resume_from_checkpoint"),
])
def test_settings_that_contradict_or_do_nothing_are_refused_naming_both(settings, named):
    with pytest.raises(ValueError, match=named):
        TrainConfig(**settings)
    assert TrainConfig(param_dtype="bfloat16").dtype == "bfloat16"  # implied, not contradicted


def test_do_predict_without_a_test_split_is_refused_before_training(tiny_bert, snippets_csv, tmp_path, capsys):
    code = main(["train", "--model_name_or_path", str(tiny_bert), "--train_file", str(snippets_csv["train"]),
                 "--text_column", "sentence", "--output_dir", str(tmp_path / "out"), "--do_predict"])

    assert code == 2 and "--do_predict predicts the test split, but the data has none" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
