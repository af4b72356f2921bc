"""Checkpoints named by a Hugging Face hub id ("org/name"): the local folder they resolve to.

A hub id resolves through huggingface_hub's cache (the layout transformers shares:
`<cache>/models--org--name/refs/<revision>` holds a commit hash, `snapshots/<hash>/` the files).
With HF_HUB_OFFLINE set (or `local_files_only=True`) nothing is downloaded: a cached snapshot is
used, else the error says what was searched and what to do. Online, only what a loader reads is
downloaded: config, tokenizer and other small text files, and the safetensors weights, or
`pytorch_model*.bin` where a repository has no safetensors.
"""

from __future__ import annotations

import os
from pathlib import Path

from flaxheads.conversion.checkpoint_io import CONFIG_NAME

_SMALL_FILES = ["*.json", "*.txt", "*.model"]
"""config.json, tokenizer files (tokenizer.json, vocab.txt, merges.txt, spiece.model, ...)."""
_SAFETENSORS = ["*.safetensors"]
_BIN = ["pytorch_model*.bin"]


def resolve_checkpoint(
    path: str | os.PathLike,
    *,
    revision: str | None = None,
    cache_dir: str | os.PathLike | None = None,
    token: str | bool | None = None,
    local_files_only: bool | None = None,
) -> Path:
    """The local checkpoint folder `path` names.

    An existing folder is returned as it is. Anything else must be a hub id ("org/name" or
    "name"), looked up in the huggingface_hub cache `cache_dir` (default: HF_HUB_CACHE, else
    HF_HOME/hub, else ~/.cache/huggingface/hub) at `revision` (branch, tag or commit; default
    "main"). Offline (HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE set, or `local_files_only=True`;
    None means False unless those are set) the cached snapshot is returned and nothing is
    downloaded; online the snapshot is downloaded or updated with `token`, falling back to the
    cache when the hub cannot be reached.

    Raises NotADirectoryError for a file; FileNotFoundError for a missing folder that is no valid
    hub id, for an id that is not cached where nothing may or can be downloaded (naming the id,
    the cache folder searched, HF_HUB_OFFLINE and the alternative), or that the hub does not know;
    PermissionError for a gated or private repository without access.
    """
    folder = Path(path).expanduser()
    if folder.is_dir():
        return folder
    if folder.exists():
        raise NotADirectoryError(f"{path} is a file; pass the checkpoint folder that holds it ({folder.parent})")
    repo_id = os.fspath(path)
    if not _is_hub_id(repo_id):
        raise FileNotFoundError(
            f"the folder {path} does not exist; pass the path of a checkpoint folder (config.json and "
            "weights), or a Hugging Face hub id such as 'org/name'"
        )
    cache = _cache_folder(cache_dir)
    cached = _cached_snapshot(repo_id, revision, cache)
    offline = _offline_reason(local_files_only)
    if offline:
        if cached is None:
            raise FileNotFoundError(_not_cached(repo_id, revision, cache, offline))
        return cached
    return _download(repo_id, revision, cache, token, cached)


def _is_hub_id(name: str) -> bool:
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return True


def _cache_folder(cache_dir: str | os.PathLike | None) -> Path:
    """The cache huggingface_hub uses, from the environment as it is now (huggingface_hub reads
    it once, at import)."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def _offline_reason(local_files_only: bool | None) -> str | None:
    """Why nothing may be downloaded, or None when downloading is allowed."""
    for variable in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if os.environ.get(variable, "").upper() in ("1", "ON", "YES", "TRUE"):
            return f"{variable}={os.environ[variable]} forbids downloading"
    if local_files_only:
        return "local_files_only=True forbids downloading"
    return None


def _cached_snapshot(repo_id: str, revision: str | None, cache: Path) -> Path | None:
    """The cached snapshot folder of `repo_id` at `revision` that holds a config.json, or None."""
    from huggingface_hub import try_to_load_from_cache

    config = try_to_load_from_cache(repo_id, CONFIG_NAME, cache_dir=cache, revision=revision or "main")
    return Path(config).parent if isinstance(config, str) else None  # not a str: known missing


def _download(repo_id: str, revision: str | None, cache: Path, token, cached: Path | None) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError, LocalEntryNotFoundError, OfflineModeIsEnabled, RepositoryNotFoundError, RevisionNotFoundError,
    )

    def fetch(patterns: list[str]) -> Path:
        return Path(snapshot_download(repo_id, revision=revision, cache_dir=cache, token=token,
                                      allow_patterns=patterns, library_name="flaxheads"))

    try:
        folder = fetch(_SMALL_FILES + _SAFETENSORS)
        if not any(folder.glob("*.safetensors")):
            folder = fetch(_BIN)
        return folder
    except GatedRepoError:
        raise PermissionError(
            f"{repo_id} is a gated repository: accept its terms on huggingface.co and pass token= "
            "(or log in with `hf auth login`)"
        ) from None
    except RepositoryNotFoundError:
        raise FileNotFoundError(
            f"no folder {repo_id} here, and the Hugging Face hub has no model {repo_id} (or it is private: "
            "pass token= or log in with `hf auth login`)"
        ) from None
    except RevisionNotFoundError:
        raise FileNotFoundError(f"the hub model {repo_id} has no revision {revision!r}") from None
    except (LocalEntryNotFoundError, OfflineModeIsEnabled, ConnectionError) as error:
        if cached is not None:
            return cached
        raise FileNotFoundError(
            _not_cached(repo_id, revision, cache, f"the hub could not be reached ({type(error).__name__})")
        ) from error


def _not_cached(repo_id: str, revision: str | None, cache: Path, reason: str) -> str:
    snapshot = cache / f"models--{repo_id.replace('/', '--')}" / "snapshots"
    return (
        f"{repo_id} is not a local folder, and the Hugging Face hub id {repo_id} (revision "
        f"{revision or 'main'}) is not in the cache: searched {snapshot} for a snapshot with {CONFIG_NAME} "
        f"(cache_dir= or HF_HUB_CACHE choose the cache); {reason}. Download it once with the hub reachable "
        "and HF_HUB_OFFLINE unset, or download the checkpoint folder elsewhere (e.g. `hf download "
        f"{repo_id} --local-dir DIR`), copy it here and pass its path"
    )
