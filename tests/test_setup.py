"""scripts/setup.sh's choice of Python (its own, or a new .venv when the system Python is
"externally managed", PEP 668) and the wrappers that find it. Nothing big is installed: the
decision is tested as a function, setup.sh through --dry-run, and .venv creation with
--without-pip (about a second)."""

from __future__ import annotations

import importlib.util
import os
import pathlib
import shutil
import subprocess
import sys
import sysconfig

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
DEBIAN_PYTHON = pathlib.Path("/usr/bin/python3")


def _load_install_target():
    spec = importlib.util.spec_from_file_location("install_target", REPO / "scripts" / "install_target.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.install_target


install_target = _load_install_target()


@pytest.fixture
def repo_copy(tmp_path) -> pathlib.Path:
    """A folder holding a copy of scripts/, so that setup.sh's .venv and cd land in tmp_path."""
    shutil.copytree(REPO / "scripts", tmp_path / "repo" / "scripts")
    return tmp_path / "repo"


def bash(script: str, cwd: pathlib.Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", script], cwd=cwd, capture_output=True, text=True, timeout=120,
                          env={**os.environ, **env})


def externally_managed(stdlib: pathlib.Path) -> pathlib.Path:
    stdlib.mkdir(parents=True, exist_ok=True)
    (stdlib / "EXTERNALLY-MANAGED").write_text("[externally-managed]\nError=use a venv\n")
    return stdlib


def test_an_externally_managed_python_gets_a_venv(tmp_path):
    stdlib = externally_managed(tmp_path / "lib" / "python3.11")

    where, why = install_target("/usr/bin/python3", "/usr", "/usr", str(stdlib), {})

    assert where == "venv"
    assert "externally managed" in why and str(stdlib / "EXTERNALLY-MANAGED") in why


def test_a_python_that_accepts_pip_installs_is_installed_into(tmp_path):
    where, _ = install_target("/opt/py/bin/python", "/opt/py", "/opt/py", str(tmp_path), {})

    assert where == "here"


def test_a_virtual_environment_is_installed_into_even_over_an_externally_managed_base(tmp_path):
    stdlib = externally_managed(tmp_path / "lib" / "python3.11")

    where, why = install_target("/v/bin/python", "/v", "/usr", str(stdlib), {})

    assert where == "here" and "virtual environment /v" in why


def test_pip_break_system_packages_installs_into_the_externally_managed_python(tmp_path):
    stdlib = externally_managed(tmp_path / "lib" / "python3.11")

    where, _ = install_target("/usr/bin/python3", "/usr", "/usr", str(stdlib), {"PIP_BREAK_SYSTEM_PACKAGES": "1"})

    assert where == "here"


def test_dry_run_names_the_python_it_would_install_into_and_creates_nothing(repo_copy):
    expected = install_target(sys.executable, sys.prefix, sys.base_prefix, sysconfig.get_path("stdlib"), os.environ)

    result = bash("bash scripts/setup.sh --dry-run", repo_copy, PYTHON=sys.executable)

    assert result.returncode == 0, result.stderr
    assert expected[1] in result.stdout
    assert not (repo_copy / ".venv").exists()


def test_dry_run_with_debians_externally_managed_python3_plans_a_venv(repo_copy):
    if not DEBIAN_PYTHON.exists():
        pytest.skip(f"no {DEBIAN_PYTHON} here")
    stdlib = subprocess.run([DEBIAN_PYTHON, "-c", "import sysconfig; print(sysconfig.get_path('stdlib'))"],
                            capture_output=True, text=True).stdout.strip()
    if not (pathlib.Path(stdlib) / "EXTERNALLY-MANAGED").is_file():
        pytest.skip(f"{DEBIAN_PYTHON} is not externally managed here")

    result = bash("bash scripts/setup.sh --dry-run", repo_copy, PYTHON=str(DEBIAN_PYTHON))

    assert result.returncode == 0, result.stderr
    assert "is externally managed" in result.stdout and f"{repo_copy}/.venv" in result.stdout
    assert not (repo_copy / ".venv").exists()


def fake_python(folder: pathlib.Path, when_without_pip: str) -> pathlib.Path:
    """A `python` that fails `-m venv` like Debian's python3 without python3-venv (no ensurepip),
    and runs `when_without_pip` (a venv command) for `-m venv --without-pip ...`."""
    path = folder / "python-without-ensurepip"
    path.write_text(
        "#!/usr/bin/env bash\n"
        'if [[ "$1 $2" == "-m venv" ]]; then\n'
        '    if [[ " $* " != *" --without-pip "* ]]; then\n'
        '        mkdir -p "${@: -1}/bin"  # venv leaves a partial folder behind\n'
        '        echo "ensurepip is not available" >&2; exit 1\n'
        "    fi\n"
        f"    exec {when_without_pip}\n"
        "fi\n"
        f'exec {sys.executable} "$@"\n'
    )
    path.chmod(0o755)
    return path


def test_without_ensurepip_the_venv_uses_the_system_pip(repo_copy):
    python = fake_python(repo_copy, f'{sys.executable} "$@"')

    result = bash(f"source scripts/setup.sh && make_venv {python}", repo_copy)

    assert result.returncode == 0, result.stderr
    assert "no pip of its own" in result.stdout
    venv_python = repo_copy / ".venv" / "bin" / "python"
    prefix = subprocess.run([venv_python, "-c", "import sys; print(sys.prefix)"], capture_output=True, text=True)
    assert pathlib.Path(prefix.stdout.strip()) == repo_copy / ".venv"
    assert subprocess.run([venv_python, "-m", "pip", "--version"], capture_output=True).returncode == 0


def test_without_ensurepip_or_pip_the_error_names_the_packages_and_leaves_no_venv(repo_copy):
    # --without-pip and no system site-packages: the new venv cannot import pip at all.
    python = fake_python(repo_copy, f"{sys.executable} -m venv --without-pip .venv")

    result = bash(f"source scripts/setup.sh && make_venv {python}", repo_copy)

    assert result.returncode != 0
    assert "ensurepip is not available" in result.stderr
    assert "python3-venv" in result.stderr and "python3-pip" in result.stderr
    assert not (repo_copy / ".venv").exists()


def test_wrappers_run_the_repositorys_venv_python_when_there_is_one(repo_copy):
    venv_python = repo_copy / ".venv" / "bin" / "python"
    venv_python.parent.mkdir(parents=True)
    venv_python.write_text('#!/usr/bin/env bash\necho "venv python $*"\n')
    (venv_python.parent / "flaxheads").write_text("")
    (venv_python.parent / "flaxheads").chmod(0o755)
    venv_python.chmod(0o755)

    result = bash("scripts/flaxheads train --help && bash scripts/test.sh -k x && source scripts/python_env.sh "
                  "&& use_repo_python && type -P flaxheads", repo_copy, PYTHON="/nowhere", FLAXHEADS_TEST_WORKERS="0")

    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "venv python -m flaxheads.cli train --help",
        "venv python -m pytest -q --durations=25 -k x",
        str(venv_python.parent / "flaxheads"),  # the tests' `flaxheads` subprocess finds .venv's script
    ]


def test_wrappers_run_python_from_the_environment_without_a_venv(repo_copy):
    result = bash("source scripts/python_env.sh && repo_python", repo_copy, PYTHON="/opt/my/python")

    assert result.stdout.strip() == "/opt/my/python"


def test_test_script_runs_the_fast_lane_and_spreads_files_over_workers(repo_copy):
    """`--fast` leaves out the tests marked slow; tests run in parallel workers, a file to a worker."""
    venv_python = repo_copy / ".venv" / "bin" / "python"
    venv_python.parent.mkdir(parents=True)
    venv_python.write_text('#!/usr/bin/env bash\nprintf "%s|" "$@"; echo\n')
    venv_python.chmod(0o755)

    fast = bash("bash scripts/test.sh --fast -k x", repo_copy, FLAXHEADS_TEST_WORKERS="2")
    everything = bash("bash scripts/test.sh", repo_copy, FLAXHEADS_TEST_WORKERS="3")

    parallel = "--dist|loadfile|--no-loadscope-reorder|"
    assert fast.stdout.strip() == f"-m|pytest|-q|--durations=25|-n|2|{parallel}-m|not slow|-k|x|"
    assert everything.stdout.strip() == f"-m|pytest|-q|--durations=25|-n|3|{parallel}"
