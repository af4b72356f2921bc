"""Which head works best? A head study: every head on the same backbone, equal settings, several
seeds; one JSON line per finished cell (resumable), bootstrap statistics, a markdown report with
plots. `flaxheads study run|report` is its command line.

    grid = committed_grid()                                  # or StudyGrid((Block(...), ...), StudySettings(...))
    run_study(grid, "runs/head_study")                       # again after a kill: continues
    write_report(["runs/head_study/results.jsonl"], "docs/head_study.md")
"""

import importlib
from typing import TYPE_CHECKING

from flaxheads.study.grid import Block, DataSpec, StudyGrid, StudySettings, committed_grid

if TYPE_CHECKING:
    from flaxheads.study.report import write_report
    from flaxheads.study.runner import StudyError, run_study

_LAZY = {"write_report": "flaxheads.study.report", "StudyError": "flaxheads.study.runner",
         "run_study": "flaxheads.study.runner"}
"""Imported on first use: the report needs scipy, the runner jax, and `flaxheads train` (whose
parser lists `flaxheads study`'s flags) needs neither (1.7 s of scipy.stats at every start)."""


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'flaxheads.study' has no attribute {name!r}")
    return getattr(importlib.import_module(_LAZY[name]), name)

__all__ = ["Block", "DataSpec", "StudyError", "StudyGrid", "StudySettings", "committed_grid", "run_study",
           "write_report"]
