"""Where scripts/setup.sh installs, for the Python that runs this file: prints `here <why>` or
`venv <why>`.

here: a virtual environment, or a Python that accepts pip installs (a conda environment, a pyenv
      or python.org build, a system Python whose owner set PIP_BREAK_SYSTEM_PACKAGES).
venv: an "externally managed" Python (PEP 668: a file EXTERNALLY-MANAGED in its stdlib folder, as
      Debian's and Ubuntu's python3 have), whose pip refuses to install: setup.sh makes .venv.
"""

from __future__ import annotations

import os
import pathlib
import sys
import sysconfig


def install_target(executable: str, prefix: str, base_prefix: str, stdlib: str,
                   environ: dict[str, str]) -> tuple[str, str]:
    """("here" or "venv", why) for a Python at `executable` with sys.prefix `prefix`,
    sys.base_prefix `base_prefix` and stdlib folder `stdlib`, run with environment `environ`."""
    if prefix != base_prefix:
        return "here", f"the virtual environment {prefix} ({executable})"
    marker = pathlib.Path(stdlib) / "EXTERNALLY-MANAGED"
    if not marker.is_file():
        return "here", f"{executable} (it accepts pip installs)"
    if environ.get("PIP_BREAK_SYSTEM_PACKAGES", "").lower() in ("1", "true", "yes", "on"):
        return "here", f"{executable} (externally managed, but PIP_BREAK_SYSTEM_PACKAGES is set)"
    return "venv", f"{executable} is externally managed ({marker}): pip refuses to install into it"


if __name__ == "__main__":
    print(*install_target(sys.executable, sys.prefix, sys.base_prefix, sysconfig.get_path("stdlib"), os.environ))
