"""`flaxheads study run|report`: a head study (every head on one backbone, equal settings, several
seeds) and its report.

  flaxheads study run --study_dir studies/minilm        # the committed grid; again after a kill: continues
  flaxheads study report studies/minilm/results.jsonl --output docs/head_study.md

`run` without grid flags trains the committed grid (MiniLM x 7 heads x 4 built-in data sets x 5
seeds, fine-tuned, plus a linear probe of pooler/cls/mean on movie_snippets); `--grid converged`
the second study (`grid.converged_grid`: converged cells, 12 seeds, controls). Flags given replace
the chosen grid's values. Data sets:
a built-in name, NAME=TRAIN[,VALIDATION[,TEST]] for your files, NAME=hub:ORG/NAME for a Hugging
Face data set. `report` merges any number of results files (e.g. from several machines).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import json
import shlex

from flaxheads.study.grid import (
    CONVERGED_HEADS,
    DEFAULT_HEAD,
    GRIDS,
    MAJORITY,
    STUDY_DATASETS,
    STUDY_HEADS,
    Block,
    DataSpec,
    StudyGrid,
    StudySettings,
)

_SETTINGS = [field for field in dataclasses.fields(StudySettings) if field.name != "train_options"]
_BLOCK_FLAGS = {"finetune": ("heads", "datasets", "seeds"), "probe": ("probe_heads", "probe_datasets", None),
                "lbfgs": ("lbfgs_heads", "lbfgs_datasets", "lbfgs_seeds"), "majority": (None, "majority_datasets", None)}
"""Mode -> the flags of its block's heads, data sets and seeds (None: the fine-tuned cells' seeds,
or no heads)."""


def build_parser(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="study_command", required=True)
    run = sub.add_parser("run", help="train the cells of a study that its results file lacks",
                         formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    run.add_argument("--study_dir", required=True, help="folder of the study: results.jsonl and cells/")
    run.add_argument("--checkpoints", nargs="+", default=[None],
                     help="checkpoint folders or hub ids (default: the shipped MiniLM)")
    run.add_argument("--grid", choices=sorted(GRIDS), default="committed",
                     help="the study whose cells and settings the other flags start from (grid.GRIDS)")
    run.add_argument("--heads", nargs="+", help="heads (or study arms, e.g. pooler_reinit) fine-tuned end to end")
    run.add_argument("--datasets", nargs="+", help="data sets of the fine-tuned cells")
    run.add_argument("--seeds", nargs="+", type=int, help="seeds of the fine-tuned and probe cells")
    run.add_argument("--probe_heads", nargs="*",
                     help="heads also trained on a frozen backbone by the Trainer (linear probe); none: no probe cells")
    run.add_argument("--probe_datasets", nargs="*", help="data sets of the probe cells")
    run.add_argument("--lbfgs_heads", nargs="*",
                     help="heads whose frozen features get a converged L-BFGS linear probe; none: no such cells")
    run.add_argument("--lbfgs_datasets", nargs="*", help="data sets of the L-BFGS probe cells")
    run.add_argument("--lbfgs_seeds", nargs="*", type=int, help="seeds of the L-BFGS probe cells")
    run.add_argument("--majority_datasets", nargs="*", help="data sets that get a majority-class baseline cell")
    for field in _SETTINGS:
        kind = int if "int" in str(field.type) else float
        many = "tuple" in str(field.type)
        run.add_argument(f"--{field.name}", type=_optional(kind) if "None" in str(field.type) else kind,
                         nargs="*" if many else None, default=None,
                         help=f"StudySettings.{field.name} (flaxheads/study/grid.py; default: the --grid's)")
    run.add_argument("--train_option", action="append", default=[], metavar="FIELD=VALUE",
                     help="another TrainConfig field for every cell, e.g. dtype=bfloat16 (repeatable)")
    run.add_argument("--text_column", default="text", help="text column of your files")
    run.add_argument("--text_pair_column", default=None, help="second text column of your files")
    run.add_argument("--label_column", default="label", help="label column of your files")
    run.add_argument("--keep_models", action="store_true", help="keep each cell's checkpoints and exported model")
    run.add_argument("--max_cells", type=int, default=None, help="stop after training this many cells")
    run.add_argument("--list", action="store_true", help="print the cells and how many are done; train nothing")
    run.set_defaults(study_run=_run)

    report = sub.add_parser("report", help="markdown report and PNG plots from results files",
                            formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    report.add_argument("results", nargs="+", help="results.jsonl files (merged; a cell in two counts once)")
    report.add_argument("--output", default="docs/head_study.md", help="markdown file to write")
    report.add_argument("--figures_dir", default=None, help="folder of the PNGs (default: beside --output, "
                        "named after it)")
    report.add_argument("--split", default="test", choices=("test", "validation"), help="split whose metrics compare")
    report.add_argument("--overwrite", action="store_true", help="replace an existing report and its figures")
    report.set_defaults(study_run=_report)


def _optional(kind):
    def parse(text: str):
        return None if text.lower() == "none" else kind(text)
    parse.__name__ = kind.__name__
    return parse


def run_args(args: argparse.Namespace) -> int:
    return args.study_run(args)


def grid_defaults(grid: StudyGrid) -> dict[str, object]:
    """The `study run` flag values that describe `grid` (flags of absent modes: empty)."""
    values: dict[str, object] = {f.name: getattr(grid.settings, f.name) for f in _SETTINGS}
    for mode, flags in _BLOCK_FLAGS.items():
        values.update({flag: [] for flag in flags if flag})
    for block in grid.blocks:
        heads, datasets, seeds = _BLOCK_FLAGS[block.modes[0]]
        for flag, items in ((heads, block.heads), (datasets, [d.name for d in block.datasets]), (seeds, block.seeds)):
            if flag:
                values[flag] = list(items)
    return values


def grid_from_args(args: argparse.Namespace) -> StudyGrid:
    """The StudyGrid the `study run` flags describe: the --grid's, with the flags given replacing
    its values."""
    chosen = {**grid_defaults(GRIDS[args.grid]()),
              **{k: v for k, v in vars(args).items() if v is not None and k in _flag_names()}}
    columns = dict(text_column=args.text_column, text_pair_column=args.text_pair_column,
                   label_column=args.label_column)
    options = dict(_train_option(text) for text in args.train_option)
    settings = StudySettings(**{f.name: chosen[f.name] for f in _SETTINGS}, train_options=tuple(options.items()))
    checkpoints = tuple(args.checkpoints)
    blocks = []
    for mode, (heads, datasets, seeds) in _BLOCK_FLAGS.items():
        names = chosen[heads] if heads else [MAJORITY]
        if names and chosen[datasets]:
            block_seeds = chosen[seeds] if seeds else chosen["seeds"][:1] if mode == "majority" else chosen["seeds"]
            blocks.append(Block(tuple(names), tuple(DataSpec.parse(d, **columns) for d in chosen[datasets]),
                                tuple(block_seeds), modes=(mode,), checkpoints=checkpoints))
    return StudyGrid(tuple(blocks), settings)


def _flag_names() -> set[str]:
    return {f.name for f in _SETTINGS} | {flag for flags in _BLOCK_FLAGS.values() for flag in flags if flag}


def _train_option(text: str) -> tuple[str, object]:
    name, sep, value = text.partition("=")
    if not sep:
        raise ValueError(f"--train_option {text!r}: write FIELD=VALUE, e.g. dtype=bfloat16")
    try:
        return name, ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return name, value  # a bare word: a string


def _run(args: argparse.Namespace) -> int:
    grid = grid_from_args(args)
    if args.list:
        return _list(grid, args.study_dir)
    from flaxheads.study.runner import run_study

    run = run_study(grid, args.study_dir, keep_models=args.keep_models, max_cells=args.max_cells)
    print(f"study: trained {len(run.ran)} cell(s), {len(run.skipped)} were done already; results in "
          f"{run.results_file}")
    return 0


def _list(grid: StudyGrid, study_dir: str) -> int:
    from pathlib import Path

    from flaxheads.study.grid import cell_key, cell_key_fields
    from flaxheads.study.results import read_results
    from flaxheads.study.runner import RESULTS_FILE, StudyError, describe, lr_search_cells, with_chosen_rates

    records = read_results(Path(study_dir) / RESULTS_FILE).records
    done = {record["key"] for record in records}
    identities = {spec: spec.identity() for spec in {cell.data for cell in grid.cells()}}
    try:
        cells = lr_search_cells(grid) + with_chosen_rates(grid, grid.cells(), records, identities)
    except StudyError:  # the search is not finished: the study's cells wait for their rates
        cells = lr_search_cells(grid) + grid.cells()
    finished = 0
    for cell in cells:
        is_done = cell_key(cell_key_fields(cell, grid.settings, identities[cell.data])) in done
        finished += is_done
        pending = grid.settings.learning_rates and cell.mode == "finetune" and cell.learning_rate is None
        print(f"{'done' if is_done else 'todo'}  {describe(cell)}{' (rate chosen after the search)' if pending else ''}")
    print(f"{len(cells)} cells, {finished} done")
    return 0


def _report(args: argparse.Namespace) -> int:
    from flaxheads.study.report import write_report
    from flaxheads.study.results import merge_records

    records, _ = merge_records(args.results)
    reproduce = reproduce_command(records, args.results, args.output) if records else None
    report = write_report(args.results, args.output, figures_dir=args.figures_dir, reproduce=reproduce,
                          overwrite=args.overwrite, split=args.split)
    for line in report.problems:
        print(f"note: {line}")
    print(f"wrote {report.markdown} and {len(report.figures)} figure(s)")
    return 0


def reproduce_command(records: list[dict], results: list[str], output: str) -> str:
    """The `flaxheads study run` and `report` commands that give `records` again: the grid the
    records span, and their settings where they differ from the defaults."""
    tuned = [r for r in records if r["mode"] == "finetune" and not r.get("lr_search")]
    by_mode = {mode: [r for r in records if r["mode"] == mode] for mode in ("probe", "lbfgs", "majority")}
    settings = records[0]["settings"]
    words = ["flaxheads", "study", "run", "--study_dir", "STUDY_DIR"]
    checkpoints = _unique(r["checkpoint"] for r in records)
    if checkpoints != ["all-MiniLM-L6-v2"]:
        words += ["--checkpoints", *checkpoints]
    words += ["--heads", *_unique(r["head"] for r in tuned), "--datasets", *_unique(r["dataset"] for r in tuned),
              "--seeds", *map(str, sorted({r["seed"] for r in tuned}))]
    words += ["--probe_heads", *_unique(r["head"] for r in by_mode["probe"]), "--probe_datasets",
              *_unique(r["dataset"] for r in by_mode["probe"])]
    if by_mode["lbfgs"]:
        words += ["--lbfgs_heads", *_unique(r["head"] for r in by_mode["lbfgs"]), "--lbfgs_datasets",
                  *_unique(r["dataset"] for r in by_mode["lbfgs"]), "--lbfgs_seeds",
                  *map(str, sorted({r["seed"] for r in by_mode["lbfgs"]}))]
    if by_mode["majority"]:
        words += ["--majority_datasets", *_unique(r["dataset"] for r in by_mode["majority"])]
    for field in _SETTINGS:
        value = settings.get(field.name, field.default)
        if _json(value) != _json(field.default):
            words += [f"--{field.name}", *(map(str, value) if isinstance(value, list) else [str(value)])]
    words += [f"--train_option={k}={v!r}" for k, v in (settings.get("train_options") or {}).items()]
    report = ["flaxheads", "study", "report", *results, "--output", output]
    named = _named_grid(records)
    shorthand = f"# the same cells: flaxheads study run --grid {named} --study_dir STUDY_DIR\n" if named else ""
    return shorthand + shlex.join(words) + "\n" + shlex.join(report)


def _named_grid(records: list[dict]) -> str | None:
    """The `--grid` whose cells and settings are exactly those of `records` (the shipped MiniLM's),
    or None."""
    if {r["checkpoint"] for r in records} != {"all-MiniLM-L6-v2"}:
        return None
    cells = {(r["head"], r["dataset"], r["seed"], r["mode"]) for r in records if not r.get("lr_search")}
    for name, make in GRIDS.items():
        grid = make()
        if (json.dumps(grid.settings.to_dict(), sort_keys=True) == json.dumps(records[0]["settings"], sort_keys=True)
                and cells == {(c.head, c.data.name, c.seed, c.mode) for c in grid.cells()}):
            return name
    return None


def _json(value):
    """`value` as a record holds it (tuples are lists there)."""
    return list(value) if isinstance(value, tuple) else value


def _unique(items) -> list[str]:
    """Each name once: the study's heads and data sets in the study's order, others as first seen."""
    seen = list(dict.fromkeys(items))
    order = {name: i for i, name in enumerate(dict.fromkeys((DEFAULT_HEAD, *STUDY_HEADS, *CONVERGED_HEADS,
                                                             *STUDY_DATASETS)))}
    return sorted(seen, key=lambda name: (order.get(name, len(order)), seen.index(name)))
