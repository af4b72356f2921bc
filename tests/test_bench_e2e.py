"""`flaxheads bench e2e`: both sides get the same job, and it runs (never its timings)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from flaxheads.benchmarks import e2e
from flaxheads.benchmarks.cli import main as bench_main
from flaxheads.cli import build_parser


def test_bench_e2e_takes_the_options_that_shorten_the_job():
    args = build_parser().parse_args(["bench", "e2e", "--max_steps", "2", "--max_train_samples", "64",
                                      "--max_eval_samples", "16", "--no-torch", "--json", "out.json"])
    assert (args.what, args.max_steps, args.max_train_samples, args.max_eval_samples, args.torch, args.json) == (
        "e2e", 2, 64, 16, False, "out.json")


def test_the_trainer_peer_trains_with_the_hyperparameters_of_flaxheads_train(tmp_path):
    cfg = e2e.E2EJob.default().train_config()
    args = e2e.training_arguments(cfg, str(tmp_path))
    assert (args.learning_rate, args.weight_decay, args.max_grad_norm, args.num_train_epochs, args.seed) == (
        cfg.learning_rate, cfg.weight_decay, cfg.max_grad_norm, cfg.num_train_epochs, cfg.seed) == (
        1e-4, 0.01, 1.0, 1.0, 42)
    assert args.per_device_train_batch_size == cfg.per_device_train_batch_size == 32
    assert args.get_warmup_steps(265) == cfg.num_warmup_steps(265) == 27
    assert str(args.lr_scheduler_type.value) == cfg.lr_scheduler_type == "linear"
    assert args.train_sampling_strategy == cfg.sampling == "group_by_length"
    assert not args.bf16 and e2e.training_arguments(e2e.E2EJob.default(dtype="bfloat16").train_config(),
                                                    str(tmp_path)).bf16


def test_the_default_job_packs_and_unpacked_runs_the_same_job_padded(monkeypatch):
    from flaxheads.benchmarks import cli as bench_cli

    asked = {}
    monkeypatch.setattr(e2e, "measure", lambda job, **options: asked.update(job=job, **options) or [])
    bench_cli.e2e(build_parser().parse_args(["bench", "e2e", "--unpacked", "--no-torch"]))
    job, unpacked = asked["job"], asked["unpacked_job"]
    assert job.config["packing"] is None and job.train_config().packing_applies("single_label_classification")
    assert unpacked.config == {**job.config, "packing": False}
    assert (unpacked.max_train_samples, unpacked.max_eval_samples) == (job.max_train_samples, job.max_eval_samples)


@pytest.mark.parametrize("changes, flags", [
    ({}, []),
    ({"max_steps": 3, "dtype": "bfloat16", "max_seq_length": 64}, ["--max_steps", "3", "--dtype", "bfloat16",
                                                                   "--max_seq_length", "64"]),
])
def test_flaxheads_runs_the_job_as_the_train_command_with_the_flags_that_make_it(changes, flags, tmp_path):
    from flaxheads.cli import train_config

    for job, extra in ((e2e.E2EJob.default(**changes), []), (e2e.E2EJob.default(**changes).unpacked(), ["--no_packing"])):
        assert sorted(job.command_flags()) == sorted(flags + extra)
        parsed = build_parser().parse_args(["train", "--output_dir", str(tmp_path), *job.command_flags()])
        assert train_config(parsed) == dataclasses.replace(job.train_config(), output_dir=str(tmp_path))


def test_rounds_take_turns_and_each_row_is_compared_with_the_trainer_of_its_round(monkeypatch):
    walls = iter([100.0, 130.0, 120.0, 80.0, 96.0])  # Trainer, cold, warm; then Trainer, warm
    ran = []

    def fake(kind):
        def run(*args, **kwargs):
            ran.append(kind)
            wall = next(walls)
            # the Trainer's wall_s leaves out its process's start and exit; the ratio must not
            return {"wall_s": wall - 2.0, "process_s": wall} if kind == "trainer" else {"wall_s": wall, "process_s": wall}
        return run

    monkeypatch.setattr(e2e, "run_side", fake("trainer"))
    monkeypatch.setattr(e2e, "run_command", fake("flaxheads"))
    rows = e2e.measure(e2e.E2EJob.default(), rounds=2)
    assert ran == ["trainer", "flaxheads", "flaxheads", "trainer", "flaxheads"]
    assert [(row["round"], row["impl"].split(" (")[0], row["speedup_vs_trainer"]) for row in rows] == [
        (1, "transformers Trainer", 1.0), (1, "flaxheads", round(100 / 130, 2)), (1, "flaxheads", round(100 / 120, 2)),
        (2, "transformers Trainer", 1.0), (2, "flaxheads", round(80 / 96, 2))]
    assert "warm" in rows[-1]["impl"] and "cold" in rows[1]["impl"]
    with pytest.raises(ValueError, match="rounds"):
        e2e.measure(e2e.E2EJob.default(), rounds=0)


def test_a_job_cut_to_sample_limits_has_no_command_and_an_unknown_change_is_refused():
    assert e2e.E2EJob.default(max_train_samples=64).command_flags() is None
    job = e2e.E2EJob.default()
    with pytest.raises(ValueError, match="learning_rate"):
        dataclasses.replace(job, config={**job.config, "learning_rate": 1.0}).command_flags()


def test_the_job_cuts_every_split_to_the_sample_limits():
    task = e2e.load_job_task(e2e.E2EJob.default(max_train_samples=40, max_eval_samples=8))
    assert {name: len(split) for name, split in task.splits.items()} == {"train": 40, "validation": 8, "test": 8}


@pytest.mark.slow  # two training runs and a transformers Trainer run
def test_bench_e2e_runs_both_sides_with_the_same_job(tiny_bert, tmp_path, capsys):
    # Without --unpacked (two more flaxheads runs, +35 s of CI): those are the same code with
    # TrainConfig(packing=False), which most training tests run.
    out = tmp_path / "e2e.json"
    # One flaxheads run (--flaxheads_runs 1): the warm second run is the next test's.
    assert bench_main(["e2e", "--model", str(tiny_bert), "--max_steps", "2", "--max_train_samples", "64",
                       "--max_eval_samples", "16", "--max_seq_length", "32", "--flaxheads_runs", "1",
                       "--json", str(out)]) == 0
    trainer, cold = json.loads(out.read_text())
    assert [row["impl"] for row in (trainer, cold)] == [
        "transformers Trainer (PyTorch)", "flaxheads (cold compilation cache)"]
    assert all(row["steps"] == 2 and 0 <= row["test_accuracy"] <= 1 and row["wall_s"] > 0 for row in (trainer, cold))
    assert 0 < cold["compilations"] and cold["cache_hits"] < cold["compilations"]
    assert "| impl |" in capsys.readouterr().out.replace("| dtype | impl |", "| impl |")


@pytest.mark.slow  # two runs of the train command on the whole default data set (2 steps of a tiny model)
def test_bench_e2e_times_the_train_command_itself_and_its_second_run_compiles_nothing(tiny_bert, tmp_path):
    out = tmp_path / "e2e.json"
    assert bench_main(["e2e", "--model", str(tiny_bert), "--max_steps", "2", "--max_seq_length", "32", "--no-torch",
                       "--json", str(out)]) == 0
    cold, warm = json.loads(out.read_text())
    assert [row["impl"] for row in (cold, warm)] == ["flaxheads (cold compilation cache)",
                                                      "flaxheads (warm compilation cache)"]
    assert all(row["steps"] == 2 and row["wall_s"] == row["process_s"] > row["train_s"] > 0 for row in (cold, warm))
    assert cold["new_cache_entries"] > 0 and warm["new_cache_entries"] == 0


def test_an_existing_json_file_is_refused_before_anything_runs(tmp_path, capsys):
    out = tmp_path / "mine.json"
    out.write_text("my results")

    assert bench_main(["e2e", "--max_steps", "1", "--no-torch", "--json", str(out)]) == 2
    assert out.read_text() == "my results"
    assert "already exists" in capsys.readouterr().err
