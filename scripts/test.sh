#!/usr/bin/env bash
# The test suite (what CI runs), with the Python that scripts/setup.sh installed into.
#
#   bash scripts/test.sh                       everything, as CI runs it
#   bash scripts/test.sh --fast                the fast lane for local work: every test not marked `slow`
#                                              (pyproject.toml says what slow means); 2,000 tests,
#                                              4 min 53 s on 2 cores (2026-11-28, the README)
#   bash scripts/test.sh --full                every combination of the cross products (families x heads x
#                                              padding sides ...); without it each run tests a part that
#                                              holds every family, head and side, and every combination
#                                              every 3 runs (tests/conftest.py, `MATRIX_PARTS`)
#   bash scripts/test.sh tests/test_cli.py -k help     other arguments go to pytest
#
# Tests run in FLAXHEADS_TEST_WORKERS parallel processes (pytest-xdist; default: the number of
# cores, at most 4; 0 runs them in this process), each test file on one worker so that its
# module fixtures (a tiny finished run, say) are built once. The slowest 25 tests are listed at
# the end.
set -euo pipefail
source "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/python_env.sh"
cd "$repo_root"
use_repo_python

args=()
lane=()
for arg in "$@"; do
    if [[ $arg == --fast ]]; then
        lane=(-m "not slow")
    elif [[ $arg == --full ]]; then
        export FLAXHEADS_TEST_MATRIX=all
    else
        args+=("$arg")
    fi
done
cores=$(nproc 2>/dev/null || echo 2)
workers=${FLAXHEADS_TEST_WORKERS:-$(( cores < 4 ? cores : 4 ))}
parallel=()
if (( workers > 0 )); then
    # --no-loadscope-reorder: xdist would otherwise start the files with the most tests first, not
    # tests/conftest.py's LONGEST_FILES (the doc examples: 11 tests, the longest file, started last).
    parallel=(-n "$workers" --dist loadfile --no-loadscope-reorder)
fi
exec "$python" -m pytest -q --durations=25 "${parallel[@]}" "${lane[@]}" "${args[@]}"
