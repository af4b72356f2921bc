"""The `flaxheads` command: `convert`, `inspect` and `predict` through `main(argv)`, the installed script,
and the `train`/`evaluate` flags (help, choices, run_glue's command line; parsed, never run)."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import io
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors.numpy import load_file as load_numpy
from safetensors.torch import load_file

import flaxheads
from flaxheads.cli import build_parser, main, train_config
from flaxheads.data.builtin import BUILTIN_DATASETS
from flaxheads.heads import HEAD_NAMES
from flaxheads.tasks import TASKS
from flaxheads.problem import PROBLEM_TYPES
from flaxheads.tasks.token.tags import SCHEMES
from flaxheads.training.config import EVAL_STRATEGIES, REPORT_TO, SAMPLING_STRATEGIES, TrainConfig
from flaxheads.tasks.token.entity_metrics import MODES as EVAL_MODES
from flaxheads.training.optim import SCHEDULES
from flaxheads.training.parallel import PARALLEL

TOKENIZER_FILES = ["special_tokens_map.json", "tokenizer.json", "tokenizer_config.json", "vocab.txt"]


@pytest.fixture(scope="module")
def minilm_round_trip(minilm_path, tmp_path_factory):
    """MiniLM -> `flaxheads convert` (flax) -> `convert --to pytorch` -> `convert` (flax again)."""
    root = tmp_path_factory.mktemp("cli")
    codes = [
        main(["convert", str(minilm_path), str(root / "flax")]),
        main(["convert", str(root / "flax"), str(root / "pytorch"), "--to", "pytorch"]),
        main(["convert", str(root / "pytorch"), str(root / "flax_again"), "--to", "flaxheads"]),
    ]
    return root, codes


@pytest.mark.slow
def test_convert_commands_succeed(minilm_round_trip):
    _, codes = minilm_round_trip

    assert codes == [0, 0, 0]


def test_convert_default_direction_writes_flaxheads_format_for_a_pytorch_source(minilm_round_trip):
    root, _ = minilm_round_trip

    assert (root / "flax" / "flaxheads_model.safetensors").is_file()
    assert not (root / "flax" / "model.safetensors").exists()
    assert (root / "pytorch" / "model.safetensors").is_file()


def test_convert_to_pytorch_keeps_every_pretrained_tensor_bit_identical(minilm_path, minilm_round_trip):
    root, _ = minilm_round_trip
    original = load_file(minilm_path / "model.safetensors")
    exported = load_file(root / "pytorch" / "model.safetensors")

    # A bare BertModel checkpoint comes back as BertForSequenceClassification: "bert." prefix,
    # plus the classifier the default "pooler" head created; the position_ids buffer is dropped.
    pretrained = {name: tensor for name, tensor in original.items() if name != "embeddings.position_ids"}
    assert set(exported) == {f"bert.{name}" for name in pretrained} | {"classifier.weight", "classifier.bias"}
    for name, tensor in pretrained.items():
        assert exported[f"bert.{name}"].dtype == tensor.dtype, name
        assert torch.equal(exported[f"bert.{name}"], tensor), name


def test_convert_flax_pytorch_flax_round_trip_is_bit_identical(minilm_round_trip):
    root, _ = minilm_round_trip
    first = load_numpy(root / "flax" / "flaxheads_model.safetensors")
    again = load_numpy(root / "flax_again" / "flaxheads_model.safetensors")

    assert sorted(first) == sorted(again)
    for name in first:
        assert first[name].dtype == again[name].dtype, name
        assert (first[name] == again[name]).all(), name


@pytest.mark.parametrize("directory", ["flax", "pytorch", "flax_again"])
def test_convert_copies_the_tokenizer_files(minilm_path, minilm_round_trip, directory):
    root, _ = minilm_round_trip

    for name in TOKENIZER_FILES:
        assert (root / directory / name).read_bytes() == (minilm_path / name).read_bytes(), name


def test_convert_prints_the_loading_info(minilm_path, tmp_path, capsys):
    assert main(["convert", str(minilm_path), str(tmp_path / "out"), "--head", "mean", "--num_labels", "4"]) == 0

    out = capsys.readouterr().out
    assert "head.classifier.weight" in out and "must be trained" in out
    assert f"wrote flaxheads checkpoint to {tmp_path / 'out'}" in out


def test_inspect_names_model_type_head_and_new_parameters(hf_checkpoint, capsys):
    checkpoint = hf_checkpoint("RobertaModel")

    assert main(["inspect", str(checkpoint.path), "--num_labels", "3"]) == 0

    out = capsys.readouterr().out
    assert "model_type: roberta" in out
    assert "head shown: 'roberta'" in out and "num_labels 3" in out
    assert "layers 2, hidden 32, vocab 99" in out
    for name in ["classifier.dense.weight", "classifier.out_proj.weight"]:
        assert name in out
    assert "must be trained" in out


def test_inspect_with_another_head_reports_what_that_head_creates(hf_checkpoint, capsys):
    checkpoint = hf_checkpoint("BertModel")

    assert main(["inspect", str(checkpoint.path), "--head", "cls"]) == 0

    out = capsys.readouterr().out
    assert "model_type: bert" in out and "head shown: 'cls'" in out
    assert "head.classifier.weight" in out
    assert "pooler.dense.weight" in out  # unused by the cls head


@pytest.mark.parametrize("command", ["inspect", "convert"])
def test_bad_path_exits_2_with_an_error_message(tmp_path, capsys, command):
    missing = tmp_path / "no-such-model"
    argv = [command, str(missing)] + ([str(tmp_path / "out")] if command == "convert" else [])

    assert main(argv) == 2

    err = capsys.readouterr().err
    assert err.startswith(f"flaxheads {command}: error:")
    assert str(missing) in err


def test_convert_onto_its_own_source_exits_2_and_leaves_it_intact(minilm_round_trip, capsys):
    root, _ = minilm_round_trip
    before = (root / "pytorch" / "model.safetensors").read_bytes()

    assert main(["convert", str(root / "pytorch"), str(root / "pytorch"), "--to", "flaxheads", "--overwrite"]) == 2

    assert "is src" in capsys.readouterr().err
    assert (root / "pytorch" / "model.safetensors").read_bytes() == before


def test_convert_onto_a_folder_holding_a_model_names_the_overwrite_flag(minilm_round_trip, capsys):
    root, _ = minilm_round_trip

    assert main(["convert", str(root / "flax"), str(root / "pytorch"), "--to", "pytorch"]) == 2

    err = capsys.readouterr().err
    assert "already holds a checkpoint" in err and "model.safetensors" in err and "vocab.txt" in err
    assert "--overwrite" in err and "overwrite=True" not in err


def test_convert_overwrite_onto_a_directory_of_the_other_format_exits_2(minilm_round_trip, capsys):
    root, _ = minilm_round_trip

    assert main(["convert", str(root / "flax"), str(root / "pytorch"), "--to", "flaxheads", "--overwrite"]) == 2

    err = capsys.readouterr().err
    assert "holds ['model.safetensors']" in err and "remove" in err


@pytest.mark.slow
def test_convert_overwrite_replaces_the_model_and_keeps_other_files(minilm_path, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["convert", str(minilm_path), str(out), "--num_labels", "4"]) == 0
    (out / "notes.txt").write_text("mine")

    assert main(["convert", str(minilm_path), str(out), "--num_labels", "2", "--overwrite"]) == 0

    assert json.loads((out / "config.json").read_text())["id2label"] == {"0": "LABEL_0", "1": "LABEL_1"}
    assert (out / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("command", ["convert", "inspect"])
def test_another_num_labels_error_names_the_ignore_mismatched_sizes_flag(hf_checkpoint, tmp_path, capsys, command):
    checkpoint = hf_checkpoint("BertForSequenceClassification", num_labels=3)
    argv = [command, str(checkpoint.path)] + ([str(tmp_path / "out")] if command == "convert" else [])

    assert main(argv + ["--num_labels", "5"]) == 2

    err = capsys.readouterr().err
    assert "classifier.weight" in err and "--ignore_mismatched_sizes" in err
    assert "ignore_mismatched_sizes=True" not in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("command", ["convert", "inspect"])
def test_ignore_mismatched_sizes_flag_reports_the_classifier_as_new(hf_checkpoint, tmp_path, capsys, command):
    checkpoint = hf_checkpoint("BertForSequenceClassification", num_labels=3)
    argv = [command, str(checkpoint.path)] + ([str(tmp_path / "out")] if command == "convert" else [])

    assert main(argv + ["--num_labels", "5", "--ignore_mismatched_sizes"]) == 0

    out = capsys.readouterr().out
    assert "must be trained" in out and "classifier.weight (checkpoint shape" in out
    if command == "convert":
        assert json.loads((tmp_path / "out" / "config.json").read_text())["num_labels"] == 5


def test_keyboard_interrupt_prints_one_line_and_exits_130(monkeypatch, tmp_path, capsys):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("flaxheads.convert.convert", interrupted)

    assert main(["convert", str(tmp_path / "src"), str(tmp_path / "dst")]) == 130

    err = capsys.readouterr().err
    assert err == "flaxheads convert: interrupted\n"


@pytest.fixture(scope="module")
def classifier(tiny_bert, tmp_path_factory):
    """A 2-label export of tiny_bert with its tokenizer: its classifier is in the weights, so it
    loads with nothing new (as a trained model would)."""
    path = tmp_path_factory.mktemp("classifier")
    flaxheads.from_pretrained(tiny_bert, num_labels=2).save_pretrained(path)
    for name in TOKENIZER_FILES:
        shutil.copy(tiny_bert / name, path / name)
    return path


def predicted_texts(capsys) -> list[str]:
    return [json.loads(line)["text"] for line in capsys.readouterr().out.splitlines()]


def test_predict_input_file_gives_one_row_per_line_crlf_lines_included(classifier, tmp_path, capsys):
    lines = ["a fine film", "  spaced out  ", "last line"]
    input_file = tmp_path / "texts.txt"
    input_file.write_bytes("\r\n".join(lines).encode() + b"\r\n")

    assert main(["predict", "--model_name_or_path", str(classifier), "--input_file", str(input_file)]) == 0

    assert predicted_texts(capsys) == lines


@pytest.mark.parametrize("blank", ["", " \t "], ids=["empty", "white-space"])
def test_predict_input_file_with_a_blank_line_is_refused_naming_the_line_not_labelled(classifier, tmp_path, capsys,
                                                                                       blank):
    input_file = tmp_path / "texts.txt"
    input_file.write_bytes(f"a fine film\r\n{blank}\r\nlast line\r\n".encode())

    assert main(["predict", "--model_name_or_path", str(classifier), "--input_file", str(input_file)]) == 2

    out, err = capsys.readouterr()
    assert out == "" and f"--input_file {input_file} line 2 is blank" in err and "Remove the blank lines" in err


def test_predict_input_file_dash_reads_standard_input(classifier, monkeypatch, capsys):
    monkeypatch.setattr("sys.stdin", io.StringIO("first\nsecond\nthird"))

    assert main(["predict", "--model_name_or_path", str(classifier), "--input_file", "-"]) == 0

    assert predicted_texts(capsys) == ["first", "second", "third"]


def test_predict_input_file_that_is_not_utf8_names_the_file_and_iconv(tmp_path, capsys):
    input_file = tmp_path / "latin1.txt"
    input_file.write_bytes("ok\ncaf\u00e9\n".encode("latin-1"))

    assert main(["predict", "--model_name_or_path", str(tmp_path), "--input_file", str(input_file)]) == 2

    err = capsys.readouterr().err
    assert "--input_file" in err and str(input_file) in err and "line 2" in err and "iconv" in err


@pytest.mark.slow  # a subprocess running the installed console script
def test_installed_console_script_shows_help():
    result = subprocess.run(["flaxheads", "--help"], capture_output=True, text=True, timeout=120)

    assert result.returncode == 0, result.stderr
    assert "convert" in result.stdout and "inspect" in result.stdout


def test_exit_process_finishes_what_a_normal_exit_does(tmp_path):
    """The command's exit skips the interpreter's teardown, not the threads, atexit handlers and
    buffered output (a pipe's stdout is block-buffered) that sys.exit would finish, and an idle
    thread pool's worker (not a daemon) does not keep it waiting."""
    code = (
        "import atexit, pathlib, sys, threading, time\n"
        "from flaxheads.cli import exit_process\n"
        f"out = pathlib.Path({str(tmp_path)!r})\n"
        "atexit.register(lambda: (out / 'atexit').write_text('ran'))\n"
        "threading.Thread(target=lambda: (time.sleep(0.3), (out / 'thread').write_text('done'))).start()\n"
        "import concurrent.futures; pool = concurrent.futures.ThreadPoolExecutor(1); pool.submit(int).result()\n"
        "print('buffered line'); sys.stderr.write('unflushed error')\n"
        "exit_process(3)\n"
    )
    buffered = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=buffered)

    assert result.returncode == 3
    assert result.stdout == "buffered line\n" and result.stderr == "unflushed error"
    assert (tmp_path / "atexit").read_text() == "ran" and (tmp_path / "thread").read_text() == "done"


# --- train / evaluate flags: help, choices, run_glue's command line (parsing only) ---------------

TRAIN_FIELDS = [field.name for field in dataclasses.fields(TrainConfig)]
CHOICE_OWNERS = {
    "head": HEAD_NAMES,
    "dataset": tuple(BUILTIN_DATASETS),
    "dtype": ("float32", "bfloat16"),
    "lr_scheduler_type": SCHEDULES,
    "problem_type": PROBLEM_TYPES,
    "eval_strategy": EVAL_STRATEGIES,
    "report_to": REPORT_TO,
    "train_sampling_strategy": SAMPLING_STRATEGIES,
    "parallel": tuple(PARALLEL),
    "task": tuple(TASKS),
    "tag_scheme": SCHEMES,
    "eval_mode": EVAL_MODES,
}


@functools.cache
def command_parser(command: str) -> argparse.ArgumentParser:
    """The subcommand's parser (built once: tests only read it)."""
    subparsers = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return subparsers.choices[command]


def flag_action(command: str, name: str) -> argparse.Action:
    return command_parser(command)._option_string_actions[f"--{name}"]


@pytest.mark.parametrize("command", ["train", "evaluate"])
def test_every_train_flag_has_a_description_beyond_its_default(command):
    for name in TRAIN_FIELDS:
        help_text = flag_action(command, name).help or ""
        assert len(help_text.split()) >= 3 and not help_text.startswith("default:"), name


def test_train_flags_are_the_config_fields_with_their_defaults():
    args = build_parser().parse_args(["train"])

    # The command line always writes a run folder; in Python the default is an in-memory run.
    assert train_config(args) == TrainConfig(output_dir="runs/minilm-movie_snippets")
    assert {name for name in vars(args) if name not in ("command", "run", "command_parser", "compilation_cache")} == set(TRAIN_FIELDS)


@pytest.mark.parametrize("name", sorted(CHOICE_OWNERS))
def test_choice_flag_offers_exactly_the_owning_modules_values(name):
    assert tuple(flag_action("train", name).choices) == CHOICE_OWNERS[name]


@pytest.mark.parametrize("command", ["train", "evaluate"])
def test_help_runs_and_lists_every_choice(command, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([command, "--help"])

    assert exit_.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    for name, choices in CHOICE_OWNERS.items():
        assert f"--{name} {{{','.join(choices)}}}" in out, name


@pytest.mark.parametrize("name", sorted(CHOICE_OWNERS))
def test_a_value_outside_the_choices_is_rejected_naming_the_valid_ones(name, capsys):
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["train", f"--{name}", "bogus"])

    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert f"--{name}" in err and "invalid choice: 'bogus'" in err
    assert all(repr(choice) in err for choice in CHOICE_OWNERS[name])


@pytest.mark.parametrize("name", sorted(CHOICE_OWNERS))
def test_train_config_rejects_a_value_outside_the_choices_naming_the_valid_ones(name):
    with pytest.raises(ValueError, match=f"{name}='bogus': choose one of") as error:
        TrainConfig(**{name: "bogus"})

    assert all(choice in str(error.value) for choice in CHOICE_OWNERS[name])


RUN_GLUE_ARGS = (
    "--model_name_or_path X --do_train --do_eval --max_seq_length 128 --per_device_train_batch_size 32 "
    "--learning_rate 2e-5 --num_train_epochs 3 --output_dir out --overwrite_output_dir --bf16 "
    "--eval_strategy epoch --report_to none --warmup_steps 0.1 --train_file a.csv --validation_file b.csv"
).split()


def test_run_glue_command_line_parses_into_the_expected_train_config():
    config = train_config(build_parser().parse_args(["train", *RUN_GLUE_ARGS]))

    assert config == TrainConfig(
        model_name_or_path="X", do_train=True, do_eval=True, max_seq_length=128, per_device_train_batch_size=32,
        learning_rate=2e-5, num_train_epochs=3.0, output_dir="out", overwrite_output_dir=True, bf16=True,
        eval_strategy="epoch", report_to="none", warmup_steps=0.1, train_file="a.csv", validation_file="b.csv",
    )
    assert config.dtype == "bfloat16" and config.num_warmup_steps(1000) == 100


def test_warmup_steps_takes_a_count_as_well_as_a_ratio():
    config = train_config(build_parser().parse_args(["train", "--warmup_steps", "100"]))

    assert config.warmup_steps == 100 and config.num_warmup_steps(1000) == 100


@pytest.mark.parametrize("negative", ["--no_group_by_length", "--no-group_by_length"])
def test_no_flag_turns_a_boolean_field_off(negative):
    args = build_parser().parse_args(["train", negative, "--no_do_eval"])

    assert args.group_by_length is False and args.do_eval is False and args.do_train is True


def test_library_messages_name_a_false_boolean_by_its_no_underscore_flag():
    from flaxheads.cli import _in_flag_terms

    message = _in_flag_terms("retry with group_by_length=False", command_parser("train"))

    assert message == "retry with --no_group_by_length"
