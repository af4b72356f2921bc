"""Transparent huge pages for glibc's allocations, which XLA:CPU's temporaries need to be fast.

XLA:CPU allocates each execution's temporaries with malloc: 299 MB for the default job's packed
MiniLM train step. glibc serves a request over 32 MB with a fresh mmap and returns it on free, so
every step faults in its temporaries again, ~68,000 zeroed 4 KiB pages. With the glibc tunable
`glibc.malloc.hugetlb=1`, glibc asks the kernel for transparent huge pages (madvise) for what it
maps, and a step takes ~570 faults of 2 MiB instead. Measured on the default job's train step
(2-core CPU, 2026-11-26, three processes each way, interleaved): 446-474 ms a step against
494-552 ms (medians), about 12% faster.

glibc reads its tunables once, when a process starts. So the tunable goes into the environment
of the processes flaxheads starts (`with_huge_pages`): `scripts/flaxheads` and `scripts/test.sh`
export it themselves (`scripts/python_env.sh`, the same string), and the installed `flaxheads`
command (`launcher`) starts itself again with it for its long commands (`restart_with_huge_pages`).
`FLAXHEADS_HUGE_PAGES=off` leaves glibc's default. Elsewhere (no glibc, not Linux, transparent
huge pages off in the kernel) nothing changes.
"""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Mapping

TUNABLE = "glibc.malloc.hugetlb=1"
"""The glibc tunable; `scripts/python_env.sh` spells the same."""
ENVIRONMENT_VARIABLE = "FLAXHEADS_HUGE_PAGES"
""""off" leaves glibc's allocation as it is."""
LONG_COMMANDS = ("train", "search", "study", "bench")
"""Commands worth starting again with the tunable (`restart_with_huge_pages`): a second start costs
a few milliseconds (`launcher`), a train step of the default job gains ~12%."""
_THP_SETTING = "/sys/kernel/mm/transparent_hugepage/enabled"


def applies() -> bool:
    """Linux with glibc, transparent huge pages not "never", and not turned off by the variable."""
    if os.environ.get(ENVIRONMENT_VARIABLE, "").strip().lower() == "off":
        return False
    if sys.platform != "linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        with open(_THP_SETTING) as f:
            return "[never]" not in f.read()
    except OSError:
        return False


def active(env: Mapping[str, str] | None = None) -> bool:
    """Whether `env` (default: this process's environment) sets glibc's hugetlb tunable."""
    tunables = (os.environ if env is None else env).get("GLIBC_TUNABLES", "")
    return any(item.startswith("glibc.malloc.hugetlb=") for item in tunables.split(":"))


def with_huge_pages(env: Mapping[str, str]) -> dict[str, str]:
    """`env` with the tunable added to GLIBC_TUNABLES (other tunables kept), where it `applies`
    and `env` does not set hugetlb itself."""
    env = dict(env)
    if applies() and not active(env):
        env["GLIBC_TUNABLES"] = ":".join(filter(None, [env.get("GLIBC_TUNABLES", ""), TUNABLE]))
    return env


def without_huge_pages(env: Mapping[str, str]) -> dict[str, str]:
    """`env` without a hugetlb tunable (the other tunables kept): glibc's default allocation."""
    env = dict(env)
    kept = [item for item in env.get("GLIBC_TUNABLES", "").split(":")
            if item and not item.startswith("glibc.malloc.hugetlb=")]
    env.pop("GLIBC_TUNABLES", None)
    if kept:
        env["GLIBC_TUNABLES"] = ":".join(kept)
    return env


def restart_with_huge_pages(argv: list[str]) -> None:
    """Replaces this process by `python -m flaxheads.cli *argv` with the tunable set, where it
    applies and is not set yet; returns where nothing is to change. For the command line only:
    what this process did so far is lost."""
    env = with_huge_pages(os.environ)
    if active(env) and not active():
        sys.stdout.flush()
        sys.stderr.flush()
        os.execve(sys.executable, [sys.executable, "-m", "flaxheads.cli", *argv], env)
