"""Figures as PNG files: matplotlib with the Agg backend (no display needed), imported only when
a figure is drawn, and written under a temporary name then renamed, so a reader never finds half
an image. Used by a run's report (`flaxheads.training.run_report`) and the head study's plots."""

from __future__ import annotations

from pathlib import Path

from flaxheads import atomic

DPI = 110


def pyplot():
    """matplotlib.pyplot on the Agg backend; ModuleNotFoundError saying how to install it."""
    try:
        import matplotlib
    except ModuleNotFoundError:
        raise ModuleNotFoundError("drawing figures needs matplotlib: pip install matplotlib") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(plt, figure, path: Path) -> Path:
    """Lays out `figure`, writes it to `path` (format from the suffix) atomically, closes it."""
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic.write_file(path, lambda tmp: figure.savefig(tmp, dpi=DPI, format=path.suffix.lstrip(".") or "png"))
    plt.close(figure)
    return path
