"""A fork server for the test suite's `flaxheads` and `python` commands: one process imports what
those commands import (jax, flax, transformers, torch, datasets, orbax, every flaxheads module)
once, and each command runs in a fork of it as in a process of its own: its argv, environment,
working folder, standard streams, the signals sent to it and its exit status. A command's own
process spent ~5 s of CPU importing before doing anything (measured 2026-11-29: 5.1 CPU-s for
`flaxheads train`'s imports, 9.6 s with torch), and the doc examples run ~50 of them.

    python tests/forkserver.py serve SOCKET [--bare]        the server (`Server` starts one; --bare:
                                                            no imports, for testing the server itself)
    python -I -S tests/forkserver.py SOCKET flaxheads ARG...   `flaxheads ARG...` through it
    python -I -S tests/forkserver.py SOCKET python SCRIPT ARG...   `python SCRIPT ARG...` through it

The client is a few stdlib imports (~20 ms). What a fork cannot reproduce it does not pretend
to: a command whose environment differs from the server's in a variable that may be read at
import time (any but `RUN_TIME_VARIABLES`), or a server that is gone, runs in a process of its
own (the client execs it). The server refuses to start serving if its imports started jax's
backend (a fork after XLA started its threads is not a clean process).
`FLAXHEADS_TEST_FORK_SERVER_TRACE=FILE`: the client says in FILE which commands ran in a process of
their own, and why.

For the tests' use only: the library's own `flaxheads` command is `flaxheads.launcher`.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys

AVAILABLE = hasattr(os, "pidfd_open") and hasattr(socket, "send_fds")
"""Linux (5.3 or later) with Python 3.9 or later: what the server needs."""
RUN_TIME_VARIABLES = frozenset({"PATH", "PWD", "OLDPWD", "SHLVL", "_", "COLUMNS", "LINES", "PYTEST_CURRENT_TEST"})
"""Variables no import reads (PATH: the shell's, for finding commands; the shell's own; pytest's
name of the test running): they may differ between the server and a command run through it."""
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
LAUNCHER = "import sys; from flaxheads.launcher import main; sys.argv[0] = 'flaxheads'; main()"
"""`python -c LAUNCHER ARG...` is the installed `flaxheads ARG...` (pyproject's [project.scripts])."""


# --- the client ----------------------------------------------------------------------------------

def client(socket_path: str, mode: str, args: list[str]) -> None:
    """Runs the command through the server at `socket_path` and exits as it exits; execs it
    in this process when the server cannot run it."""
    request = json.dumps({"mode": mode, "args": args, "cwd": os.getcwd(), "env": dict(os.environ)}).encode()
    streams = [fd if _is_open(fd) else os.open(os.devnull, os.O_RDWR) for fd in (0, 1, 2)]
    try:
        connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        connection.connect(socket_path)
        socket.send_fds(connection, [len(request).to_bytes(8, "big") + request], streams)
        answers = connection.makefile("r")
        first = answers.readline().split()
    except OSError:
        first = []
    if first[:1] != ["pid"]:
        if os.environ.get("FLAXHEADS_TEST_FORK_SERVER_TRACE"):
            with open(os.environ["FLAXHEADS_TEST_FORK_SERVER_TRACE"], "a") as trace:
                print(f"{mode} {args[:2]}: runs in a process of its own: {' '.join(first) or 'no server'}", file=trace)
        _exec(mode, args)
    child = int(first[1])
    def forward(received, frame):
        try:
            os.kill(child, received)
        except ProcessLookupError:  # it has just ended: its status follows
            pass

    for number in FORWARDED_SIGNALS:
        signal.signal(number, forward)
    last = answers.readline().split()
    if last[:1] != ["exit"]:
        print(f"forkserver: the server stopped before command {child} ended", file=sys.stderr)
        os._exit(1)
    status = int(last[1])
    if os.WIFSIGNALED(status):  # ended by a signal: so does this process, as the shell expects
        signal.signal(os.WTERMSIG(status), signal.SIG_DFL)
        os.kill(os.getpid(), os.WTERMSIG(status))
    os._exit(os.waitstatus_to_exitcode(status))


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def _exec(mode: str, args: list[str]) -> None:
    if mode == "flaxheads":
        os.execv(sys.executable, [sys.executable, "-c", LAUNCHER, *args])
    os.execv(sys.executable, [sys.executable, *args])


# --- the server ----------------------------------------------------------------------------------

PRELOAD = ("numpy", "jax", "jax.numpy", "flax.nnx", "optax", "orbax.checkpoint", "torch", "transformers", "datasets",
           "pandas", "safetensors", "tokenizers", "matplotlib", "matplotlib.pyplot", "optuna", "uvicorn", "starlette",
           "prometheus_client", "httpx")
"""Imported before any fork, besides every flaxheads module; a module that is not installed is left out."""
TRANSFORMERS_NAMES = ("AutoConfig", "AutoTokenizer", "AutoModelForSequenceClassification", "PreTrainedTokenizerFast",
                      "BertTokenizerFast", "BertConfig", "pipeline")
"""transformers' lazily imported names the commands and examples reach for."""


def _preload() -> None:
    import importlib
    import pkgutil

    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    import transformers

    for name in TRANSFORMERS_NAMES:
        getattr(transformers, name)
    import flaxheads

    for module in pkgutil.walk_packages(flaxheads.__path__, "flaxheads."):
        importlib.import_module(module.name)
    from jax._src import xla_bridge

    if xla_bridge._backends:
        raise RuntimeError("forkserver: importing the modules started jax's backend; a fork of it would share "
                           "XLA's threads: find the import that does it")


def serve(socket_path: str, preload: bool = True) -> None:
    """Serves commands on `socket_path` until standard input closes (the parent's end)."""
    import selectors

    startup_env = dict(os.environ)
    if preload:
        _preload()
    imports_set = {name: value for name, value in os.environ.items() if startup_env.get(name) != value}
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(socket_path)
    listener.listen(64)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    selector.register(sys.stdin, selectors.EVENT_READ)
    print("ready", flush=True)
    while True:
        for key, _ in selector.select():
            if key.fileobj is sys.stdin:
                if not os.read(sys.stdin.fileno(), 1024):
                    return
            elif key.fileobj is listener:
                try:
                    _start(listener, selector, startup_env, imports_set)
                except (OSError, ValueError) as error:  # one client's broken request: the next may be fine
                    print(f"forkserver: a request failed: {error!r}", file=sys.stderr)
            else:  # a child's pidfd: it ended
                pid, connection = key.data
                selector.unregister(key.fileobj)
                os.close(key.fileobj)
                _, status = os.waitpid(pid, 0)
                try:
                    connection.sendall(f"exit {status}\n".encode())
                except OSError:  # the client is gone
                    pass
                connection.close()


def _start(listener, selector, startup_env: dict[str, str], imports_set: dict[str, str]) -> None:
    import selectors

    connection, _ = listener.accept()
    request, streams = _receive(connection)
    changed = sorted(name for name in set(request["env"]) | set(startup_env)
                     if name not in RUN_TIME_VARIABLES and request["env"].get(name) != startup_env.get(name))
    if changed or request["mode"] not in ("flaxheads", "python"):
        connection.sendall(f"no {','.join(changed) or 'mode'}\n".encode())
        connection.close()
        for fd in streams:
            os.close(fd)
        return
    pid = os.fork()
    if pid == 0:
        try:
            listener.close()
            for key in list(selector.get_map().values()):
                if isinstance(key.data, tuple):
                    key.data[1].close()
            selector.close()
            connection.close()
            _become(request, streams, imports_set)
        except BaseException:  # noqa: BLE001 - a fork must never return into the server's loop
            import traceback

            traceback.print_exc()
        finally:
            os._exit(1)
    for fd in streams:
        os.close(fd)
    connection.sendall(f"pid {pid}\n".encode())
    selector.register(os.pidfd_open(pid), selectors.EVENT_READ, data=(pid, connection))


def _receive(connection) -> tuple[dict, list[int]]:
    data, streams, _, _ = socket.recv_fds(connection, 1 << 20, 3)
    while len(data) < 8 or len(data) < 8 + int.from_bytes(data[:8], "big"):
        more = connection.recv(1 << 20)
        if not more:
            raise ConnectionError("forkserver: a client hung up mid-request")
        data += more
    return json.loads(data[8:]), list(streams)


def _become(request: dict, streams: list[int], imports_set: dict[str, str]) -> None:
    """In the fork: the command's process, from its streams and environment to its exit. Its
    environment is the client's with what the imports set in the server (TF_CPP_MIN_LOG_LEVEL,
    say), as the command's imports would have set it in a process of its own."""
    import random
    import runpy

    for target, fd in enumerate(streams):
        os.dup2(fd, target)
        os.close(fd)
    sys.stdin = open(0, closefd=False)  # the server's own stdin was its parent's pipe
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    os.environ.update(imports_set)
    for number in (*FORWARDED_SIGNALS, signal.SIGCHLD):
        signal.signal(number, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    random.seed()  # a process of its own draws its seeds afresh
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    args = request["args"]
    try:
        if request["mode"] == "flaxheads":
            sys.argv, sys.path[0] = ["flaxheads", *args], ""
            from flaxheads.launcher import main

            main()
        sys.argv, sys.path[0] = list(args), os.path.dirname(os.path.abspath(args[0]))
        runpy.run_path(args[0], run_name="__main__")
        code = 0
    except SystemExit as stop:
        code = stop.code
    except KeyboardInterrupt:
        import traceback

        traceback.print_exc()
        sys.stderr.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    except BaseException:  # noqa: BLE001 - what the interpreter does with an uncaught error
        import traceback

        traceback.print_exc()
        code = 1
    if code is not None and not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    # What the command line's exit does; a bare server imports it here.
    from flaxheads.cli import exit_process

    exit_process(code or 0)


class Server:
    """A fork server in a process of its own, for the environment `env`: `command(mode)` is the
    argv prefix that runs a command through it."""

    def __init__(self, socket_path: str, env: dict[str, str], preload: bool = True):
        import subprocess

        self.socket_path, self.env = socket_path, env
        bare = [] if preload else ["--bare"]
        self.process = subprocess.Popen([sys.executable, __file__, "serve", socket_path, *bare], env=env,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        if self.process.stdout.readline() != b"ready\n":
            self.process.wait(timeout=60)
            raise RuntimeError(f"forkserver: the server did not start (exit status {self.process.returncode})")

    def command(self, mode: str) -> list[str]:
        return [sys.executable, "-I", "-S", __file__, self.socket_path, mode]

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=60)


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(sys.argv[2], preload="--bare" not in sys.argv[3:])
    else:
        client(sys.argv[1], sys.argv[2], sys.argv[3:])
