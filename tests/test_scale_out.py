"""Data parallel, FSDP, pmap and multi-host training on CPU with fake devices.

Every run trains the same tiny BERT on the same global batches (8 examples) in a fresh process
whose device count is set by XLA_FLAGS before jax starts. Layouts must agree up to float32
reduction order. Every run cuts the data into two shards (`--data_shards 2`, which decides the
global batches' order), so that the two-process run, whose processes each read only their own
half, shares the one-process references (the default single shard is what the rest of the
suite trains on).
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from runs import cpu_devices_env

pytestmark = pytest.mark.slow  # subprocesses on fake devices and several processes, each training

STEPS = 6
TOLERANCE = 2e-5


def _flags(model: Path, data: dict[str, Path], output_dir: Path, per_device: int, *extra: str) -> list[str]:
    return [
        "train", "--model_name_or_path", str(model), "--train_file", str(data["train"]),
        "--validation_file", str(data["validation"]), "--text_column", "sentence", "--output_dir", str(output_dir),
        "--max_seq_length", "32", "--per_device_train_batch_size", str(per_device),
        "--per_device_eval_batch_size", "4", "--learning_rate", "1e-3", "--max_steps", str(STEPS),
        "--logging_steps", "2", "--save_steps", "3", "--seed", "3", "--disable_tqdm", "--data_shards", "2", *extra,
    ]


_RUNNER = textwrap.dedent(
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
    sys.exit(main(sys.argv[2:]))
    """
)


def _run(devices: int, argv: list[str], *, mode: str = "plain", env: dict | None = None, check: bool = True):
    """`flaxheads <argv>` in a fresh process on `devices` CPU devices: its stdout (check=True), or
    the running process (check=False; `_finish` it, with the others of its job)."""
    # Output goes to unnamed files, never to a pipe: in a job of several processes, one blocked on
    # a full pipe that nobody reads stalls every other process in its next collective. On SIGABRT,
    # faulthandler prints every thread's Python stack (see `_finish`).
    full_env = cpu_devices_env(devices, PYTHONFAULTHANDLER="1", **(env or {}))
    out, err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
    proc = subprocess.Popen([sys.executable, "-c", _RUNNER, mode, *argv], env=full_env, stdout=out, stderr=err,
                            text=True)
    proc.output_files = (out, err)
    return proc if not check else _finish(proc)[0]


def _finish(*procs, expected: int = 0, timeout: float = 420) -> list[str]:
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


def _weights(directory: Path) -> dict[str, np.ndarray]:
    return load_file(str(directory / "model.safetensors"))


def _max_difference(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> float:
    assert a.keys() == b.keys()
    return max(float(np.abs(a[k] - b[k]).max()) for k in a)


@pytest.fixture(scope="module")
def one_device(tiny_bert, snippets_csv, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("one_device")
    _run(1, _flags(tiny_bert, snippets_csv, out, 8))
    return out


@pytest.fixture(scope="module")
def four_devices(tiny_bert, snippets_csv, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("four_devices")
    _run(4, _flags(tiny_bert, snippets_csv, out, 2, "--mesh", "data=4"))
    return out


def test_four_way_data_parallel_matches_one_device(one_device, four_devices):
    difference = _max_difference(_weights(one_device), _weights(four_devices))
    print("1 device vs data=4:", difference)
    assert 0 <= difference < TOLERANCE


# FSDP trains both halves of test_checkpoint_saved_on_four_devices_resumes_on_two (data=2,fsdp=2,
# then fsdp=2), which ends equal to data=4.
def test_pmap_matches_one_device(tiny_bert, snippets_csv, one_device, tmp_path):
    _run(4, _flags(tiny_bert, snippets_csv, tmp_path, 2, "--parallel", "pmap"))
    difference = _max_difference(_weights(one_device), _weights(tmp_path))
    print("pmap on 4 devices vs 1 device:", difference)
    assert difference < TOLERANCE


def test_checkpoint_saved_on_four_devices_resumes_on_two(tiny_bert, snippets_csv, four_devices, tmp_path):
    _finish(_run(4, _flags(tiny_bert, snippets_csv, tmp_path, 2, "--mesh", "data=2,fsdp=2"),
                 mode="stop_after_first_save", check=False), expected=3)
    out = _run(2, _flags(tiny_bert, snippets_csv, tmp_path, 4, "--mesh", "fsdp=2"))
    assert "resuming from step 3" in out
    difference = _max_difference(_weights(four_devices), _weights(tmp_path))
    print("4 devices, stopped at step 3, resumed on 2:", difference)
    assert difference < TOLERANCE


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_reading_their_own_shards_match_one_process_with_four_devices(
    tiny_bert, snippets_csv, four_devices, tmp_path
):
    coordinator = f"127.0.0.1:{_free_port()}"
    procs = [
        _run(2, _flags(tiny_bert, snippets_csv, tmp_path, 2, "--mesh", "data=4", "--coordinator_address",
                       coordinator, "--num_processes", "2", "--process_id", str(i)),
             check=False)
        for i in range(2)
    ]
    outputs = _finish(*procs)
    assert "resuming" not in outputs[0]
    for i, out in enumerate(outputs):  # 128 train and 32 validation examples, half each
        assert f"process {i}/2 tokenized 64 of 128 train, 16 of 32 validation examples (shards {i}-{i} of 2)" in out
    difference = _max_difference(_weights(four_devices), _weights(tmp_path))
    print("2 processes x 2 devices vs 1 process x 4 devices:", difference)
    assert difference < TOLERANCE
    # Evaluation counts both processes' examples, as the single process does.
    ours, reference = (json.loads((d / "results.json").read_text())["validation"]
                       for d in (tmp_path, four_devices))
    assert ours["accuracy"] == reference["accuracy"] and ours["loss"] == pytest.approx(reference["loss"], abs=1e-5)
    # Logs are written once, by process 0.
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert len([line for line in lines if '"split": "train"' in line]) == STEPS // 2


def _token_flags(model: Path, conll: dict[str, Path], output_dir: Path, *extra: str) -> list[str]:
    """4 steps of token classification on `conll`, global batches of 4 sentences (windows) on 2
    devices, the data cut into 2 shards; the test split scored and predicted."""
    return [
        "train", "--model_name_or_path", str(model), "--train_file", str(conll["train"]),
        "--validation_file", str(conll["validation"]), "--test_file", str(conll["test"]), "--do_predict",
        "--output_dir", str(output_dir), "--max_seq_length", "16", "--per_device_train_batch_size", "2",
        "--per_device_eval_batch_size", "2", "--learning_rate", "3e-3", "--max_steps", "4", "--warmup_ratio", "0",
        "--logging_steps", "2", "--save_steps", "100", "--seed", "3", "--report_to", "none", "--disable_tqdm",
        "--data_shards", "2", *extra,
    ]


def test_two_processes_score_and_predict_token_classification_as_one_process(tiny_bert, conll, tmp_path):
    reference = tmp_path / "one_process"
    _run(2, _token_flags(tiny_bert, conll, reference))
    coordinator = f"127.0.0.1:{_free_port()}"
    ours = tmp_path / "two_processes"
    procs = [
        _run(1, _token_flags(tiny_bert, conll, ours, "--coordinator_address", coordinator, "--num_processes", "2",
                             "--process_id", str(i)), check=False)
        for i in range(2)
    ]
    _finish(*procs)

    difference = _max_difference(_weights(reference), _weights(ours))
    print("token classification, 2 processes x 1 device vs 1 process x 2 devices:", difference)
    assert difference < TOLERANCE
    # Every sentence's words are scored once, with both processes' rows merged back into words.
    assert (ours / "predict_results.txt").read_text() == (reference / "predict_results.txt").read_text()
    results, expected = (json.loads((d / "results.json").read_text()) for d in (ours, reference))
    assert results["reports"] == expected["reports"]
    for split in ("validation", "test"):
        assert results[split]["loss"] == pytest.approx(expected[split]["loss"], abs=1e-5)
        assert {k: v for k, v in results[split].items() if k != "loss"} == \
            {k: v for k, v in expected[split].items() if k != "loss"}


def test_two_processes_reading_one_shard_are_refused_naming_data_shards(tiny_bert, snippets_csv, tmp_path):
    coordinator = f"127.0.0.1:{_free_port()}"
    procs = [
        _run(2, _flags(tiny_bert, snippets_csv, tmp_path, 2, "--data_shards", "1", "--coordinator_address",
                       coordinator, "--num_processes", "2", "--process_id", str(i)), check=False)
        for i in range(2)
    ]
    _finish(*procs, expected=2)
    for proc in procs:
        assert "--data_shards 1 must be a multiple of the process count 2" in proc.stderr_text


def test_bfloat16_parameters_for_inference_stay_close_to_float32(tiny_bert):
    import jax
    import jax.numpy as jnp

    import flaxheads

    full = flaxheads.from_pretrained(tiny_bert, num_labels=3, seed=1)
    half = flaxheads.from_pretrained(tiny_bert, num_labels=3, seed=1, dtype="bfloat16", param_dtype="bfloat16")
    leaves = jax.tree_util.tree_leaves(jax.tree.map(lambda x: x, __import__("flax").nnx.state(half)))
    assert {leaf.dtype for leaf in leaves} == {jnp.dtype("bfloat16")}
    ids = jnp.asarray(np.random.RandomState(0).randint(1000, 30000, (4, 16)), jnp.int32)
    difference = float(jnp.abs(full(ids) - half(ids)).max())
    print("bf16 parameters vs float32, max logit difference:", difference)
    assert difference < 5e-2
