#!/usr/bin/env bash
# Run here, where PyPI is reachable, before scripts/gpu_bench.sh runs on a device machine (which
# reaches nothing). Downloads into .whl/ (git ignores it) the wheels of what flaxheads needs and
# the device image lacks (datasets and its dill/multiprocess, tensorboardX; accelerate, which
# TrainingArguments needs for the PyTorch peer's Trainer optimizer) or holds at another
# version than this checkout is tested with (transformers): each at the version installed here,
# for the image's Python 3.12 on x86-64. flax stays the image's: it must match the image's jax
# (flax 0.12.8 with the image's jax 0.11.2 fails at import: no hijax.HiPrimitive). gpu_bench.sh
# installs them when .whl/ travels:
#
#   bash scripts/gpu_wheels.sh
#   device run: command "bash scripts/gpu_bench.sh", carry [".whl"]
set -euo pipefail
source "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/python_env.sh"
use_repo_python
cd "$repo_root"

packages=(accelerate datasets dill multiprocess tensorboardX transformers)
pins=()
for name in "${packages[@]}"; do
    version=$("$python" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$name") || {
        echo "gpu_wheels.sh: $name is not installed here: run bash scripts/setup.sh first" >&2
        exit 1
    }
    pins+=("$name==$version")
done

rm -rf .whl.partial
mkdir .whl.partial
"$python" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
    --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl.partial "${pins[@]}"
rm -rf .whl
mv .whl.partial .whl
echo "gpu_wheels.sh: .whl/ holds ${pins[*]} ($(du -sh .whl | cut -f1)); carry it: the device tool's carry [\".whl\"]"
