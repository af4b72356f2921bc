"""A hyperparameter search's report, beside its runs: the table of trials (trials.csv,
trials.md: values, objective, state, steps, seconds), the best trial's export as best_model/, and
pictures through Optuna's matplotlib visualisation (search_report/: the optimisation history, the
parameters' importances, the objective against the learning rate). Every file is written
atomically, and recorded in search.json, so the next report replaces only what a search wrote:
a file of the same name that no search recorded is refused, never overwritten."""

from __future__ import annotations

import csv
import io
import json
import math
import shutil
import sys
import warnings
from pathlib import Path
from typing import Any

from flaxheads import atomic, plotting
from flaxheads.training import run_dir

RECORD_FILE = "search.json"
"""The search's record in its output_dir: which files there it wrote (so it replaces only those)."""
BEST_MODEL_DIR = "best_model"
"""The best trial's export, copied into the search's output_dir."""
TABLE_FILES = ("trials.csv", "trials.md")
PICTURES_DIR = "search_report"


class SearchConflict(ValueError):
    """A file the search would write exists, and no search recorded writing it."""


def trial_rows(study) -> list[dict[str, Any]]:
    """One row per trial: number, state, objective, each parameter, steps, seconds, run folder."""
    names = sorted({name for trial in study.trials for name in trial.params})
    rows = []
    for trial in study.trials:
        value = trial.values if trial.values is None or len(trial.values) > 1 else trial.values[0]
        row = {"number": trial.number, "state": trial.state.name.lower(), "objective": value}
        row.update({name: trial.params.get(name) for name in names})
        row.update(steps=trial.user_attrs.get("steps"), seconds=_rounded(trial.user_attrs.get("seconds")),
                   run=trial.user_attrs.get("run_name"))
        rows.append(row)
    return rows


def _rounded(seconds):
    return None if seconds is None else round(float(seconds), 1)


def csv_text(rows: list[dict[str, Any]]) -> str:
    out = io.StringIO()
    if rows:
        writer = csv.DictWriter(out, fieldnames=list(rows[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    return out.getvalue()


def markdown_text(rows: list[dict[str, Any]], best: int | None) -> str:
    if not rows:
        return "No trials.\n"
    columns = list(rows[0])
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        cells = [_cell(row[name]) for name in columns]
        if row["number"] == best:
            cells[0] = f"**{cells[0]}** (best)"
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _cell(value) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.6g}"
    return str(value)


def _record(output_dir: Path) -> dict[str, Any]:
    path = output_dir / RECORD_FILE
    if not path.exists():
        return {"written": []}
    return json.loads(path.read_text(encoding="utf-8"))


def _claim(output_dir: Path, names: list[str]) -> dict[str, Any]:
    """search.json listing `names` beside what it listed, written before the files are; SearchConflict
    when one of them exists and no search recorded it."""
    record = _record(output_dir)
    strangers = [name for name in names if (output_dir / name).exists() and name not in record["written"]]
    if strangers:
        raise SearchConflict(f"{', '.join(strangers)} in {output_dir} were not written by a search: a search writes "
                             "its table, pictures and best_model/ there. Move them, or choose another output_dir")
    record["written"] = sorted({*record["written"], *names})
    atomic.write_json(output_dir / RECORD_FILE, record)
    return record


def write(study, output_dir: Path, *, compilations: int) -> dict[str, Any]:
    """The search's table, best export and pictures in `output_dir`; returns {"trials": rows,
    "best_model": path or None, "report": [paths]} for `BestRun.run_summary`."""
    rows = trial_rows(study)
    best = _best_number(study)
    best_run = next((row["run"] for row in rows if row["number"] == best), None)
    best_folder = output_dir / best_run if best_run else None
    exports = best_folder is not None and (best_folder / run_dir.RUN_FILE).exists()
    names = [*TABLE_FILES, PICTURES_DIR] + ([BEST_MODEL_DIR] if exports else [])
    record = _claim(output_dir, names)
    atomic.write_text(output_dir / "trials.csv", csv_text(rows))
    atomic.write_text(output_dir / "trials.md", markdown_text(rows, best))
    best_model = copy_best_export(best_folder, output_dir) if exports else None
    report = [output_dir / name for name in TABLE_FILES] + draw(study, output_dir / PICTURES_DIR)
    record.update(best_trial=best, best_run=best_run, train_step_compilations=compilations)
    atomic.write_json(output_dir / RECORD_FILE, record)
    return {"trials": rows, "best_model": best_model, "report": report}


def _best_number(study) -> int | None:
    try:
        return study.best_trial.number
    except (ValueError, RuntimeError):  # no finished trial; or several objectives
        return None


def draw(study, folder: Path) -> list[Path]:
    """Optuna's matplotlib pictures of `study` as PNGs in `folder`; one that cannot be drawn (too
    few finished trials, a single value searched) is left out with a note."""
    import optuna.visualization.matplotlib as views

    plt = plotting.pyplot()
    pictures = {"optimization_history.png": lambda: views.plot_optimization_history(study),
                "param_importances.png": lambda: views.plot_param_importances(study),
                "objective_vs_learning_rate.png": lambda: views.plot_slice(study, params=["learning_rate"])}
    if not any("learning_rate" in trial.params for trial in study.trials):
        pictures.pop("objective_vs_learning_rate.png")
    drawn = []
    for name, plot in pictures.items():
        try:
            with warnings.catch_warnings():  # "experimental" since Optuna 2.2, "equal importances", "no legend"
                warnings.simplefilter("ignore", UserWarning)
                axes = plot()
        except Exception as error:  # noqa: BLE001 (a picture is extra; the table holds the numbers)
            print(f"note: search report: {name} not drawn ({type(error).__name__}: {error})", file=sys.stderr)
            continue
        figure = (axes.flat[0] if hasattr(axes, "flat") else axes).figure
        drawn.append(plotting.save(plt, figure, folder / name))
    return drawn


def copy_best_export(run_folder: Path, output_dir: Path) -> Path:
    """The files `run_folder`'s run exported (its run.json's record), as `output_dir/best_model/`,
    replacing the folder at once (`atomic.replace_folder`) (`write` has checked that no
    stranger's best_model/ is there)."""
    record = json.loads((run_folder / run_dir.RUN_FILE).read_text(encoding="utf-8"))
    target = output_dir / BEST_MODEL_DIR
    with atomic.replace_folder(target) as staging:
        for name in record.get("exported") or ():
            source = run_folder / name
            if source.is_dir():
                shutil.copytree(source, staging / name)
            elif source.exists():
                shutil.copy2(source, staging / name)
    return target
