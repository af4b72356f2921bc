"""A run never writes over what it must not, never resumes another run, and never answers from
weights or a tokenizer that are not the model's: each bad folder, re-run and fault is refused
with an error that names it, or survived with a warning."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

import flaxheads
from flaxheads.cli import main
from flaxheads.inference import predict
from flaxheads.model import UntrainedModel
from flaxheads.training import checkpoints as checkpoints_lib
from flaxheads.training.checkpoints import CheckpointMismatch
from flaxheads.training.config import TrainConfig
from flaxheads.training.run_dir import RunConflict
from flaxheads.training.run_lock import RunLock, RunLocked
from flaxheads.training.trainer import NonFiniteLoss, train

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt")


def _config(model: Path, data: dict[str, Path], output_dir: Path, **overrides) -> TrainConfig:
    settings = dict(
        model_name_or_path=str(model), train_file=str(data["train"]), validation_file=str(data["validation"]),
        text_column="sentence", output_dir=str(output_dir), max_seq_length=32, per_device_train_batch_size=16,
        per_device_eval_batch_size=32, learning_rate=1e-3, max_steps=4, logging_steps=1, save_steps=2,
        disable_tqdm=True, seed=3,
    )
    settings.update(overrides)
    return TrainConfig(**settings)


def _steps(folder: Path) -> list[int]:
    return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit()) if folder.is_dir() else []


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def finished(tiny_bert, snippets_csv, tmp_path_factory) -> Path:
    """A finished 4-step run (checkpoints at 2 and 4). Tests must leave it as it is."""
    out = tmp_path_factory.mktemp("finished")
    train(_config(tiny_bert, snippets_csv, out))
    return out


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

    with pytest.raises(RunConflict, match=r"--overwrite_output_dir.*another --output_dir"):
        train(_config(tiny_bert, snippets_csv, out))
    assert _snapshot(out) == before


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

    with pytest.raises(CheckpointMismatch, match="--overwrite_output_dir") as err:
        train(_config(tiny_bert, snippets_csv, finished, **change))
    print(err.value)
    assert named in str(err.value)
    assert _snapshot(finished) == before


def test_rerun_with_other_data_of_the_same_name_is_refused_naming_its_hash(tiny_bert, snippets_csv, finished, tmp_path):
    data = {split: tmp_path / path.name for split, path in snippets_csv.items()}
    for split, path in snippets_csv.items():
        lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
        data[split].write_text("".join(lines[:-1]), encoding="utf-8")  # one row fewer

    with pytest.raises(CheckpointMismatch, match=r"data\.files\.train\.sha256"):
        train(_config(tiny_bert, data, finished))


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
    real_save = checkpoints_lib.RunCheckpoints.save

    def save_then_stop(self, state, step, meta):
        real_save(self, state, step, meta)
        if step == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(checkpoints_lib.RunCheckpoints, "save", save_then_stop)
    with pytest.raises(KeyboardInterrupt):
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
    (out / "run.json").write_text((out / "run.json").read_text().replace('"complete": true', '"complete": false'))
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

    assert "at step 4" in message and "--resume_from_checkpoint 2" in message
    assert "--dtype float32" not in message  # the run already is float32
    assert _steps(tmp_path / "checkpoints") == [2]  # save_total_limit 2 kept 2 and 3
    assert [p.name for p in (tmp_path / "checkpoints_set_aside").iterdir()] == ["3-unconfirmed"]

    monkeypatch.undo()
    with pytest.raises(CheckpointMismatch, match="--resume_from_checkpoint"):
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
    assert "--dtype float32" in str(err.value)
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
