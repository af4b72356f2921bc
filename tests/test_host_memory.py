"""glibc's huge pages for XLA:CPU's temporaries (`flaxheads.host_memory`): the environment that
turns them on, the scripts that export it, and the command that restarts itself with it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from flaxheads import host_memory

REPO = Path(__file__).resolve().parents[1]
THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def test_the_tunable_joins_other_tunables_and_leaves_a_set_hugetlb_alone(monkeypatch):
    monkeypatch.setattr(host_memory, "applies", lambda: True)
    assert host_memory.with_huge_pages({})["GLIBC_TUNABLES"] == "glibc.malloc.hugetlb=1"
    assert host_memory.with_huge_pages({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"})["GLIBC_TUNABLES"] == (
        "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1")
    mine = {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}
    assert host_memory.with_huge_pages(mine) == mine
    assert host_memory.without_huge_pages({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1",
                                           "X": "1"}) == {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2", "X": "1"}
    assert host_memory.without_huge_pages({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}) == {}
    monkeypatch.setattr(host_memory, "applies", lambda: False)
    assert host_memory.with_huge_pages({"X": "1"}) == {"X": "1"}


def test_the_variable_turns_it_off(monkeypatch):
    monkeypatch.setenv(host_memory.ENVIRONMENT_VARIABLE, "off")
    assert not host_memory.applies()


def test_the_scripts_export_the_same_tunable():
    script = (REPO / "scripts" / "python_env.sh").read_text()
    assert host_memory.TUNABLE in script
    env = host_memory.without_huge_pages(os.environ)
    out = subprocess.run(["bash", "-c", f"source {REPO}/scripts/python_env.sh; use_repo_python; echo $GLIBC_TUNABLES"],
                         capture_output=True, text=True, env=env, check=True).stdout
    assert host_memory.TUNABLE in out.split(":")[-1]


# A 300 MB malloc, written, as XLA's temporaries are (numpy asks for huge pages itself: not numpy).
_ALLOCATE = """
import ctypes
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
size = 300 * 2**20
ctypes.memset(libc.malloc(size), 1, size)
print(next(int(line.split()[1]) for line in open("/proc/self/smaps_rollup") if line.startswith("AnonHugePages")))
"""


@pytest.mark.skipif(not host_memory.applies(), reason="needs Linux, glibc and transparent huge pages")
def test_a_process_started_with_the_tunable_gets_huge_pages_for_a_large_allocation():
    def huge_kib(env):
        return int(subprocess.run([sys.executable, "-c", _ALLOCATE], capture_output=True, text=True, env=env,
                                  check=True).stdout)

    with_pages = huge_kib(host_memory.with_huge_pages(os.environ))
    print("AnonHugePages with the tunable:", with_pages, "KiB")
    assert with_pages >= 200 * 1024
    if "[madvise]" in THP.read_text():  # with "always" every process gets them anyway
        assert huge_kib(host_memory.without_huge_pages(os.environ)) < 16 * 1024


def test_the_command_restarts_itself_with_the_tunable_where_it_is_missing():
    code = "from flaxheads import host_memory; host_memory.restart_with_huge_pages(['--help']); print('not restarted')"
    env = {**host_memory.without_huge_pages(os.environ), host_memory.ENVIRONMENT_VARIABLE: ""}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env).stdout
    if host_memory.applies():
        assert "usage: flaxheads" in out and "not restarted" not in out
    else:
        assert "not restarted" in out
    env = host_memory.with_huge_pages(env)
    assert "not restarted" in subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                             env=env).stdout


def test_the_installed_command_restarts_before_importing_jax():
    """`launcher.main` (the console script) restarts a long command while the process holds no jax yet."""
    code = ("import os, sys; sys.argv = ['flaxheads', 'train', '--help']\n"
            "os.execve = lambda exe, argv, env: (print('jax' in sys.modules, argv[1:4]), sys.exit(0))\n"
            "from flaxheads import launcher; launcher.main()")
    env = {**host_memory.without_huge_pages(os.environ), host_memory.ENVIRONMENT_VARIABLE: ""}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    if host_memory.applies():
        assert out.strip() == "False ['-m', 'flaxheads.cli', 'train']"
    else:
        assert "usage: flaxheads train" in out
