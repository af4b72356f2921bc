"""Data parallel, FSDP, pmap and multi-host training on CPU with fake devices.

Every run trains the same tiny BERT on the same global batches (8 packed rows) in a fresh process
whose device count is set by XLA_FLAGS before jax starts. Layouts must agree up to float32
reduction order. Every run cuts the data into two shards (`--data_shards 2`, which decides the
global batches' order), so that the two-process run, whose processes each read only their own
half, shares the one-process references (the default single shard is what the rest of the
suite trains on). Token classification over two processes: test_multi_process_tokens.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from jobs import finish, free_port, max_difference, run, weights

pytestmark = pytest.mark.slow  # subprocesses on fake devices and several processes, each training

STEPS = 6
TOLERANCE = 2e-5


def _flags(model: Path, data: dict[str, Path], output_dir: Path, per_device: int, *extra: str) -> list[str]:
    return [
        "train", "--model_name_or_path", str(model), "--train_file", str(data["train"]),
        "--validation_file", str(data["validation"]), "--text_column", "sentence", "--output_dir", str(output_dir),
        "--max_seq_length", "32", "--per_device_train_batch_size", str(per_device),
        "--per_device_eval_batch_size", "4", "--learning_rate", "1e-3", "--max_steps", str(STEPS),
        "--logging_steps", "2", "--save_steps", "3", "--seed", "3", "--disable_tqdm", "--data_shards", "2",
        # Packed (the default): `per_device` rows a device, so every layout takes the same 8 rows a step.
        "--packed_batch_rows", str(per_device), *extra,
    ]


@pytest.fixture(scope="module")
def one_device(tiny_bert, snippets_csv, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("one_device")
    run(1, _flags(tiny_bert, snippets_csv, out, 8))
    return out


@pytest.fixture(scope="module")
def four_devices(tiny_bert, snippets_csv, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("four_devices")
    run(4, _flags(tiny_bert, snippets_csv, out, 2, "--mesh", "data=4"))
    return out


def test_four_way_data_parallel_matches_one_device(one_device, four_devices):
    difference = max_difference(weights(one_device), weights(four_devices))
    print("1 device vs data=4:", difference)
    assert 0 <= difference < TOLERANCE


# FSDP trains both halves of test_checkpoint_saved_on_four_devices_resumes_on_two (data=2,fsdp=2,
# then fsdp=2), which ends equal to data=4.
def test_pmap_matches_one_device(tiny_bert, snippets_csv, one_device, tmp_path):
    run(4, _flags(tiny_bert, snippets_csv, tmp_path, 2, "--parallel", "pmap"))
    difference = max_difference(weights(one_device), weights(tmp_path))
    print("pmap on 4 devices vs 1 device:", difference)
    assert difference < TOLERANCE


def test_checkpoint_saved_on_four_devices_resumes_on_two(tiny_bert, snippets_csv, four_devices, tmp_path):
    finish(run(4, _flags(tiny_bert, snippets_csv, tmp_path, 2, "--mesh", "data=2,fsdp=2"),
                 mode="stop_after_first_save", check=False), expected=3)
    out = run(2, _flags(tiny_bert, snippets_csv, tmp_path, 4, "--mesh", "fsdp=2"))
    assert "resuming from step 3" in out
    difference = max_difference(weights(four_devices), weights(tmp_path))
    print("4 devices, stopped at step 3, resumed on 2:", difference)
    assert difference < TOLERANCE


def test_two_processes_reading_their_own_shards_match_one_process_with_four_devices(
    tiny_bert, snippets_csv, four_devices, tmp_path
):
    coordinator = f"127.0.0.1:{free_port()}"
    procs = [
        run(2, _flags(tiny_bert, snippets_csv, tmp_path, 2, "--mesh", "data=4", "--coordinator_address",
                       coordinator, "--num_processes", "2", "--process_id", str(i), "--save_total_limit", "1"),
             check=False)
        for i in range(2)
    ]
    outputs = finish(*procs)
    assert "resuming" not in outputs[0]
    # Step 3 pruned by both processes together (Orbax's delete is a collective), step 6 kept.
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir() if p.name.isdigit()) == ["6"]
    for i, out in enumerate(outputs):  # 128 train and 32 validation examples, half each (train first: packed)
        assert f"process {i}/2 tokenized 64 of 128 train examples (shards {i}-{i} of 2)" in out
        assert f"process {i}/2 tokenized 16 of 32 validation examples (shards {i}-{i} of 2)" in out
    difference = max_difference(weights(four_devices), weights(tmp_path))
    print("2 processes x 2 devices vs 1 process x 4 devices:", difference)
    assert difference < TOLERANCE
    # Evaluation counts both processes' examples, as the single process does.
    ours, reference = (json.loads((d / "results.json").read_text())["validation"]
                       for d in (tmp_path, four_devices))
    assert ours["accuracy"] == reference["accuracy"] and ours["loss"] == pytest.approx(reference["loss"], abs=1e-5)
    # Logs are written once, by process 0.
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert len([line for line in lines if '"split": "train"' in line]) == STEPS // 2
