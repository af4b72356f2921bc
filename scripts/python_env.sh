# Sourced by scripts/setup.sh, scripts/test.sh and scripts/flaxheads: which Python runs flaxheads.
#   base_python: $PYTHON if set, else `python`, else `python3` (Debian and Ubuntu have only the latter).
#   repo_python: the repository's .venv (made by setup.sh where the system Python refuses pip
#                installs) when it exists, else base_python.
#   use_repo_python: sets $python to repo_python and, for .venv, puts .venv/bin first on PATH (as
#                `source .venv/bin/activate` would: the tests run the installed `flaxheads` script);
#                and exports glibc's huge-page tunable (use_huge_pages).

repo_root=$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.." && pwd)

base_python() {
    if [[ -n "${PYTHON:-}" ]]; then
        echo "$PYTHON"
    elif command -v python >/dev/null 2>&1; then
        echo python
    elif command -v python3 >/dev/null 2>&1; then
        echo python3
    else
        echo "no Python found: install python3 (Debian/Ubuntu: sudo apt-get install python3 python3-pip)," \
             "or name one with PYTHON=/path/to/python" >&2
        return 1
    fi
}

repo_python() {
    if [[ -x "$repo_root/.venv/bin/python" ]]; then
        echo "$repo_root/.venv/bin/python"
    else
        base_python
    fi
}

# glibc.malloc.hugetlb=1: transparent huge pages for XLA:CPU's per-step temporaries, ~12% off a
# train step (flaxheads/host_memory.py says why; TUNABLE there is the same string). Added to
# GLIBC_TUNABLES unless that sets hugetlb already or FLAXHEADS_HUGE_PAGES=off.
use_huge_pages() {
    if [[ ${FLAXHEADS_HUGE_PAGES:-} == off || ":${GLIBC_TUNABLES:-}" == *":glibc.malloc.hugetlb="* ]]; then
        return 0
    fi
    export GLIBC_TUNABLES="${GLIBC_TUNABLES:+$GLIBC_TUNABLES:}glibc.malloc.hugetlb=1"
}

use_repo_python() {
    use_huge_pages
    python=$(repo_python)
    if [[ $python == "$repo_root/.venv/bin/python" ]]; then
        export PATH="$repo_root/.venv/bin:$PATH"
    fi
}
