#!/usr/bin/env bash
# Builds the second Python environment the step benchmark's Hugging Face Flax peer runs in:
# transformers 4.57 (the last line with Flax models; v5 removed them) on the same jax, jaxlib,
# flax and optax as the main environment, so the two Flax peers differ only in model code.
#
#   bash scripts/make_hf_flax_env.sh /work/hf-flax-env    # prints the venv's python at the end
#   python scripts/bench.py steps --hf-flax-python /work/hf-flax-env/bin/python
#
# DIR: a new or existing venv folder, outside the repository. Idempotent: re-running it installs
# nothing new. On a GPU machine set JAX_EXTRA to jax's extra for it (e.g. JAX_EXTRA=cuda12), or the
# peer's jax runs on the CPU. No torch: transformers 4.57 converts a PyTorch safetensors checkpoint
# to Flax with safetensors alone (only pytorch_model.bin files would need torch).
set -euo pipefail
DIR=${1:?usage: bash scripts/make_hf_flax_env.sh DIR}
PY="$DIR/bin/python"
if [ ! -x "$PY" ]; then
    "${PYTHON:-python3}" -m venv "$DIR"
fi
# transformers 4.57.6 is the newest 4.57 patch; jax, jaxlib, flax and optax are the main
# environment's versions, which transformers 4.57's Flax BERT runs on unpatched.
"$PY" -m pip install --quiet --disable-pip-version-check \
    "transformers==4.57.6" "jax${JAX_EXTRA:+[$JAX_EXTRA]}==0.10.2" "jaxlib==0.10.2" "flax==0.12.8" "optax==0.2.8" \
    "safetensors" "numpy"
"$PY" -c "from transformers import FlaxBertForSequenceClassification" 2>/dev/null
echo "$PY"
