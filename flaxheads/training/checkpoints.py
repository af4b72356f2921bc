"""Orbax checkpoints of a training run: {train state, data position, run identity, best metric}.

Orbax writes each step into a temporary folder and renames it when complete, so a process
killed at any moment, even mid-save, leaves the last finished checkpoint intact; leftover
temporary folders are removed on the next start.

A finished checkpoint can still go bad later (a disk error, a half-finished `rm`, a full disk
while copying, a flipped bit). Orbax keeps no checksums, so flaxheads records the SHA-256 of every
file of a step once Orbax has finished it (`flaxheads_checksums.process_<i>.json`: each process
its own files, process 0 the shared ones) and checks them before the step is read. A damaged step
is moved aside, never deleted, and the run falls back to an older one. A step saved before
checksums existed, or whose process was killed between Orbax's commit and the checksum file,
has none: it is read unchecked, with a warning naming the missing file (not refused: Orbax
renamed it into place whole, and it is often the newest step of a run killed right after saving;
refusing it would discard good training to guard against damage nothing suggests).

A checkpoint at step s holds the weights after update s. It is *confirmed* once a loss computed
from those weights was finite (the trainer learns that at step s+1, or from an evaluation) and
says so with `confirm(s)`; a run that went NaN resumes from a confirmed step. A checkpoints folder
written before confirmations existed has no record file: all its steps count as confirmed.

On disk, for a checkpoints directory `<output_dir>/checkpoints`:

    checkpoints/<step>/                 Orbax step folders with items `state` and `meta`
    checkpoints/confirmed_steps.json    {"confirmed_steps": [...]}; Orbax lists step folders only
    checkpoints_set_aside/<step>-damaged, <step>-unconfirmed (then -2, -3, ...)

Multi-process runs: `save`, `restore` and `restore_newest_intact` are collective (every process
calls them). Process 0 alone writes the record and moves folders: `confirm`, `set_aside` and
`set_aside_unconfirmed` act on process 0 and do nothing elsewhere, so they may be called on process
0 only (sync before the others look). Steps and the record are read from disk on every call.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import json
import os
import sys
import types
from typing import Callable, Any, Iterable

import jax
import numpy as np
import orbax.checkpoint as ocp

from flaxheads import atomic
from flaxheads.conversion.checkpoint_io import CheckpointError
from flaxheads.training.step import TrainState

RECORD_NAME = "confirmed_steps.json"
# Orbax's words for a target that does not fit an intact checkpoint: the caller's mistake, not damage.
_TARGET_ERRORS = ("is not compatible with the stored shape", "tree structures do not match")
# Orbax reads these before any array. Without them it fails late and misleadingly (a missing
# state/_METADATA surfaces as a pytree structure error), so their absence is checked on disk.
_REQUIRED_FILES = (os.path.join("state", "_METADATA"), os.path.join("meta", "metadata"))
CHECKSUMS_PREFIX = "flaxheads_checksums.process_"


class CheckpointMismatch(ValueError):
    """The output directory holds checkpoints of a different model, head or task."""


class RunCheckpoints:
    def __init__(self, directory: str | os.PathLike, *, max_to_keep: int | None, identity: dict[str, Any],
                 asynchronous: bool = True, differences: Callable[[dict | None, dict], list[str]] | None = None):
        """`identity` describes what is being trained (backbone config, head, labels); a restore
        refuses checkpoints whose identity differs: `differences(saved, identity)` lists how
        (default: every key whose value is not equal). `max_to_keep` newest steps are kept, plus
        always the newest confirmed one (None: keep every step).

        `asynchronous`: `save` returns once Orbax holds its own copy of the arrays and writes the
        files in a background thread while training goes on; the next save, any look at the steps
        on disk (`all_steps` and what uses it) and `close` wait for it first."""
        if max_to_keep is not None and max_to_keep < 1:
            raise ValueError(f"max_to_keep must be positive or None, got {max_to_keep}")
        self.identity = identity
        self.differences = differences or _differing_keys
        self.directory = os.path.abspath(directory)
        self.max_to_keep = max_to_keep
        self.asynchronous = asynchronous
        self._writing = False  # a save is being written in the background
        self._saving_step: int | None = None  # ... this step
        self._unpruned = False  # ... and once written, the steps beyond max_to_keep are still to go
        self.set_aside_directory = self.directory + "_set_aside"
        self._record_path = os.path.join(self.directory, RECORD_NAME)
        self.manager = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(
                max_to_keep=None,  # Orbax's collection could delete the only confirmed step: see save
                create=True,
                # The train state is donated right after saving: Orbax copies the arrays before
                # save returns (tests/test_checkpoint_faults.py checks that the saved state is intact).
                enable_async_checkpointing=asynchronous,
                cleanup_tmp_directories=True,
            ),
            item_names=("state", "meta"),
        )
        self._read_record()  # a damaged record is reported now, not in the middle of the run

    # Steps.

    def all_steps(self) -> list[int]:
        """Checkpoint steps on disk, oldest first (a save being written is waited for)."""
        # Pruning is collective (every process decides first): with several processes it waits
        # for the next save or close, which every process calls.
        self._settle(prune=jax.process_count() == 1)
        self.manager.reload()  # another process may have moved some aside
        return list(self.manager.all_steps())

    def latest_step(self) -> int | None:
        steps = self.all_steps()
        return steps[-1] if steps else None

    def confirmed_steps(self) -> list[int]:
        """Confirmed steps on disk, oldest first (every step when the folder has no record)."""
        confirmed = self._read_record()
        return [step for step in self.all_steps() if confirmed is None or step in confirmed]

    def latest_good_step(self) -> int | None:
        """The newest confirmed step, or None."""
        confirmed = self.confirmed_steps()
        return confirmed[-1] if confirmed else None

    def resolve_resume(self, value: str) -> int:
        """The step that `value` names: a step number ("300") or the path of a step folder of
        this checkpoints directory (".../checkpoints/300"). Raises ValueError naming the
        available steps when there is no such checkpoint."""
        steps = self.all_steps()
        available = f"available steps: {', '.join(map(str, steps))}" if steps else "it holds no checkpoints"
        text = str(value).strip()
        if text.isdigit():
            step = int(text)
        else:
            path = os.path.realpath(os.path.expanduser(text))
            if os.path.dirname(path) != os.path.realpath(self.directory) or not os.path.basename(path).isdigit():
                raise ValueError(
                    f"{value!r} is not a step folder of {self.directory}: pass a step number or a step "
                    f"folder of this output_dir's checkpoints ({available}), or copy that checkpoint "
                    f"folder into {self.directory}"
                )
            step = int(os.path.basename(path))
        if step not in steps:
            raise ValueError(f"{self.directory} has no checkpoint at step {step}; {available}")
        return step

    # Saving and confirming.

    def save(self, state: TrainState, step: int, meta: dict[str, Any]) -> None:
        """Saves `state` (global arrays; every process calls this) as checkpoint `step`,
        unconfirmed, then deletes the steps beyond the `max_to_keep` newest except the newest
        confirmed one (asynchronous: once the step is written, see `__init__`)."""
        self._settle()
        # Said before Orbax starts: a full device mid-save gives hundreds of lines of TensorStore errors.
        atomic.require_space(self.directory, _state_bytes(state), f"checkpoint step {step}")
        # Recorded before Orbax writes: a step on disk without a record would count as confirmed.
        self._write_record(set(self.confirmed_steps()) - {step})
        with self._no_space_said(step):
            self.manager.save(
                step,
                args=ocp.args.Composite(
                    state=ocp.args.StandardSave(state),
                    meta=ocp.args.JsonSave({**meta, "identity": self.identity}),
                ),
                force=True,
            )
        self._writing, self._saving_step = True, step
        if not self.asynchronous:
            self._settle()

    def wait(self) -> None:
        """Returns once the save being written is on disk and the surplus steps are deleted
        (every process calls this)."""
        self._settle()

    def _settle(self, *, prune: bool = True) -> None:
        """Waits for the save being written; then (`prune`) deletes the surplus steps."""
        if self._writing:
            self._writing = False  # once: a failed save is reported here, not again by close
            with self._no_space_said(self._saving_step):
                self.manager.wait_until_finished()
            self._unpruned = True
            _write_checksums(os.path.join(self.directory, str(self._saving_step)))
        if prune and self._unpruned:
            self._unpruned = False
            self._prune()

    def confirm(self, step: int) -> None:
        """Records that a loss computed from the weights of checkpoint `step` was finite. Steps
        without a checkpoint, or confirmed already, are ignored (nothing is written), so the
        trainer may confirm every step. Older steps it makes surplus go at the next `save`."""
        confirmed = set(self.confirmed_steps())
        if step not in confirmed and step in self.all_steps():
            self._write_record(confirmed | {step})

    def set_aside(self, steps: Iterable[int], why: str) -> list[str]:
        """Moves each of `steps` that exists to `<set_aside_directory>/<step>-<why>` (`-2`, `-3`,
        ... when taken); returns the destinations (on process 0; elsewhere nothing moves: [])."""
        existing = self.all_steps()
        steps = [step for step in sorted(set(steps)) if step in existing]
        if jax.process_index() != 0:
            return []
        os.makedirs(self.set_aside_directory, exist_ok=True)
        destinations = []
        for step in steps:
            destination = os.path.join(self.set_aside_directory, f"{step}-{why}")
            suffix = 2
            while os.path.lexists(destination):
                destination = os.path.join(self.set_aside_directory, f"{step}-{why}-{suffix}")
                suffix += 1
            os.rename(os.path.join(self.directory, str(step)), destination)
            destinations.append(destination)
        confirmed = self._read_record()
        if confirmed is not None:
            self._write_record(confirmed - set(steps))
        self.manager.reload()
        return destinations

    def set_aside_unconfirmed(self) -> list[int]:
        """Moves every unconfirmed step to `<set_aside_directory>/<step>-unconfirmed`; returns
        those steps, oldest first."""
        confirmed = set(self.confirmed_steps())
        steps = [step for step in self.all_steps() if step not in confirmed]
        self.set_aside(steps, "unconfirmed")
        return steps

    # Restoring.

    def restore(self, abstract_state: TrainState, step: int | None = None) -> tuple[TrainState, dict[str, Any]]:
        """The state saved at `step` (default: latest), laid out like `abstract_state`
        (ShapeDtypeStructs with shardings), and its metadata.

        Raises CheckpointMismatch for checkpoints of another run, ValueError for a step that is
        not there, CheckpointError for one that cannot be read (nothing is moved)."""
        step = self.latest_step() if step is None else step
        if step is None:
            raise ValueError(f"{self.directory} holds no checkpoints")
        if step not in self.all_steps():
            steps = ", ".join(map(str, self.all_steps())) or "none"
            raise ValueError(f"{self.directory} has no checkpoint at step {step}; available steps: {steps}")
        with _abandoned_reads_silenced():
            try:
                meta = self._read_meta(step)
                self._check_identity(meta)
                state = self._read_state(abstract_state, step)
                _warn_if_unchecked(os.path.join(self.directory, str(step)), step)
                return state, meta
            except _UnreadableStep as err:
                reason = str(err)  # raised below, outside: its frames would keep Orbax's reads alive
        others = ", ".join(str(s) for s in self.all_steps() if s != step) or "none"
        raise CheckpointError(
            f"checkpoint step {step} in {self.directory} cannot be read ({reason}); other steps: {others}"
        )

    def restore_newest_intact(
        self, abstract_state: TrainState, *, steps: Iterable[int] | None = None
    ) -> tuple[TrainState, dict[str, Any], int]:
        """`(state, meta, step)` of the newest of `steps` (default: all) that reads back whole.

        Every candidate's metadata is checked against `identity` first, so CheckpointMismatch
        is raised with nothing moved. A step that then fails to read (files missing, damaged
        data) is moved to `<set_aside_directory>/<step>-damaged` with a one-line warning on
        stderr, and the next older step is tried. Raises CheckpointError when none is intact.
        """
        existing = self.all_steps()  # collective: the same on every process
        candidates = sorted(existing if steps is None else set(existing) & set(steps), reverse=True)
        metas: dict[int, dict[str, Any] | str] = {}  # the metadata, or why it cannot be read
        with _abandoned_reads_silenced():
            for step in candidates:
                try:
                    metas[step] = self._read_meta(step)
                except _UnreadableStep as err:
                    metas[step] = str(err)
                    continue
                self._check_identity(metas[step])
            moved = []
            for i, step in enumerate(candidates):
                failure = metas[step] if isinstance(metas[step], str) else None
                state = None
                if failure is None:
                    try:
                        state = self._read_state(abstract_state, step)
                    except _UnreadableStep as err:
                        failure = str(err)
                if _on_every_process(failure is None):
                    _warn_if_unchecked(os.path.join(self.directory, str(step)), step)
                    return state, metas[step], step
                destination = self.set_aside([step], "damaged")
                ocp.multihost.sync_global_processes("flaxheads_checkpoint_set_aside")
                self.manager.reload()
                moved += destination
                if destination:
                    older = candidates[i + 1:]
                    fallback = f"falling back to step {older[0]}" if older else "no older step left"
                    print(f"warning: checkpoint step {step} in {self.directory} is damaged "
                          f"({failure or 'unreadable on another process'}); moved it to {destination[0]}; {fallback}",
                          file=sys.stderr)
        among = "" if steps is None else f" among steps {sorted(set(steps))}"
        listed = f"; set aside as damaged: {', '.join(moved)}" if moved else ""
        raise CheckpointError(
            f"{self.directory} holds no intact checkpoint{among}{listed}. Start over with "
            "overwrite_output_dir=True, or use another output_dir"
        )

    def close(self, *, collective: bool = True) -> None:
        """Finishes the save being written (every process calls this), then closes Orbax's manager.
        `collective=False` (a process unwinding an error, which the others may not share): the
        surplus steps stay, since deciding which go is a collective the others would not join."""
        self._settle(prune=collective or jax.process_count() == 1)
        self.manager.close()

    # Internals.

    @contextlib.contextmanager
    def _no_space_said(self, step: int):
        """A full device while Orbax writes `step` raised as `atomic.NoSpace`, naming the folder
        (TensorStore's error, wrapped by Orbax, names a temporary file)."""
        try:
            yield
            return
        except Exception as error:
            if not atomic.is_no_space(error):
                raise
            message = f"no space left on the device of {self.directory} while saving checkpoint step {step}"
        raise atomic.NoSpace(message) from None

    def _read_meta(self, step: int) -> dict[str, Any]:
        """Raises _UnreadableStep when the files are not all there or do not read back."""
        step_dir = os.path.join(self.directory, str(step))
        missing = [name for name in _REQUIRED_FILES if not os.path.isfile(os.path.join(step_dir, name))]
        if missing:
            raise _UnreadableStep(f"{', '.join(missing)} missing")
        changed = _changed_files(step_dir)
        if changed:
            raise _UnreadableStep(f"{', '.join(changed[:3])} changed since it was saved (SHA-256 differs)")
        return self._read(step, meta=ocp.args.JsonRestore()).meta

    def _read_state(self, abstract_state: TrainState, step: int) -> TrainState:
        return self._read(step, state=ocp.args.StandardRestore(abstract_state)).state

    def _read(self, step: int, **items):
        try:
            return self.manager.restore(step, args=ocp.args.Composite(**items))
        except Exception as err:
            message = str(err)
            if isinstance(err, MemoryError) or "RESOURCE_EXHAUSTED" in message or any(
                words in message for words in _TARGET_ERRORS
            ):
                raise  # says nothing against the checkpoint, which must not be set aside for it
            reason = _one_line(err)
        # Raised outside the except clause: Orbax's error chain would keep its abandoned reads alive.
        raise _UnreadableStep(reason)

    def _check_identity(self, meta: dict[str, Any]) -> None:
        saved, best = meta.get("identity"), meta.get("best")
        if (isinstance(saved, dict) and "selection" not in saved and "selection" in self.identity
                and isinstance(best, dict) and "metric" in best):
            # Saved before identities recorded the selection: the best evaluation it carries names its metric.
            saved = {**saved, "selection": {**self.identity["selection"], "metric_for_best_model": best["metric"]}}
        differing = self.differences(saved, self.identity)
        if differing:
            raise CheckpointMismatch(
                f"{self.directory} holds checkpoints of a different run ({'; '.join(differing[:4])}). Use another "
                "output_dir, or pass overwrite_output_dir=True to start over there"
            )

    def _prune(self) -> None:
        if self.max_to_keep is None:
            return
        # Every process decides from the same folder and record: read once process 0 has written
        # its confirmations (it confirms before it saves or closes), and before it deletes anything.
        # Decided otherwise, the processes would call Orbax's delete, a collective, unequally often.
        ocp.multihost.sync_global_processes("flaxheads_checkpoint_prune_read")
        steps = self.all_steps()
        keep = set(steps[-self.max_to_keep:]) | {self.latest_good_step()}
        doomed = [step for step in steps if step not in keep]
        ocp.multihost.sync_global_processes("flaxheads_checkpoint_prune")
        for step in doomed:
            self.manager.delete(step)
        confirmed = self._read_record()
        if doomed and confirmed is not None:
            self._write_record(confirmed - set(doomed))

    def _read_record(self) -> set[int] | None:
        try:
            with open(self._record_path) as f:
                record = json.load(f)
            return {int(step) for step in record["confirmed_steps"]}
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError) as err:
            raise CheckpointError(
                f"{self._record_path} cannot be read ({_one_line(err)}); delete it to count every "
                "checkpoint step as confirmed"
            ) from err

    def _write_record(self, confirmed: set[int]) -> None:
        """On process 0, atomically (temporary file + rename): a crash leaves the old or the new."""
        if jax.process_index() != 0 or confirmed == self._read_record():
            return
        os.makedirs(self.directory, exist_ok=True)
        atomic.write_json(self._record_path, {"confirmed_steps": sorted(confirmed)})


def _state_bytes(state) -> int:
    """About what this process writes of `state`: its share of the arrays' bytes."""
    return sum(int(getattr(leaf, "nbytes", 0)) for leaf in jax.tree.leaves(state)) // jax.process_count()


def _step_files(step_dir: str) -> list[str]:
    """Every file of a step folder (paths relative to it), the checksum files aside: each
    process's, and the temporary file another process is writing its own into right now
    (`.flaxheads_checksums.process_1.json.XXXX.tmp`, gone a moment later)."""
    found = []
    for root, _, files in os.walk(step_dir):
        for name in files:
            relative = os.path.relpath(os.path.join(root, name), step_dir)
            if not name.lstrip(".").startswith(CHECKSUMS_PREFIX):
                found.append(relative)
    return sorted(found)


def _written_by(relative: str, process: int) -> bool:
    """Whether process `process` wrote this file: Orbax puts each process's arrays under
    `.../ocdbt.process_<i>/` and `.../process_<i>`; the rest is process 0's."""
    owners = [int(part.rsplit("process_", 1)[1]) for part in relative.split(os.sep)
              if "process_" in part and part.rsplit("process_", 1)[1].isdigit()]
    return owners[0] == process if owners else process == 0


def _file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _write_checksums(step_dir: str) -> None:
    """This process's checksum file for the finished step in `step_dir` (a step already moved away
    or pruned is skipped)."""
    if not os.path.isdir(step_dir):
        return
    process = jax.process_index()
    sums = {relative: _file_sha256(os.path.join(step_dir, relative))
            for relative in _step_files(step_dir) if _written_by(relative, process)}
    atomic.write_json(os.path.join(step_dir, f"{CHECKSUMS_PREFIX}{process}.json"), {"sha256": sums})


def _warn_if_unchecked(step_dir: str, step: int) -> None:
    """A warning on stderr when this process's checksum file of the step is missing: its files were
    read without a check."""
    name = f"{CHECKSUMS_PREFIX}{jax.process_index()}.json"
    if not os.path.isfile(os.path.join(step_dir, name)):
        print(f"warning: checkpoint step {step} in {os.path.dirname(step_dir)} has no {name} (saved before flaxheads "
              "kept checksums, or the run stopped right after Orbax finished it), so damage to its files cannot be "
              "detected; it was read as it is", file=sys.stderr)


def _changed_files(step_dir: str) -> list[str]:
    """The files of the step whose content differs from their recorded checksum (or that are gone)."""
    changed = []
    for name in sorted(os.listdir(step_dir)):
        if not name.startswith(CHECKSUMS_PREFIX):
            continue
        try:
            with open(os.path.join(step_dir, name)) as f:
                sums = json.load(f)["sha256"]
        except (OSError, ValueError, KeyError, TypeError):
            changed.append(name)
            continue
        for relative, expected in sums.items():
            path = os.path.join(step_dir, relative)
            if not os.path.isfile(path) or _file_sha256(path) != expected:
                changed.append(relative)
    return changed


class _UnreadableStep(Exception):
    """A checkpoint step that does not read back; the message is the reason, in one line."""


def _on_every_process(ok: bool) -> bool:
    """Whether `ok` holds on all processes: they must agree on which step to fall back to."""
    if jax.process_count() == 1:
        return ok
    from jax.experimental import multihost_utils

    return bool(np.all(multihost_utils.process_allgather(np.array(ok))))


@contextlib.contextmanager
def _abandoned_reads_silenced():
    """When one array fails to read, Orbax abandons the reads of the others; garbage collected
    later, each prints its full TensorStore error ("Exception ignored in: <coroutine ...>").
    Collect them here and drop those messages, so the one-line warning is what the user sees.
    Every Orbax read of a restore happens inside, the failed attempts and the fallbacks."""
    previous = sys.unraisablehook

    def hook(unraisable):
        source = unraisable.object
        abandoned_read = isinstance(source, types.CoroutineType) and "orbax" in source.cr_code.co_filename
        # A read finishing after Orbax closed its event loop reports to that loop, from no object.
        late_read = source is None and "Event loop is closed" in str(unraisable.exc_value)
        if not (abandoned_read or late_read):
            previous(unraisable)

    sys.unraisablehook = hook
    try:
        yield
    finally:
        gc.collect()
        sys.unraisablehook = previous


def _one_line(err: BaseException) -> str:
    """The root cause in one line: Orbax wraps TensorStore's precise error in a vague one."""
    while (err.__cause__ or err.__context__) is not None:
        err = err.__cause__ or err.__context__
    lines = str(err).strip().splitlines()
    line = lines[0].split(" [tensorstore_spec=")[0] if lines else ""
    line = line if len(line) <= 240 else line[:237] + "..."
    return f"{type(err).__name__}: {line}" if line else type(err).__name__


def _differing_keys(saved: dict | None, current: dict) -> list[str]:
    saved = saved or {}
    differing = sorted(k for k in set(saved) | set(current) if saved.get(k) != current.get(k))
    return [f"{k}: saved {saved.get(k)!r}, now {current.get(k)!r}" for k in differing]
