"""The tests' fork server (tests/forkserver.py) runs a command as a process of its own would:
argv, folder, environment, streams, exit status and signals; a command it cannot run so runs in a
process of its own. A bare server (no imports) keeps these fast; the doc examples use a full one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from forkserver import AVAILABLE, Server

pytestmark = pytest.mark.skipif(not AVAILABLE, reason="the fork server needs Linux's pidfd_open")

SCRIPT = """
import json, os, sys, time
print(json.dumps({"argv": sys.argv, "cwd": os.getcwd(), "pid": os.getpid(), "ppid": os.getppid(),
                  "path0": sys.path[0], "given": os.environ.get("GIVEN"), "stdin": sys.stdin.read()}))
print("to stderr", file=sys.stderr)
if sys.argv[1] == "sleep":
    print("sleeping", flush=True)
    time.sleep(60)
sys.exit(int(sys.argv[1]))
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fork")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(os.path.dirname(os.path.dirname(__file__))), *sys.path])}
    started = Server(str(folder / "s"), env, preload=False)
    yield started
    started.close()


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "script.py"
    path.write_text(SCRIPT)
    return path


def test_a_command_runs_in_a_fork_with_its_argv_folder_environment_streams_and_exit_status(server, script, tmp_path):
    env = dict(server.env, PATH=f"/nowhere{os.pathsep}{server.env['PATH']}")  # PATH may differ from the server's
    done = subprocess.run([*server.command("python"), str(script), "3", "more"], cwd=tmp_path, env=env,
                          input="what the client read", capture_output=True, text=True, timeout=60)
    seen = json.loads(done.stdout)
    assert done.returncode == 3 and done.stderr == "to stderr\n"
    assert seen["argv"] == [str(script), "3", "more"] and seen["cwd"] == str(tmp_path)
    assert seen["path0"] == str(script.parent) and seen["stdin"] == "what the client read"
    assert seen["ppid"] == server.process.pid  # a fork of the server, not the client's exec


def test_a_command_whose_environment_differs_at_import_time_runs_in_a_process_of_its_own(server, script, tmp_path):
    trace = tmp_path / "trace"
    env = dict(server.env, GIVEN="yes", FLAXHEADS_TEST_FORK_SERVER_TRACE=str(trace))
    client = subprocess.Popen([*server.command("python"), str(script), "0"], env=env, stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, text=True)
    seen = json.loads(client.communicate(timeout=60)[0])
    assert client.returncode == 0 and seen["given"] == "yes"
    assert seen["pid"] == client.pid  # the client exec'd it
    assert "runs in a process of its own: no FLAXHEADS_TEST_FORK_SERVER_TRACE,GIVEN" in trace.read_text()


def test_a_signal_to_the_client_reaches_the_command_and_the_client_ends_as_it_ends(server, script):
    client = subprocess.Popen([*server.command("python"), str(script), "sleep"], env=server.env,
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    command = json.loads(client.stdout.readline())["pid"]
    assert client.stdout.readline() == "sleeping\n"
    client.send_signal(signal.SIGTERM)
    assert client.wait(timeout=60) == -signal.SIGTERM
    time.sleep(0.1)
    with pytest.raises(ProcessLookupError):
        os.kill(command, 0)  # gone, and reaped by the server
