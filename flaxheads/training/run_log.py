"""What a training run leaves behind for people to read: metric logs, a progress bar, summaries.

Only the main process (`jax.process_index() == 0`) writes anything, so a multi-host run
produces one log rather than one per host. Every class takes `is_main_process` so that this
can be tested on a single machine.
"""

from __future__ import annotations

import json
import math
import numbers
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

import jax
import tensorboardX
import tqdm

SPLITS = ("train", "eval", "test")
METRICS_FILENAME = "metrics.jsonl"
TENSORBOARD_DIRNAME = "tensorboard"
# tensorboardX writes events from a background thread and flushes on this period; close()
# writes everything. 10 s keeps a live TensorBoard current without a disk flush per scalar.
_TENSORBOARD_FLUSH_SECS = 10


def _default_is_main_process() -> bool:
    return jax.process_index() == 0


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"Unknown split {split!r}; expected one of {SPLITS}.")


def _as_number(value: Any) -> int | float:
    """A Python int or float from a Python, numpy or 0-d JAX number."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)
    return float(value)


def _json_number(value: int | float) -> int | float | None:
    # Strict JSON has no NaN/Infinity; null keeps every line parseable by any reader (jq, pandas).
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class RunLogger:
    """Appends metrics to `<output_dir>/metrics.jsonl` and TensorBoard `<output_dir>/tensorboard/`.

    Each `log` call writes one JSON line, `{"step": 500, "split": "eval", "accuracy": 0.84, ...}`,
    and flushes it, so a killed run leaves only complete lines. Non-finite values are written as
    `null` in JSON (and as themselves in TensorBoard). A run that starts at step `start_step`
    (resumed from that checkpoint) first drops the records of later steps, which it is about to
    log again, and so does TensorBoard (`purge_step`): every (step, split) appears once.

    TensorBoard tags are `<split>/<name>`, e.g. `train/loss`, `eval/accuracy`; the event files
    are written by tensorboardX, which needs no TensorFlow, from a background thread that
    reaches the disk within about 10 s, and completely by `close()`.

    On a non-main process the logger creates no directory or file and `log` does nothing
    beyond checking its arguments.
    """

    def __init__(
        self,
        output_dir: str | os.PathLike[str],
        *,
        is_main_process: bool | None = None,
        tensorboard: bool = True,
        start_step: int | None = None,
    ):
        """Opens the log files.

        Args:
          output_dir: a local directory; created if missing.
          is_main_process: whether this process writes; defaults to `jax.process_index() == 0`.
          tensorboard: whether to write TensorBoard event files besides the JSONL file.
          start_step: the step the run continues from (0 for a fresh start); records of later
            steps are dropped. None appends to whatever the file holds.
        """
        self.output_dir = Path(output_dir)
        self.is_main_process = (
            _default_is_main_process() if is_main_process is None else is_main_process
        )
        self._jsonl_file: TextIO | None = None
        self._summary_writer: tensorboardX.SummaryWriter | None = None
        self._closed = False
        if not self.is_main_process:
            return
        self.output_dir.mkdir(parents=True, exist_ok=True)
        if start_step is not None:
            _drop_records_after(self.metrics_path, start_step)
        self._jsonl_file = open(self.metrics_path, "a", encoding="utf-8")
        if tensorboard:
            self._summary_writer = tensorboardX.SummaryWriter(
                logdir=str(self.tensorboard_dir), flush_secs=_TENSORBOARD_FLUSH_SECS,
                purge_step=start_step + 1 if start_step is not None and self.tensorboard_dir.exists() else None,
            )

    @property
    def metrics_path(self) -> Path:
        return self.output_dir / METRICS_FILENAME

    @property
    def tensorboard_dir(self) -> Path:
        return self.output_dir / TENSORBOARD_DIRNAME

    def log(self, step: int, split: str, metrics: Mapping[str, Any]) -> None:
        """Records `metrics` (name -> number) for `split` ("train", "eval" or "test") at `step`.

        Raises:
          ValueError: unknown split, a metric named "step" or "split", or a closed logger.
        """
        _check_split(split)
        if self._closed:
            raise ValueError("RunLogger.log() called after close().")
        reserved = {"step", "split"} & set(metrics)
        if reserved:
            raise ValueError(f"Metric names {sorted(reserved)} clash with the record's own keys.")
        if not self.is_main_process:
            return
        step = int(step)
        values = {name: _as_number(value) for name, value in metrics.items()}
        record = {"step": step, "split": split}
        record.update({name: _json_number(value) for name, value in values.items()})
        # One write of a whole line, then a flush: an interrupted run never leaves half a record.
        self._jsonl_file.write(json.dumps(record, allow_nan=False) + "\n")
        self._jsonl_file.flush()
        if self._summary_writer is not None:
            for name, value in values.items():
                self._summary_writer.add_scalar(f"{split}/{name}", value, global_step=step)

    def close(self) -> None:
        """Flushes and closes the files; further `log` calls raise. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        if self._jsonl_file is not None:
            self._jsonl_file.close()
        if self._summary_writer is not None:
            self._summary_writer.close()

    def __enter__(self) -> RunLogger:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _drop_records_after(path: Path, step: int) -> None:
    """Rewrites `path` (atomically) without the records of steps after `step`."""
    if not path.is_file():
        return
    with open(path, encoding="utf-8") as f:
        lines = f.readlines()
    kept = []
    for line in lines:
        try:
            keep = json.loads(line)["step"] <= step
        except (json.JSONDecodeError, KeyError, TypeError):
            keep = False  # a line cut short by a crash
        if keep:
            kept.append(line)
    if len(kept) == len(lines):
        return
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("".join(kept), encoding="utf-8")
    os.replace(tmp, path)


def _is_interactive(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


class ProgressBar:
    """A tqdm bar over training steps whose postfix shows loss, learning rate and examples/s.

    Disabled (a no-op) on non-main processes and when `disable=True`. When the stream is not a
    terminal (CI logs, files, pipes) it redraws at most every 30 s and uses ASCII characters,
    so logs get a readable line now and then instead of thousands of carriage returns.
    """

    def __init__(
        self,
        total: int | None,
        *,
        desc: str = "train",
        initial: int = 0,
        disable: bool = False,
        is_main_process: bool | None = None,
        file: TextIO | None = None,
    ):
        """Starts the bar.

        Args:
          total: the number of steps in the run, or None when unknown.
          desc: the label in front of the bar.
          initial: the step the bar starts at (non-zero when resuming).
          disable: show nothing.
          is_main_process: defaults to `jax.process_index() == 0`; other processes show nothing.
          file: the stream to draw on; defaults to stderr, leaving stdout for results.
        """
        if is_main_process is None:
            is_main_process = _default_is_main_process()
        stream = sys.stderr if file is None else file
        interactive = _is_interactive(stream)
        self._bar = tqdm.tqdm(
            total=total,
            initial=initial,
            desc=desc,
            unit="step",
            file=stream,
            disable=disable or not is_main_process,
            dynamic_ncols=interactive,
            mininterval=0.1 if interactive else 30.0,
            ascii=not interactive,
        )
        self._last_update_time = time.perf_counter()
        self.examples_per_second: float | None = None
        """The throughput measured by the latest `update` that was given `examples`."""

    @property
    def disabled(self) -> bool:
        return bool(self._bar.disable)

    @property
    def postfix(self) -> str:
        """The postfix text as last set ('' when disabled or not yet set)."""
        return "" if self.disabled else (self._bar.postfix or "")

    def update(
        self,
        steps: int = 1,
        *,
        loss: float | None = None,
        learning_rate: float | None = None,
        examples: int | None = None,
    ) -> None:
        """Advances the bar by `steps` and refreshes the postfix.

        Args:
          steps: how many steps were taken since the previous call.
          loss: the latest training loss.
          learning_rate: the learning rate of the latest step.
          examples: how many examples those `steps` consumed; examples/s is this count over
            the wall time since the previous call (or since the bar was created).
        """
        now = time.perf_counter()
        elapsed = now - self._last_update_time
        self._last_update_time = now
        if examples is not None and elapsed > 0:
            self.examples_per_second = examples / elapsed
        if self.disabled:
            return
        postfix = {}
        if loss is not None:
            postfix["loss"] = f"{float(loss):.4f}"
        if learning_rate is not None:
            postfix["lr"] = f"{float(learning_rate):.2e}"
        if examples is not None and self.examples_per_second is not None:
            postfix["ex/s"] = f"{self.examples_per_second:.1f}"
        if postfix:
            # No refresh here: the update below redraws when tqdm's interval allows.
            self._bar.set_postfix(postfix, refresh=False)
        self._bar.update(steps)

    def write(self, message: str) -> None:
        """Prints a line (e.g. an evaluation summary) above the bar without garbling it."""
        if not self.disabled:
            self._bar.write(message, file=self._bar.fp)

    def close(self) -> None:
        self._bar.close()

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _format_value(value: Any) -> str:
    value = _as_number(value)
    if isinstance(value, int):
        return str(value)
    if value != 0 and math.isfinite(value) and not 1e-3 <= abs(value) < 1e5:
        return f"{value:.3e}"
    return f"{value:.4f}"


def format_summary(split: str, step: int, metrics: Mapping[str, Any]) -> str:
    """One line for humans, metrics in the order given.

    >>> format_summary("eval", 500, {"accuracy": 0.84213, "mcc": 0.68431, "loss": 0.37118})
    'eval  step 500  accuracy 0.8421  mcc 0.6843  loss 0.3712'
    """
    parts = [split, f"step {int(step)}"]
    parts += [f"{name} {_format_value(value)}" for name, value in metrics.items()]
    return "  ".join(parts)
