
"""The study's report: markdown (question, setup, tables, plots, conclusions drawn from the
statistics, the command that reproduces it) and its PNG figures, from one or more results files
(results from several machines merge; a cell present twice counts once)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from flaxheads import atomic
from flaxheads.study import literature, plots, stats
from flaxheads.study.results import merge_records
from flaxheads.study.table import StudyTable

QUESTION = (
    "Which classification head works best on a pretrained encoder: BERT's pooler, the [CLS] token, mean "
    "pooling, mean and max pooling concatenated, a learned attention pooling, the last four layers' [CLS] "
    "concatenated, or another of flaxheads' heads (the study's are listed under Setup)? And how much does "
    "fine-tuning the backbone end to end add over training only a classifier on its frozen features? Every "
    "head sits on the same backbone here, trained with the same settings, data and seeds, so the head is the "
    "only difference."
)


@dataclasses.dataclass
class Report:
    markdown: Path
    figures: list[Path]
    problems: list[str]
    """Sentences about the results files (half-written lines ignored, missing files)."""


def write_report(results_files: Sequence[str | os.PathLike], markdown: str | os.PathLike, *,
                 figures_dir: str | os.PathLike | None = None, reproduce: str | None = None,
                 overwrite: bool = False, split: str = "test") -> Report:
    """Writes the report of the records in `results_files` to `markdown` and its figures to
    `figures_dir` (default: `<markdown without .md>/` beside it, e.g. docs/head_study/).

    `reproduce`: the command(s) that reproduce the study, quoted in the report. Raises
    FileExistsError for an existing `markdown` or figure unless `overwrite`, ValueError when the
    files hold no record."""
    markdown = Path(markdown)
    figures_dir = Path(figures_dir) if figures_dir is not None else markdown.with_suffix("")
    records, problems = merge_records(results_files)
    if not records:
        raise ValueError(f"no study records in {', '.join(map(str, results_files))}: run `flaxheads study run` first")
    table = StudyTable(records, split=split)
    targets = [markdown] + [figures_dir / name for name in _figure_names(table)]
    existing = [str(path) for path in targets if path.exists()]
    if existing and not overwrite:
        raise FileExistsError(f"{', '.join(existing)} exist(s); pass overwrite=True (--overwrite) to replace the "
                              "report")
    figures = draw_figures(table, figures_dir)
    text = render(table, figures, markdown.parent, reproduce=reproduce, problems=problems)
    markdown.parent.mkdir(parents=True, exist_ok=True)
    atomic.write_text(markdown, text)
    return Report(markdown, figures, problems)


def _figure_names(table: StudyTable) -> list[str]:
    return [f"{kind}{_suffix(table, c)}.png" for c in table.checkpoints() for kind in FIGURES]


FIGURES = ("metric_per_head", "paired_differences", "learning_curves", "frozen_vs_finetuned", "critical_difference")
"""The figures per checkpoint, each drawn by the `plots` function of its name (None when it has no data)."""


def _suffix(table: StudyTable, checkpoint: str) -> str:
    """'' for a one-checkpoint study, else a file-name form of the checkpoint."""
    if len(table.checkpoints()) == 1:
        return ""
    return "_" + "".join(ch if ch.isalnum() or ch in "-." else "_" for ch in checkpoint)


def draw_figures(table: StudyTable, figures_dir: Path) -> list[Path]:
    drawn = []
    for checkpoint in table.checkpoints():
        suffix = _suffix(table, checkpoint)
        drawn += [getattr(plots, kind)(table, checkpoint, figures_dir / f"{kind}{suffix}.png") for kind in FIGURES]
    return [path for path in drawn if path is not None]


# -- markdown ---------------------------------------------------------------------------------


def render(table: StudyTable, figures: Sequence[Path], base: Path, *, reproduce: str | None = None,
           problems: Sequence[str] = ()) -> str:
    """The report's markdown; figure links relative to `base` (the markdown's folder)."""
    parts = ["# Which head works best? A head study\n", "## Question\n", QUESTION + "\n", "## Setup\n",
             setup(table) + "\n"]
    for checkpoint in table.checkpoints():
        title = f" ({checkpoint})" if len(table.checkpoints()) > 1 else ""
        parts += [f"## Results{title}\n", results_table(table, checkpoint) + "\n",
                  f"### Each head against the default head (`{table.default_head}`), paired by seed\n",
                  comparison_table(table, checkpoint) + "\n"]
        parts += _analysis_sections(table, checkpoint)
        if "probe" in table.modes():
            parts += ["### Fine-tuned vs frozen backbone (linear probe)\n", probe_table(table, checkpoint) + "\n"]
    parts += ["## Plots\n"] + [f"![{path.stem}]({os.path.relpath(path, base)})\n" for path in figures]
    parts += ["## Conclusions\n", conclusions(table) + "\n"]
    notes = [note for note in map(checkpoint_note, table.checkpoints()) if note]
    if notes:
        parts += ["## The checkpoint\n", "\n\n".join(notes) + "\n"]
    parts += ["## What others measured\n", literature.section() + "\n"]
    if reproduce:
        # The comment tells tests/test_doc_examples.py to list the cells instead of training them for hours.
        parts += ["## Reproduce\n", '<!-- test: replace "flaxheads study run" "flaxheads study run --list" -->\n'
                  f"```sh\n{reproduce}\n```\n"]
    if problems:
        parts += ["## Notes on the results files\n", "".join(f"- {line}\n" for line in problems)]
    return "\n".join(parts)


def setup(table: StudyTable) -> str:
    records = table.records
    first = records[0]
    settings = first["settings"]
    seeds = table.seeds()
    lines = [
        f"- Backbone(s): {', '.join(f'`{c}`' for c in table.checkpoints())}",
        f"- Heads: {', '.join(f'`{h}`' for h in table.heads())} (default, the reference of the comparisons: "
        f"`{table.default_head}`)",
        "- Data sets (train / validation / test examples used): " + "; ".join(
            f"`{d}` {_sizes(table, d)}, judged by {table.split} {table.metric(d)}" for d in table.datasets()),
        f"- Seeds: {', '.join(map(str, seeds))} ({len(seeds)}); a seed sets the head's initialisation, dropout and "
        f"the data order; the splits and subsets are fixed (split_seed {settings.get('split_seed')})"
        + (f"; the learning-rate search ran on seed(s) {', '.join(map(str, table.search_seeds()))}"
           if table.searches else ""),
        "- Modes: " + ", ".join(table.modes()) + " (" + "; ".join(MODE_MEANINGS[m] for m in table.modes()
                                                            if m in MODE_MEANINGS) + ")",
        "- Shared settings: " + ", ".join(f"{k} {v}" for k, v in _shared_settings(table).items()),
        *([budget] if (budget := _budget(table)) else []),
        f"- Cells: {len(records)}; compute: {_hours(sum(r.get('wall_seconds') or 0 for r in records))} in all, "
        f"{_mean_seconds(records):.0f} s per cell on {_devices(records)}",
        f"- Versions: {_versions(records)}",
        "- Statistics: mean ± standard deviation over seeds [95% t interval of the mean]. Each head against the "
        "default: paired by seed, exact sign-flip permutation p-value (all 2^n flips up to "
        f"{stats.EXACT_SIGN_FLIPS_UP_TO} seeds), Holm-adjusted over all the comparisons of a checkpoint and mode; "
        "a 95% paired bootstrap interval over seeds and test examples (test-set noise included; "
        f"{stats.BOOTSTRAP_SAMPLES} resamples, seed {stats.BOOTSTRAP_SEED}). \"better\"/\"worse\" only when "
        f"the Holm-adjusted p < {stats.ALPHA} and that interval excludes 0; otherwise \"within noise\". "
        "Across data sets: Friedman test over data-set x seed blocks, Nemenyi critical difference.",
    ]
    lines += [f"- Failed cell (no metrics): {r['head']} on {r['dataset']}, seed {r['seed']}, {r['mode']}: {r['error']}"
              for r in table.failed()]
    return "\n".join(lines)


MODE_MEANINGS = {
    "finetune": "finetune: backbone and head trained end to end",
    "probe": "probe: backbone frozen, only the head trained by the Trainer",
    "lbfgs": "lbfgs: a logistic regression fitted to convergence (L-BFGS) on the head's features of the frozen "
             "backbone",
    "majority": "majority: the training split's most frequent class, predicted for every example",
}


def _shared_settings(table: StudyTable) -> dict[str, Any]:
    """The records' settings without those a cell does not use: the fixed rate and step count where
    rates are chosen per cell and the budget is epochs, the probe's rate where no cell probes."""
    settings = {k: v for k, v in table.records[0]["settings"].items() if v not in ({}, None)}
    if settings.get("learning_rates"):
        settings.pop("learning_rate", None)
    if settings.get("max_epochs"):
        settings.pop("max_steps", None)
    if "probe" not in table.modes():
        settings.pop("probe_learning_rate", None)
    return settings


def _budget(table: StudyTable) -> str | None:
    """Each fine-tuned cell's budget, in steps, and what the cells used of it; None without an
    epoch budget."""
    settings = table.records[0]["settings"]
    if not settings.get("max_epochs"):
        return None
    most = round(settings["max_epochs"] * -(-settings["train_examples"] // settings["batch_size"]))
    tuned = [r for seeds in (g for k, g in table.groups.items() if k[2] == "finetune") for r in seeds.values()
             if r.get("steps")]
    if not tuned:
        return None
    steps = sorted(r["steps"] for r in tuned)
    stopped = sum(r["steps"] < most for r in tuned)
    patience, every = settings.get("early_stopping_patience"), settings.get("eval_steps")
    return (f"- Budget: at most {settings['max_epochs']:g} epochs x {settings['train_examples']} examples / batch "
            f"{settings['batch_size']} = {most} steps a cell, validation every {every} steps, stopping after "
            f"{patience} evaluations ({patience * every} steps) without a better one; the model of the best "
            f"evaluation is the one tested. The {len(tuned)} fine-tuned cells ran {steps[0]}-{steps[-1]} steps "
            f"(median {steps[len(steps) // 2]}); {stopped} stopped early.")


def _sizes(table: StudyTable, dataset: str) -> str:
    sizes = next(r.get("split_sizes") or {} for r in table.records if r["dataset"] == dataset)
    return " / ".join(str(sizes.get(s, "-")) for s in ("train", "validation", "test"))


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.0f} min"


def _mean_seconds(records: Sequence[dict[str, Any]]) -> float:
    walls = [r["wall_seconds"] for r in records if r.get("wall_seconds") is not None]
    return sum(walls) / len(walls) if walls else 0.0


def _devices(records: Sequence[dict[str, Any]]) -> str:
    kinds = {(d.get("kind"), d.get("count"), d.get("cpu_count")) for d in (r.get("device") or {} for r in records)}
    return "; ".join(f"{count} x {kind} ({cpus} CPU cores)" for kind, count, cpus in sorted(kinds, key=str))


def _versions(records: Sequence[dict[str, Any]]) -> str:
    seen = {tuple(sorted((r.get("versions") or {}).items())) for r in records}
    return "; ".join(", ".join(f"{k} {v}" for k, v in versions) for versions in sorted(seen))


def _cell(summary: stats.Summary | None) -> str:
    if summary is None:
        return "-"
    return f"{summary.mean:.4f} ± {summary.std:.4f} [{summary.low:.4f}, {summary.high:.4f}] (n={summary.n})"


def _markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def results_table(table: StudyTable, checkpoint: str, mode: str = "finetune") -> str:
    datasets = table.datasets()
    header = ["head"] + [f"{d} ({table.split} {table.metric(d)})" for d in datasets]
    rows = [[f"`{h}`"] + [_cell(table.summary((checkpoint, d, mode, h))) for d in datasets] for h in table.heads()]
    return _markdown_table(header, rows)


def _difference(comparison: stats.Comparison | None) -> str:
    if comparison is None:
        return "-"
    examples = (f"; seeds x examples [{comparison.example_low:+.4f}, {comparison.example_high:+.4f}]"
                if comparison.example_low is not None else "")
    holm = f", Holm {comparison.p_holm:.3g}" if comparison.p_holm is not None else ""
    return (f"{comparison.difference:+.4f} [{comparison.low:+.4f}, {comparison.high:+.4f}]{examples}; "
            f"p {comparison.p:.3g}{holm} **{comparison.verdict}** (n={comparison.n})")


def comparison_table(table: StudyTable, checkpoint: str, mode: str = "finetune") -> str:
    datasets = table.datasets()
    header = ["head"] + [f"{d}: difference [95% t CI]; p" for d in datasets]
    rows = [[f"`{h}`"] + [_difference(table.comparison((checkpoint, d, mode, h))) for d in datasets]
            for h in table.heads() if h != table.default_head]
    return _markdown_table(header, rows)


def probe_table(table: StudyTable, checkpoint: str) -> str:
    rows = []
    for dataset in table.datasets():
        for head in table.heads():
            probe = table.summary((checkpoint, dataset, "probe", head))
            if probe is None:
                continue
            tuned = table.summary((checkpoint, dataset, "finetune", head))
            gap = stats.paired_comparison(table.values((checkpoint, dataset, "finetune", head)),
                                          table.values((checkpoint, dataset, "probe", head)),
                                          higher_is_better=table.higher_is_better(dataset))
            rows.append([f"`{dataset}`", f"`{head}`", _cell(tuned), _cell(probe), _difference(gap)])
    header = ["data set", "head", "fine-tuned", "frozen (probe)", "fine-tuned minus frozen [95% CI]"]
    return _markdown_table(header, rows)


def conclusions(table: StudyTable) -> str:
    """A few sentences read off the paired comparisons (fine-tuned cells): per data set, which
    heads are within noise of the default, which better, which worse; and the probe's cost."""
    sentences = []
    for checkpoint in table.checkpoints():
        for dataset in table.datasets():
            verdicts: dict[str, list[str]] = {stats.WITHIN_NOISE: [], stats.BETTER: [], stats.WORSE: []}
            for head in table.heads():
                comparison = table.comparison((checkpoint, dataset, "finetune", head))
                if comparison is not None:
                    verdicts[comparison.verdict].append(
                        f"`{head}` ({comparison.difference:+.4f})")
            if not any(verdicts.values()):
                continue
            parts = []
            if verdicts[stats.WITHIN_NOISE]:
                parts.append("within noise of it: " + ", ".join(verdicts[stats.WITHIN_NOISE]))
            if verdicts[stats.BETTER]:
                parts.append("better: " + ", ".join(verdicts[stats.BETTER]))
            if verdicts[stats.WORSE]:
                parts.append("worse: " + ", ".join(verdicts[stats.WORSE]))
            where = f"{checkpoint} on " if len(table.checkpoints()) > 1 else ""
            sentences.append(f"- {where}`{dataset}` ({table.split} {table.metric(dataset)}, against "
                             f"`{table.default_head}`): " + "; ".join(parts) + "." + _rate_caveat(table, checkpoint,
                                                                                                 dataset))
    sentences += _probe_sentences(table)
    if not sentences:
        return ("Too few cells for comparisons: every data set needs the default head and another head on the "
                "same seeds.")
    return "\n".join(sentences)


def _rate_caveat(table: StudyTable, checkpoint: str, dataset: str) -> str:
    """A sentence when the heads on `dataset` trained at different chosen learning rates: a
    difference between two of them is then the rate's as much as the head's."""
    by_rate: dict[tuple[float, ...], list[str]] = {}
    for head in table.heads():
        rates = tuple(table.chosen_rates(checkpoint, dataset, head))
        if rates:
            by_rate.setdefault(rates, []).append(f"`{head}`")
    if len(by_rate) < 2:
        return ""
    groups = "; ".join(f"{', '.join(f'{r:g}' for r in rates)} for {', '.join(heads)}"
                       for rates, heads in by_rate.items())
    return (f" The heads trained at different learning rates here ({groups}), chosen on validation: a difference "
            "between heads of different rates may be the rate's, not the head's.")


def _probe_sentences(table: StudyTable) -> list[str]:
    sentences = []
    for checkpoint in table.checkpoints():
        for dataset in table.datasets():
            gaps = []
            for head in table.heads():
                gap = stats.paired_comparison(table.values((checkpoint, dataset, "finetune", head)),
                                              table.values((checkpoint, dataset, "probe", head)),
                                              higher_is_better=table.higher_is_better(dataset))
                if gap is not None:
                    gaps.append(f"`{head}` {gap.difference:+.4f} ({gap.verdict} for fine-tuning)")
            if gaps:
                sentences.append(f"- Fine-tuned minus frozen backbone on `{dataset}`: " + ", ".join(gaps) + ".")
    return sentences


def _analysis_sections(table: StudyTable, checkpoint: str) -> list[str]:
    """Rank analysis, baselines and converged probes, convergence: each where the records have it."""
    parts = []
    ranks = table.ranks(checkpoint)
    if ranks is not None:
        ordered = sorted(zip(ranks.average_ranks, ranks.heads))
        parts += ["### Ranks across data sets (Friedman, Nemenyi)\n",
                  f"Over {ranks.blocks} data-set x seed blocks (rank 1 best): "
                  + ", ".join(f"`{head}` {rank:.2f}" for rank, head in ordered)
                  + f". Friedman chi-square {ranks.statistic:.2f}, p {ranks.p:.3g}; Nemenyi critical difference "
                  f"{ranks.critical_difference:.2f} (alpha {stats.ALPHA}): heads whose average ranks differ by more "
                  "differ.\n"]
    rows = []
    for dataset in table.datasets():
        majority = table.majority(checkpoint, dataset)
        for head in table.heads():
            frozen = table.summary((checkpoint, dataset, "lbfgs", head))
            if frozen is not None:
                rows.append([f"`{dataset}`", f"`{head}`", _cell(table.summary((checkpoint, dataset, "finetune", head))),
                             _cell(frozen), "-" if majority is None else f"{majority:.4f}"])
    if rows:
        parts += ["### Fine-tuned vs converged linear probe (L-BFGS on frozen features) and the majority class\n",
                  _markdown_table(["data set", "head", "fine-tuned", "frozen, L-BFGS probe", "majority class"], rows)
                  + "\n"]
    parts += [convergence(table, checkpoint) + "\n"] if table.searches or table.unconverged() else []
    return parts


def convergence(table: StudyTable, checkpoint: str) -> str:
    """The learning rates chosen on validation and the cells that may not have converged."""
    lines = ["### Convergence and learning rates\n"]
    rates = [f"`{head}` on `{dataset}`: {', '.join(f'{r:g}' for r in table.chosen_rates(checkpoint, dataset, head))}"
             for dataset in table.datasets() for head in table.heads() if table.chosen_rates(checkpoint, dataset, head)]
    if rates:
        lines.append(f"Learning rates chosen on validation ({len(table.searches)} search cells): " + "; ".join(rates)
                     + ".")
    searched = search_table(table, checkpoint)
    if searched:
        lines.append(("\n" if rates else "") + searched)
    late = [record for record in table.unconverged() if record["checkpoint"] == checkpoint]
    counts: dict[tuple[str, str], int] = {}
    for record in late:
        counts[record["dataset"], record["head"]] = counts.get((record["dataset"], record["head"]), 0) + 1
    cells = {(d, h): len(seeds) for (c, d, m, h), seeds in table.groups.items() if c == checkpoint and m == "finetune"}
    lines.append(f"{len(late)} of {sum(cells.values())} fine-tuned cell(s) reached their best validation metric in "
                 "the last quarter of their steps (perhaps still rising when they ended)" + (": " + ", ".join(
                     f"`{h}` on `{d}` {n} of {cells.get((d, h), n)}" for (d, h), n in sorted(counts.items()))
                     if late else "") + ".")
    noise = validation_noise(table.records)
    if noise:
        lines.append(noise)
    return "\n".join(lines)


def search_table(table: StudyTable, checkpoint: str) -> str | None:
    """The learning-rate search: each arm's best validation metric at each candidate rate (the
    mean over its search seeds), the chosen rate in bold; None without search cells."""
    values: dict[tuple[str, str], dict[float, list[float]]] = {}
    for record in table.searches:
        best = (record.get("best") or {}).get("value")
        if record["checkpoint"] == checkpoint and best is not None and "error" not in record:
            values.setdefault((record["dataset"], record["head"]), {}).setdefault(
                record["learning_rate"], []).append(float(best))
    if not values:
        return None
    rates = sorted({rate for by_rate in values.values() for rate in by_rate})
    rows = ["| data set | head | " + " | ".join(f"lr {rate:g}" for rate in rates) + " |",
            "|---|---|" + "---|" * len(rates)]
    for (dataset, head), by_rate in values.items():
        means = {rate: float(np.mean(v)) for rate, v in by_rate.items()}
        chosen = max(sorted(means), key=lambda rate: means[rate])
        cells = [("" if rate not in means else f"**{means[rate]:.3f}**" if rate == chosen else f"{means[rate]:.3f}")
                 for rate in rates]
        rows.append(f"| {dataset} | {head} | " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


def validation_noise(records: list[dict[str, Any]]) -> str | None:
    """How far one evaluation on the study's validation subset moves by chance: the binomial
    standard error of an accuracy at the cells' mean best value; None without accuracies."""
    sizes = [r["split_sizes"]["validation"] for r in records if (r.get("split_sizes") or {}).get("validation")]
    best = [float(r["best"]["value"]) for r in records if (r.get("best") or {}).get("metric") == "accuracy"
            and r["best"].get("value") is not None]
    if not sizes or not best:
        return None
    n, p = min(sizes), float(np.mean(best))
    return (f"How much to read into both: one evaluation on {n} validation examples has a binomial standard error "
            f"of {np.sqrt(p * (1 - p) / n):.3f} at accuracy {p:.2f}, so a search rate that wins by less than about "
            "twice that, or a best evaluation late in a flat but noisy curve, may be chance.")


def checkpoint_note(checkpoint: str) -> str | None:
    """What the shipped MiniLM's weights say about its pooler (read from them, not assumed):
    None for another checkpoint."""
    if checkpoint != "all-MiniLM-L6-v2":
        return None
    import json

    import numpy as np
    from safetensors.numpy import load_file

    from flaxheads.shipped_model import minilm_path

    folder = minilm_path()
    weights = load_file(folder / "model.safetensors")
    kernel, bias = weights["pooler.dense.weight"].astype(np.float64), weights["pooler.dense.bias"]
    top = np.linalg.svd(kernel, compute_uv=False)[0]
    edge = 2 * kernel.std() * np.sqrt(kernel.shape[0])
    pooling = json.loads((folder / "1_Pooling" / "config.json").read_text())
    modes = [k.removeprefix("pooling_mode_") for k, on in pooling.items() if k.startswith("pooling_mode_") and on]
    return (f"`all-MiniLM-L6-v2` is a sentence-transformers encoder trained for {' and '.join(modes)} pooling "
            f"(its 1_Pooling/config.json). Its BERT pooler was never trained: the bias is exactly 0 "
            f"(max |b| = {np.abs(bias).max():g}) and the weight's largest singular value, {top:.3f}, sits at the "
            f"edge a random Gaussian matrix of its size and spread would have ({edge:.3f}). On this checkpoint the "
            "`pooler` head is a fresh dense + tanh layer over [CLS], which `pooler_reinit` makes explicit; the "
            "results say nothing about a checkpoint whose pooler was trained (e.g. BERT's, trained on next-sentence "
            "prediction).")
