"""The study's figures as PNG files (matplotlib, Agg backend: no display needed), one panel per
data set: the metric per head with 95% CIs, the learning curves per head, frozen vs fine-tuned.

matplotlib is imported only when a figure is drawn (`flaxheads.plotting`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from flaxheads.plotting import pyplot, save
from flaxheads.study.table import StudyTable


def _panels(plt, count: int, *, width: float = 4.2, height: float = 3.4):
    columns = min(count, 2)
    rows = -(-count // columns)
    width = max(width * columns, 6.4)  # room for the figure's title over a single panel
    figure, axes = plt.subplots(rows, columns, figsize=(width, height * rows), squeeze=False)
    for extra in axes.flat[count:]:
        extra.set_visible(False)
    return figure, list(axes.flat[:count])


def metric_per_head(table: StudyTable, checkpoint: str, path: Path, mode: str = "finetune") -> Path | None:
    """Mean test metric per head with its 95% bootstrap CI (bars) and each seed (dots); the
    default head's mean as a dashed line. None when `mode` has no cells."""
    datasets = [d for d in table.datasets() if any(table.values((checkpoint, d, mode, h)) for h in table.heads())]
    if not datasets:
        return None
    plt = pyplot()
    figure, axes = _panels(plt, len(datasets))
    for ax, dataset in zip(axes, datasets):
        heads = [h for h in table.heads() if table.values((checkpoint, dataset, mode, h))]
        for x, head in enumerate(heads):
            group = (checkpoint, dataset, mode, head)
            summary = table.summary(group)
            color = "tab:orange" if head == table.default_head else "tab:blue"
            ax.errorbar(x, summary.mean, yerr=[[summary.mean - summary.low], [summary.high - summary.mean]],
                        fmt="o", color=color, capsize=4, markersize=6)
            seeds = list(table.values(group).values())
            ax.scatter(np.full(len(seeds), x + 0.18), seeds, s=9, color="gray", alpha=0.7)
            if head == table.default_head:
                ax.axhline(summary.mean, color=color, linestyle="--", linewidth=0.8)
        ax.set_xticks(range(len(heads)), heads, rotation=35, ha="right")
        ax.set_title(dataset)
        ax.set_ylabel(f"{table.split} {table.metric(dataset)}")
        ax.grid(axis="y", alpha=0.3)
    figure.suptitle(f"{checkpoint}, {mode}: mean and 95% CI over seeds (dots: seeds)", fontsize=10)
    return save(plt, figure, path)


def learning_curves(table: StudyTable, checkpoint: str, path: Path, mode: str = "finetune") -> Path | None:
    """Validation metric against step, one line per head (mean over seeds, band: min to max)."""
    datasets = [d for d in table.datasets() if any(table.curves((checkpoint, d, mode, h)) for h in table.heads())]
    if not datasets:
        return None
    plt = pyplot()
    figure, axes = _panels(plt, len(datasets))
    for ax, dataset in zip(axes, datasets):
        for head in table.heads():
            steps, values = _curve_matrix(table.curves((checkpoint, dataset, mode, head)))
            if steps is None:
                continue
            style = dict(linewidth=2.2, color="black") if head == table.default_head else dict(linewidth=1.2)
            line, = ax.plot(steps, values.mean(axis=0), label=head, **style)
            ax.fill_between(steps, values.min(axis=0), values.max(axis=0), color=line.get_color(), alpha=0.12)
        ax.set_title(dataset)
        ax.set_xlabel("step")
        ax.set_ylabel(f"validation {table.metric(dataset)}")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    figure.suptitle(f"{checkpoint}, {mode}: learning curves (mean over seeds; band: min to max)", fontsize=10)
    return save(plt, figure, path)


def _curve_matrix(curves: dict[int, list[tuple[int, float]]]):
    """(steps, seeds x steps values) on the steps every seed has; (None, None) when none."""
    if not curves:
        return None, None
    common = sorted(set.intersection(*(set(step for step, _ in curve) for curve in curves.values())))
    if not common:
        return None, None
    values = np.array([[dict(curve)[step] for step in common] for curve in curves.values()])
    return np.array(common), values


def frozen_vs_finetuned(table: StudyTable, checkpoint: str, path: Path) -> Path | None:
    """Per data set with linear-probe cells: each head's mean and 95% CI fine-tuned and frozen."""
    datasets = [d for d in table.datasets() if any(table.values((checkpoint, d, "probe", h)) for h in table.heads())]
    if not datasets:
        return None
    plt = pyplot()
    figure, axes = _panels(plt, len(datasets))
    modes = (("finetune", "fine-tuned", "tab:blue"), ("probe", "frozen backbone (linear probe)", "tab:red"))
    for ax, dataset in zip(axes, datasets):
        heads = [h for h in table.heads() if table.values((checkpoint, dataset, "probe", h))]
        for offset, (mode, label, color) in zip((-0.15, 0.15), modes):
            for x, head in enumerate(heads):
                summary = table.summary((checkpoint, dataset, mode, head))
                if summary is None:
                    continue
                ax.errorbar(x + offset, summary.mean, yerr=[[summary.mean - summary.low], [summary.high - summary.mean]],
                            fmt="o", color=color, capsize=4, label=label if x == 0 else None)
        ax.set_xticks(range(len(heads)), heads)
        ax.set_title(dataset)
        ax.set_ylabel(f"{table.split} {table.metric(dataset)}")
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(fontsize=7)
    figure.suptitle(f"{checkpoint}: fine-tuned vs frozen backbone (mean and 95% CI over seeds)", fontsize=10)
    return save(plt, figure, path)
