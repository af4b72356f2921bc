"""Writing files and folders so that a reader sees the old version or the new one, never a part of
either: the one home of every write flaxheads makes that someone else may read.

- `write_file(path, write)`, `write_text`, `write_json`: one file through a temporary file in the
  same folder and a rename.
- `staged_into(folder)`: several files (an export: config.json, weights, tokenizer) written into
  a private staging folder, then moved into `folder` with one rename each. While they move, the
  folder holds `INCOMPLETE_MARKER`; readers that must not mix two exports (`require_complete`)
  refuse a folder that still holds it, so a kill between two renames cannot pair new weights with
  an old config.
- `replace_folder(folder)`: a whole folder (a peft adapter) written under a temporary name and
  swapped in, so a reader sees the old folder, the new one, or none.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import socket
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

try:
    import fcntl
except ImportError:  # Windows: staging folders are made the same way, and never removed as abandoned
    fcntl = None

INCOMPLETE_MARKER = ".flaxheads-incomplete"
"""Present in a folder while `staged_into` moves files into it; gone once every file is in place."""
STAGING_MARK = ".flaxheads-staging"
"""In a staging folder, locked by its writer while it writes (`_staging`): whose it is and whether it is in use."""


class IncompleteFolder(ValueError):
    """A folder whose last multi-file update was interrupted: its files may come from two versions."""


class NoSpace(OSError):
    """No space left on a device (errno ENOSPC); the message, all of `str()`, names where and what to do."""

    def __init__(self, message: str):
        super().__init__(errno.ENOSPC, message)

    def __str__(self) -> str:
        return self.strerror


def is_no_space(error: BaseException) -> bool:
    """Whether `error`, or an error it was raised from, says the device is full: an OSError with
    errno ENOSPC, or a library's wrapping of one (TensorStore's, through Orbax, is a ValueError
    saying "No space left on device")."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if getattr(error, "errno", None) == errno.ENOSPC or "No space left on device" in str(error):
            return True
        error = error.__cause__ or error.__context__
    return False


def require_space(folder: str | os.PathLike, needed: int, what: str) -> None:
    """NoSpace before `what` writes about `needed` bytes into `folder` (or, while it is missing,
    its nearest existing parent) on a device with less free space: said in one sentence, rather
    than by the writer failing half-way."""
    place = Path(folder)
    while not place.exists() and place != place.parent:
        place = place.parent
    try:
        free = shutil.disk_usage(place).free
    except OSError:
        return  # cannot tell: the write itself will say
    if free < needed:
        raise NoSpace(f"{what} needs about {_size(needed)} in {folder}, and its device has {_size(free)} free")


def _size(count: int) -> str:
    for unit in ("bytes", "KB", "MB", "GB"):
        if count < 1000 or unit == "GB":
            return f"{count:.0f} {unit}" if unit == "bytes" else f"{count:.1f} {unit}"
        count /= 1000
    return f"{count:.1f} TB"


def _umask() -> int:
    """The process's umask. Linux reports it in /proc/self/status; elsewhere the only way to read it
    is to set it and set it back, which is process-wide: a file another thread creates meanwhile
    gets the stricter 0o077, never a looser mode."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def write_file(target: str | os.PathLike, write: Callable[[str], None]) -> Path:
    """`write(temporary_path)` fills a temporary file in `target`'s folder, which then replaces
    `target` with one rename: a crash never leaves a half-written file where a good one was.
    Returns `target` as a Path."""
    target = Path(target)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        # mkstemp makes the file private (0600); the result gets the mode any new file would.
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def write_text(target: str | os.PathLike, text: str) -> Path:
    """`text` (UTF-8) as `target`, written atomically."""
    return write_file(target, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


def write_json(target: str | os.PathLike, value: Any, *, sort_keys: bool = False) -> Path:
    """`value` as indented JSON, written atomically (numpy scalars become floats)."""
    return write_text(target, json.dumps(value, indent=2, sort_keys=sort_keys, default=float) + "\n")


def require_complete(folder: str | os.PathLike, *, fix: str) -> None:
    """IncompleteFolder when `folder` holds `INCOMPLETE_MARKER`: an update of several files was
    interrupted there, so they may not belong together. `fix` says how to redo it."""
    marker = Path(folder) / INCOMPLETE_MARKER
    if marker.exists():
        try:
            what = marker.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError):
            what = ""
        raise IncompleteFolder(
            f"{folder} was being written when the writer stopped ({what or 'an update of several files'}): its files "
            f"may come from two versions and are not read. {fix}; or, if you know its files are right, delete "
            f"{marker}"
        )


@contextlib.contextmanager
def staged_into(dst: str | os.PathLike, *, describe: str = "",
                remove: Callable[[set[str]], Iterable[str]] | None = None) -> Iterator[Path]:
    """An empty folder to write files into. When the block ends without error, every file written
    there moves into `dst` (created if missing) with one rename each, `dst` holding
    `INCOMPLETE_MARKER` (saying `describe`) from before the first rename to after the last; on
    any error before the moves `dst` is left as it was, and folders created for it are removed
    again. The staging folder is gone either way (and staging folders abandoned by killed writers
    of `dst` are removed first: `remove_abandoned`). Files in `dst` that the block did not write
    are never touched, except those `remove(names written)` returns: they go in the same moves
    (put back if a move fails), so a reader never finds them beside the new files. `remove` may
    raise to refuse the update, leaving `dst` as it was."""
    target = Path(dst).resolve()
    require_folder(dst)
    created = make_folders(target.parent)
    try:
        with _staging(target, beside=_may_stage_beside(target)) as root:
            staging = root / "files"
            staging.mkdir()
            yield staging
            names = set(os.listdir(staging))
            removing = set(remove(names)) - names if remove is not None else set()
            _move_into(staging, target, names, describe, root / "replaced", removing)
    except BaseException:
        remove_empty(created)
        raise


@contextlib.contextmanager
def replace_folder(dst: str | os.PathLike) -> Iterator[Path]:
    """An empty folder beside `dst` to write into; when the block ends without error it becomes
    `dst` (an existing `dst` is renamed away first, then removed), so a reader finds the old
    folder, the new one or, for an instant, none, never a mix. On error `dst` is untouched."""
    target = Path(dst).resolve()
    created = make_folders(target.parent)
    try:
        with _staging(target, beside=True) as root:
            staging = root / "folder"
            staging.mkdir()
            yield staging
            os.chmod(staging, 0o777 & ~_umask())
            if os.path.lexists(target):
                os.replace(target, root / "old")  # removed with the staging folder
            os.replace(staging, target)
    except BaseException:
        remove_empty(created)
        raise


def remove_abandoned(dst: str | os.PathLike) -> list[Path]:
    """Removes the staging folders of `dst` (`.NAME.tmp-*` beside it, or inside it) that writers
    killed mid-way left: only those holding `STAGING_MARK` that no process holds locked, so never
    a staging folder in use, nor one flaxheads cannot prove is its own. Returns those removed."""
    if fcntl is None:
        return []
    target = Path(dst).resolve()
    prefix = f".{target.name}.tmp-"
    removed = []
    for folder in (target.parent, target):
        try:
            names = [name for name in os.listdir(folder) if name.startswith(prefix)]
        except OSError:  # missing, or not a folder
            continue
        for name in names:
            candidate = folder / name
            try:
                fd = os.open(candidate / STAGING_MARK, os.O_RDWR | os.O_NOFOLLOW)
            except OSError:  # no mark (not provably flaxheads'), or not a folder
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:  # its writer is alive
                os.close(fd)
                continue
            try:
                shutil.rmtree(candidate, ignore_errors=True)
                removed.append(candidate)
            finally:
                os.close(fd)
    return removed


@contextlib.contextmanager
def _staging(dst: Path, *, beside: bool) -> Iterator[Path]:
    """A private staging folder `.NAME.tmp-XXXX` for `dst` (beside it, or inside it), holding
    `STAGING_MARK` locked by this process until the block ends; removed then. Abandoned staging
    folders of `dst` are removed first."""
    remove_abandoned(dst)
    root = Path(tempfile.mkdtemp(prefix=f".{dst.name}.tmp-", dir=dst.parent if beside else dst))
    # The mark is locked before it gets its name: no one can take a folder being made for abandoned.
    fd = os.open(root / f"{STAGING_MARK}.new", os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.write(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "for": str(dst)}).encode())
        os.replace(root / f"{STAGING_MARK}.new", root / STAGING_MARK)
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)
        os.close(fd)


def require_folder(folder: str | os.PathLike, *, argument: str = "", fix: str = "pass a folder (a new one, or one "
                   "that exists)") -> None:
    """NotADirectoryError when `folder`, or a folder it lies in, exists as a file (so it could
    never be made), naming it as `argument` (a parameter's name) and saying `fix`."""
    name = f"{argument} {folder}" if argument else str(folder)
    path = Path(folder)
    for place in (path, *path.parents):
        if os.path.lexists(place) and not place.is_dir():
            where = "is a file, not a folder" if place == path else f"lies in {place}, which is a file"
            raise NotADirectoryError(f"{name} {where}: {fix}")


def make_folders(folder: Path) -> list[Path]:
    """Creates `folder` and any missing parents; returns those it created, deepest first."""
    missing = []
    while not folder.exists() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    for new in reversed(missing):
        new.mkdir(exist_ok=True)
    return missing


def remove_empty(folders: list[Path]) -> None:
    """Removes `folders` (made by `make_folders`), deepest first, if nothing else has filled them."""
    for folder in folders:
        with contextlib.suppress(OSError):
            folder.rmdir()


def _may_stage_beside(dst: Path) -> bool:
    """Whether a staging folder beside `dst` is on its file system, so each file moves in with one
    rename; else (`dst` a mount point, or its parent read-only) it goes inside `dst`."""
    parent = dst.parent
    return not dst.is_dir() or (os.access(parent, os.W_OK) and dst.stat().st_dev == parent.stat().st_dev)


def _move_into(staging: Path, dst: Path, names: set[str], describe: str, replaced: Path,
               remove: set[str] = frozenset()) -> None:
    """Moves the files `names` from `staging` into `dst` (created if missing) with one rename
    each, and the files `remove` out of it, under `INCOMPLETE_MARKER`; the files they replace (or
    remove) wait in the new folder `replaced`, and are put back if any move fails."""
    created = make_folders(dst)
    replaced.mkdir()
    marker = dst / INCOMPLETE_MARKER
    several = len(names) + len(remove) > 1
    if several:
        write_text(marker, (describe or f"moving {', '.join(sorted(names))} into place") + "\n")
    moved = []
    try:
        for name in sorted(remove):
            if os.path.lexists(dst / name):
                os.replace(dst / name, replaced / name)
                moved.append(name)
        for name in sorted(names):
            if os.path.lexists(dst / name):
                os.replace(dst / name, replaced / name)
            moved.append(name)
            os.replace(staging / name, dst / name)
    except BaseException:
        for name in reversed(moved):
            with contextlib.suppress(OSError):  # put back as much as can be; the first error is what to report
                if os.path.lexists(replaced / name):
                    os.replace(replaced / name, dst / name)
                else:
                    (dst / name).unlink(missing_ok=True)
        if several:
            marker.unlink(missing_ok=True)
        remove_empty(created)
        raise
    if several:
        marker.unlink()


__all__ = [
    "INCOMPLETE_MARKER",
    "IncompleteFolder",
    "NoSpace",
    "is_no_space",
    "make_folders",
    "remove_abandoned",
    "remove_empty",
    "replace_folder",
    "require_complete",
    "require_folder",
    "require_space",
    "staged_into",
    "write_file",
    "write_json",
    "write_text",
]
