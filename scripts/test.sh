#!/usr/bin/env bash
# The test suite (what CI runs), with the Python that scripts/setup.sh installed into. Arguments go
# to pytest: bash scripts/test.sh tests/test_cli.py -k help
set -euo pipefail
source "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/python_env.sh"
cd "$repo_root"
use_repo_python
exec "$python" -m pytest -q "$@"
