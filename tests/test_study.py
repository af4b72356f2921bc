"""The head study: runner (grid, one line per cell, resume), statistics, report and plots.

The runner tests train a tiny random BERT for 2 steps per cell; the study they share runs once.
"""

from __future__ import annotations

import dataclasses
import json
import shutil

import numpy as np
import pytest

from flaxheads.study import stats
from flaxheads.study.grid import Block, DataSpec, StudyGrid, StudySettings
from flaxheads.study.results import append_record, merge_records, read_results
from flaxheads.study.runner import RESULTS_FILE, StudyError, run_study

# One bucket of 16 tokens and 2 steps: each cell compiles one train and one eval step.
TINY_SETTINGS = StudySettings(max_seq_length=16, max_steps=2, batch_size=8, eval_steps=1, train_examples=32,
                              validation_examples=None, test_examples=16)


def _tiny_grid(tiny_bert, snippets_csv, heads=("pooler", "cls"), seeds=(0, 1), modes=("finetune",)) -> StudyGrid:
    files = f"{snippets_csv['train']},{snippets_csv['validation']},{snippets_csv['validation']}"
    data = DataSpec.parse(f"snippets={files}", text_column="sentence")
    return StudyGrid((Block(heads, (data,), seeds, modes=modes, checkpoints=(str(tiny_bert),)),), TINY_SETTINGS)


@pytest.fixture(scope="module")
def tiny_study(tiny_bert, snippets_csv, tmp_path_factory):
    """A 1 head x 2 seeds study of the tiny BERT, run once: (grid, study_dir, StudyRun). Heads
    multiply like seeds; the converged grid's test runs two of them."""
    grid = _tiny_grid(tiny_bert, snippets_csv, heads=("pooler",))
    study_dir = tmp_path_factory.mktemp("study")
    return grid, study_dir, run_study(grid, study_dir)


@pytest.mark.slow  # training runs
def test_grid_of_one_head_and_two_seeds_writes_two_lines(tiny_study):
    grid, study_dir, run = tiny_study
    records = read_results(study_dir / RESULTS_FILE).records
    assert len(records) == 2 and len(run.ran) == 2
    assert {(r["head"], r["seed"]) for r in records} == {("pooler", 0), ("pooler", 1)}
    first = records[0]
    assert first["steps"] == 2 and [point["step"] for point in first["curve"]] == [0, 1, 2]
    assert len(first["test_predictions"]) == len(first["test_labels"]) == 16
    assert "accuracy" in first["validation"] and "accuracy" in first["test"]
    assert first["settings"]["max_steps"] == 2 and first["versions"]["jax"] and first["device"]["count"] >= 1


@pytest.mark.slow  # training runs
def test_seeds_change_training_but_not_the_data(tiny_study):
    _, study_dir, _ = tiny_study
    by_seed = {r["seed"]: r for r in read_results(study_dir / RESULTS_FILE).records if r["head"] == "pooler"}
    assert by_seed[0]["split_sizes"] == by_seed[1]["split_sizes"] == {"train": 32, "validation": 32, "test": 16}
    assert by_seed[0]["validation"]["loss"] != by_seed[1]["validation"]["loss"]


@pytest.mark.slow  # training runs
def test_finished_cell_keeps_its_logs_but_not_its_weights(tiny_study):
    _, study_dir, _ = tiny_study
    cell_dir = study_dir / read_results(study_dir / RESULTS_FILE).records[0]["cell_dir"]
    assert (cell_dir / "metrics.jsonl").is_file() and (cell_dir / "results.json").is_file()
    assert not (cell_dir / "checkpoints").exists() and not (cell_dir / "model.safetensors").exists()


@pytest.mark.slow  # training runs
def test_rerun_of_a_finished_study_trains_nothing(tiny_study):
    grid, study_dir, _ = tiny_study
    again = run_study(grid, study_dir)
    assert again.ran == [] and len(again.skipped) == 2


@pytest.mark.slow  # training runs
def test_resume_after_a_kill_reruns_only_the_missing_cell(tiny_study, tmp_path):
    grid, study_dir, _ = tiny_study
    copy = tmp_path / "study"
    shutil.copytree(study_dir, copy)
    lines = (copy / RESULTS_FILE).read_bytes().splitlines(keepends=True)
    killed = json.loads(lines[-1])
    # Killed while writing the last line, and before the cell's folder was finished.
    (copy / RESULTS_FILE).write_bytes(b"".join(lines[:-1]) + lines[-1][:40])
    shutil.rmtree(copy / killed["cell_dir"])
    resumed = run_study(grid, copy, log=lambda line: None)
    assert resumed.ran == [killed["key"]] and len(resumed.skipped) == 1
    assert any("half-written" in line for line in resumed.problems)
    results = read_results(copy / RESULTS_FILE)
    assert len(results.records) == 2 and results.truncated_tail == 0 and not results.bad_lines


def test_results_file_of_something_else_is_refused(tiny_bert, snippets_csv, tmp_path):
    (tmp_path / RESULTS_FILE).write_text('{"not": "a study record"}\n')
    with pytest.raises(StudyError, match="not a study's results file"):
        run_study(_tiny_grid(tiny_bert, snippets_csv), tmp_path)
    assert (tmp_path / RESULTS_FILE).read_text() == '{"not": "a study record"}\n'


def _has_freeze_backbone() -> bool:
    from flaxheads.training.config import TrainConfig

    return "freeze_backbone" in {field.name for field in dataclasses.fields(TrainConfig)}


@pytest.mark.skipif(not _has_freeze_backbone(), reason="TrainConfig has no freeze_backbone yet (the lora branch)")
@pytest.mark.slow  # training runs
def test_probe_cell_trains_the_head_on_a_frozen_backbone(tiny_bert, snippets_csv, tmp_path):
    import flaxheads

    grid = _tiny_grid(tiny_bert, snippets_csv, heads=("cls",), seeds=(0,), modes=("probe",))
    run = run_study(grid, tmp_path, keep_models=True, log=lambda line: None)
    (record,) = read_results(tmp_path / RESULTS_FILE).records
    assert record["mode"] == "probe" and record["key"] == run.ran[0]
    trained = flaxheads.from_pretrained(tmp_path / record["cell_dir"], num_labels=2)
    pretrained = flaxheads.from_pretrained(tiny_bert, num_labels=2, head="cls")
    import jax
    from flax import nnx

    trained_leaves = jax.tree.leaves(nnx.state(trained.backbone, nnx.Param))
    pretrained_leaves = jax.tree.leaves(nnx.state(pretrained.backbone, nnx.Param))
    assert len(trained_leaves) == len(pretrained_leaves) > 0
    for after, before in zip(trained_leaves, pretrained_leaves):
        np.testing.assert_array_equal(np.asarray(after), np.asarray(before))
    assert record["settings"]["probe_learning_rate"] == TINY_SETTINGS.probe_learning_rate


@pytest.mark.skipif(_has_freeze_backbone(), reason="TrainConfig has freeze_backbone: the probe runs")
def test_probe_without_freeze_backbone_names_the_fix(tiny_bert, snippets_csv, tmp_path):
    grid = _tiny_grid(tiny_bert, snippets_csv, heads=("cls",), seeds=(0,), modes=("probe",))
    with pytest.raises(StudyError, match="--probe_heads with no heads"):
        run_study(grid, tmp_path)


# -- statistics --------------------------------------------------------------------------------


def test_t_interval_covers_the_mean_95_percent_of_the_time_at_ten_seeds():
    rng = np.random.default_rng(0)
    samples = rng.normal(0.3, 0.02, size=(2000, 10))
    covered = [low <= 0.3 <= high for low, high in map(stats.t_interval, samples)]
    assert 0.93 <= np.mean(covered) <= 0.97


def test_holm_matches_the_hand_worked_example():
    # sorted 0.005, 0.01, 0.03, 0.04 -> 4 x 0.005, 3 x 0.01, 2 x 0.03, max(1 x 0.04, 0.06)
    np.testing.assert_allclose(stats.holm([0.01, 0.04, 0.03, 0.005]), [0.03, 0.06, 0.06, 0.02])
    np.testing.assert_allclose(stats.holm([0.5, 0.9]), [1.0, 1.0])


def test_exact_sign_flip_p_equals_brute_force_enumeration_and_scipy():
    import itertools

    from scipy.stats import permutation_test

    d = np.array([0.03, 0.01, -0.005, 0.02, 0.04, 0.015, -0.01, 0.025])
    flips = [abs(np.mean(np.array(signs) * d)) for signs in itertools.product((1, -1), repeat=d.size)]
    brute = np.mean(np.array(flips) >= abs(d.mean()) - 1e-12)
    scipy_p = permutation_test((d,), np.mean, permutation_type="samples", n_resamples=np.inf).pvalue
    assert stats.sign_flip_p(d) == pytest.approx(brute) == pytest.approx(scipy_p)
    assert stats.sign_flip_p(np.full(10, 0.01)) == pytest.approx(2 / 2 ** 10)  # the smallest p at 10 seeds


def test_monte_carlo_sign_flip_p_is_close_to_the_exact_one():
    d = np.random.default_rng(1).normal(0.005, 0.02, size=18)
    assert stats.sign_flip_p(d, exact_up_to=12) == pytest.approx(stats.sign_flip_p(d), abs=0.01)


def test_friedman_equals_scipy_and_the_nemenyi_cd_demsars_table():
    from scipy.stats import friedmanchisquare

    scores = np.random.default_rng(2).normal(size=(20, 5)) + np.array([0.0, 0.3, 0.6, 0.1, 0.2])
    ranks = stats.rank_analysis(list("abcde"), scores)
    expected = friedmanchisquare(*scores.T)
    assert ranks.statistic == pytest.approx(expected.statistic) and ranks.p == pytest.approx(expected.pvalue)
    assert sum(ranks.average_ranks) == pytest.approx(15.0)
    assert ranks.critical_difference == pytest.approx(2.728 * np.sqrt(5 * 6 / (6 * 20)), rel=1e-3)  # Demsar 2006


def test_paired_bootstrap_over_examples_is_zero_for_equal_predictions_and_wider_than_seeds_alone():
    rng = np.random.default_rng(3)
    labels = rng.integers(0, 2, size=300)
    a = np.where(rng.random((10, 300)) < 0.8, labels, 1 - labels)
    b = np.where(rng.random((10, 300)) < 0.8, labels, 1 - labels)
    assert stats.paired_bootstrap_ci(a, a, labels, "accuracy") == (0.0, 0.0)
    low, high = stats.paired_bootstrap_ci(a, b, labels, "accuracy")
    seeds_only = stats.t_interval((a == labels).mean(1) - (b == labels).mean(1))
    assert high - low > seeds_only[1] - seeds_only[0]
    scores = labels + rng.normal(size=(10, 300))
    assert stats.paired_bootstrap_ci(scores, scores, labels, "pearson") == (0.0, 0.0)


def test_weighted_pearson_equals_corrcoef_of_the_resampled_examples():
    rng = np.random.default_rng(4)
    labels, scores = rng.normal(size=50), rng.normal(size=(3, 50))
    weights = rng.multinomial(50, np.full(50, 1 / 50), size=1)
    rows = np.repeat(np.arange(50), weights[0])
    expected = [np.corrcoef(scores[s, rows], labels[rows])[0, 1] for s in range(3)]
    np.testing.assert_allclose(stats._pearson(scores, labels, weights)[0], expected)


def test_holm_corrected_verdict_finds_a_consistent_gain_at_ten_seeds_and_calls_noise_noise():
    default = {seed: 0.80 + 0.01 * np.sin(seed) for seed in range(10)}
    better = {seed: value + 0.05 + 0.002 * seed for seed, value in default.items()}
    noisy = {seed: value + (0.01 if seed % 2 else -0.012) for seed, value in default.items()}
    family = stats.with_holm({"gain": stats.paired_comparison(better, default),
                              "noise": stats.paired_comparison(noisy, default)})
    assert family["gain"].verdict == stats.BETTER and family["gain"].p_holm == pytest.approx(2 * 2 / 2 ** 10)
    assert family["noise"].verdict == stats.WITHIN_NOISE


def test_five_seeds_can_never_pass_the_exact_test():
    default = {seed: 0.8 for seed in range(5)}
    assert stats.paired_comparison({s: 0.9 for s in range(5)}, default).verdict == stats.WITHIN_NOISE


def test_paired_comparison_of_a_lower_is_better_metric_calls_a_rise_worse():
    default = {seed: 1.0 + 0.01 * seed for seed in range(10)}
    assert stats.paired_comparison({s: v + 0.5 for s, v in default.items()}, default,
                                   higher_is_better=False).verdict == stats.WORSE


def test_paired_comparison_uses_only_the_shared_seeds():
    assert stats.paired_comparison({0: 1.0, 1: 2.0}, {1: 1.5, 2: 0.0}).n == 1
    assert stats.paired_comparison({0: 1.0}, {1: 1.0}) is None


# -- report ------------------------------------------------------------------------------------


def _record(head, dataset, seed, mode="finetune", value=0.8):
    problem = "regression" if dataset == "scores" else "single_label_classification"
    metric = "pearson" if problem == "regression" else "accuracy"
    return {"key": f"{head}-{dataset}-{seed}-{mode}", "checkpoint": "tiny", "head": head, "dataset": dataset,
            "data": {"builtin": dataset}, "seed": seed, "mode": mode, "problem_type": problem,
            "settings": dataclasses.asdict(StudySettings()) | {"train_options": {}},
            "split_sizes": {"train": 100, "validation": 10, "test": 10},
            "validation": {metric: value}, "test": {metric: value, "loss": 0.5},
            "curve": [{"step": 5, metric: value - 0.1}, {"step": 10, metric: value}], "steps": 10,
            "wall_seconds": 3.0, "versions": {"jax": "x"}, "device": {"kind": "cpu", "count": 1, "cpu_count": 2}}


@pytest.fixture
def results_files(tmp_path):
    """Two results files of a hand-made study (the second repeats a cell and ends half-written)."""
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    rng = np.random.default_rng(0)
    for dataset in ("snips", "scores"):
        for seed in range(10):
            append_record(first, _record("pooler", dataset, seed, value=0.80 + 0.01 * rng.normal()))
            append_record(first, _record("mean", dataset, seed, value=0.85 + 0.01 * rng.normal()))
            append_record(second, _record("cls", dataset, seed, value=0.80 + 0.01 * rng.normal()))
            append_record(second, _record("pooler", dataset, seed, "probe", value=0.6 + 0.01 * rng.normal()))
    append_record(second, _record("pooler", "snips", 0, value=0.0))  # the same cell as a.jsonl's: merged away
    with open(second, "a") as f:
        f.write('{"key": "half')
    return [first, second]


def test_merge_counts_a_cell_from_two_files_once_and_ignores_a_half_written_line(results_files):
    records, problems = merge_records(results_files)
    assert len(records) == 80
    assert any("half-written" in line for line in problems)


@pytest.mark.slow
def test_report_writes_markdown_with_verdicts_and_three_png_plots(results_files, tmp_path):
    from flaxheads.study.report import write_report

    report = write_report(results_files, tmp_path / "docs" / "head_study.md", reproduce="flaxheads study run ...")
    text = report.markdown.read_text()
    assert "## Conclusions" in text and "flaxheads study run ..." in text
    assert "better: `mean`" in text and "within noise of it: `cls`" in text
    assert sorted(p.name for p in report.figures) == ["critical_difference.png", "frozen_vs_finetuned.png",
                                                      "learning_curves.png", "metric_per_head.png",
                                                      "paired_differences.png"]
    assert "### Ranks across data sets (Friedman, Nemenyi)" in text and "Holm" in text
    published = text.split("## What others measured\n", 1)[1]  # after the study's own conclusions
    assert "Sun, Qiu, Xu and Huang (2019)" in published and "Reimers and Gurevych (2019)" in published
    assert text.index("## Conclusions") < text.index("## What others measured")
    for figure in report.figures:
        assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"head_study/{figure.name}" in text


def test_report_refuses_to_replace_an_existing_report_without_overwrite(results_files, tmp_path):
    from flaxheads.study.report import write_report

    markdown = tmp_path / "head_study.md"
    markdown.write_text("my notes")
    with pytest.raises(FileExistsError, match="overwrite"):
        write_report(results_files, markdown)
    assert markdown.read_text() == "my notes"


def test_study_report_command_writes_the_report_and_its_reproduce_command(results_files, tmp_path, capsys):
    from flaxheads.cli import main

    output = tmp_path / "report.md"
    assert main(["study", "report", *map(str, results_files), "--output", str(output)]) == 0
    text = output.read_text()
    assert "flaxheads study run --study_dir STUDY_DIR --checkpoints tiny --heads pooler cls mean" in text
    assert "--probe_heads pooler --probe_datasets snips scores" in text


def test_report_refuses_to_pool_results_of_different_settings(results_files, tmp_path):
    from flaxheads.study.report import write_report

    other = _record("pooler", "snips", 19)
    other["settings"]["max_steps"] = 1
    append_record(tmp_path / "c.jsonl", other)
    with pytest.raises(ValueError, match="different study settings"):
        write_report([*results_files, tmp_path / "c.jsonl"], tmp_path / "r.md")


def test_report_lists_a_failed_cell_and_leaves_it_out_of_the_numbers(results_files, tmp_path):
    from flaxheads.study.report import write_report

    failed = {key: value for key, value in _record("mean", "snips", 17).items()
              if key not in ("validation", "test", "curve", "problem_type", "split_sizes")}
    append_record(tmp_path / "c.jsonl", {**failed, "error": "loss became nan at step 3"})
    report = write_report([*results_files, tmp_path / "c.jsonl"], tmp_path / "r.md")
    text = report.markdown.read_text()
    assert "Failed cell (no metrics): mean on snips, seed 17, finetune: loss became nan at step 3" in text
    assert "(n=10)" in text and "(n=11)" not in text


@pytest.mark.slow  # training runs
def test_a_diverging_cell_is_recorded_as_failed_and_the_study_goes_on(tiny_bert, snippets_csv, tmp_path):
    grid = _tiny_grid(tiny_bert, snippets_csv, heads=("cls",), seeds=(0,))
    grid = dataclasses.replace(grid, settings=dataclasses.replace(TINY_SETTINGS, learning_rate=1e30, warmup_ratio=0.0))
    run = run_study(grid, tmp_path, log=lambda line: None)
    (record,) = read_results(tmp_path / RESULTS_FILE).records
    # Diverged: its training loss, or first its validation scores, stopped being finite.
    assert record["key"] == run.ran[0] and ("loss became" in record["error"] or "non-finite" in record["error"])


@pytest.mark.slow  # training runs
def test_study_run_of_a_tiny_converged_grid_and_its_report_render_the_new_sections(tiny_bert, snippets_csv, tmp_path):
    from flaxheads.cli import main

    data = f"snippets={snippets_csv['train']},{snippets_csv['validation']},{snippets_csv['validation']}"
    study = tmp_path / "study"
    assert main(["study", "run", "--grid", "converged", "--study_dir", str(study), "--checkpoints", str(tiny_bert),
                 "--heads", "pooler", "mean_max", "--datasets", data, "--seeds", "0", "--lbfgs_heads", "pooler",
                 "attention", "--lbfgs_datasets", data, "--lbfgs_seeds", "0", "--majority_datasets", data,
                 "--text_column", "sentence", "--max_seq_length", "16", "--batch_size", "8", "--eval_steps", "2",
                 "--train_examples", "32", "--test_examples", "16", "--max_epochs", "1", "--early_stopping_patience",
                 "1", "--learning_rates"]) == 0
    records = read_results(study / RESULTS_FILE).records
    assert sorted((r["mode"], r["head"]) for r in records) == sorted(
        [("finetune", "pooler"), ("finetune", "mean_max"), ("lbfgs", "pooler"), ("lbfgs", "attention"),
         ("majority", "majority")])
    assert all(len(r["test_predictions"]) == 16 for r in records)
    assert all(r["curve"][0]["step"] == 0 for r in records if r["mode"] == "finetune")
    report = tmp_path / "report.md"
    assert main(["study", "report", str(study / RESULTS_FILE), "--output", str(report)]) == 0
    text = report.read_text()
    assert "Fine-tuned vs converged linear probe (L-BFGS on frozen features) and the majority class" in text
    assert "seeds x examples [" in text and "--lbfgs_heads pooler attention" in text
    assert "- Budget: at most 1 epochs x 32 examples / batch 8 = 4 steps a cell" in text
    assert "lbfgs: a logistic regression fitted to convergence" in text and "max_steps" not in text.split("## Results")[0]
    assert (tmp_path / "report" / "paired_differences.png").is_file()


def test_cells_train_padded_batches_as_the_committed_results_did_unless_the_study_says(tiny_bert, snippets_csv,
                                                                                      tmp_path):
    from flaxheads.study.runner import cell_train_config

    grid = _tiny_grid(tiny_bert, snippets_csv, heads=("cls",), seeds=(0,))
    (cell,) = grid.cells()
    assert cell_train_config(cell, grid.settings, tmp_path / "cell").packing is False  # TrainConfig's default packs
    packed = dataclasses.replace(grid.settings, train_options=(("packing", True),))
    assert cell_train_config(cell, packed, tmp_path / "cell").packing is True


def test_a_candidate_rate_added_to_a_study_keeps_the_keys_of_the_cells_already_run():
    from flaxheads.study.grid import CONVERGED_SETTINGS, cell_key, cell_key_fields, converged_grid
    from flaxheads.study.runner import lr_search_cells

    def search_keys(settings: StudySettings) -> dict:
        return {(c.head, c.data.name, c.learning_rate): cell_key(cell_key_fields(c, settings, {"rows": 1}))
                for c in lr_search_cells(converged_grid(seeds=(0,), settings=settings))}

    before = search_keys(dataclasses.replace(CONVERGED_SETTINGS, learning_rates=(1e-4, 3e-4)))
    after = search_keys(CONVERGED_SETTINGS)
    assert len(before) == 42 and len(after) == 63
    assert {cell: after[cell] for cell in before} == before
    # A setting every cell trains with is part of every key.
    assert not set(search_keys(dataclasses.replace(CONVERGED_SETTINGS, max_epochs=5)).values()) & set(after.values())


def test_the_committed_studies_resume_under_the_keys_their_grids_give_today():
    """The first study's 155 cells, and the converged study's learning-rate search cells run so
    far, are cells of today's grids: a rerun skips them instead of training them again."""
    from pathlib import Path

    from flaxheads.study.grid import cell_key, cell_key_fields, committed_grid, converged_grid
    from flaxheads.study.runner import lr_search_cells

    def keys(grid, cells) -> set[str]:
        return {cell_key(cell_key_fields(c, grid.settings, c.data.identity())) for c in cells}

    root = Path(__file__).parent.parent
    first = committed_grid()
    assert {r["key"] for r in read_results(root / "docs/head_study/results.jsonl").records} == keys(first, first.cells())
    converged = converged_grid()
    searched = {r["key"] for r in read_results(root / "studies/minilm-converged/results.jsonl").records
                if r.get("lr_search")}
    assert len(searched) >= 36 and searched <= keys(converged, lr_search_cells(converged))


def test_the_report_shows_every_candidate_rate_and_how_far_one_evaluation_moves_by_chance():
    from flaxheads.study.report import convergence
    from flaxheads.study.table import StudyTable

    def search(head, rate, value):
        return _record(head, "snips", 1000) | {"key": f"{head}-{rate}", "lr_search": True, "learning_rate": rate,
                                                "best": {"metric": "accuracy", "value": value, "step": 5}}

    records = [search("pooler", 1e-4, 0.80), search("pooler", 3e-5, 0.80), search("mean", 1e-4, 0.90),
               search("mean", 3e-5, 0.85)]
    records += [_record("pooler", "snips", 0) | {"learning_rate": 3e-5}, _record("mean", "snips", 0)
                | {"learning_rate": 1e-4}]
    text = convergence(StudyTable(records), "tiny")
    assert "| data set | head | lr 3e-05 | lr 0.0001 |" in text
    # A tie goes to the smaller rate, as the runner chooses.
    assert "| snips | pooler | **0.800** | 0.800 |" in text and "| snips | mean | 0.850 | **0.900** |" in text
    # 10 validation examples at the searches' mean best accuracy, 0.8375: sqrt(p (1 - p) / 10) = 0.117.
    assert "one evaluation on 10 validation examples has a binomial standard error of 0.117" in text
    # Heads of different chosen rates: the conclusions say the rate may be the cause.
    from flaxheads.study.report import conclusions

    said = conclusions(StudyTable(records))
    assert "trained at different learning rates here (3e-05 for `pooler`; 0.0001 for `mean`)" in said
    same_rate = [r | {"learning_rate": 1e-4} if not r.get("lr_search") else r for r in records[:2] + records[4:]]
    assert "different learning rates" not in conclusions(StudyTable(same_rate))


def test_the_reproduce_command_names_the_grid_whose_cells_and_settings_the_results_are():
    from pathlib import Path

    from flaxheads.study.cli import reproduce_command
    from flaxheads.study.results import merge_records

    first = Path(__file__).parent.parent / "docs/head_study/results.jsonl"
    records, _ = merge_records([first])
    command = reproduce_command(records, [str(first)], "report.md")
    assert command.startswith("# the same cells: flaxheads study run --grid committed --study_dir STUDY_DIR\n")
    assert "--grid" not in reproduce_command(records[1:], [str(first)], "report.md")  # a cell short
