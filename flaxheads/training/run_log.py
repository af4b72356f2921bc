"""What a training run leaves behind for people to read: metric logs, a progress bar, summaries.

Only the main process (`jax.process_index() == 0`) writes anything, so a multi-host run
produces one log rather than one per host. Every class takes `is_main_process` so that this
can be tested on a single machine.
"""

from __future__ import annotations

import collections
import json
import math
import numbers
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import jax
import tqdm

from flaxheads import atomic, quiet_imports
from flaxheads.training.run_files import METRICS_FILENAME, TENSORBOARD_DIRNAME  # noqa: F401 (re-exported)

if TYPE_CHECKING:
    import tensorboardX

SPLITS = ("train", "eval", "test")
# tensorboardX writes events from a background thread and flushes on this period; close()
# writes everything. 10 s keeps a live TensorBoard current without a disk flush per scalar.
_TENSORBOARD_FLUSH_SECS = 10


def _tensorboardx():
    """tensorboardX, imported without torch when torch is not loaded yet: its writer imports torch
    where it is installed (2.2 s of every `flaxheads train` here) only to name torch tensors among
    the types it accepts; flaxheads logs Python floats."""
    with quiet_imports.hidden("torch"):  # tensorboardX takes the ImportError for "no torch"
        import tensorboardX
    return tensorboardX


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
        self._summary_writer: "tensorboardX.SummaryWriter | None" = None
        self._closed = False
        if not self.is_main_process:
            return
        self.output_dir.mkdir(parents=True, exist_ok=True)
        if start_step is not None:
            _drop_records_after(self.metrics_path, start_step)
        self._jsonl_file = open(self.metrics_path, "a", encoding="utf-8")
        if tensorboard:
            self._summary_writer = _tensorboardx().SummaryWriter(
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
    atomic.write_text(path, "".join(kept))


def _is_interactive(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


class MovingThroughput:
    """Examples per second and mean loss over the last `window` finished steps.

    Each `observe` says a step has finished now; its interval is the time since the previous one
    finished. An interval that holds more than training (a compilation, an evaluation, a save) is
    observed with `timed=False`: it restarts the clock without counting, so the rate is steady
    from the first steps on instead of jumping from ~1 to thousands.
    """

    def __init__(self, window: int = 20, *, start: float | None = None):
        self._seconds: collections.deque[float] = collections.deque(maxlen=window)
        self._examples: collections.deque[float] = collections.deque(maxlen=window)
        self._losses: collections.deque[float] = collections.deque(maxlen=window)
        self._last = start

    def observe(self, examples: float, loss: float | None = None, *, timed: bool = True,
                now: float | None = None) -> None:
        """A step that trained `examples` real examples (and gave `loss`) finished at `now`
        (default: the clock's time)."""
        now = time.perf_counter() if now is None else now
        if timed and self._last is not None and now > self._last:
            self._seconds.append(now - self._last)
            self._examples.append(float(examples))
        if loss is not None and math.isfinite(loss):
            self._losses.append(float(loss))
        self._last = now

    def restart_clock(self, now: float | None = None) -> None:
        """Time since the last step held no training (an evaluation, a save): the next interval
        starts now."""
        self._last = time.perf_counter() if now is None else now

    @property
    def examples_per_second(self) -> float | None:
        """Real examples over seconds of the timed steps in the window; None before any."""
        return sum(self._examples) / sum(self._seconds) if self._seconds else None

    @property
    def loss(self) -> float | None:
        """Mean loss of the steps in the window; None before any."""
        return sum(self._losses) / len(self._losses) if self._losses else None


def progress_line(step: int, total: int | None, *, loss: float | None, learning_rate: float | None,
                  examples_per_second: float | None, elapsed: float, loss_label: str = "loss") -> str:
    """The plain line printed when the output is not a terminal.

    >>> progress_line(50, 265, loss=0.61234, learning_rate=9.8e-05, examples_per_second=51.23, elapsed=75.4)
    'train  step 50/265  loss 0.6123  lr 9.80e-05  ex/s 51.2  elapsed 1:15  eta 5:24'
    """
    parts = ["train", f"step {step}" + (f"/{total}" if total else "")]
    if loss is not None:
        parts.append(f"{loss_label} {loss:.4f}")
    if learning_rate is not None:
        parts.append(f"lr {learning_rate:.2e}")
    if examples_per_second is not None:
        parts.append(f"ex/s {examples_per_second:.1f}")
    parts.append(f"elapsed {_clock(elapsed)}")
    if total and 0 < step < total:
        parts.append(f"eta {_clock(elapsed / step * (total - step))}")
    return "  ".join(parts)


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class ProgressBar:
    """Training progress: on a terminal, a tqdm bar over steps whose postfix shows the running
    loss (the mean of the last `window` steps, labelled so), the learning rate and examples/s
    (`MovingThroughput`), refreshed every step; elsewhere (CI logs, files, pipes), a plain
    `progress_line` instead of a bar's carriage returns: at every `log` call (every logging step,
    its loss the logging window's mean, as metrics.jsonl records it), after the first step, and at
    least every `quiet_seconds` in between (the running mean, labelled so), so a slow start is
    never silent.

    Disabled (a no-op) on non-main processes and when `disable=True`.
    """

    QUIET_SECONDS = 60.0

    def __init__(
        self,
        total: int | None,
        *,
        desc: str = "train",
        initial: int = 0,
        disable: bool = False,
        is_main_process: bool | None = None,
        file: TextIO | None = None,
        window: int = 20,
    ):
        """Starts the bar.

        Args:
          total: the number of steps in the run, or None when unknown.
          desc: the label in front of the bar.
          initial: the step the bar starts at (non-zero when resuming).
          disable: show nothing.
          is_main_process: defaults to `jax.process_index() == 0`; other processes show nothing.
          file: the stream to draw on; defaults to stderr, leaving stdout for results.
          window: steps the running loss and examples/s average over.
        """
        if is_main_process is None:
            is_main_process = _default_is_main_process()
        self._stream = sys.stderr if file is None else file
        self._shown = is_main_process and not disable
        self._interactive = _is_interactive(self._stream)
        self._bar = tqdm.tqdm(
            total=total, initial=initial, desc=desc, unit="step", file=self._stream,
            disable=not (self._shown and self._interactive), dynamic_ncols=True, mininterval=0.1,
        )
        self._total, self._step, self._start = total, initial, time.perf_counter()
        self._initial = initial
        self._last_line = self._start
        self.window = window
        self.throughput = MovingThroughput(window, start=self._start)
        self.learning_rate: float | None = None

    @property
    def disabled(self) -> bool:
        return not self._shown

    @property
    def examples_per_second(self) -> float | None:
        return self.throughput.examples_per_second

    @property
    def postfix(self) -> str:
        """The postfix text as last set ('' when not drawn as a bar or not yet set)."""
        return "" if self._bar.disable else (self._bar.postfix or "")

    def update(
        self,
        steps: int = 1,
        *,
        loss: float | None = None,
        learning_rate: float | None = None,
        examples: float | None = None,
        timed: bool = True,
    ) -> None:
        """`steps` more steps have finished (just now), training `examples` real examples; `loss`
        and `learning_rate` are the latest step's. `timed=False` when the time since the previous
        update held more than training (a compilation, an evaluation): not counted in examples/s."""
        self.throughput.observe(examples or 0, loss, timed=timed and examples is not None)
        self._step += steps
        if learning_rate is not None:
            self.learning_rate = float(learning_rate)
        if self._shown and not self._interactive:
            first = self._step == self._initial + steps
            if first or time.perf_counter() - self._last_line >= self.QUIET_SECONDS:
                self._line(self.throughput.loss, f"loss (mean of last {self.window} steps)")
        if self._bar.disable:
            return
        postfix = {}
        if self.throughput.loss is not None:
            postfix[f"loss (last {self.window})"] = f"{self.throughput.loss:.4f}"
        if self.learning_rate is not None:
            postfix["lr"] = f"{self.learning_rate:.2e}"
        if self.examples_per_second is not None:
            postfix["ex/s"] = f"{self.examples_per_second:.1f}"
        if postfix:
            # No refresh here: the update below redraws when tqdm's interval allows.
            self._bar.set_postfix(postfix, refresh=False)
        self._bar.update(steps)

    def log(self, loss: float | None = None) -> None:
        """Prints a `progress_line` of where the run stands, when the output is not a terminal
        (on a terminal the bar shows the same). `loss`: the logging window's mean, as recorded in
        metrics.jsonl (None: the running mean, labelled so)."""
        if self._shown and not self._interactive:
            if loss is None:
                self._line(self.throughput.loss, f"loss (mean of last {self.window} steps)")
            else:
                self._line(loss, "loss")

    def restart_clock(self) -> None:
        """The time since the last step held no training (an evaluation, a save)."""
        self.throughput.restart_clock()

    def _line(self, loss: float | None, loss_label: str) -> None:
        self._last_line = time.perf_counter()
        self._print(progress_line(self._step, self._total, loss=loss, learning_rate=self.learning_rate,
                                  examples_per_second=self.examples_per_second,
                                  elapsed=self._last_line - self._start, loss_label=loss_label))

    def write(self, message: str) -> None:
        """Prints a line (e.g. an evaluation summary) above the bar without garbling it."""
        if self._shown:
            self._print(message)

    def _print(self, message: str) -> None:
        if self._bar.disable:
            print(message, file=self._stream, flush=True)
        else:
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
