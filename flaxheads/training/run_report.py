"""A training run's report: PNG figures in `<output_dir>/report/`, drawn from the run's metrics
log (metrics.jsonl) and results (results.json) when it finishes, and again by `flaxheads report
RUN_DIR`. It knows no task: each figure is drawn when results.json holds what it needs, and a
task's scorer decides what its reports hold (`reports[split]`).

- training_curves.png: training and validation loss against the step; the validation metric the
  run follows (metric_for_best_model) with its best evaluation; on both, the step whose weights
  were exported (results' exported_step with load_best_model_at_end, else the last step): the
  model `predict` and `evaluate` read.
- confusion_matrix.png (a report with "confusion_matrix": single-label examples, token
  classification's words by tag): counts, coloured by the share of each true class, of the test
  split where it was scored, else the validation split.
- per_class_f1.png (a report with "per_class": classification) or per_type_f1.png (with
  "per_type": token classification's entity types): F1 per class, label or type of the scored
  splits, with support.
- reliability.png (with calibrate): accuracy against confidence per bin on the validation split,
  before and after temperature scaling, with the ECE of each.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from flaxheads import plotting
from flaxheads.training.run_files import (
    METRICS_FILENAME, REPORT_DIR, RESULTS_FILE, RUN_FILE, RunConflict, read_results, read_run, recorded_outputs,
    write_run_record,
)

MAX_ANNOTATED_CLASSES = 25
"""Above this many classes the confusion matrix shows colours only (numbers would not fit)."""

MAX_MARKED_POINTS = 40
"""A loss curve of at most this many logged steps shows each as a point: a line of one point is
invisible, and a few points joined by lines hide where the logs were."""

PER_KEYS = {"per_class": "class", "per_type": "entity type"}
"""The report entries that hold one F1 per name, and what a name is in the figure's title."""


def read_metrics_log(file: str | os.PathLike) -> list[dict[str, Any]]:
    """The rows of a run's metrics.jsonl; a line cut short by a kill (the last one) is skipped."""
    rows = []
    for line in Path(file).read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and "step" in row:
            rows.append(row)
    return rows


def draw(output_dir: str | os.PathLike, results: dict[str, Any], log: list[dict[str, Any]] | None = None
         ) -> list[Path]:
    """Draws every figure the run's `results` and metrics `log` (default: read from output_dir)
    support into output_dir/report/; returns their paths."""
    output_dir = Path(output_dir)
    if log is None:
        file = output_dir / METRICS_FILENAME
        log = read_metrics_log(file) if file.is_file() else []
    folder = output_dir / REPORT_DIR
    drawn = [
        _training_curves(log, results, folder / "training_curves.png"),
        _confusion_matrix(results, folder / "confusion_matrix.png"),
        *(_per_name_f1(results, key, folder / f"{key}_f1.png") for key in PER_KEYS),
        _reliability(results, folder / "reliability.png"),
    ]
    return [path for path in drawn if path is not None]


def regenerate(run_dir: str | os.PathLike) -> list[Path]:
    """`flaxheads report RUN_DIR`: the figures again, from the run's results.json and metrics.jsonl.
    ValueError when the folder holds no flaxheads run or no finished run's results; RunConflict
    when flaxheads cannot prove it wrote the folder's run.json or results.json (another program's,
    or changed since: `run_files.read_run`, `run_files.read_results`), or when its report/ is not
    one the run recorded writing (it is never written over). A run from before the report existed
    gets report/ added to the names its run.json records."""
    run_dir = Path(run_dir)
    record = read_run(run_dir)
    if record is None:
        raise ValueError(f"{run_dir} holds no {RUN_FILE}: a report is drawn only in a flaxheads train run's folder "
                         "(its --output_dir)")
    results = read_results(run_dir, record)
    if results is None:
        raise ValueError(f"{run_dir} holds no {RESULTS_FILE}: a report is drawn from a finished flaxheads train run's "
                         "folder (its --output_dir)")
    if REPORT_DIR not in recorded_outputs(record, run_dir):
        if os.path.lexists(run_dir / REPORT_DIR):
            raise RunConflict(f"{run_dir / REPORT_DIR} is not the run's (its {RUN_FILE} records no report), and the "
                              "report would write over it: move it out of the folder, then draw the report again")
        write_run_record(run_dir, {**record, "outputs": [*record.get("outputs", []), REPORT_DIR]})
    return draw(run_dir, results)


def _followed_metric(results: dict[str, Any], eval_rows: list[dict[str, Any]]) -> str | None:
    metric = (results.get("best") or {}).get("metric")
    if metric and any(metric in row for row in eval_rows):
        return metric
    names = [k for row in eval_rows for k in row if k not in ("step", "split", "loss", "epoch", "seconds")]
    return names[0] if names else None


def _series(rows: list[dict[str, Any]], key: str) -> tuple[np.ndarray, np.ndarray]:
    points = [(row["step"], row[key]) for row in rows if row.get(key) is not None]
    return np.array([p[0] for p in points]), np.array([p[1] for p in points], dtype=np.float64)


def exported_step(results: dict[str, Any]) -> int | None:
    """The step whose weights the run exported: the best evaluation's with load_best_model_at_end
    (results' exported_step), else the last step."""
    step = results.get("exported_step", results.get("steps"))
    return None if step is None else int(step)


def _training_curves(log: list[dict[str, Any]], results: dict[str, Any], path: Path) -> Path | None:
    train_rows = [row for row in log if row.get("split") == "train"]
    eval_rows = [row for row in log if row.get("split") == "eval"]
    if not train_rows and not eval_rows:
        return None
    metric = _followed_metric(results, eval_rows)
    exported = exported_step(results)
    plt = plotting.pyplot()
    panels = 2 if metric else 1
    figure, axes = plt.subplots(1, panels, figsize=(5.2 * panels, 3.8), squeeze=False)
    ax = axes[0][0]
    for rows, label in ((train_rows, "training loss"), (eval_rows, "validation loss")):
        steps, values = _series(rows, "loss")
        if len(steps):
            ax.plot(steps, values, "o-" if len(steps) <= MAX_MARKED_POINTS else "-", label=label, markersize=4)
    last = max([row["step"] for row in train_rows + eval_rows] + [int(results.get("steps") or 0)])
    ax.set(xlabel="step", ylabel="loss", title="Loss", xlim=(0, last * 1.03 + 1))
    _mark_exported(ax, exported)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    if metric:
        ax = axes[0][1]
        steps, values = _series(eval_rows, metric)
        ax.plot(steps, values, "o-", color="tab:green", markersize=4, label=f"validation {metric}")
        best = results.get("best") or {}
        if best.get("metric") == metric and best.get("step") is not None and best.get("value") is not None:
            kept = "" if best["step"] == exported else " (not exported; load_best_model_at_end=True exports it)"
            ax.plot([best["step"]], [best["value"]], "*", color="tab:red", markersize=14,
                    label=f"best: {best['value']:.4g} at step {best['step']}{kept}")
        _mark_exported(ax, exported)
        ax.set(xlabel="step", ylabel=metric, title=f"Validation {metric}", xlim=axes[0][0].get_xlim())
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    exported_note = "" if exported is None else f"; exported: the weights of step {exported}"
    figure.suptitle(f"Training: {results.get('steps', '?')} steps{exported_note}")
    return plotting.save(plt, figure, path)


def _mark_exported(ax, step: int | None) -> None:
    """A dashed line at the step whose weights the run exported, which `predict` reads."""
    if step is not None:
        ax.axvline(step, color="gray", linestyle="--", linewidth=1,
                   label=f"exported step {step} (the model predict uses)")


def _report_split(results: dict[str, Any], key: str) -> tuple[str, dict[str, Any]] | None:
    """The test split's per-class report holding `key`, else the validation split's."""
    reports = results.get("reports") or {}
    for split in ("test", "validation"):
        if key in (reports.get(split) or {}):
            return split, reports[split]
    return None


def _confusion_matrix(results: dict[str, Any], path: Path) -> Path | None:
    found = _report_split(results, "confusion_matrix")
    if found is None:
        return None
    split, report = found
    names = list(report.get("confusion_labels") or report["per_class"])
    counted = report.get("confusion_of", "examples")
    counts = np.asarray(report["confusion_matrix"], dtype=np.float64)
    totals = counts.sum(axis=1, keepdims=True)
    shares = np.divide(counts, totals, out=np.zeros_like(counts), where=totals > 0)
    plt = plotting.pyplot()
    size = min(max(4.0, 0.55 * len(names) + 2.5), 16.0)
    figure, ax = plt.subplots(figsize=(size + 1.2, size))
    image = ax.imshow(shares, cmap="Blues", vmin=0.0, vmax=1.0)
    figure.colorbar(image, ax=ax, fraction=0.046, pad=0.04, label="share of the true class")
    ax.set_xticks(range(len(names)), names, rotation=45 if len(names) > 4 else 0, ha="right" if len(names) > 4 else "center")
    ax.set_yticks(range(len(names)), names)
    ax.set(xlabel="predicted", ylabel="true")
    if len(names) <= MAX_ANNOTATED_CLASSES:
        for i in range(len(names)):
            for j in range(len(names)):
                ax.text(j, i, f"{int(counts[i, j])}", ha="center", va="center",
                        color="white" if shares[i, j] > 0.5 else "black", fontsize=9)
    accuracy = np.trace(counts) / max(counts.sum(), 1.0)
    ax.set_title(f"Confusion matrix, {split} split\n({int(counts.sum())} {counted}, accuracy {accuracy:.3f})")
    return plotting.save(plt, figure, path)


def _per_name_f1(results: dict[str, Any], key: str, path: Path) -> Path | None:
    """F1 per name of the reports' `key` entry ("per_class", "per_type"), a bar per scored split.
    A name one split lacks (an entity type neither true nor predicted there) has no bar in it."""
    reports = {split: r for split, r in (results.get("reports") or {}).items() if r and r.get(key)}
    if not reports:
        return None
    names = list(dict.fromkeys(name for report in reports.values() for name in report[key]))
    plt = plotting.pyplot()
    height = min(max(3.0, 0.45 * len(names) * len(reports) + 2.0), 20.0)
    figure, ax = plt.subplots(figsize=(6.8, height))
    bar = 0.8 / len(reports)
    y = np.arange(len(names))
    for k, (split, report) in enumerate(reports.items()):
        scored = [n for n in names if n in report[key]]
        macro = (report.get("macro_avg") or {}).get("f1")
        bars = ax.barh(y[[names.index(n) for n in scored]] + (k - (len(reports) - 1) / 2) * bar,
                       [report[key][n]["f1"] for n in scored], height=bar,
                       label=split if macro is None else f"{split} (macro F1 {macro:.3f})")
        for rect, n in zip(bars, scored):
            ax.text(rect.get_width() + 0.01, rect.get_y() + rect.get_height() / 2,
                    f"{report[key][n]['f1']:.2f} (n={report[key][n]['support']})", va="center", fontsize=8)
    ax.set_yticks(y, names)
    ax.invert_yaxis()
    ax.set(xlim=(0, 1.25), xlabel="F1", title=f"F1 per {PER_KEYS[key]}")
    ax.set_xticks(np.linspace(0.0, 1.0, 6))
    ax.grid(axis="x", alpha=0.3)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=len(reports), frameon=False)
    return plotting.save(plt, figure, path)


def _reliability(results: dict[str, Any], path: Path) -> Path | None:
    calibration = results.get("calibration") or {}
    bins = calibration.get("reliability")
    if not bins:
        return None
    plt = plotting.pyplot()
    figure, axes = plt.subplots(1, 2, figsize=(10, 4.4), sharey=True)
    for ax, when in zip(axes, ("before", "after")):
        rows = bins[when]
        centres = [(b["lower"] + b["upper"]) / 2 for b in rows]
        width = 1.0 / calibration.get("ece_bins", 15)
        ax.bar(centres, [b["accuracy"] for b in rows], width=width * 0.9, color="tab:blue", alpha=0.8,
               label="accuracy in the bin")
        ax.plot([b["confidence"] for b in rows], [b["accuracy"] for b in rows], "o", color="tab:orange",
                markersize=4, label="mean confidence")
        ax.plot([0, 1], [0, 1], "--", color="gray", linewidth=1, label="perfectly calibrated")
        scores = calibration[when]
        t = 1.0 if when == "before" else calibration["temperature"]
        ax.set(xlim=(0, 1), ylim=(0, 1), xlabel="confidence", title=f"{when.capitalize()} (T = {t:.3g}): "
               f"ECE {scores['ece']:.3f}, log-loss {scores['log_loss']:.3f}")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("accuracy")
    axes[0].legend(loc="upper left")
    figure.suptitle("Reliability on the validation split")
    return plotting.save(plt, figure, path)
