"""Token classification trained, scored and predicted by two processes (multi-host on
127.0.0.1, each reading only its own data shard) equals one process; an error on one process
ends the job at once, said; the data-shard refusal; bf16 parameters for inference. (Sequence
classification over several devices and processes: test_scale_out.py.)"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest
from jobs import finish, free_port, max_difference, run, weights

TOLERANCE = 2e-5


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


@pytest.mark.slow  # three processes, each training
def test_two_processes_score_and_predict_token_classification_as_one_process(tiny_bert, conll, tmp_path):
    reference = tmp_path / "one_process"
    run(2, _token_flags(tiny_bert, conll, reference))
    coordinator = f"127.0.0.1:{free_port()}"
    ours = tmp_path / "two_processes"
    procs = [
        run(1, _token_flags(tiny_bert, conll, ours, "--coordinator_address", coordinator, "--num_processes", "2",
                             "--process_id", str(i)), check=False)
        for i in range(2)
    ]
    finish(*procs)

    difference = max_difference(weights(reference), weights(ours))
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


@pytest.mark.slow  # two processes, each training
def test_an_error_on_one_process_is_printed_and_ends_the_job_at_once(tiny_bert, conll, tmp_path):
    """Process 0 alone fails writing a file (after the evaluation's export): it says so and exits,
    and process 1, waiting for it in the test split's scoring, stops too, rather than both
    aborting in a mismatched collective with the error unsaid (or waiting 5 minutes at jax's
    shutdown barrier)."""
    coordinator = f"127.0.0.1:{free_port()}"
    procs = [
        run(1, _token_flags(tiny_bert, conll, tmp_path / "run", "--coordinator_address", coordinator,
                             "--num_processes", "2", "--process_id", str(i)),
            mode="process_0_fails_recording_the_best", check=False)
        for i in range(2)
    ]
    start = time.monotonic()
    with pytest.raises(AssertionError) as failed:  # their exit statuses are not 0
        finish(*procs, timeout=150)
    assert "still running" not in str(failed.value)
    print(f"the job ended {time.monotonic() - start:.0f} s after it started")
    first, second = procs
    assert first.returncode == 2, first.stderr_text[-3000:]
    assert ("flaxheads train: error (process 0 of 2): the best model's record cannot be written (injected)"
            in first.stderr_text)
    assert "Gloo" not in first.stderr_text  # no collective mismatch
    # Process 1 stops on the lost connection, or the job's coordination service (process 0's) ends it first.
    assert second.returncode != 0


def test_more_processes_than_data_shards_are_refused_naming_data_shards(monkeypatch):
    import jax

    from flaxheads import data

    task = data.load_in_memory({"train": (["a", "b", "c", "d"], [0, 1, 0, 1])}).task
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    with pytest.raises(ValueError, match="--data_shards 1 must be a multiple of the process count 2"):
        data.check_data_shards(1, task, 8, 8)
    data.check_data_shards(2, task, 8, 8)


@pytest.mark.slow
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
