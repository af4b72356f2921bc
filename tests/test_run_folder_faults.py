"""Faults of the output folder a run meets, each said in one sentence that names the folder and
what to do: an output_dir that is a file, a device that fills up (the same command resumes once
there is room), a tokenized cache cut short."""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path

import pytest

from flaxheads import atomic
from flaxheads.cli import main
from flaxheads.training import run_dir
from flaxheads.training.run_files import RunConflict
from flaxheads.training.run_lock import RunLock
from flaxheads.tasks.runs import Trainer, train
from runs import four_step_config


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


# ---------------------------------------------------------------------------------------------
# Runs refused before they train, and folders a run cannot write


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.slow
@pytest.mark.parametrize("folder", ["new", "the_users"])
def test_a_run_refused_before_it_trains_leaves_the_folder_as_it_found_it(tiny_bert, snippets_csv, tmp_path, folder):
    out = tmp_path / "run"
    if folder == "the_users":
        out.mkdir()
        (out / "NOTES.md").write_text("my notes")

    with pytest.raises(ValueError, match="has no checkpoint at step 7"):  # found once the data is tokenized
        train(four_step_config(tiny_bert, snippets_csv, out, resume_from_checkpoint="7"))

    assert (not out.exists()) if folder == "new" else sorted(os.listdir(out)) == ["NOTES.md"]


@pytest.mark.slow
def test_a_refused_explicit_resume_of_a_finished_run_leaves_it_as_it_was(finished_run, tiny_bert, snippets_csv,
                                                                         tmp_path):
    out = tmp_path / "run"
    shutil.copytree(finished_run, out)
    before = _snapshot(out)

    with pytest.raises(ValueError, match="has no checkpoint at step 7"):
        train(four_step_config(tiny_bert, snippets_csv, out, resume_from_checkpoint="7"))

    assert _snapshot(out) == before  # run.json still says complete: the same command reports it


@pytest.mark.slow
def test_a_run_killed_before_it_trains_is_recorded_so_the_next_run_is_not_refused(
        tiny_bert, snippets_csv, tmp_path, monkeypatch):
    out = tmp_path / "run"
    monkeypatch.setattr(run_dir, "undo_unstarted", lambda *args: [])  # as if SIGKILLed: nothing is put back
    real_loop = Trainer._loop

    def killed(self, *args):
        raise KeyboardInterrupt  # after its tokenized cache is written, before any checkpoint

    monkeypatch.setattr(Trainer, "_loop", killed)
    with pytest.raises(KeyboardInterrupt):
        train(four_step_config(tiny_bert, snippets_csv, out))
    assert (out / "tokenized").is_dir() and (out / "run.json").is_file()
    monkeypatch.setattr(Trainer, "_loop", real_loop)

    assert train(four_step_config(tiny_bert, snippets_csv, out))["steps"] == 4


@pytest.mark.slow
def test_a_finished_run_on_read_only_media_reports_itself_complete_without_writing(
        finished_run, tiny_bert, snippets_csv, monkeypatch, capsys):
    before = _snapshot(finished_run)

    def read_only(self):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), os.path.join(self.output_dir, ".flaxheads.lock"))

    monkeypatch.setattr(RunLock, "acquire", read_only)
    result = train(four_step_config(tiny_bert, snippets_csv, finished_run))

    assert result["already_complete"] and result["steps"] == 4
    assert "already complete" in capsys.readouterr().out
    with pytest.raises(run_dir.UnwritableFolder) as err:  # an explicit resume writes: said in one sentence
        train(four_step_config(tiny_bert, snippets_csv, finished_run, resume_from_checkpoint="2"))
    assert str(err.value).startswith(f"output_dir {finished_run} cannot be written (Read-only file system)")
    assert _snapshot(finished_run) == before


# ---------------------------------------------------------------------------------------------
# An export holds only what this run made


SWAPPED = {"cls_token": "[SEP]", "sep_token": "[CLS]"}  # what a stale file read beside the new model would say


@pytest.fixture
def tokenizer_writing_a_special_tokens_map(monkeypatch):
    """Tokenizers whose save_pretrained also writes special_tokens_map.json (as transformers 4 did);
    undone by `monkeypatch.undo()`."""
    import transformers

    real = transformers.PreTrainedTokenizerBase.save_pretrained

    def save_pretrained(self, folder, *args, **kwargs):
        saved = real(self, folder, *args, **kwargs)
        Path(folder, "special_tokens_map.json").write_text(json.dumps(SWAPPED))
        return saved

    monkeypatch.setattr(transformers.PreTrainedTokenizerBase, "save_pretrained", save_pretrained)


@pytest.mark.slow
def test_overwrite_output_dir_leaves_no_file_of_an_export_killed_before_its_record(
        tiny_bert, snippets_csv, tmp_path, monkeypatch, tokenizer_writing_a_special_tokens_map):
    out = tmp_path / "run"

    def killed(*args, **kwargs):
        raise KeyboardInterrupt  # after the export, before results.json and the final run.json

    monkeypatch.setattr(run_dir, "write_results", killed)
    with pytest.raises(KeyboardInterrupt):
        train(four_step_config(tiny_bert, snippets_csv, out))
    assert json.loads((out / "special_tokens_map.json").read_text()) == SWAPPED
    monkeypatch.undo()  # a tokenizer that writes no special_tokens_map.json

    train(four_step_config(tiny_bert, snippets_csv, out, learning_rate=5e-4, overwrite_output_dir=True))

    assert not (out / "special_tokens_map.json").exists()
    assert "special_tokens_map.json" not in json.loads((out / "run.json").read_text())["exported"]


@pytest.mark.slow
def test_a_tokenizer_file_no_run_wrote_that_the_export_would_leave_is_refused_before_training(
        tiny_bert, snippets_csv, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(tiny_bert, out)  # a model no run wrote there: overwrite_output_dir replaces it
    (out / "special_tokens_map.json").write_text(json.dumps(SWAPPED))
    (out / "added_tokens.json").write_text("{}")
    before = _snapshot(out)

    with pytest.raises(RunConflict, match=r"holds added_tokens.json, special_tokens_map.json, vocab.txt, which no "
                                          r"flaxheads run recorded writing.*Move them out of the folder"):
        train(four_step_config(tiny_bert, snippets_csv, out, overwrite_output_dir=True))

    assert _snapshot(out) == before


def test_an_export_removes_the_files_it_replaces_and_refuses_others_a_loader_would_read(hf_checkpoint, tmp_path):
    import transformers

    import flaxheads
    from flaxheads.shipped_model import minilm_path

    model = flaxheads.from_pretrained(hf_checkpoint("BertForSequenceClassification", num_labels=2).path)
    tokenizer = transformers.AutoTokenizer.from_pretrained(minilm_path())
    out = tmp_path / "export"
    out.mkdir()
    (out / "special_tokens_map.json").write_text(json.dumps(SWAPPED))

    with pytest.raises(FileExistsError, match=r"holds special_tokens_map.json, which this save does not write"):
        model.save_pretrained(out, tokenizer=tokenizer)
    assert sorted(os.listdir(out)) == ["special_tokens_map.json"]  # nothing written
    model.save_pretrained(out)  # no tokenizer: tokenizer files are not its to judge
    assert (out / "special_tokens_map.json").exists()
    model.save_pretrained(out, tokenizer=tokenizer, replaces=["special_tokens_map.json"])  # the caller's own
    assert sorted(os.listdir(out)) == ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
