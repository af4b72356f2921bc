"""One training run per output directory at a time, held with the operating system's file lock.

`RunLock(output_dir)` opens `<output_dir>/.flaxheads.lock` and takes an exclusive, non-blocking
kernel lock on it (`fcntl.flock`; `msvcrt.locking` on Windows). The kernel releases the lock when
its holder exits in any way, SIGKILL and power loss of a local disk included, so a dead run never
blocks a folder and there is nothing to take over: no stale-lock logic, and no race between two
runs taking over the same stale lock. The file also holds a note of who holds it (pid, host,
start time, command), so a run refused by the lock can name the run it collided with.

Of two runs started on the same folder exactly one gets the lock. Process 0 of a multi-process
run takes it, the others do not.
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import sys
from typing import Any

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None
    import msvcrt

LOCK_NAME = ".flaxheads.lock"


class RunLocked(ValueError):
    """Another run holds the output directory; the message names it and the ways out."""


class RunLock:
    """`with RunLock(output_dir): ...`, or `acquire()` / `release()`."""

    def __init__(self, output_dir: str | os.PathLike):
        self.output_dir = os.path.abspath(output_dir)
        self.path = os.path.join(self.output_dir, LOCK_NAME)
        self._fd: int | None = None

    def acquire(self) -> RunLock:
        """Takes the lock (creating `output_dir` if needed) or raises RunLocked naming its holder."""
        os.makedirs(self.output_dir, exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                _lock(fd)
            except OSError:
                holder = _read_note(fd)
                os.close(fd)
                raise RunLocked(_held_message(self.output_dir, holder)) from None
            # A holder that was releasing may have removed the file between our open and our
            # lock: then we hold a lock on a file no one else can find. Start over on the new one.
            if _same_file(fd, self.path):
                break
            os.close(fd)
        _write_note(fd, {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "command": " ".join(sys.argv),
        })
        self._fd = fd
        return self

    def release(self) -> None:
        """Removes the lock file (still holding the lock, so no one else is using it) and releases."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            if _same_file(fd, self.path):
                os.remove(self.path)
        except OSError:
            pass
        finally:
            _unlock(fd)
            os.close(fd)

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc_info) -> None:
        self.release()


def _lock(fd: int) -> None:
    """The exclusive lock on `fd`, without waiting; OSError when another process holds it."""
    if fcntl is not None:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    else:
        os.lseek(fd, 0, os.SEEK_SET)
        msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)


def _unlock(fd: int) -> None:
    if fcntl is not None:
        fcntl.flock(fd, fcntl.LOCK_UN)
    else:
        os.lseek(fd, 0, os.SEEK_SET)
        msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)


def _same_file(fd: int, path: str) -> bool:
    try:
        on_disk = os.stat(path)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (mine.st_dev, mine.st_ino) == (on_disk.st_dev, on_disk.st_ino)


def _write_note(fd: int, note: dict[str, Any]) -> None:
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, json.dumps(note).encode())
    os.fsync(fd)


def _read_note(fd: int) -> dict[str, Any] | None:
    """The holder's note; None while it is not yet written (the holder has just taken the lock)."""
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        note = json.loads(os.read(fd, 1 << 16).decode())
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    return note if isinstance(note, dict) else None


def _held_message(output_dir: str, holder: dict[str, Any] | None) -> str:
    if holder is None:
        who = "a run that is starting right now"
    else:
        who = (f"pid {holder.get('pid')} on {holder.get('host')}, started {holder.get('started')}, command: "
               f"{holder.get('command')}")
    return (f"{output_dir} is in use by another run ({who}). Wait for it to finish, or pick another "
            "output_dir")
