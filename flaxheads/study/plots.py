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
        majority = table.majority(checkpoint, dataset)
        if majority is not None:
            ax.axhline(majority, color="gray", linestyle=":", linewidth=1.2, label="majority class (test)")
        ax.set_title(dataset)
        ax.set_xlabel("step")
        ax.set_ylabel(f"validation {table.metric(dataset)}")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    figure.suptitle(f"{checkpoint}, {mode}: learning curves\n(mean over seeds, up to the last step every seed reached; "
                    "band: min to max)", fontsize=10)
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
    """Per data set with linear-probe cells: each head's mean and 95% CI fine-tuned and frozen
    (the converged L-BFGS probe where the study has one, else the Trainer's probe)."""
    frozen = "lbfgs" if "lbfgs" in table.modes() else "probe"
    datasets = [d for d in table.datasets() if any(table.values((checkpoint, d, frozen, h)) for h in table.heads())]
    if not datasets:
        return None
    plt = pyplot()
    figure, axes = _panels(plt, len(datasets))
    label = "frozen, L-BFGS probe" if frozen == "lbfgs" else "frozen backbone (linear probe)"
    modes = (("finetune", "fine-tuned", "tab:blue"), (frozen, label, "tab:red"))
    for ax, dataset in zip(axes, datasets):
        heads = [h for h in table.heads() if table.values((checkpoint, dataset, frozen, h))]
        for offset, (mode, label, color) in zip((-0.15, 0.15), modes):
            for x, head in enumerate(heads):
                summary = table.summary((checkpoint, dataset, mode, head))
                if summary is None:
                    continue
                ax.errorbar(x + offset, summary.mean, yerr=[[summary.mean - summary.low], [summary.high - summary.mean]],
                            fmt="o", color=color, capsize=4, label=label if x == 0 else None)
        ax.set_xticks(range(len(heads)), heads, rotation=35, ha="right")
        ax.set_title(dataset)
        ax.set_ylabel(f"{table.split} {table.metric(dataset)}")
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(fontsize=7)
    figure.suptitle(f"{checkpoint}: fine-tuned vs frozen backbone (mean and 95% CI over seeds)", fontsize=10)
    return save(plt, figure, path)


def paired_differences(table: StudyTable, checkpoint: str, path: Path, mode: str = "finetune") -> Path | None:
    """Each head minus the default head, paired by seed: the mean with its 95% t interval (thick)
    and, where there is one, the interval over seeds and test examples (thin); filled markers for
    the differences the Holm-corrected analysis calls better or worse."""
    comparisons = table.comparisons(checkpoint, mode)
    datasets = [d for d in table.datasets() if any(key[0] == d for key in comparisons)]
    if not datasets:
        return None
    plt = pyplot()
    figure, axes = _panels(plt, len(datasets))
    for ax, dataset in zip(axes, datasets):
        heads = [h for h in table.heads() if (dataset, h) in comparisons]
        for y, head in enumerate(heads):
            c = comparisons[(dataset, head)]
            if c.example_low is not None:
                ax.plot([c.example_low, c.example_high], [y, y], color="tab:gray", linewidth=1)
            ax.plot([c.low, c.high], [y, y], color="tab:blue", linewidth=3)
            filled = c.verdict != "within noise"
            ax.plot(c.difference, y, "o", color="tab:blue", markerfacecolor="tab:blue" if filled else "white")
        ax.axvline(0.0, color="black", linewidth=0.8)
        ax.set_yticks(range(len(heads)), heads)
        ax.set_title(dataset)
        ax.set_xlabel(f"{table.split} {table.metric(dataset)} minus {table.default_head}'s")
        ax.grid(axis="x", alpha=0.3)
    figure.suptitle(f"{checkpoint}, {mode}: paired differences\n(thick: 95% t CI over seeds; thin: over seeds and "
                    "test examples; filled: Holm-corrected finding)", fontsize=9)
    return save(plt, figure, path)


def critical_difference(table: StudyTable, checkpoint: str, path: Path) -> Path | None:
    """Average rank of each head over the data-set x seed blocks on a line, with a bar as long as
    the Nemenyi critical difference: heads closer than it are not told apart."""
    ranks = table.ranks(checkpoint)
    if ranks is None:
        return None
    plt = pyplot()
    figure, ax = plt.subplots(figsize=(7.0, 0.45 * len(ranks.heads) + 1.4))
    ordered = sorted(zip(ranks.average_ranks, ranks.heads))
    for y, (rank, head) in enumerate(ordered):
        ax.plot(rank, y, "o", color="tab:blue")
        ax.annotate(head, (rank, y), textcoords="offset points", xytext=(8, -3), fontsize=8)
    best = ordered[0][0]
    ax.plot([best, best + ranks.critical_difference], [-0.8, -0.8], color="tab:red", linewidth=3)
    ax.annotate(f"CD {ranks.critical_difference:.2f}", (best, -0.8), textcoords="offset points", xytext=(0, 5),
                fontsize=8, color="tab:red")
    ax.set_xlim(0.5, len(ranks.heads) + 0.5)
    ax.set_ylim(len(ordered) - 0.4, -1.4)
    ax.set_yticks([])
    ax.set_xlabel("average rank (1 = best)")
    ax.set_title(f"{checkpoint}: Friedman p {ranks.p:.3g} over {ranks.blocks} blocks; Nemenyi critical difference",
                 fontsize=9)
    return save(plt, figure, path)
