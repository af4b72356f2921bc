"""The `flaxheads` command's parser, as a new user meets it: every `--help` answers without
importing jax, flax, datasets, transformers or torch; a flag is never taken for an abbreviation of
another (`--max_step` is refused, not read as `--max_steps`); an unknown flag is answered with the
nearest known ones; and what the library says reaches the command line in flags."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

from flaxheads import names, notes
from flaxheads.cli import _in_flag_terms, build_parser, main

HEAVY = ("jax", "flax", "datasets", "transformers", "torch", "optuna", "starlette", "uvicorn")
COMMANDS = [[], ["convert"], ["inspect"], ["train"], ["search"], ["evaluate"], ["predict"], ["serve"], ["report"],
            ["bench"], ["study"], ["study", "run"], ["study", "report"]]
"""Every command and subcommand of `flaxheads` (a test below checks that the list is whole)."""


def _parsers(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(command words, parser) of `parser` and of every subcommand under it."""
    yield list(path), parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, (*path, name))


def _parse_error(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(argv)
    assert exit_.value.code == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


def test_the_list_of_commands_is_every_command_of_the_parser():
    assert sorted(path for path, _ in _parsers(build_parser())) == sorted(COMMANDS)


def test_every_commands_help_imports_no_jax_flax_datasets_transformers_torch_or_optuna():
    code = (
        "import json, sys\n"
        "from flaxheads.cli import main\n"
        "loaded = {}\n"
        f"for command in {COMMANDS!r}:\n"
        "    try:\n"
        "        main([*command, '--help'])\n"
        "    except SystemExit:\n"
        "        pass\n"
        f"    loaded[' '.join(command)] = [m for m in {HEAVY!r} if m in sys.modules]\n"
        "print(json.dumps(loaded))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    loaded = json.loads(result.stdout.strip().splitlines()[-1])

    assert loaded == {" ".join(command): [] for command in COMMANDS}


def test_name_tables_equal_the_registries_that_own_them():
    from flaxheads import heads, problem, tasks
    from flaxheads.data import batching, builtin
    from flaxheads.training import optim, parallel

    assert names.HEAD_NAMES == heads.HEAD_NAMES == tuple(heads.HEADS)
    assert names.BUILTIN_DATASET_NAMES == tuple(builtin.BUILTIN_DATASETS)
    assert names.PROBLEM_TYPES == problem.PROBLEM_TYPES
    assert names.TASKS == tuple(tasks.TASKS) and names.TASK_SETTINGS == tasks.setting_choices()
    assert names.TASK_SETTINGS["tag_scheme"] == tuple(tasks.TASKS["token-classification"].setting_choices["tag_scheme"])
    assert names.PARALLEL_MODES == tuple(parallel.PARALLEL)
    assert names.SCHEDULES is optim.SCHEDULES and names.PAD_TO_MULTIPLE_OF is batching.PAD_TO_MULTIPLE_OF


def test_no_parser_of_any_command_takes_abbreviations():
    assert {" ".join(path): parser.allow_abbrev for path, parser in _parsers(build_parser())} == {
        " ".join(command): False for command in COMMANDS}


def test_an_abbreviated_flag_is_refused_naming_the_flag_it_abbreviates(capsys):
    assert _parse_error(["train", "--max_step", "2"], capsys) == (
        "flaxheads train: error: unrecognized argument --max_step; did you mean --max_steps?")


def test_a_misspelled_flag_gets_the_nearest_flag_suggested(capsys):
    assert _parse_error(["train", "--learnig_rate", "5e-5"], capsys) == (
        "flaxheads train: error: unrecognized argument --learnig_rate; did you mean --learning_rate?")


def test_a_flag_with_an_equals_sign_and_several_unknown_flags_each_get_their_suggestion(capsys):
    assert _parse_error(["evaluate", "--splt=test", "--text_colum", "x"], capsys) == (
        "flaxheads evaluate: error: unrecognized arguments --splt (did you mean --split?), "
        "--text_colum (did you mean --text_column?)")


def test_an_unknown_flag_like_no_known_one_points_at_the_commands_help(capsys):
    assert _parse_error(["report", "runs/x", "--zzz"], capsys) == (
        "flaxheads report: error: unrecognized argument --zzz (`flaxheads report --help` lists the flags)")


def test_a_subcommands_unknown_flag_is_compared_with_that_subcommands_flags(capsys):
    assert _parse_error(["study", "run", "--study_dir", "s", "--seed", "1"], capsys) == (
        "flaxheads study run: error: unrecognized argument --seed; did you mean --seeds?")


def test_extra_words_that_are_no_flags_are_listed_as_argparse_does(capsys):
    assert _parse_error(["train", "stray"], capsys) == "flaxheads train: error: unrecognized arguments: stray"


def test_a_tag_scheme_message_names_the_tag_scheme_flag():
    message = "the tags mix scheme tags with others: Fix that tag, or pass scheme='none' to read every tag as a label"
    parsers = {" ".join(path): parser for path, parser in _parsers(build_parser())}
    train, predict = parsers["train"], parsers["predict"]

    assert _in_flag_terms(message, train) == message.replace("scheme='none'", "--tag_scheme none")
    assert _in_flag_terms(message, predict) == message  # predict has no --tag_scheme: Python's words stay
    assert _in_flag_terms("pass tag_scheme='IOB2'", train) == "pass --tag_scheme IOB2"


def test_a_flag_named_beside_its_parameter_is_named_once_on_the_command_line():
    train = build_parser()._subparsers._group_actions[0].choices["train"]
    message = ("packing=True (--packing) does not apply. Pass doc_stride=55 or less (--doc_stride), or "
               "max_seq_length=99 or more (--max_seq_length); see (--seed)")
    assert _in_flag_terms(message, train) == ("--packing does not apply. Pass --doc_stride 55 or less, or "
                                              "--max_seq_length 99 or more; see (--seed)")


def test_a_note_printed_while_a_command_runs_names_its_flags_and_python_callers_keep_parameters(
        monkeypatch, capsys):
    from flaxheads import cli
    from flaxheads.training.loop import print0

    def already_complete(args) -> int:
        print0("the run in out is already complete; Pass overwrite_output_dir=True to train again")
        return 0

    monkeypatch.setattr(cli, "_train", already_complete)
    assert main(["--compilation_cache", "off", "train"]) == 0
    print0("Pass overwrite_output_dir=True to train again")  # after the command: Python's words again

    assert capsys.readouterr().out.splitlines() == [
        "the run in out is already complete; Pass --overwrite_output_dir to train again",
        "Pass overwrite_output_dir=True to train again"]
    assert notes.wording is None
