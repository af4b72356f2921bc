"""Which head works best? A head study: every head on the same backbone, equal settings, several
seeds; one JSON line per finished cell (resumable), bootstrap statistics, a markdown report with
plots. `flaxheads study run|report` is its command line.

    grid = committed_grid()                                  # or StudyGrid((Block(...), ...), StudySettings(...))
    run_study(grid, "runs/head_study")                       # again after a kill: continues
    write_report(["runs/head_study/results.jsonl"], "docs/head_study.md")
"""

from flaxheads.study.grid import Block, DataSpec, StudyGrid, StudySettings, committed_grid
from flaxheads.study.report import write_report
from flaxheads.study.runner import StudyError, run_study

__all__ = ["Block", "DataSpec", "StudyError", "StudyGrid", "StudySettings", "committed_grid", "run_study",
           "write_report"]
