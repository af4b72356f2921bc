"""Orbax checkpoints of a training run: {train state, data position, run identity, best metric}.

Orbax writes each step into a temporary folder and renames it when complete, so a process
killed at any moment, even mid-save, leaves the last finished checkpoint intact; leftover
temporary folders are removed on the next start.
"""

from __future__ import annotations

import os
from typing import Any

import orbax.checkpoint as ocp

from flaxheads.training.step import TrainState


class CheckpointMismatch(ValueError):
    """The output directory holds checkpoints of a different model, head or task."""


class RunCheckpoints:
    def __init__(self, directory: str | os.PathLike, *, max_to_keep: int, identity: dict[str, Any]):
        """`identity` describes what is being trained (backbone config, head, labels); a restore
        refuses checkpoints whose identity differs."""
        self.identity = identity
        self.directory = os.path.abspath(directory)
        self.manager = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(
                max_to_keep=max_to_keep,
                create=True,
                enable_async_checkpointing=False,  # the train state is donated right after saving
                cleanup_tmp_directories=True,
            ),
            item_names=("state", "meta"),
        )

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def save(self, state: TrainState, step: int, meta: dict[str, Any]) -> None:
        """Saves `state` (global arrays; every process calls this) as checkpoint `step`."""
        self.manager.save(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(state),
                meta=ocp.args.JsonSave({**meta, "identity": self.identity}),
            ),
            force=True,
        )
        self.manager.wait_until_finished()

    def restore(self, abstract_state: TrainState, step: int | None = None) -> tuple[TrainState, dict[str, Any]]:
        """The state saved at `step` (default: latest), laid out like `abstract_state`
        (ShapeDtypeStructs with shardings), and its metadata."""
        step = self.latest_step() if step is None else step
        meta = self.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore())).meta
        if meta.get("identity") != self.identity:
            raise CheckpointMismatch(_describe_mismatch(self.directory, meta.get("identity"), self.identity))
        restored = self.manager.restore(
            step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state))
        )
        return restored.state, meta

    def close(self) -> None:
        self.manager.close()


def _describe_mismatch(directory: str, saved: dict | None, current: dict) -> str:
    saved = saved or {}
    differing = sorted(k for k in set(saved) | set(current) if saved.get(k) != current.get(k))
    details = "; ".join(f"{k}: saved {saved.get(k)!r}, now {current.get(k)!r}" for k in differing[:4])
    return (
        f"{directory} holds checkpoints of a different run ({details}). Use a new --output_dir, or "
        "delete that folder to start over"
    )
