"""Whole-directory conversion between Hugging Face PyTorch and flaxheads, and checkpoint inspection."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import numpy as np

from flaxheads import atomic, conversion
from flaxheads.conversion import checkpoint_io
from flaxheads.conversion.formats import FLAXHEADS, PYTORCH, checkpoint_files, tokenizer_files
from flaxheads.conversion.hub import resolve_checkpoint
from flaxheads.conversion.loading import flat_variables, open_checkpoint, weight_format, writable_format
from flaxheads import tasks
from flaxheads.model import save_pretrained


def model_class(checkpoint) -> type:
    """The model class of the task `checkpoint` (a `Checkpoint`) holds (`tasks.of_checkpoint`); a
    sequence classifier for a bare or pretraining checkpoint."""
    return (tasks.of_checkpoint(checkpoint) or tasks.TASKS[tasks.DEFAULT]).model_class


def copy_tokenizer_files(src: str | os.PathLike, dst: str | os.PathLike) -> list[str]:
    """Copies whatever tokenizer files `src` has into `dst`; returns their names."""
    copied = tokenizer_files(src)
    for name in copied:
        shutil.copy2(Path(src) / name, Path(dst) / name)
    return copied


def default_direction(src: str | os.PathLike) -> str:
    """flaxheads-native sources convert to "pytorch", everything else to "flaxheads"."""
    fmt = weight_format(src)
    return PYTORCH.name if fmt is FLAXHEADS else FLAXHEADS.name


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
    """Converts a checkpoint directory, keeping its dtype so the conversion is exact: a model of
    any task (`flaxheads.tasks.MODELS`: sequence classification, token classification, multiple
    choice), the one config.json's `architectures` name (a bare or pretraining checkpoint converts
    as a sequence classifier, whose head `head` and `num_labels` choose).

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
    fmt = writable_format(to or default_direction(src), argument="to")
    _check_destination(src, dst, {checkpoint_io.CONFIG_NAME, fmt.written_as, *tokenizer_files(src)}, overwrite)
    checkpoint = open_checkpoint(src)
    model, info = model_class(checkpoint).from_pretrained(
        checkpoint, head=head, num_labels=num_labels, param_dtype="auto",
        ignore_mismatched_sizes=ignore_mismatched_sizes, output_loading_info=True,
    )
    with atomic.staged_into(dst, describe=f"converting {src} to {fmt.name}") as staging:
        save_pretrained(model, staging, format=fmt.name)
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
    model, info = model_class(checkpoint).from_pretrained(
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
        f"head shown: {cfg.head!r}, " + (f"num_labels {cfg.num_labels}, labels {list(cfg.label_names)}"
                                        if hasattr(cfg, "label_names") else f"a {tasks.of_model(model).noun} (no labels)"),
        f"  task: {cfg.task}",
        "",
        str(info),
    ]
    return "\n".join(lines)

