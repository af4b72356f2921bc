"""Whole-directory conversion between Hugging Face PyTorch and flaxheads, and checkpoint inspection."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import numpy as np

from flaxheads import conversion
from flaxheads.conversion import checkpoint_io
from flaxheads.pretrained import _flat_variables, from_pretrained, save_pretrained

TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
    "vocab.txt", "vocab.json", "merges.txt", "spiece.model", "sentencepiece.bpe.model",
)


def copy_tokenizer_files(src: str | os.PathLike, dst: str | os.PathLike) -> list[str]:
    """Copies whatever tokenizer files `src` has into `dst`; returns their names."""
    copied = []
    for name in TOKENIZER_FILES:
        if (Path(src) / name).is_file():
            shutil.copy2(Path(src) / name, Path(dst) / name)
            copied.append(name)
    return copied


def default_direction(src: str | os.PathLike) -> str:
    """flaxheads-native sources convert to pytorch, everything else to flax."""
    return "pytorch" if (Path(src) / checkpoint_io.FLAX_NAME).is_file() else "flax"


def convert(
    src: str | os.PathLike,
    dst: str | os.PathLike,
    *,
    to: str | None = None,
    head: str | None = None,
    num_labels: int | None = None,
):
    """Converts a checkpoint directory, keeping its dtype so the conversion is exact.

    Returns (LoadingInfo, seconds). Tokenizer files are copied along.
    """
    start = time.perf_counter()
    to = to or default_direction(src)
    model, info = from_pretrained(
        src, head=head, num_labels=num_labels, param_dtype="auto", output_loading_info=True
    )
    save_pretrained(model, dst, format=to)
    copy_tokenizer_files(src, dst)
    return info, time.perf_counter() - start


def describe(path: str | os.PathLike, *, head: str | None = None, num_labels: int | None = None) -> str:
    """A readable report: architecture, sizes, weight file, and what a head would load or create."""
    hf_config = checkpoint_io.read_config(path)
    table = conversion.architecture_table(hf_config.get("model_type"))
    model, info = from_pretrained(path, head=head, num_labels=num_labels, param_dtype="auto", output_loading_info=True)
    cfg = model.config
    counts = {"backbone": 0, "head": 0}
    for key, (_, var) in _flat_variables(model).items():
        counts[key.split(".", 1)[0]] += int(np.prod(var.shape))
    b = cfg.backbone
    lines = [
        f"{path}",
        f"  model_type: {b.model_type}   architectures in config: {hf_config.get('architectures')}",
        f"  layers {b.num_hidden_layers}, hidden {b.hidden_size}, vocab {b.vocab_size}",
        f"  parameters: backbone {counts['backbone']:,}, head {counts['head']:,}",
        f"  canonical head: {table.canonical_head!r} ({table.classification_architecture}); "
        f"head shown: {cfg.head!r}, num_labels {cfg.num_labels}, labels {list(cfg.label_names)}",
        "",
        str(info),
    ]
    return "\n".join(lines)

