"""The installed `flaxheads` command (`[project.scripts]`): a long command starts again with
glibc's huge pages (`host_memory`) before anything heavy is imported, then `flaxheads.cli.main`
runs. Restarting here, not in `cli`, spares the first process the ~3.7 s of importing jax, flax,
datasets and transformers that the second pays anyway (the package imports its names lazily)."""

from __future__ import annotations

import sys
import typing

from flaxheads import host_memory


def main() -> typing.NoReturn:
    """`flaxheads.cli.main()` on the command line, restarted first for `host_memory.LONG_COMMANDS`;
    the process then ends without the interpreter's teardown (`cli.exit_process`)."""
    if len(sys.argv) > 1 and sys.argv[1] in host_memory.LONG_COMMANDS:
        host_memory.restart_with_huge_pages(sys.argv[1:])
    from flaxheads.cli import exit_process, main as run

    exit_process(run())
