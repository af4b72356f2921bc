"""Jobs of `flaxheads` command lines in fresh processes on fake CPU devices, one or several
processes each (multi-host on 127.0.0.1): start them, wait for all, compare their exports."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file

from runs import cpu_devices_env

RUNNER = textwrap.dedent(
    """
    import sys
    from flaxheads.cli import main
    if sys.argv[1] == "stop_after_first_save":
        from flaxheads.training import checkpoints
        real_save = checkpoints.RunCheckpoints.save
        def save(self, *args):
            real_save(self, *args)
            raise SystemExit(3)
        checkpoints.RunCheckpoints.save = save
    if sys.argv[1] == "process_0_fails_recording_the_best" and sys.argv[sys.argv.index("--process_id") + 1] == "0":
        from flaxheads.training import run_files
        def record_best(*args):
            raise OSError("the best model's record cannot be written (injected)")
        run_files.record_best = record_best
    sys.exit(main(sys.argv[2:]))
    """
)


def run(devices: int, argv: list[str], *, mode: str = "plain", env: dict | None = None, check: bool = True):
    """`flaxheads <argv>` in a fresh process on `devices` CPU devices: its stdout (check=True), or
    the running process (check=False; `finish` it, with the others of its job)."""
    # Output goes to unnamed files, never to a pipe: in a job of several processes, one blocked on
    # a full pipe that nobody reads stalls every other process in its next collective. On SIGABRT,
    # faulthandler prints every thread's Python stack (see `finish`).
    full_env = cpu_devices_env(devices, PYTHONFAULTHANDLER="1", **(env or {}))
    out, err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")  # noqa: SIM115 (finish closes them)
    proc = subprocess.Popen([sys.executable, "-c", RUNNER, mode, *argv], env=full_env, stdout=out, stderr=err,
                            text=True)
    proc.output_files = (out, err)
    return proc if not check else finish(proc)[0]


def finish(*procs, expected: int = 0, timeout: float = 420) -> list[str]:
    """Waits for the processes of one job; returns their stdouts (their stderrs are left in
    `proc.stderr_text`). A job still running after `timeout` seconds is stopped with SIGABRT,
    and the failure shows every process's stacks."""
    deadline = time.monotonic() + timeout
    hung = []
    for proc in procs:
        try:
            proc.wait(timeout=max(deadline - time.monotonic(), 1))
        except subprocess.TimeoutExpired:
            hung.append(proc)
    for proc in hung:
        proc.send_signal(signal.SIGABRT)
    for proc in hung:
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    outputs = []
    for proc in procs:
        for file in proc.output_files:
            file.seek(0)
        outputs.append(tuple(file.read() for file in proc.output_files))
        for file in proc.output_files:
            file.close()
        proc.stderr_text = outputs[-1][1]
    shown = "\n".join(f"--- process {i}: exit {proc.returncode}\n{out[-2000:]}\n{err[-6000:]}"
                      for i, (proc, (out, err)) in enumerate(zip(procs, outputs)))
    assert not hung, f"{len(hung)} of {len(procs)} process(es) still running after {timeout:.0f} s\n{shown}"
    assert all(proc.returncode == expected for proc in procs), shown
    return [out for out, _ in outputs]


def weights(directory: Path) -> dict[str, np.ndarray]:
    return load_file(str(directory / "model.safetensors"))


def max_difference(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> float:
    assert a.keys() == b.keys()
    return max(float(np.abs(a[k] - b[k]).max()) for k in a)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
