"""One training run per output directory at a time.

`RunLock(output_dir)` creates `<output_dir>/.flaxheads.lock` with O_CREAT|O_EXCL, so of two runs
started on the same folder exactly one gets it. The file says who holds it (pid, host, start
time, command) so that the other can name the run it collided with. A lock whose holder died
(same host, pid gone) is taken over; a lock from another host cannot be checked and is refused.
Process 0 of a multi-process run takes it, the others do not.
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import sys
import time
from typing import Any

LOCK_NAME = ".flaxheads.lock"
# The holder writes the file right after creating it: an unreadable one younger than this may
# still be being written.
_UNREADABLE_GRACE_S = 60.0


class RunLocked(ValueError):
    """Another run holds the output directory; the message names it and the ways out."""


class RunLock:
    """`with RunLock(output_dir): ...`, or `acquire()` / `release()`."""

    def __init__(self, output_dir: str | os.PathLike):
        self.output_dir = os.path.abspath(output_dir)
        self.path = os.path.join(self.output_dir, LOCK_NAME)
        self._mine: dict[str, Any] | None = None

    def acquire(self) -> RunLock:
        """Takes the lock (creating `output_dir` if needed) or raises RunLocked."""
        os.makedirs(self.output_dir, exist_ok=True)
        mine = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": datetime.datetime.now().astimezone().isoformat(timespec="microseconds"),
            "command": " ".join(sys.argv),
        }
        for _ in range(3):  # the holder may release between our create and our read
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                try:
                    self._take_over_if_stale(mine)
                except FileNotFoundError:
                    continue
            else:
                with os.fdopen(fd, "w") as f:
                    _write(f, mine)
            self._mine = mine
            return self
        raise RunLocked(f"{self.output_dir} is being locked and released by other runs; try again")

    def release(self) -> None:
        """Removes the lock file if it is still ours; someone else's is left alone."""
        if self._mine is None:
            return
        try:
            if _read(self.path) == self._mine:
                os.remove(self.path)
        except FileNotFoundError:
            pass
        self._mine = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc_info) -> None:
        self.release()

    def _take_over_if_stale(self, mine: dict[str, Any]) -> None:
        holder = _read(self.path)
        if holder is None:
            age = time.time() - os.path.getmtime(self.path)
            if age < _UNREADABLE_GRACE_S:
                raise RunLocked(
                    f"{self.output_dir} is locked by {self.path}, which cannot be read yet: a run may be "
                    "starting there. Wait for it, pick another --output_dir, or, if no run is using the "
                    f"folder, delete {self.path}"
                )
            why = f"its lock file is unreadable and {age:.0f} s old"
        elif holder["host"] != mine["host"]:
            raise RunLocked(
                f"{self.output_dir} is locked by a run on host {holder['host']} (pid {holder['pid']}, started "
                f"{holder.get('started')}, command: {holder.get('command')}); from {mine['host']} it cannot be "
                "checked whether that run is alive. Wait for it or pick another --output_dir; if no run is "
                f"using the folder, delete {self.path}"
            )
        elif _pid_alive(holder["pid"]):
            raise RunLocked(
                f"{self.output_dir} is in use by another run: pid {holder['pid']} on {holder['host']}, "
                f"started {holder.get('started')}, command: {holder.get('command')}. Wait for it to "
                "finish, or pick another --output_dir"
            )
        else:
            why = f"pid {holder['pid']}, started {holder.get('started')}, is no longer running"
        temporary = f"{self.path}.{os.getpid()}.tmp"
        with open(temporary, "w") as f:
            _write(f, mine)
        os.replace(temporary, self.path)
        now = _read(self.path)
        if now != mine:  # another run took the stale lock over at the same moment
            raise RunLocked(
                f"{self.output_dir} was just taken over by another run ({now}); pick another --output_dir"
            )
        print(f"note: taking over the stale lock of {self.output_dir} ({why})", file=sys.stderr)


def _write(f, record: dict[str, Any]) -> None:
    json.dump(record, f)
    f.flush()
    os.fsync(f.fileno())


def _read(path: str) -> dict[str, Any] | None:
    """The lock's record; None if it is not one (half-written, damaged). FileNotFoundError if gone."""
    try:
        with open(path) as f:
            record = json.load(f)
    except (ValueError, UnicodeDecodeError):
        return None
    valid = (isinstance(record, dict) and isinstance(record.get("pid"), int) and record["pid"] > 0
             and isinstance(record.get("host"), str))
    return record if valid else None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, owned by another user
        return True
    return True
