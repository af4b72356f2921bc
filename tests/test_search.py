"""Hyperparameter search (`Trainer.hyperparameter_search`, `flaxheads search`): one tiny 3-trial
search shared by most questions (its run folders, study, table, best export, compilations), and a
few searches of their own where the question needs one (pruning, model_init, resume, workers)."""

from __future__ import annotations

import csv
import json
import signal
import subprocess
import sys
import time
import weakref

import pytest
from runs import four_step_config

optuna = pytest.importorskip("optuna")

searches = pytest.mark.slow  # trains tiny runs: the module's search (~40 CPU-s once, shared), or one of its own


def _space(trial):
    # Every value here is a run-time argument of the train step: one compiled program for the search.
    return {"learning_rate": trial.suggest_float("learning_rate", 1e-4, 3e-3, log=True),
            "warmup_ratio": trial.suggest_float("warmup_ratio", 0.0, 0.5),
            "weight_decay": trial.suggest_float("weight_decay", 0.001, 0.1),
            "adam_beta2": trial.suggest_float("adam_beta2", 0.98, 0.999),
            "max_grad_norm": trial.suggest_float("max_grad_norm", 0.5, 2.0)}


def _trainer(tiny_bert, snippets_csv, output_dir, **overrides):
    from flaxheads import Trainer

    settings = dict(eval_steps=2, save_steps=4, max_steps=4)
    settings.update(overrides)
    return Trainer.from_config(four_step_config(tiny_bert, snippets_csv, output_dir, **settings))


@pytest.fixture(scope="module")
def searched(tiny_bert, snippets_csv, tmp_path_factory):
    """Three trials of 4 steps, evaluated every 2, into one output folder (no pruning: the median
    pruner waits for 5 finished trials by default)."""
    output_dir = tmp_path_factory.mktemp("search") / "out"
    best = _trainer(tiny_bert, snippets_csv, output_dir).hyperparameter_search(
        hp_space=_space, n_trials=3, direction="minimize")
    return best, output_dir


@searches
def test_search_returns_transformers_best_run_of_its_best_trial(searched):
    best, _ = searched
    study = best.run_summary["study"]
    assert type(best).__name__ == "BestRun" and best._fields == ("run_id", "objective", "hyperparameters",
                                                                  "run_summary")
    assert best.run_id == str(study.best_trial.number)
    assert best.objective == study.best_trial.value == min(t.value for t in study.trials)
    assert set(best.hyperparameters) == {"learning_rate", "warmup_ratio", "weight_decay", "adam_beta2",
                                         "max_grad_norm"}


@searches
def test_default_objective_of_a_trial_is_the_sum_of_its_eval_metrics(searched):
    best, output_dir = searched
    results = json.loads((output_dir / f"run-{best.run_id}" / "results.json").read_text())
    validation = results["validation"]
    # transformers' rule: the loss is left out when there are metrics
    assert best.objective == pytest.approx(sum(v for k, v in validation.items() if k != "loss"))


@searches
def test_each_trial_is_a_run_folder_of_its_own_with_its_values(searched):
    best, output_dir = searched
    for trial in best.run_summary["study"].trials:
        folder = output_dir / f"run-{trial.number}"
        run = json.loads((folder / "run.json").read_text())
        assert run["complete"] and (folder / "results.json").exists() and (folder / "config.json").exists()
        assert run["identity"]["settings"]["learning_rate"] == trial.params["learning_rate"]


@searches
def test_one_train_step_program_serves_every_trial(searched):
    best, _ = searched
    assert best.run_summary["compilations"] == 1


@searches
def test_the_study_is_stored_in_sqlite_in_the_output_folder(searched):
    _, output_dir = searched
    study = optuna.load_study(study_name="flaxheads-search", storage=f"sqlite:///{output_dir / 'optuna.db'}")
    assert [t.state for t in study.trials] == [optuna.trial.TrialState.COMPLETE] * 3


@searches
def test_the_best_trials_export_is_the_searchs_best_model(searched):
    best, output_dir = searched
    assert (output_dir / "best_model" / "config.json").read_bytes() == (
        output_dir / f"run-{best.run_id}" / "config.json").read_bytes()
    assert (output_dir / "best_model" / "model.safetensors").read_bytes() == (
        output_dir / f"run-{best.run_id}" / "model.safetensors").read_bytes()


@searches
def test_the_table_lists_every_trial_with_values_objective_state_steps_and_seconds(searched):
    best, output_dir = searched
    lines = (output_dir / "trials.csv").read_text().splitlines()
    header = lines[0].split(",")
    assert header[:3] == ["number", "state", "objective"] and {"learning_rate", "steps", "seconds"} <= set(header)
    assert len(lines) == 4 and all(",complete," in line for line in lines[1:])
    assert f"**{best.run_id}** (best)" in (output_dir / "trials.md").read_text()


@searches
def test_the_report_draws_the_history_importances_and_learning_rate_pictures(searched):
    _, output_dir = searched
    assert {p.name for p in (output_dir / "search_report").iterdir()} == {
        "optimization_history.png", "param_importances.png", "objective_vs_learning_rate.png"}


@searches
def test_a_search_run_again_runs_no_finished_trial_again(searched, tiny_bert, snippets_csv):
    best, output_dir = searched
    again = _trainer(tiny_bert, snippets_csv, output_dir).hyperparameter_search(hp_space=_space, n_trials=3)
    assert len(again.run_summary["study"].trials) == 3 and again.run_id == best.run_id


def test_the_report_refuses_to_overwrite_a_file_no_search_wrote(tmp_path):
    from flaxheads.training import search_report

    (tmp_path / "trials.csv").write_text("mine")
    with pytest.raises(ValueError, match="trials.csv .* not written by a search"):
        search_report._claim(tmp_path, ["trials.csv"])
    assert (tmp_path / "trials.csv").read_text() == "mine"


@searches
def test_a_pruned_trial_stops_at_its_first_evaluation_and_its_trainer_is_freed(tiny_bert, snippets_csv, tmp_path,
                                                                                monkeypatch):
    from flaxheads.training import trainer as training

    runs = []
    real = training.Trainer.for_trial
    monkeypatch.setattr(training.Trainer, "for_trial",
                        lambda self, *a: runs.append(weakref.ref(run := real(self, *a))) or run)
    trainer = _trainer(tiny_bert, snippets_csv, tmp_path)
    with pytest.raises(ValueError, match="no trial of the search finished"):
        trainer.hyperparameter_search(hp_space=_space, n_trials=2,
                                      compute_objective=lambda metrics: metrics["eval_loss"],
                                      pruner=optuna.pruners.ThresholdPruner(upper=0.0))  # every loss > 0: pruned
    trials = optuna.load_study(study_name="flaxheads-search", storage=f"sqlite:///{tmp_path / 'optuna.db'}").trials
    assert [t.state for t in trials] == [optuna.trial.TrialState.PRUNED] * 2
    assert [t.user_attrs["steps"] for t in trials] == [2, 2]
    assert [run() for run in runs] == [None, None]


def _columns(path):
    with open(path, encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    return [r["sentence"] for r in rows], [r["label"] for r in rows]


@searches
def test_a_trainer_given_model_init_searches_in_memory_calling_it_per_trial(tiny_bert, snippets_csv):
    import flaxheads
    from flaxheads.tokenizer import load_tokenizer
    from flaxheads.training.config import TrainConfig

    calls = []

    def model_init(trial):
        calls.append(trial)
        return flaxheads.SequenceClassifier.from_pretrained(tiny_bert, num_labels=2, seed=3)

    args = TrainConfig(output_dir=None, max_steps=2, per_device_train_batch_size=16, max_seq_length=32,
                       disable_tqdm=True, seed=3)
    trainer = flaxheads.Trainer(model_init=model_init, args=args, train_dataset=_columns(snippets_csv["train"]),
                                eval_dataset=_columns(snippets_csv["validation"]),
                                tokenizer=load_tokenizer(tiny_bert)[0])
    best = trainer.hyperparameter_search(direction="maximize", n_trials=2, hp_space=lambda trial: {
        "learning_rate": trial.suggest_float("learning_rate", 1e-4, 1e-3)})
    assert calls[0] is None and len(calls) == 3 and all(isinstance(t, optuna.Trial) for t in calls[1:])
    assert best.objective == max(t.value for t in best.run_summary["study"].trials)
    assert best.run_summary["output_dir"] is None


# -- the command line ---------------------------------------------------------------------------


def test_search_flags_read_ranges_choices_and_plain_values():
    from flaxheads.cli import build_parser
    from flaxheads.training.search_space import Choice, Range

    args = build_parser().parse_args(["search", "--learning_rate", "1e-5:3e-4:log", "--warmup_ratio", "0:0.2",
                                      "--num_train_epochs", "1:4", "--lr_scheduler_type", "linear,cosine",
                                      "--per_device_train_batch_size", "8,16", "--weight_decay", "0:0.1:0.01",
                                      "--max_steps", "5"])
    assert args.learning_rate == Range(1e-5, 3e-4, float, log=True)
    assert args.warmup_ratio == Range(0.0, 0.2, float)
    assert args.num_train_epochs == Range(1.0, 4.0, float)  # a float field: epochs may be fractions
    assert args.weight_decay == Range(0.0, 0.1, float, step=0.01)
    assert args.lr_scheduler_type == Choice(("linear", "cosine"))
    assert args.per_device_train_batch_size == Choice((8, 16))
    assert args.max_steps == 5


@pytest.mark.parametrize("argv, said", [
    (["--learning_rate", "3e-4:1e-5"], "argument --learning_rate: --learning_rate 3e-4:1e-5: the range's low end "
                                       "must be below its high end (--learning_rate 1e-5:3e-4)"),
    (["--learning_rate", "0:1e-3:log"], "a log range needs a positive low end, or drop :log"),
    (["--lr_scheduler_type", "linear,cosin"], "--lr_scheduler_type cosin: choose from linear, cosine, constant"),
    (["--learning_rate", "1e-5:x"], "e.g. --learning_rate 1e-5:3e-4:log"),
])
def test_a_bad_range_or_choice_is_refused_naming_the_flag_and_the_fix(argv, said, capsys):
    from flaxheads.cli import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["search", *argv])
    assert said in capsys.readouterr().err


def test_a_search_space_in_json_reads_as_the_flags_do(tmp_path):
    from flaxheads.training.search_space import Choice, Range, from_json

    kinds, choices = {"learning_rate": float, "lr_scheduler_type": str, "warmup_ratio": float}, {}
    text = '{"learning_rate": "1e-5:3e-4:log", "lr_scheduler_type": ["linear", "cosine"], ' \
           '"warmup_ratio": {"low": 0, "high": 0.2}}'
    (tmp_path / "space.json").write_text(text)
    expected = {"learning_rate": Range(1e-5, 3e-4, float, log=True), "lr_scheduler_type": Choice(("linear", "cosine")),
                "warmup_ratio": Range(0.0, 0.2, float)}
    assert from_json(text, kinds, choices) == from_json(str(tmp_path / "space.json"), kinds, choices) == expected
    with pytest.raises(ValueError, match="--search_space names 'learning_rat', which is no flag"):
        from_json('{"learning_rat": "1:2"}', kinds, choices)


def test_search_without_a_space_says_how_to_give_one(capsys):
    from flaxheads.cli import main

    assert main(["search", "--max_steps", "2"]) == 2
    assert "give a range or choices, e.g. --learning_rate 1e-5:3e-4:log" in capsys.readouterr().err


def test_metric_for_best_model_reads_transformers_eval_prefix():
    from flaxheads.training.config import TrainConfig

    assert TrainConfig(metric_for_best_model="eval_macro_f1").metric_for_best_model == "macro_f1"


def _search_command(tiny_bert, snippets_csv, output_dir, *extra):
    return [sys.executable, "-m", "flaxheads.cli", "search", "--model_name_or_path", str(tiny_bert),
            "--train_file", str(snippets_csv["train"]), "--validation_file", str(snippets_csv["validation"]),
            "--text_column", "sentence", "--max_seq_length", "32", "--per_device_train_batch_size", "16",
            "--max_steps", "4", "--eval_steps", "2", "--save_steps", "2", "--disable_tqdm", "--seed", "3",
            "--learning_rate", "1e-4:3e-3:log", "--warmup_ratio", "0:0.3", "--output_dir", str(output_dir), *extra]


def _stored(output_dir):
    storage = f"sqlite:///{output_dir / 'optuna.db'}"
    return optuna.load_study(study_name="flaxheads-search", storage=storage).trials


@pytest.mark.slow  # three processes of the command, each importing jax and training tiny runs
def test_a_search_killed_after_its_first_trial_resumes_without_repeating_finished_trials(tiny_bert, snippets_csv,
                                                                                         tmp_path):
    output_dir = tmp_path / "out"
    command = _search_command(tiny_bert, snippets_csv, output_dir, "--n_trials", "3")
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        done = []
        while process.poll() is None and not done:
            time.sleep(0.2)
            try:  # the search may be creating the storage's tables just now
                done = [t for t in _stored(output_dir) if t.state == optuna.trial.TrialState.COMPLETE]
            except Exception:  # noqa: BLE001
                continue
        process.send_signal(signal.SIGKILL)
    finally:
        process.wait()
    first = {t.number: t.params for t in _stored(output_dir) if t.state == optuna.trial.TrialState.COMPLETE}
    assert first, "the search ended before it was killed"
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    trials = _stored(output_dir)
    complete = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(complete) == 3 and all(first[n] == t.params for t in complete for n in [t.number] if n in first)
    assert len({t.user_attrs["run_name"] for t in complete}) == 3  # no run done twice
    assert len({tuple(sorted(t.params.items())) for t in complete}) == 3  # the resumed sampler drew new values
    summary = json.loads(result.stdout[result.stdout.rindex("\n{\n"):result.stdout.rindex("\n}") + 2])
    assert summary["best_run"] in {str(t.number) for t in complete} and summary["train_step_compilations"] == 1


@pytest.mark.slow  # two processes of the command at once
def test_two_worker_processes_share_one_study_through_its_storage(tiny_bert, snippets_csv, tmp_path):
    output_dir = tmp_path / "out"
    output_dir.mkdir()
    command = _search_command(tiny_bert, snippets_csv, output_dir, "--n_trials", "4",
                              "--storage", f"journal:{output_dir / 'journal.log'}")
    workers = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outputs = [worker.communicate(timeout=600) for worker in workers]
    assert [worker.returncode for worker in workers] == [0, 0], [err[-2000:] for _, err in outputs]
    from optuna.storages.journal import JournalFileBackend

    journal = optuna.storages.JournalStorage(JournalFileBackend(str(output_dir / "journal.log")))
    study = optuna.load_study(study_name="flaxheads-search", storage=journal)
    finished = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(finished) >= 4
    assert {t.user_attrs["owner"]["pid"] for t in finished} == {worker.pid for worker in workers}
    assert len({t.user_attrs["run_name"] for t in finished}) == len(finished)
    assert len({tuple(sorted(t.params.items())) for t in finished}) == len(finished)  # workers drew apart


# -- the pieces, without training ---------------------------------------------------------------


def test_default_objective_is_transformers_loss_alone_else_the_sum_of_metrics_without_speed():
    from flaxheads.training.search import default_compute_objective

    assert default_compute_objective({"eval_loss": 0.4, "epoch": 2.0, "eval_runtime": 3.0}) == 0.4
    assert default_compute_objective({"eval_loss": 0.4, "eval_accuracy": 0.75, "eval_f1": 0.5,
                                      "eval_samples_per_second": 90.0}) == 1.25


def test_a_space_naming_no_trainconfig_field_is_refused_with_the_fields_to_name():
    from flaxheads.training.search import check_space

    with pytest.raises(ValueError, match="hp_space gave learnig_rate, which TrainConfig has no field for"):
        check_space({"learnig_rate": 1e-4})
    with pytest.raises(ValueError, match="name it with hp_name="):
        check_space({"output_dir": "x"})


def test_a_storage_is_a_database_url_or_a_journal_file(tmp_path):
    from flaxheads.training.search import storage_of

    assert storage_of(f"sqlite:///{tmp_path / 'x.db'}").url == f"sqlite:///{tmp_path / 'x.db'}"
    assert isinstance(storage_of(f"journal:{tmp_path / 'j'}"), optuna.storages.JournalStorage)
    with pytest.raises(ValueError, match="pass sqlite:///PATH, postgresql://..., or journal:PATH"):
        storage_of("x.db")


def test_a_new_database_opened_by_another_process_in_the_same_moment_opens_here_too(tmp_path, monkeypatch):
    from sqlalchemy.exc import OperationalError

    from flaxheads.training.search import storage_of

    metadata = optuna.storages._rdb.models.BaseModel.metadata
    create_all, calls = metadata.create_all, []

    def other_process_created_them_first(engine, *args, **kwargs):
        calls.append(engine)
        create_all(engine, *args, **kwargs)  # what the other process made between our check and our creation
        if len(calls) == 1:
            raise OperationalError("CREATE TABLE studies", {}, Exception("table studies already exists"))

    monkeypatch.setattr(metadata, "create_all", other_process_created_them_first)
    storage = storage_of(f"sqlite:///{tmp_path / 'optuna.db'}")
    assert len(calls) == 2
    assert optuna.create_study(storage=storage, study_name="s").study_name == "s"
    with pytest.raises(OperationalError, match="unable to open database file"):  # not a race: said at once
        storage_of(f"sqlite:///{tmp_path / 'no folder' / 'optuna.db'}")
    assert len(calls) == 3


def test_a_search_trains_nothing_when_a_value_of_its_space_is_no_valid_setting():
    from flaxheads.training.config import TrainConfig
    from flaxheads.training.search_space import Range, check

    with pytest.raises(ValueError, match="warmup_ratio=1.5: it must be in"):
        check({"warmup_ratio": Range(0.0, 1.5, float)}, TrainConfig(output_dir=None))
