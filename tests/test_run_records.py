"""What flaxheads wrote in a run folder is known by content, never by a file's name: its records
(run.json, a scoring run's record) carry a mark with the SHA-256 of their content, and every path
that clears, replaces or redraws files decides only from a record flaxheads can prove it wrote."""

from __future__ import annotations

import json

import pytest

from flaxheads import data
from flaxheads.training import run_dir, run_files
from flaxheads.training.config import TrainConfig
from flaxheads.training.run_files import RunConflict


def _identity() -> dict:
    task = data.load_in_memory({"train": (["a", "b"], [0, 1])}).task
    return run_dir.run_identity(TrainConfig(output_dir=None, dataset=None), task, {"model_type": "bert"}, "cls", 8,
                                total_steps=10, model="sha256:model", tokenizer="tokenizer", best_metric="accuracy")


def _snapshot(folder) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _every_path_that_clears_or_replaces(folder) -> dict:
    identity = _identity()
    return {
        "check_folder": lambda: run_dir.check_folder(folder, identity, explicit_resume=False),
        "check_folder overwrite": lambda: run_dir.check_folder(folder, identity, explicit_resume=False,
                                                               overwrite=True),
        "clear_run": lambda: run_dir.clear_run(folder),
        "write_predictions": lambda: run_dir.write_predictions(folder, "index\tprediction\n", overwrite=True),
    }


def test_a_run_json_another_program_wrote_is_refused_by_every_path_that_clears_or_replaces(tmp_path):
    (tmp_path / "run.json").write_text(json.dumps({"experiment": "mine", "complete": True, "outputs": []}))
    (tmp_path / "results.json").write_text("{}")
    (tmp_path / "predict_results.txt").write_text("mine")
    before = _snapshot(tmp_path)

    for name, call in _every_path_that_clears_or_replaces(tmp_path).items():
        with pytest.raises(RunConflict, match=r"run\.json was not written by flaxheads") as err:
            call()
        assert "Move run.json out of the folder" in str(err.value), name
    assert _snapshot(tmp_path) == before


def test_a_run_json_changed_after_flaxheads_wrote_it_is_refused(tmp_path):
    run_dir.write_run(tmp_path, _identity(), complete=False, model_name="m")
    record = json.loads((tmp_path / "run.json").read_text())
    record["outputs"].append("NOTES.md")  # an edit that would let overwrite_output_dir remove the user's notes
    (tmp_path / "run.json").write_text(json.dumps(record))
    (tmp_path / "NOTES.md").write_text("my notes")

    for call in _every_path_that_clears_or_replaces(tmp_path).values():
        with pytest.raises(RunConflict, match=r"run\.json was changed after flaxheads wrote it"):
            call()
    assert (tmp_path / "NOTES.md").read_text() == "my notes"


def test_a_run_json_flaxheads_wrote_is_read_back_as_it_was_written(tmp_path):
    identity = _identity()
    run_dir.write_run(tmp_path, identity, complete=False, model_name="m", exported=["config.json"])

    record = run_files.read_run(tmp_path)

    assert record["identity"] == json.loads(json.dumps(identity)) and record["exported"] == ["config.json"]
    assert run_files.MARK not in record
    assert run_dir.check_folder(tmp_path, identity, explicit_resume=False) == record


def test_a_run_json_of_an_earlier_version_without_the_mark_is_still_read(tmp_path):
    identity = json.loads(json.dumps(_identity()))
    earlier = {"identity": identity, "complete": False, "model_name": "m", "outputs": list(run_files.RUN_OUTPUTS),
               "exported": [], "command": "flaxheads train"}
    (tmp_path / "run.json").write_text(json.dumps(earlier))

    assert run_files.read_run(tmp_path) == earlier
    assert run_dir.check_folder(tmp_path, _identity(), explicit_resume=False) == earlier
    (tmp_path / "run.json").write_text(json.dumps({**earlier, "notes": "mine"}))  # a key no version wrote
    with pytest.raises(RunConflict, match="not written by flaxheads"):
        run_files.read_run(tmp_path)


def test_a_scoring_record_flaxheads_cannot_prove_claims_no_file(tmp_path):
    (tmp_path / run_files.SCORING_RECORD).write_text(json.dumps({"outputs": ["predict_results.txt", "NOTES.md"]}))
    (tmp_path / "predict_results.txt").write_text("mine")

    assert run_files.recorded_outputs(None, tmp_path) == set()
    with pytest.raises(RunConflict, match="no flaxheads run recorded writing it"):
        run_dir.write_predictions(tmp_path, "index\tprediction\n", overwrite=True)
    assert run_dir.clear_run(tmp_path) == []
    assert (tmp_path / run_files.SCORING_RECORD).exists()


def test_a_scoring_record_flaxheads_wrote_lets_the_same_command_replace_its_predictions(tmp_path):
    run_dir.write_predictions(tmp_path, "index\tprediction\n0\ta\n")

    run_dir.write_predictions(tmp_path, "index\tprediction\n0\tb\n", overwrite=True)

    assert (tmp_path / "predict_results.txt").read_text().endswith("0\tb\n")
    assert sorted(run_dir.clear_run(tmp_path)) == [run_files.SCORING_RECORD, "predict_results.txt"]
