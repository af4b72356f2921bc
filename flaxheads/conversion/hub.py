"""Where a checkpoint named by `from_pretrained(path, ...)` lives on this machine.

Placeholder: only local folders. The hub version resolves "org/name" ids through
huggingface_hub's cache with the same signature.
"""

from __future__ import annotations

import os
from pathlib import Path


def resolve_checkpoint(
    path: str | os.PathLike,
    *,
    revision: str | None = None,
    cache_dir: str | os.PathLike | None = None,
    token: str | bool | None = None,
    local_files_only: bool = False,
) -> Path:
    """The local folder holding the checkpoint `path` names.

    Raises FileNotFoundError naming `path` when it is not an existing folder.
    """
    folder = Path(path)
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder} is not a directory; pass a Hugging Face checkpoint directory")
    return folder
