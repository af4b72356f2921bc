"""The weight formats a checkpoint folder can hold, by one set of names used in the API and the
command line alike:

| name        | files                                             | read | written by `save_pretrained(format=...)` |
|-------------|---------------------------------------------------|------|------------------------------------------|
| `pytorch`   | model.safetensors (sharded too), pytorch_model.bin | yes  | yes: what transformers loads             |
| `flaxheads` | flaxheads_model.safetensors, keyed by flax paths  | yes  | yes                                      |
| `hf_flax`   | flax_model.msgpack (sharded too), or model.safetensors with metadata format "flax": transformers 4.x `Flax*` models | yes | no: transformers 5 has no Flax model to load it |

The registry, in search order, is `flaxheads.conversion.WEIGHT_FORMATS`. Also here: which files
of a folder belong to a checkpoint (`checkpoint_files`), so that nothing else in it is mistaken
for one.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import warnings
from pathlib import Path
from typing import Callable

from flaxheads.conversion import checkpoint_io, hf_flax
from flaxheads.conversion.checkpoint_io import TensorReader
from flaxheads.conversion.rules import Rename, native_names, pytorch_names

LEGACY_NAMES = {"flax": "flaxheads"}
"""Earlier names of a format, still accepted where a format is named (`--to flax`)."""


@dataclasses.dataclass(frozen=True)
class WeightFormat:
    """One way a checkpoint folder can store its weights."""

    name: str
    files: tuple[str, ...]
    """Weight file names, any of which in a folder means this format."""
    open: Callable[[Path], TensorReader]
    rename: Rename = pytorch_names
    """Expanded rules naming Hugging Face PyTorch tensors -> rules naming this format's tensors."""
    holds_pretraining_heads: bool = True
    """Whether a file of this format can carry a pretraining checkpoint's heads (BERT's NSP)."""
    written_as: str | None = None
    """The weight file `save_pretrained` writes in this format; None: flaxheads reads it only."""
    holds: Callable[[Path], bool] | None = None
    """Whether a folder holds this format, where its file names alone do not say (default: any of
    `files` is there)."""

    def found_in(self, folder: str | os.PathLike) -> bool:
        if self.holds is not None:
            return self.holds(Path(folder))
        return any((Path(folder) / name).is_file() for name in self.files)


_PYTORCH_FILES = (checkpoint_io.SAFETENSORS_NAME, checkpoint_io.SAFETENSORS_INDEX_NAME, checkpoint_io.BIN_NAME,
                  checkpoint_io.BIN_INDEX_NAME)


def _holds_pytorch(folder: Path) -> bool:
    present = [name for name in _PYTORCH_FILES if (folder / name).is_file()]
    if present == [checkpoint_io.SAFETENSORS_NAME]:
        # ... unless its metadata says "flax": a transformers 4.x Flax model's (HF_FLAX).
        return not hf_flax.is_flax_safetensors(folder)
    return bool(present)


PYTORCH = WeightFormat(
    "pytorch",
    _PYTORCH_FILES,
    checkpoint_io.open_weights,
    written_as=checkpoint_io.SAFETENSORS_NAME,
    holds=_holds_pytorch,
)
FLAXHEADS = WeightFormat(
    "flaxheads",
    (checkpoint_io.FLAX_NAME,),
    functools.partial(checkpoint_io.open_weights, file_name=checkpoint_io.FLAX_NAME),
    native_names,
    holds_pretraining_heads=False,
    written_as=checkpoint_io.FLAX_NAME,
)
# Hugging Face Flax (transformers 4.x `Flax*` models' save_pretrained): read without torch or
# transformers 4.x; PyTorch weights in the same folder win, as in transformers.
HF_FLAX = WeightFormat("hf_flax", hf_flax.WEIGHT_NAMES, hf_flax.open_hf_flax, hf_flax.hf_flax_rules,
                       holds=lambda folder: hf_flax.weights_file(folder) is not None)

TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
    "vocab.txt", "vocab.json", "merges.txt", "spiece.model", "sentencepiece.bpe.model", "tokenizer.model",
    "chat_template.jinja",
)
"""The files a transformers tokenizer saves (`tokenizer.save_pretrained`), and loads from a folder."""
WEIGHT_FILES = (*PYTORCH.files, *FLAXHEADS.files, *HF_FLAX.files, "tf_model.h5")
"""Every weight file name a loader (flaxheads or transformers) might read from a checkpoint folder."""
_SHARD = re.compile(r"(model|pytorch_model|flax_model|tf_model)-\d+-of-\d+\.(safetensors|bin|msgpack|h5)")


def canonical_name(name: str) -> str:
    """A format's name, its legacy names (`LEGACY_NAMES`) read as the current one, with a
    DeprecationWarning naming it."""
    if name in LEGACY_NAMES:
        warnings.warn(f"weight format {name!r} is now called {LEGACY_NAMES[name]!r}", DeprecationWarning,
                      stacklevel=3)
    return LEGACY_NAMES.get(name, name)


def checkpoint_files(folder: str | os.PathLike) -> list[str]:
    """The names in `folder` that belong to a checkpoint: config.json, weights (shards too),
    tokenizer files. Other files (notes, a README) are not listed. [] for a missing folder."""
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return []
    known = {checkpoint_io.CONFIG_NAME, *WEIGHT_FILES, *TOKENIZER_FILES}
    return sorted(name for name in names if name in known or _SHARD.fullmatch(name))


def tokenizer_files(folder: str | os.PathLike) -> list[str]:
    """The names of the tokenizer files `folder` has."""
    return [name for name in TOKENIZER_FILES if (Path(folder) / name).is_file()]


__all__ = [
    "FLAXHEADS",
    "HF_FLAX",
    "LEGACY_NAMES",
    "PYTORCH",
    "TOKENIZER_FILES",
    "WEIGHT_FILES",
    "WeightFormat",
    "canonical_name",
    "checkpoint_files",
    "tokenizer_files",
]
