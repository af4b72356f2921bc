"""The run report: every figure a run's results support is drawn, with its class names, titles and
axis labels (a token classifier's per entity type and per tag); the curves show every logged step
and say which step's weights were exported; `flaxheads report RUN_DIR` draws them again; a report
that cannot be drawn never fails the run."""

from __future__ import annotations

import json
import types

import numpy as np
import pytest
from PIL import Image

from flaxheads import plotting
from flaxheads.cli import main
from flaxheads.training import calibration, class_metrics, run_report
from flaxheads.tasks.runs import Trainer

NAMES = ["negative", "neutral", "positive"]


def _results(calibrated: bool = True) -> dict:
    rng = np.random.default_rng(0)
    logits, labels = rng.normal(size=(90, 3)) * 2, rng.integers(0, 3, size=90)
    report = class_metrics.report("single_label_classification", logits, labels, NAMES)
    results = {"steps": 30, "best": {"metric": "accuracy", "value": 0.61, "step": 20}, "exported_step": 20,
               "validation": {"accuracy": 0.6}, "reports": {"validation": report, "test": report}}
    if calibrated:
        results["calibration"] = calibration.calibrate(logits, labels, "single_label_classification")
    return results


def _log() -> list[dict]:
    rows = [{"step": s, "split": "train", "loss": 1.1 - 0.02 * s, "learning_rate": 1e-4} for s in range(1, 31)]
    rows += [{"step": s, "split": "eval", "loss": 1.0 - 0.01 * s, "accuracy": 0.4 + 0.01 * s} for s in (10, 20, 30)]
    return rows


@pytest.fixture
def drawn_figures(monkeypatch):
    """Every figure the report saves, kept open for inspection (and still written)."""
    figures = {}
    save = plotting.save

    def keep(plt, figure, path):
        figures[path.name] = {"texts": [t.get_text() for t in figure.findobj(match=lambda o: hasattr(o, "get_text"))],
                              "lines": {line.get_label(): (list(line.get_xdata()), line.get_marker())
                                        for ax in figure.axes for line in ax.get_lines()},
                              "titles": [ax.get_title() for ax in figure.axes],
                              "xlabels": [ax.get_xlabel() for ax in figure.axes],
                              "ylabels": [ax.get_ylabel() for ax in figure.axes]}
        return save(plt, figure, path)

    monkeypatch.setattr(plotting, "save", keep)
    return figures


def test_every_figure_is_drawn_readable_with_names_and_titles(tmp_path, drawn_figures):
    paths = run_report.draw(tmp_path, _results(), _log())

    assert [p.name for p in paths] == ["training_curves.png", "confusion_matrix.png", "per_class_f1.png",
                                       "reliability.png"]
    for path in paths:
        assert path.parent == tmp_path / "report"
        with Image.open(path) as image:
            assert image.format == "PNG" and min(image.size) >= 300
    curves = drawn_figures["training_curves.png"]
    assert "Loss" in curves["titles"] and "Validation accuracy" in curves["titles"]
    assert "step" in curves["xlabels"] and {"loss", "accuracy"} <= set(curves["ylabels"])
    assert any("best: 0.61 at step 20" in t for t in curves["texts"])
    assert any("exported step 20 (the model predict uses)" in t for t in curves["texts"])
    confusion = drawn_figures["confusion_matrix.png"]
    assert set(NAMES) <= set(confusion["texts"]) and any("test split" in t for t in confusion["titles"])
    assert {"predicted"} <= set(confusion["xlabels"]) and "true" in confusion["ylabels"]
    f1 = drawn_figures["per_class_f1.png"]
    assert set(NAMES) <= set(f1["texts"]) and "F1 per class" in f1["titles"]
    assert any(t.startswith("validation (macro F1") for t in f1["texts"])
    reliability = drawn_figures["reliability.png"]
    assert any(t.startswith("Before (T = 1)") for t in reliability["titles"])
    assert any(t.startswith("After (T = ") for t in reliability["titles"])


def test_figures_without_their_data_are_left_out(tmp_path):
    regression = {"steps": 4, "best": {"metric": "mse", "value": 0.3, "step": 4},
                  "validation": {"mse": 0.3}, "reports": {}}
    log = [{"step": 1, "split": "train", "loss": 1.0}, {"step": 4, "split": "eval", "loss": 0.4, "mse": 0.3}]

    assert [p.name for p in run_report.draw(tmp_path, regression, log)] == ["training_curves.png"]
    assert [p.name for p in run_report.draw(tmp_path / "u", _results(calibrated=False), [])] == [
        "confusion_matrix.png", "per_class_f1.png"]


def test_one_logged_training_step_still_draws_the_training_loss(tmp_path, drawn_figures):
    log = [{"step": 2, "split": "train", "loss": 1.2}, {"step": 2, "split": "eval", "loss": 1.1, "accuracy": 0.5}]

    run_report.draw(tmp_path, {"steps": 2, "best": {"metric": "accuracy", "value": 0.5, "step": 2}}, log)

    steps, marker = drawn_figures["training_curves.png"]["lines"]["training loss"]
    assert steps == [2] and marker == "o"  # a line of one point alone would draw nothing


def test_the_exported_step_is_the_last_one_without_load_best_model_at_end_and_the_best_says_so(
        tmp_path, drawn_figures):
    results = {**_results(calibrated=False), "steps": 30}
    del results["exported_step"]  # load_best_model_at_end=False: the last weights are exported

    run_report.draw(tmp_path, results, _log())

    curves = drawn_figures["training_curves.png"]
    assert "exported step 30 (the model predict uses)" in curves["lines"]
    assert "best: 0.61 at step 20 (not exported; load_best_model_at_end=True exports it)" in curves["lines"]
    assert any("exported: the weights of step 30" in t for t in curves["texts"])


def _entity_results() -> dict:
    """A token-classification run's results.json, as its scorer fills `reports` (entity_report
    and the words' tag confusion)."""
    from flaxheads.tasks.token import entity_metrics, scoring

    true = [["B-PER", "I-PER", "O", "B-LOC"], ["O", "B-ORG", "O"]]
    predicted = [["B-PER", "I-PER", "O", "O"], ["O", "B-ORG", "B-LOC"]]
    tags = ["B-LOC", "B-ORG", "B-PER", "I-PER", "O"]
    report = {**entity_metrics.entity_report(true, predicted), **scoring.tag_confusion(true, predicted, tags)}
    return {"steps": 8, "best": {"metric": "f1", "value": 0.66, "step": 4}, "exported_step": 4,
            "validation": {"f1": 0.66}, "reports": {"validation": report}}


def test_a_token_run_draws_f1_per_entity_type_and_the_words_tag_confusion(tmp_path, drawn_figures):
    paths = run_report.draw(tmp_path, _entity_results(), [])

    assert [p.name for p in paths] == ["confusion_matrix.png", "per_type_f1.png"]
    f1 = drawn_figures["per_type_f1.png"]
    assert "F1 per entity type" in f1["titles"] and {"LOC", "ORG", "PER"} <= set(f1["texts"])
    assert "1.00 (n=1)" in f1["texts"]  # PER and ORG found, LOC missed
    confusion = drawn_figures["confusion_matrix.png"]
    assert {"B-LOC", "I-PER", "O"} <= set(confusion["texts"])
    assert any("(7 words, accuracy 0.714)" in t for t in confusion["titles"])


def test_the_tag_confusion_counts_each_word_once_true_by_predicted():
    from flaxheads.tasks.token.scoring import tag_confusion

    confusion = tag_confusion([["B-PER", "O"], ["B-LOC"]], [["B-PER", "B-PER"], ["O"]], ["B-PER", "O"])

    assert confusion["confusion_labels"] == ["B-PER", "O", "B-LOC"]  # a tag only the split holds comes last
    assert confusion["confusion_matrix"] == [[1, 0, 0], [1, 0, 0], [0, 1, 0]]
    json.dumps(confusion)  # it goes to results.json


@pytest.mark.slow
def test_a_token_classification_run_reports_its_entity_types_and_tags(tiny_bert, conll, tmp_path):
    out = tmp_path / "run"
    assert main(["train", "--model_name_or_path", str(tiny_bert), "--train_file", str(conll["train"]),
                 "--validation_file", str(conll["validation"]), "--test_file", str(conll["test"]),
                 "--output_dir", str(out), "--max_seq_length", "16", "--per_device_train_batch_size", "8",
                 "--max_steps", "2", "--logging_steps", "2", "--save_steps", "100", "--report_to", "none",
                 "--disable_tqdm"]) == 0

    results = json.loads((out / "results.json").read_text())
    assert results["report"] == ["report/training_curves.png", "report/confusion_matrix.png",
                                 "report/per_type_f1.png"]
    test = results["reports"]["test"]
    counts = np.asarray(test["confusion_matrix"])
    assert counts.shape == (len(test["confusion_labels"]),) * 2 and "O" in test["confusion_labels"]
    assert np.trace(counts) / counts.sum() == pytest.approx(test["accuracy"])  # the words, once each


def _run_record(folder, outputs=("run.json", "results.json", "metrics.jsonl")):
    """run.json as flaxheads versions before the report and before marked records wrote it."""
    identity = {"trained": {"backbone": {"model_type": "bert"}, "head": "pooler", "label_names": NAMES},
                "settings": {"seed": 3}}
    (folder / "run.json").write_text(json.dumps({"identity": identity, "complete": True, "outputs": list(outputs)}))


@pytest.mark.slow
def test_the_report_command_draws_a_run_again_from_its_files(tmp_path, capsys):
    _run_record(tmp_path)  # a run from before the report: report/ joins what it records
    (tmp_path / "results.json").write_text(json.dumps(_results()))
    lines = [json.dumps(row) for row in _log()]
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + '\n{"step": 31, "spl')  # the last line cut by a kill

    assert main(["report", str(tmp_path)]) == 0

    printed = capsys.readouterr().out.split()
    assert [p.rsplit("/", 1)[-1] for p in printed] == ["training_curves.png", "confusion_matrix.png",
                                                       "per_class_f1.png", "reliability.png"]
    assert all((tmp_path / "report" / name).is_file() for name in ("training_curves.png", "reliability.png"))
    assert "report" in json.loads((tmp_path / "run.json").read_text())["outputs"]
    assert main(["report", str(tmp_path)]) == 0  # drawn again over its own figures


def test_the_report_command_never_writes_over_a_report_folder_the_run_did_not_write(tmp_path, capsys):
    _run_record(tmp_path)
    (tmp_path / "results.json").write_text(json.dumps(_results()))
    (tmp_path / "report").mkdir()
    (tmp_path / "report" / "training_curves.png").write_bytes(b"mine")
    record = (tmp_path / "run.json").read_bytes()

    assert main(["report", str(tmp_path)]) == 2

    assert "is not the run's (its run.json records no report)" in capsys.readouterr().err
    assert (tmp_path / "report" / "training_curves.png").read_bytes() == b"mine"
    assert (tmp_path / "run.json").read_bytes() == record


def test_the_report_command_names_a_folder_that_holds_no_run(tmp_path, capsys):
    (tmp_path / "results.json").write_text(json.dumps(_results()))  # somebody's results, no run record
    assert main(["report", str(tmp_path)]) == 2
    assert "holds no run.json: a report is drawn only in a flaxheads train run's folder" in capsys.readouterr().err
    assert not (tmp_path / "report").exists()
    (tmp_path / "results.json").unlink()
    _run_record(tmp_path)
    assert main(["report", str(tmp_path)]) == 2
    assert "holds no results.json: a report is drawn from a finished flaxheads train run" in capsys.readouterr().err
    (tmp_path / "results.json").write_text("{not json")
    assert main(["report", str(tmp_path)]) == 2
    assert "results.json is damaged" in capsys.readouterr().err


def test_a_report_that_cannot_be_drawn_costs_the_run_nothing(tmp_path, monkeypatch, capsys):
    def broken(*args, **kwargs):
        raise ModuleNotFoundError("drawing figures needs matplotlib: pip install matplotlib")

    monkeypatch.setattr(run_report, "draw", broken)
    stub = types.SimpleNamespace(output_dir=tmp_path)

    assert Trainer._draw_report(stub, {"steps": 1}) == []
    err = capsys.readouterr().err
    assert "the run report was not drawn (ModuleNotFoundError: drawing figures needs matplotlib" in err
    assert f"flaxheads report {tmp_path}" in err


def test_the_report_command_refuses_a_run_json_flaxheads_did_not_write_and_draws_nothing(tmp_path, capsys):
    (tmp_path / "run.json").write_text(json.dumps({"experiment": "mine", "complete": True}))
    (tmp_path / "results.json").write_text(json.dumps(_results()))
    (tmp_path / "report").mkdir()
    (tmp_path / "report" / "training_curves.png").write_bytes(b"mine")

    assert main(["report", str(tmp_path)]) == 2

    assert "run.json was not written by flaxheads" in capsys.readouterr().err
    assert (tmp_path / "report" / "training_curves.png").read_bytes() == b"mine"
    assert json.loads((tmp_path / "run.json").read_text()) == {"experiment": "mine", "complete": True}


def test_the_report_command_refuses_results_changed_since_the_run_wrote_them(tmp_path, capsys):
    from flaxheads.training import run_dir

    (tmp_path / "results.json").write_text(json.dumps(_results()))
    run_dir.write_run(tmp_path, {"trained": {}, "settings": {}}, complete=True, model_name="m")
    (tmp_path / "results.json").write_text(json.dumps({**_results(), "steps": 31}))  # somebody's edit

    assert main(["report", str(tmp_path)]) == 2

    assert "results.json is not the one the run wrote" in capsys.readouterr().err
    assert not (tmp_path / "report").exists()


@pytest.mark.slow  # a 2-step training run
def test_a_run_without_report_figures_draws_none_and_the_report_command_draws_them_later(
        tiny_bert, snippets_csv, tmp_path, monkeypatch):
    from flaxheads.tasks.runs import train
    from runs import four_step_config

    drawn = []
    monkeypatch.setattr(run_report, "draw", lambda *args, **kwargs: drawn.append(args) or [])
    out = tmp_path / "run"
    results = train(four_step_config(tiny_bert, snippets_csv, out, max_steps=2, report_figures=False))

    assert drawn == [] and results["report"] == [] and not (out / "report").exists()
    assert json.loads((out / "results.json").read_text())["report"] == []
    monkeypatch.undo()
    assert main(["report", str(out)]) == 0
    assert (out / "report" / "training_curves.png").is_file() and (out / "report" / "confusion_matrix.png").is_file()
