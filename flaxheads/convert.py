"""Whole-directory conversion between Hugging Face PyTorch and flaxheads, and checkpoint inspection."""

from __future__ import annotations

import os
import re
import shutil
import time
from pathlib import Path

import numpy as np

from flaxheads import conversion
from flaxheads.conversion import checkpoint_io, hf_flax
from flaxheads.conversion.hub import resolve_checkpoint
from flaxheads.conversion.loading import FORMATS, flat_variables, open_checkpoint, weight_format
from flaxheads.model import from_pretrained, save_pretrained

TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
    "vocab.txt", "vocab.json", "merges.txt", "spiece.model", "sentencepiece.bpe.model",
)
WEIGHT_FILES = (
    checkpoint_io.SAFETENSORS_NAME, checkpoint_io.SAFETENSORS_INDEX_NAME, checkpoint_io.BIN_NAME,
    checkpoint_io.BIN_INDEX_NAME, checkpoint_io.FLAX_NAME, *hf_flax.WEIGHT_NAMES, "tf_model.h5",
)
"""Every weight file name a loader (flaxheads or transformers) might read from a checkpoint directory."""
_SHARD = re.compile(r"(model|pytorch_model|flax_model|tf_model)-\d+-of-\d+\.(safetensors|bin|msgpack|h5)")
_WEIGHTS_WRITTEN = {"pytorch": checkpoint_io.SAFETENSORS_NAME, "flax": checkpoint_io.FLAX_NAME}
"""The weight file `save_pretrained` writes for each format."""


def tokenizer_files(src: str | os.PathLike) -> list[str]:
    """The names of the tokenizer files `src` has."""
    return [name for name in TOKENIZER_FILES if (Path(src) / name).is_file()]


def copy_tokenizer_files(src: str | os.PathLike, dst: str | os.PathLike) -> list[str]:
    """Copies whatever tokenizer files `src` has into `dst`; returns their names."""
    copied = tokenizer_files(src)
    for name in copied:
        shutil.copy2(Path(src) / name, Path(dst) / name)
    return copied


def checkpoint_files(folder: str | os.PathLike) -> list[str]:
    """The names in `folder` that belong to a checkpoint: config.json, weights (shards too),
    tokenizer files. Other files (notes, a README) are not listed. [] for a missing folder."""
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return []
    known = {checkpoint_io.CONFIG_NAME, *WEIGHT_FILES, *TOKENIZER_FILES}
    return sorted(name for name in names if name in known or _SHARD.fullmatch(name))


def default_direction(src: str | os.PathLike) -> str:
    """flaxheads-native sources convert to pytorch, everything else to flax."""
    fmt = weight_format(src)
    return "pytorch" if fmt is not None and fmt.name == "flaxheads" else "flax"


def convert(
    src: str | os.PathLike,
    dst: str | os.PathLike,
    *,
    to: str | None = None,
    head: str | None = None,
    num_labels: int | None = None,
    ignore_mismatched_sizes: bool = False,
    overwrite: bool = False,
):
    """Converts a checkpoint directory, keeping its dtype so the conversion is exact.

    Returns (LoadingInfo, seconds). Tokenizer files are copied along. Everything is written into
    a temporary folder beside `dst` first and moved in only when complete: a failed conversion
    leaves `dst` as it was. Files in `dst` that the conversion does not write are never touched.

    Raises ValueError when `dst` is `src`, lies inside it or contains it (even with `overwrite`);
    FileExistsError when `dst` already holds checkpoint files (config.json, weights, tokenizer
    files) and `overwrite` is False, or, even with `overwrite=True`, holds such files that the
    conversion would not replace (stale weights a loader could read instead of the new ones).
    """
    start = time.perf_counter()
    src = resolve_checkpoint(src)  # a folder, or a hub id in the huggingface_hub cache
    to = to or default_direction(src)
    if to not in FORMATS:
        raise ValueError(f"to={to!r}; choose one of {FORMATS}")
    _check_destination(src, dst, {checkpoint_io.CONFIG_NAME, _WEIGHTS_WRITTEN[to], *tokenizer_files(src)}, overwrite)
    model, info = from_pretrained(
        src, head=head, num_labels=num_labels, param_dtype="auto", ignore_mismatched_sizes=ignore_mismatched_sizes,
        output_loading_info=True,
    )
    with checkpoint_io.staged_into(dst) as staging:
        save_pretrained(model, staging, format=to)
        copy_tokenizer_files(src, staging)
        _check_destination(src, dst, set(os.listdir(staging)), overwrite)  # again: dst may have changed meanwhile
    return info, time.perf_counter() - start


def _check_destination(src, dst, writes: set[str], overwrite: bool) -> None:
    """Refuses a `dst` whose files the conversion `writes` would wrongly replace or sit beside."""
    overlap = _overlap(Path(src), Path(dst))
    if overlap:
        raise ValueError(
            f"dst {dst} {overlap} src {src}: the conversion would write into the checkpoint it reads. "
            "Pass a dst that neither is src, lies inside it, nor contains it"
        )
    if Path(dst).exists() and not Path(dst).is_dir():
        raise NotADirectoryError(f"dst {dst} is a file; pass a directory (new or empty) for the converted checkpoint")
    found = checkpoint_files(dst)
    stale = [name for name in found if name not in writes]
    remove = (
        f"remove {stale} from it first: they would stay beside the new files and a loader could read "
        f"them instead (overwrite=True replaces only the files the conversion writes: {sorted(writes)})"
    )
    if found and not overwrite:
        raise FileExistsError(
            f"dst {dst} already holds a checkpoint: {found}. Pass a new or empty dst, or overwrite=True "
            "to replace these files" + (f"; and {remove}" if stale else "")
        )
    if stale:
        raise FileExistsError(f"dst {dst} holds {stale}, which the conversion would not replace; {remove}")


def _overlap(src: Path, dst: Path) -> str | None:
    """"is", "lies inside" or "contains" when `dst` is `src`, lies inside it or contains it, seen
    through symlinks and `..`, and through other names for the same folder (bind mounts,
    case-insensitive file systems); None when the two are apart."""
    s, d = src.resolve(), dst.resolve()
    src_id, dst_id = _identity(s), _identity(d)
    if s == d or (src_id is not None and src_id == dst_id):
        return "is"
    if s in d.parents or (src_id is not None and src_id in map(_identity, d.parents)):
        return "lies inside"
    if d in s.parents or (dst_id is not None and dst_id in map(_identity, s.parents)):
        return "contains"
    return None


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        stat = path.stat()
    except OSError:
        return None
    return stat.st_dev, stat.st_ino


def describe(
    path: str | os.PathLike, *, head: str | None = None, num_labels: int | None = None,
    ignore_mismatched_sizes: bool = False,
) -> str:
    """A readable report: architecture, sizes, weight file, and what a head would load or create."""
    checkpoint = open_checkpoint(path)
    table = conversion.architecture_table(checkpoint.config.get("model_type"))
    model, info = from_pretrained(
        checkpoint, head=head, num_labels=num_labels, param_dtype="auto", ignore_mismatched_sizes=ignore_mismatched_sizes,
        output_loading_info=True,
    )
    cfg = model.config
    counts = {"backbone": 0, "head": 0}
    for key, (_, var) in flat_variables(model).items():
        counts[key.split(".", 1)[0]] += int(np.prod(var.shape))
    b = cfg.backbone
    lines = [
        f"{path}",
        f"  model_type: {b.model_type}   architectures in config: {checkpoint.config.get('architectures')}",
        f"  layers {b.num_hidden_layers}, hidden {b.hidden_size}, vocab {b.vocab_size}",
        f"  parameters: backbone {counts['backbone']:,}, head {counts['head']:,}",
        f"  canonical head: {table.canonical_head!r} ({table.classification_architecture}); "
        f"head shown: {cfg.head!r}, num_labels {cfg.num_labels}, labels {list(cfg.label_names)}",
        "",
        str(info),
    ]
    return "\n".join(lines)

