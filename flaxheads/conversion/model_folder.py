"""A model folder, opened once: the one reader of a checkpoint folder's config.json.

`open_checkpoint(path)` resolves `path` (a folder, or a hub id in the huggingface_hub cache),
reads its config.json (refusing a folder whose last export was interrupted) and finds its weight
format; the `Checkpoint` it returns is passed along instead of the path, and everything a command
asks of the folder (its task, its labels, flaxheads' own section, its weights, its tokenizer's
files) is read from it: nothing resolves or parses the folder again. A `Checkpoint` is a
path-like object (`os.fspath` gives its folder), so code that takes a folder takes it too, and
`open_checkpoint(checkpoint)` returns it as it is.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from pathlib import Path
from typing import Any

from flaxheads import conversion
from flaxheads.conversion import checkpoint_io, hub
from flaxheads.conversion.checkpoint_io import CheckpointError, TensorReader
from flaxheads.conversion.formats import WeightFormat

FLAXHEADS_SECTION = "flaxheads"
"""config.json's section recording what transformers' config cannot (the head, its options, ...)."""


def weight_format(folder: str | os.PathLike) -> WeightFormat | None:
    """The first of `conversion.WEIGHT_FORMATS` whose files `folder` holds; None when it holds none."""
    for fmt in conversion.WEIGHT_FORMATS.values():
        if fmt.found_in(folder):
            return fmt
    return None


@dataclasses.dataclass(eq=False)
class Checkpoint:
    """A checkpoint folder, read once: its config.json and its weights (opened on first use)."""

    folder: Path
    config: dict[str, Any]
    """config.json as read; treat as read-only (loaders copy it before applying overrides)."""
    format: WeightFormat | None
    """None: the folder holds no weights (an error once they are asked for)."""

    def __fspath__(self) -> str:
        return os.fspath(self.folder)

    def __str__(self) -> str:
        return str(self.folder)

    @functools.cached_property
    def reader(self) -> TensorReader:
        """The weights, opened on first use (so config errors come first, as they are cheaper to fix)."""
        if self.format is None:
            expected = [name for fmt in conversion.WEIGHT_FORMATS.values() for name in fmt.files]
            raise CheckpointError(
                f"{self.folder} has no weights: expected one of {expected}. flaxheads never starts a "
                "backbone from random weights; point it at a directory saved with save_pretrained"
            )
        return self.format.open(self.folder)

    @property
    def section(self) -> dict[str, Any]:
        """config.json's "flaxheads" section ({} when there is none)."""
        return self.config.get(FLAXHEADS_SECTION) or {}

    @property
    def known_family(self) -> bool:
        """Whether flaxheads has a conversion table for the folder's model_type."""
        return self.config.get("model_type") in conversion.TABLES

    @functools.cached_property
    def task(self) -> str | None:
        """The task of the transformers class config.json's `architectures` name (its name in
        `flaxheads.tasks.TASKS`); None for a bare or pretraining class, whose head any task would
        start anew, and for a family flaxheads has no table for."""
        if not self.known_family:
            return None
        table = conversion.TABLES[self.config["model_type"]]
        return next((task for name in self.config.get("architectures") or ()
                     if (task := table.task_of(name)) is not None), None)


def open_checkpoint(
    path: str | os.PathLike | Checkpoint,
    *,
    revision: str | None = None,
    cache_dir: str | os.PathLike | None = None,
    token: str | bool | None = None,
    local_files_only: bool = False,
) -> Checkpoint:
    """The checkpoint `path` names (a folder, or what `hub.resolve_checkpoint` resolves), with its
    config.json read; a `Checkpoint` is returned as it is.

    Raises FileNotFoundError for a path that names no checkpoint, CheckpointError for a missing
    or invalid config.json (or an interrupted export)."""
    if isinstance(path, Checkpoint):
        return path
    folder = hub.resolve_checkpoint(
        path, revision=revision, cache_dir=cache_dir, token=token, local_files_only=local_files_only
    )
    return Checkpoint(folder, checkpoint_io.read_config(folder), weight_format(folder))


def folder_of(path: str | os.PathLike | Checkpoint) -> Path:
    """The folder `path` names: a `Checkpoint`'s own, else `hub.resolve_checkpoint`'s."""
    return path.folder if isinstance(path, Checkpoint) else hub.resolve_checkpoint(path)


__all__ = ["FLAXHEADS_SECTION", "Checkpoint", "folder_of", "open_checkpoint", "weight_format"]
