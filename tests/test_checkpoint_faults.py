"""Damaged, unconfirmed and contested checkpoints: RunCheckpoints falls back, sets aside (never
deletes) and names what it did; RunLock keeps two runs out of one output directory.

The saved state is a tiny TrainState (a few KB); its arrays are large enough (32x32 float32) that
OCDBT writes them to data files under `state/ocdbt.process_0/d/` instead of inlining them.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flaxheads.conversion.checkpoint_io import CheckpointError
from flaxheads.training.checkpoints import RECORD_NAME, CheckpointMismatch, RunCheckpoints
from flaxheads.training.run_lock import LOCK_NAME, RunLock, RunLocked
from flaxheads.training.step import TrainState

IDENTITY = {"model": "tiny", "labels": ["a", "b"]}


def _state(step: int) -> TrainState:
    key = jax.random.key(step)
    params = {"kernel": jax.random.normal(key, (32, 32)), "bias": jnp.full((32,), float(step))}
    return TrainState(step=jnp.int32(step), params=params, opt_state=(jnp.zeros((32, 32)), jnp.ones(())))


def _abstract(state: TrainState) -> TrainState:
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state)


def _checkpoints(output_dir: Path, max_to_keep: int | None = 5, identity=IDENTITY) -> RunCheckpoints:
    return RunCheckpoints(output_dir / "checkpoints", max_to_keep=max_to_keep, identity=identity)


def _saved(output_dir: Path, steps, **kwargs) -> RunCheckpoints:
    checkpoints = _checkpoints(output_dir, **kwargs)
    for step in steps:
        checkpoints.save(_state(step), step, {"data_position": step})
    checkpoints.wait()  # the files on disk, for the tests that damage them
    return checkpoints


def test_an_asynchronous_save_keeps_the_state_it_was_given_though_training_donates_it(tmp_path):
    checkpoints = _checkpoints(tmp_path, max_to_keep=2)
    assert checkpoints.asynchronous
    donate = jax.jit(lambda s: jax.tree.map(lambda x: x * 0 - 7, s), donate_argnums=0)
    for step in (1, 2, 3):
        state = _state(step)
        checkpoints.save(state, step, {"data_position": step})
        jax.block_until_ready(donate(state))  # what the train step does right after a save
    assert checkpoints.all_steps() == [2, 3]  # waits for step 3, then prunes to max_to_keep
    restored, meta = checkpoints.restore(_abstract(_state(3)), 3)
    _assert_state(restored, 3)
    assert meta["data_position"] == 3
    checkpoints.close()


def _assert_state(restored: TrainState, step: int) -> None:
    for got, want in zip(jax.tree.leaves(restored), jax.tree.leaves(_state(step))):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def _truncate_data_file(step_dir: Path) -> None:
    largest = max((step_dir / "state" / "ocdbt.process_0" / "d").iterdir(), key=lambda p: p.stat().st_size)
    with open(largest, "r+b") as f:
        f.truncate(100)


def _flip_a_byte_of_array_data(step_dir: Path) -> None:
    """One byte in the middle of the largest array data file: Orbax reads it back without
    complaint (the values just change); only the checksum recorded at save tells."""
    largest = max((step_dir / "state" / "ocdbt.process_0" / "d").iterdir(), key=lambda p: p.stat().st_size)
    data = bytearray(largest.read_bytes())
    data[len(data) // 2] ^= 0x40
    largest.write_bytes(bytes(data))


DAMAGES = {
    "flipped_byte_in_array_data": _flip_a_byte_of_array_data,
    "truncated_data_file": _truncate_data_file,
    "deleted_state_metadata": lambda step_dir: (step_dir / "state" / "_METADATA").unlink(),
    "deleted_meta_metadata": lambda step_dir: (step_dir / "meta" / "metadata").unlink(),
    "half_deleted_step_folder": lambda step_dir: shutil.rmtree(step_dir / "state"),
}


@pytest.mark.parametrize("damage", DAMAGES)
def test_damaged_newest_step_is_set_aside_and_the_previous_one_restored(damage, tmp_path, capsys):
    _saved(tmp_path, [1, 2]).close()
    DAMAGES[damage](tmp_path / "checkpoints" / "2")
    checkpoints = _checkpoints(tmp_path)  # a fresh start, as on resume: nothing cached
    state, meta, step = checkpoints.restore_newest_intact(_abstract(_state(1)))
    assert step == 1 and meta["data_position"] == 1
    _assert_state(state, 1)
    warning = capsys.readouterr().err
    print(warning)
    set_aside = tmp_path / "checkpoints_set_aside" / "2-damaged"
    assert f"checkpoint step 2 in {tmp_path / 'checkpoints'} is damaged (" in warning
    assert f"moved it to {set_aside}; falling back to step 1" in warning
    assert "Traceback" not in warning and "Exception ignored" not in warning
    assert (set_aside / "meta").is_dir()
    assert checkpoints.all_steps() == [1]
    # Orbax is not left in a bad state: the run saves and restores on.
    checkpoints.save(_state(3), 3, {"data_position": 3})
    state, _, step = checkpoints.restore_newest_intact(_abstract(_state(3)))
    assert step == 3
    _assert_state(state, 3)


def test_every_step_damaged_raises_checkpoint_error_naming_what_was_set_aside(tmp_path, capsys):
    _saved(tmp_path, [1, 2]).close()
    _truncate_data_file(tmp_path / "checkpoints" / "2")
    (tmp_path / "checkpoints" / "1" / "state" / "_METADATA").unlink()
    with pytest.raises(CheckpointError, match="overwrite_output_dir=True") as err:
        _checkpoints(tmp_path).restore_newest_intact(_abstract(_state(1)))
    print(err.value)
    for step in (1, 2):
        assert str(tmp_path / "checkpoints_set_aside" / f"{step}-damaged") in str(err.value)
    assert "no older step left" in capsys.readouterr().err


def test_a_step_set_aside_twice_gets_a_numbered_folder(tmp_path):
    (tmp_path / "checkpoints_set_aside" / "2-damaged").mkdir(parents=True)
    _saved(tmp_path, [1, 2]).close()
    _truncate_data_file(tmp_path / "checkpoints" / "2")
    _checkpoints(tmp_path).restore_newest_intact(_abstract(_state(1)))
    assert (tmp_path / "checkpoints_set_aside" / "2-damaged-2" / "state").is_dir()


def test_restore_newest_intact_only_tries_the_given_steps(tmp_path):
    checkpoints = _saved(tmp_path, [1, 2, 3])
    _, _, step = checkpoints.restore_newest_intact(_abstract(_state(1)), steps=[1, 2])
    assert step == 2
    assert checkpoints.all_steps() == [1, 2, 3]


def test_checkpoints_of_another_run_are_refused_before_anything_is_set_aside(tmp_path):
    _saved(tmp_path, [1, 2]).close()
    _truncate_data_file(tmp_path / "checkpoints" / "2")
    with pytest.raises(CheckpointMismatch, match="labels"):
        _checkpoints(tmp_path, identity={**IDENTITY, "labels": ["x"]}).restore_newest_intact(_abstract(_state(1)))
    assert not (tmp_path / "checkpoints_set_aside").exists()
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir() if p.is_dir()) == ["1", "2"]


def test_a_checkpoint_from_before_the_selection_was_recorded_is_refused_for_another_best_metric(tmp_path):
    checkpoints = _checkpoints(tmp_path)  # an identity without "selection", as earlier versions saved it
    checkpoints.save(_state(1), 1, {"data_position": 1, "best": {"metric": "accuracy", "value": 0.7, "step": 1}})
    checkpoints.close()
    selection = {"metric_for_best_model": "loss", "greater_is_better": False, "load_best_model_at_end": False}

    other_metric = _checkpoints(tmp_path, identity={**IDENTITY, "selection": selection})
    with pytest.raises(CheckpointMismatch, match="selection"):
        other_metric.restore_newest_intact(_abstract(_state(1)))
    same = {**selection, "metric_for_best_model": "accuracy", "greater_is_better": True}
    _, _, step = _checkpoints(tmp_path, identity={**IDENTITY, "selection": same}).restore_newest_intact(
        _abstract(_state(1)))
    assert step == 1


def test_a_target_that_does_not_fit_is_the_callers_error_and_moves_nothing(tmp_path):
    checkpoints = _saved(tmp_path, [1, 2])
    wrong = _abstract(_state(1))._replace(opt_state=(jax.ShapeDtypeStruct((16, 32), jnp.float32), jnp.ones(())))
    with pytest.raises(ValueError, match="not compatible with the stored shape"):
        checkpoints.restore_newest_intact(wrong)
    assert checkpoints.all_steps() == [1, 2]
    assert not (tmp_path / "checkpoints_set_aside").exists()


def test_explicit_restore_of_a_damaged_step_raises_checkpoint_error_and_moves_nothing(tmp_path):
    checkpoints = _saved(tmp_path, [1, 2])
    _truncate_data_file(tmp_path / "checkpoints" / "2")
    # The checksum recorded at save names the damaged file before Orbax reads it.
    with pytest.raises(CheckpointError, match=r"step 2 .* cannot be read \(state/ocdbt\.process_0/d/\w+ changed since it "
                                              r"was saved \(SHA-256 differs\)\)"):
        checkpoints.restore(_abstract(_state(1)), 2)
    state, meta = checkpoints.restore(_abstract(_state(1)), 1)
    _assert_state(state, 1)
    assert checkpoints.all_steps() == [1, 2]
    with pytest.raises(ValueError, match="no checkpoint at step 7; available steps: 1, 2"):
        checkpoints.restore(_abstract(_state(1)), 7)


def test_unconfirmed_steps_are_set_aside_and_confirmations_persist(tmp_path):
    checkpoints = _saved(tmp_path, [1, 2, 3])
    checkpoints.confirm(1)
    checkpoints.confirm(2)
    checkpoints.confirm(99)  # no such checkpoint: ignored
    reopened = _checkpoints(tmp_path)
    assert reopened.confirmed_steps() == [1, 2]
    assert reopened.latest_good_step() == 2
    assert reopened.set_aside_unconfirmed() == [3]
    assert (tmp_path / "checkpoints_set_aside" / "3-unconfirmed" / "state").is_dir()
    assert reopened.all_steps() == [1, 2]


def test_set_aside_moves_the_given_steps_and_forgets_their_confirmation(tmp_path):
    checkpoints = _saved(tmp_path, [1, 2, 3])
    checkpoints.confirm(2)
    moved = checkpoints.set_aside([2, 3, 9], "after-resume-point")
    assert moved == [str(tmp_path / "checkpoints_set_aside" / f"{step}-after-resume-point") for step in (2, 3)]
    assert checkpoints.all_steps() == [1] and _checkpoints(tmp_path).all_steps() == [1]
    assert json.loads((tmp_path / "checkpoints" / RECORD_NAME).read_text()) == {"confirmed_steps": []}


def test_saving_a_step_again_unconfirms_it(tmp_path):
    checkpoints = _saved(tmp_path, [1])
    checkpoints.confirm(1)
    checkpoints.manager.delete(1)  # as when the trainer falls back past it and trains step 1 again
    checkpoints.save(_state(1), 1, {})
    assert checkpoints.confirmed_steps() == []


def test_confirmed_record_is_invisible_to_orbax(tmp_path):
    checkpoints = _saved(tmp_path, [1, 2])
    checkpoints.confirm(2)
    record = tmp_path / "checkpoints" / RECORD_NAME
    assert json.loads(record.read_text()) == {"confirmed_steps": [2]}
    reopened = _checkpoints(tmp_path)
    assert reopened.all_steps() == [1, 2]
    assert reopened.latest_step() == 2
    assert record.exists()  # Orbax's clean-up of temporary folders leaves it alone


def test_collection_never_deletes_the_newest_confirmed_step(tmp_path):
    checkpoints = _saved(tmp_path, [1], max_to_keep=2)
    checkpoints.confirm(1)
    for step in (2, 3, 4):  # a run whose loss went NaN right after step 1 saves these unconfirmed
        checkpoints.save(_state(step), step, {})
    assert checkpoints.all_steps() == [1, 3, 4]
    checkpoints.confirm(3)
    assert checkpoints.all_steps() == [1, 3, 4]  # surplus steps go at the next save
    checkpoints.save(_state(5), 5, {})
    assert checkpoints.all_steps() == [3, 4, 5]
    assert checkpoints.confirmed_steps() == [3]


def test_folder_without_a_record_counts_every_step_as_confirmed(tmp_path):
    _saved(tmp_path, [1, 2]).close()
    (tmp_path / "checkpoints" / RECORD_NAME).unlink()  # as written before confirmations existed
    legacy = _checkpoints(tmp_path)
    assert legacy.confirmed_steps() == [1, 2]
    assert legacy.latest_good_step() == 2
    assert legacy.set_aside_unconfirmed() == []
    legacy.save(_state(3), 3, {})
    assert _checkpoints(tmp_path).confirmed_steps() == [1, 2]


def test_resolve_resume_accepts_a_step_or_a_step_folder_and_names_the_available_steps(tmp_path):
    checkpoints = _saved(tmp_path, [1, 2])
    assert checkpoints.resolve_resume("2") == 2
    assert checkpoints.resolve_resume(str(tmp_path / "checkpoints" / "1")) == 1
    assert checkpoints.resolve_resume(str(tmp_path / "checkpoints" / "1") + "/") == 1
    with pytest.raises(ValueError, match="no checkpoint at step 7; available steps: 1, 2"):
        checkpoints.resolve_resume("7")
    with pytest.raises(ValueError, match="no checkpoint at step 9; available steps: 1, 2"):
        checkpoints.resolve_resume(str(tmp_path / "checkpoints" / "9"))
    elsewhere = tmp_path / "other_run" / "checkpoints" / "2"
    with pytest.raises(ValueError, match="step folder of this output_dir's checkpoints .* or copy"):
        checkpoints.resolve_resume(str(elsewhere))
    with pytest.raises(ValueError, match="not a step folder"):
        checkpoints.resolve_resume("latest")


# RunLock.


def test_lock_is_created_with_its_holder_and_removed_on_exit(tmp_path):
    output_dir = tmp_path / "not_yet_there"
    with RunLock(output_dir):
        holder = json.loads((output_dir / LOCK_NAME).read_text())
        assert holder["pid"] == os.getpid() and holder["host"] == socket.gethostname()
        assert set(holder) == {"pid", "host", "started", "command"}
    assert not (output_dir / LOCK_NAME).exists()


def test_second_acquire_is_refused_naming_the_holder(tmp_path):
    with RunLock(tmp_path):
        with pytest.raises(RunLocked, match=f"pid {os.getpid()} on {socket.gethostname()}") as err:
            RunLock(tmp_path).acquire()
    print(err.value)
    assert "output_dir" in str(err.value)


_HOLD_LOCK = """
import sys, time
from flaxheads.training.run_lock import RunLock
RunLock(sys.argv[1]).acquire()
print("held", flush=True)
time.sleep(600)
"""

_RACE = """
import sys, time
from flaxheads.training.run_lock import RunLock, RunLocked
start = float(sys.argv[2])
while time.time() < start:
    pass
try:
    RunLock(sys.argv[1]).acquire()
except RunLocked:
    print("refused", flush=True)
    sys.exit(0)
print("held", flush=True)
time.sleep(3)
"""


@pytest.mark.slow
def test_a_lock_left_by_a_killed_run_is_free_at_once_and_exactly_one_of_four_racers_gets_it(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", _HOLD_LOCK, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(RunLocked, match=f"pid {holder.pid}"):
        RunLock(tmp_path).acquire()
    holder.kill()  # SIGKILL: the lock file stays, the kernel lock does not
    holder.wait()
    assert (tmp_path / LOCK_NAME).exists()

    start = time.time() + 3.0  # every racer is running (imports done) before the start
    racers = [subprocess.Popen([sys.executable, "-c", _RACE, str(tmp_path), str(start)], stdout=subprocess.PIPE,
                               text=True) for _ in range(4)]
    outcomes = sorted(r.communicate(timeout=120)[0].strip() for r in racers)

    assert outcomes == ["held", "refused", "refused", "refused"]


def test_release_removes_only_the_file_it_locked(tmp_path):
    lock = RunLock(tmp_path).acquire()
    (tmp_path / LOCK_NAME).unlink()  # someone deleted the lock file by hand
    with RunLock(tmp_path):  # a new run locks a new file meanwhile
        lock.release()
        assert (tmp_path / LOCK_NAME).exists()
    assert not (tmp_path / LOCK_NAME).exists()


def test_a_save_onto_a_full_device_is_refused_in_one_sentence_before_orbax_writes(tmp_path, monkeypatch):
    from flaxheads import atomic

    checkpoints = _saved(tmp_path, [1])
    monkeypatch.setattr(atomic.shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10**9, 10**9 - 1000, 1000))

    with pytest.raises(atomic.NoSpace) as err:
        checkpoints.save(_state(2), 2, {"data_position": 2})

    assert str(err.value).startswith(f"checkpoint step 2 needs about 8.3 KB in {tmp_path / 'checkpoints'}, and its "
                                     "device has 1.0 KB free")
    assert checkpoints.all_steps() == [1]


def test_a_device_that_fills_up_while_orbax_writes_is_said_naming_the_folder(tmp_path, monkeypatch):
    from flaxheads import atomic

    checkpoints = _saved(tmp_path, [1])
    checkpoints.save(_state(2), 2, {"data_position": 2})

    def full():  # what Orbax raises from TensorStore's failed write
        raise ValueError('RESOURCE_EXHAUSTED: Error writing "step/0" in OCDBT database at local file '
                         f'"{tmp_path}/checkpoints/2.orbax-checkpoint-tmp/": No space left on device '
                         "[os_error_code='28']")

    monkeypatch.setattr(checkpoints.manager, "wait_until_finished", full)
    with pytest.raises(atomic.NoSpace) as err:
        checkpoints.wait()

    assert str(err.value) == f"no space left on the device of {tmp_path / 'checkpoints'} while saving checkpoint step 2"


def test_a_step_without_its_checksum_file_is_restored_with_a_warning_naming_it(tmp_path, capsys):
    _saved(tmp_path, [1, 2]).close()
    (tmp_path / "checkpoints" / "2" / "flaxheads_checksums.process_0.json").unlink()

    state, _, step = _checkpoints(tmp_path).restore_newest_intact(_abstract(_state(2)))

    assert step == 2
    _assert_state(state, 2)
    assert (f"checkpoint step 2 in {tmp_path / 'checkpoints'} has no flaxheads_checksums.process_0.json"
            in capsys.readouterr().err)
    _checkpoints(tmp_path).restore(_abstract(_state(1)), step=1)
    assert "has no" not in capsys.readouterr().err  # a step with its checksums: no warning


def test_another_process_writing_its_checksum_file_is_not_taken_for_a_file_of_the_step(tmp_path):
    """Process 0 sums the step's shared files while process 1 may be writing its own checksum file
    (a temporary name, renamed a moment later): summed, it would be missing at the next read and
    the intact step set aside as damaged; vanished before it is read, process 0 would fail."""
    from flaxheads.training import checkpoints as checkpoints_module

    _saved(tmp_path, [1]).close()
    step_dir = tmp_path / "checkpoints" / "1"
    being_written = step_dir / ".flaxheads_checksums.process_1.json.k3j2x9.tmp"
    being_written.write_text("{")
    checkpoints_module._write_checksums(str(step_dir))
    being_written.unlink()

    summed = json.loads((step_dir / "flaxheads_checksums.process_0.json").read_text())["sha256"]
    assert summed and not any("checksums" in name for name in summed)
    assert checkpoints_module._changed_files(str(step_dir)) == []


def test_a_flipped_byte_is_read_back_without_the_checksums(tmp_path):
    """Why the checksums exist: without them the damaged step restores with other values."""
    _saved(tmp_path, [1, 2]).close()
    step_dir = tmp_path / "checkpoints" / "2"
    for checksums in step_dir.glob("flaxheads_checksums.process_*.json"):
        checksums.unlink()
    _flip_a_byte_of_array_data(step_dir)

    state, _, step = _checkpoints(tmp_path).restore_newest_intact(_abstract(_state(2)))

    assert step == 2
    differs = [not np.array_equal(np.asarray(got), np.asarray(want))
               for got, want in zip(jax.tree.leaves(state), jax.tree.leaves(_state(2)))]
    assert any(differs)
