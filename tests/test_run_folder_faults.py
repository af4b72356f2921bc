"""Faults of the output folder a run meets, each said in one sentence that names the folder and
what to do: an output_dir that is a file, a device that fills up (the same command resumes once
there is room), a tokenized cache cut short."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

import pytest

from flaxheads import atomic
from flaxheads.cli import main
from flaxheads.training import run_dir


def _four_step_flags(model: Path, data: dict[str, Path], output_dir: Path) -> list[str]:
    """`flaxheads train` with tests/runs.py's `four_step_config` (checkpoints at steps 2 and 4)."""
    return ["train", "--model_name_or_path", str(model), "--train_file", str(data["train"]),
            "--validation_file", str(data["validation"]), "--text_column", "sentence", "--output_dir", str(output_dir),
            "--max_seq_length", "32", "--per_device_train_batch_size", "16", "--per_device_eval_batch_size", "32",
            "--learning_rate", "1e-3", "--max_steps", "4", "--logging_steps", "1", "--save_steps", "2",
            "--disable_tqdm", "--seed", "3", "--report_to", "none"]


@pytest.mark.parametrize("where", ["file", "inside_a_file"])
def test_an_output_dir_that_is_a_file_is_refused_in_one_sentence_before_anything_loads(tmp_path, capsys, where):
    file = tmp_path / "notes.txt"
    file.write_text("mine")
    output_dir = file if where == "file" else file / "run"

    assert main(["train", "--output_dir", str(output_dir), "--max_steps", "1"]) == 2

    captured = capsys.readouterr()
    assert "problem type" not in captured.out  # refused before the data was loaded
    (line,) = captured.err.strip().splitlines()
    what = "is a file, not a folder" if where == "file" else f"lies in {file}, which is a file"
    assert line.startswith(f"flaxheads train: error: output_dir {output_dir} {what}: ")
    assert "Choose another output_dir" in line and "Errno" not in line
    assert file.read_text() == "mine"


@pytest.mark.slow
@pytest.mark.parametrize("full_at", ["checkpoint", "export", "results"])
def test_a_full_device_stops_the_run_in_one_sentence_and_the_same_command_resumes(
        tiny_bert, snippets_csv, tmp_path, capsys, monkeypatch, full_at):
    out = tmp_path / "run"
    real = shutil.disk_usage

    def filling(path):  # full once checkpoint 2 is on disk (at checkpoint 4), or for the export
        full = (Path(path) == out / "checkpoints" and (out / "checkpoints" / "2").is_dir() if full_at == "checkpoint"
                else Path(path) in (out, out / "best_model"))
        return shutil._ntuple_diskusage(10**9, 10**9, 0) if full else real(path)

    def results_on_a_full_device(output_dir, results):  # a write that fails without the check before it
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(out / "results.json"))

    if full_at == "results":
        monkeypatch.setattr(run_dir, "write_results", results_on_a_full_device)
    else:
        monkeypatch.setattr(atomic.shutil, "disk_usage", filling)
    assert main(_four_step_flags(tiny_bert, snippets_csv, out)) == 2

    err = capsys.readouterr().err
    (line,) = [line for line in err.splitlines() if line.startswith("flaxheads train: error: ")]
    assert "Traceback" not in err and "Errno" not in line
    assert str(out) in line and "Free space there (or choose an output_dir on another device)" in line
    assert line.endswith("then run the same command again: it resumes from its newest checkpoint")
    monkeypatch.undo()  # room again
    assert main(_four_step_flags(tiny_bert, snippets_csv, out)) == 0
    assert f"resuming from step {2 if full_at == 'checkpoint' else 4}" in capsys.readouterr().out
    assert (out / "model.safetensors").is_file()
