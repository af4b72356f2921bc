"""Run logs: JSONL metrics, TensorBoard event files, the progress bar and summaries."""

import io
import json
import math
import struct
import subprocess
import sys
import types

import numpy as np
import pytest
from tensorboardX.proto import event_pb2
from tensorboardX.record_writer import masked_crc32c

from flaxheads.training import run_log


def _strict_json(line):
    """json.loads that refuses NaN/Infinity, which strict JSON readers reject."""

    def reject(constant):
        raise ValueError(f"non-standard JSON constant {constant}")

    return json.loads(line, parse_constant=reject)


def _read_tfrecords(path):
    """The payloads of a TFRecord file, checking the framing and both CRCs of every record."""
    data = path.read_bytes()
    offset = 0
    while offset < len(data):
        header = data[offset : offset + 8]
        (length,) = struct.unpack("<Q", header)
        (length_crc,) = struct.unpack("<I", data[offset + 8 : offset + 12])
        assert length_crc == masked_crc32c(header)
        payload = data[offset + 12 : offset + 12 + length]
        (payload_crc,) = struct.unpack("<I", data[offset + 12 + length : offset + 16 + length])
        assert payload_crc == masked_crc32c(payload)
        yield payload
        offset += 16 + length


def _read_scalars(tensorboard_dir):
    """{tag: [(step, value), ...]} from every event file under `tensorboard_dir`."""
    scalars = {}
    event_files = sorted(tensorboard_dir.glob("events.out.tfevents.*"))
    assert event_files, f"no event file in {tensorboard_dir}"
    for event_file in event_files:
        for payload in _read_tfrecords(event_file):
            event = event_pb2.Event.FromString(payload)
            for value in event.summary.value:
                scalars.setdefault(value.tag, []).append((event.step, value.simple_value))
    return scalars


# --- RunLogger ------------------------------------------------------------------------------


def test_jsonl_has_one_complete_record_per_log_call(tmp_path):
    with run_log.RunLogger(tmp_path, is_main_process=True) as logger:
        logger.log(10, "train", {"loss": 0.5, "learning_rate": 2e-5})
        logger.log(20, "eval", {"accuracy": np.float32(0.75), "loss": 0.25})
        logger.log(20, "test", {"accuracy": 0.5, "num_examples": np.int64(8)})
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [_strict_json(line) for line in lines] == [
        {"step": 10, "split": "train", "loss": 0.5, "learning_rate": 2e-5},
        {"step": 20, "split": "eval", "accuracy": 0.75, "loss": 0.25},
        {"step": 20, "split": "test", "accuracy": 0.5, "num_examples": 8},
    ]


def test_jsonl_line_is_on_disk_before_close(tmp_path):
    logger = run_log.RunLogger(tmp_path, is_main_process=True, tensorboard=False)
    logger.log(1, "train", {"loss": 1.0})
    # Read while the logger is still open, as after a killed process.
    text = (tmp_path / "metrics.jsonl").read_text()
    assert text.endswith("\n")
    assert _strict_json(text) == {"step": 1, "split": "train", "loss": 1.0}
    logger.close()


def test_jsonl_writes_non_finite_values_as_null(tmp_path):
    with run_log.RunLogger(tmp_path, is_main_process=True, tensorboard=False) as logger:
        logger.log(5, "eval", {"pearson": float("nan"), "mse": float("inf")})
    line = (tmp_path / "metrics.jsonl").read_text()
    assert _strict_json(line) == {"step": 5, "split": "eval", "pearson": None, "mse": None}


def test_a_resumed_logger_drops_the_records_after_its_start_step_and_cut_lines(tmp_path):
    with run_log.RunLogger(tmp_path, is_main_process=True, tensorboard=False) as logger:
        for step in (1, 2, 3):
            logger.log(step, "train", {"loss": 1.0})
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 1, "spl')  # a line cut short by a crash
    with run_log.RunLogger(tmp_path, is_main_process=True, tensorboard=False, start_step=2) as logger:
        logger.log(3, "train", {"loss": 0.5})
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [(_strict_json(line)["step"], _strict_json(line)["loss"]) for line in lines] == [(1, 1.0), (2, 1.0), (3, 0.5)]


def test_jsonl_appends_to_an_existing_log(tmp_path):
    with run_log.RunLogger(tmp_path, is_main_process=True, tensorboard=False) as logger:
        logger.log(1, "train", {"loss": 1.0})
    with run_log.RunLogger(tmp_path, is_main_process=True, tensorboard=False) as logger:
        logger.log(2, "train", {"loss": 0.5})
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [_strict_json(line)["step"] for line in lines] == [1, 2]


def test_tensorboard_scalars_read_back_with_split_prefixed_tags(tmp_path):
    with run_log.RunLogger(tmp_path, is_main_process=True) as logger:
        logger.log(10, "train", {"loss": 0.5})
        logger.log(20, "train", {"loss": 0.25})
        logger.log(20, "eval", {"accuracy": 0.75, "pearson": float("nan")})
    scalars = _read_scalars(tmp_path / "tensorboard")
    assert scalars["train/loss"] == [(10, 0.5), (20, 0.25)]
    assert scalars["eval/accuracy"] == [(20, 0.75)]
    [(step, pearson)] = scalars["eval/pearson"]
    assert step == 20 and math.isnan(pearson)


def test_tensorboard_events_are_written_without_importing_torch(tmp_path):
    # tensorboardX imports torch where it can (seconds of every run's start); in a fresh process
    # without torch loaded, the logger writes its events and torch stays unloaded.
    code = (
        "import sys\n"
        "from flaxheads.training import run_log\n"
        f"with run_log.RunLogger({str(tmp_path)!r}, is_main_process=True) as logger:\n"
        "    logger.log(10, 'train', {'loss': 0.5})\n"
        "print('torch' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"
    assert _read_scalars(tmp_path / "tensorboard")["train/loss"] == [(10, 0.5)]


def test_tensorboardx_loaded_after_torch_is_the_same_module():
    import tensorboardX
    import torch  # noqa: F401 (loaded: tensorboardX is imported as it is)

    assert run_log._tensorboardx() is tensorboardX


def test_non_main_process_writes_nothing(tmp_path):
    output_dir = tmp_path / "run"
    with run_log.RunLogger(output_dir, is_main_process=False) as logger:
        logger.log(10, "train", {"loss": 0.5})
    assert not output_dir.exists()


def test_is_main_process_defaults_to_process_index_zero(tmp_path):
    # A single-process test run is process 0.
    with run_log.RunLogger(tmp_path, tensorboard=False) as logger:
        assert logger.is_main_process


def test_log_rejects_unknown_split(tmp_path):
    with run_log.RunLogger(tmp_path, is_main_process=True, tensorboard=False) as logger:
        with pytest.raises(ValueError, match="split"):
            logger.log(1, "validation", {"loss": 1.0})


def test_log_rejects_metric_named_like_a_record_key(tmp_path):
    with run_log.RunLogger(tmp_path, is_main_process=True, tensorboard=False) as logger:
        with pytest.raises(ValueError, match="step"):
            logger.log(1, "train", {"step": 3.0})


def test_log_after_close_raises(tmp_path):
    logger = run_log.RunLogger(tmp_path, is_main_process=True, tensorboard=False)
    logger.close()
    logger.close()  # a second close is harmless
    with pytest.raises(ValueError, match="close"):
        logger.log(1, "train", {"loss": 1.0})


# --- ProgressBar ----------------------------------------------------------------------------


class _TTY(io.StringIO):
    def isatty(self):
        return True


def test_progress_bar_shows_running_loss_learning_rate_and_throughput_on_a_terminal(monkeypatch):
    clock = iter([100.0, 102.0, 103.0])
    monkeypatch.setattr(run_log, "time", types.SimpleNamespace(perf_counter=lambda: next(clock)))
    stream = _TTY()
    bar = run_log.ProgressBar(10, is_main_process=True, file=stream)
    bar.update(1, loss=0.2, learning_rate=2e-5, examples=64)
    bar.update(1, loss=0.1, learning_rate=1e-5, examples=32)
    assert bar.examples_per_second == 32.0  # 96 examples in 3 s
    assert bar.postfix == "loss (last 20)=0.1500, lr=1.00e-05, ex/s=32.0"  # says which mean it is
    bar.close()
    assert "2/10" in stream.getvalue()


def test_moving_throughput_leaves_out_steps_that_compiled_and_forgets_beyond_its_window():
    throughput = run_log.MovingThroughput(window=2, start=0.0)
    assert throughput.examples_per_second is None and throughput.loss is None
    throughput.observe(32, 1.0, timed=False, now=10.0)  # compilation: restarts the clock only
    assert throughput.examples_per_second is None and throughput.loss == 1.0
    throughput.observe(32, 0.5, now=11.0)
    throughput.observe(16, 0.25, now=13.0)
    assert throughput.examples_per_second == 48 / 3
    throughput.observe(30, float("nan"), now=14.0)  # pushes out the 32 examples of 1 s
    assert throughput.examples_per_second == 46 / 3 and throughput.loss == (0.5 + 0.25) / 2  # NaN not counted


def test_progress_bar_off_a_terminal_prints_a_line_after_the_first_step_and_per_log_call_and_no_bar(monkeypatch):
    # start; step 1 ends, its line; step 2 ends, the quiet check; the log line
    clock = iter([0.0, 2.0, 2.0, 4.0, 4.5, 5.0])
    monkeypatch.setattr(run_log, "time", types.SimpleNamespace(perf_counter=lambda: next(clock)))
    stream = io.StringIO()  # not a TTY, as in CI
    with run_log.ProgressBar(4, is_main_process=True, file=stream) as bar:
        bar.update(1, loss=0.5, learning_rate=1e-4, examples=32, timed=False)
        bar.update(1, loss=0.25, learning_rate=5e-5, examples=32)
        bar.log(0.3)  # the logging window's mean, as metrics.jsonl records it
    assert stream.getvalue() == (
        "train  step 1/4  loss (mean of last 20 steps) 0.5000  lr 1.00e-04  elapsed 0:02  eta 0:06\n"
        "train  step 2/4  loss 0.3000  lr 5.00e-05  ex/s 16.0  elapsed 0:05  eta 0:05\n"
    )


def test_progress_bar_off_a_terminal_prints_at_least_once_a_minute_between_log_calls(monkeypatch):
    # start; step 1 ends, its line; step 2 ends, the quiet check (29 s: none); step 3 ends, the check
    # (61 s since the last line), its line
    clock = iter([0.0, 1.0, 1.0, 30.0, 30.0, 61.5, 62.0, 62.0])
    monkeypatch.setattr(run_log, "time", types.SimpleNamespace(perf_counter=lambda: next(clock)))
    stream = io.StringIO()
    with run_log.ProgressBar(100, is_main_process=True, file=stream) as bar:
        for _ in range(3):
            bar.update(1, loss=0.5, learning_rate=1e-4, examples=32)
    steps = [line.split()[2] for line in stream.getvalue().splitlines()]
    assert steps == ["1/100", "3/100"]  # the first step, then the one a minute after the last line


def test_progress_bar_on_non_main_process_prints_nothing():
    stream = io.StringIO()
    with run_log.ProgressBar(10, is_main_process=False, file=stream) as bar:
        bar.update(1, loss=1.0, learning_rate=1e-3, examples=8)
        bar.write("eval  step 1  accuracy 0.5000")
    assert bar.disabled
    assert stream.getvalue() == ""


def test_progress_bar_with_disable_prints_nothing():
    stream = io.StringIO()
    with run_log.ProgressBar(10, disable=True, is_main_process=True, file=stream) as bar:
        bar.update(1, loss=1.0)
    assert stream.getvalue() == ""


def test_progress_bar_write_prints_the_message_on_its_own_line():
    stream = io.StringIO()
    with run_log.ProgressBar(None, is_main_process=True, file=stream) as bar:
        bar.write("eval  step 1  accuracy 0.5000")
    assert "eval  step 1  accuracy 0.5000\n" in stream.getvalue()


# --- format_summary -------------------------------------------------------------------------


def test_format_summary_reads_as_one_line_in_the_given_order():
    summary = run_log.format_summary(
        "eval", 500, {"accuracy": 0.84213, "macro_f1": 0.83991, "mcc": 0.68431, "loss": 0.37118}
    )
    assert summary == "eval  step 500  accuracy 0.8421  macro_f1 0.8399  mcc 0.6843  loss 0.3712"


def test_format_summary_uses_scientific_notation_for_tiny_values_and_keeps_ints():
    summary = run_log.format_summary(
        "train", 7, {"learning_rate": 2e-5, "num_examples": 128, "pearson": float("nan")}
    )
    assert summary == "train  step 7  learning_rate 2.000e-05  num_examples 128  pearson nan"
