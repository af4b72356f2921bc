"""The `flaxheads` command: thin argument parsing over library functions."""

from __future__ import annotations

import argparse
import atexit
import dataclasses
import difflib
import functools
import json
import os
import pathlib
import re
import sys
import threading
import traceback
import typing

# Parsing, and every command's --help, needs none of jax, flax, datasets, transformers or torch
# (tests/test_cli_parser.py checks it): the modules imported here do not import them, and the commands
# import what they run in their own functions.
from flaxheads import compile_cache, host_memory, names, notes, quiet_imports
from flaxheads.names import HEAD_NAMES
from flaxheads.training import search_space
from flaxheads.training.config import CHOICES, COMMAND_LINE_DEFAULTS, TrainConfig, field_docs


def _print_rows(rows) -> int:
    """One JSON line a prediction row (what `flaxheads predict` prints); exit status 0."""
    for row in rows:
        print(json.dumps(row, ensure_ascii=False))
    return 0


def _convert(args) -> int:
    from flaxheads.conversion.formats import canonical_name
    from flaxheads.convert import convert, default_direction

    to = canonical_name(args.to or default_direction(args.src))
    info, seconds = convert(args.src, args.dst, to=to, head=args.head, num_labels=args.num_labels,
                            ignore_mismatched_sizes=args.ignore_mismatched_sizes, overwrite=args.overwrite)
    print(info)
    print(f"wrote {to} checkpoint to {args.dst} in {seconds:.2f} s")
    return 0


def _inspect(args) -> int:
    from flaxheads.convert import describe

    print(describe(args.path, head=args.head, num_labels=args.num_labels,
                   ignore_mismatched_sizes=args.ignore_mismatched_sizes))
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse's parser, and its subcommands', without abbreviations (`--max_step 2` is refused,
    not read as `--max_steps 2`), answering an unknown flag with the nearest known ones."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def parse_args(self, args=None, namespace=None):
        parsed, unknown = self.parse_known_args(args, namespace)
        if unknown:
            parser = _innermost_parser(self, parsed)
            parser.error(unrecognized(unknown, parser))
        return parsed


def _innermost_parser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The parser of the (sub)command `args` ran: `flaxheads study run`'s for `study run ...`."""
    while True:
        subcommands = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
        chosen = getattr(args, subcommands.dest, None) if subcommands else None
        if chosen not in (subcommands.choices if subcommands else ()):
            return parser
        parser = subcommands.choices[chosen]


def unrecognized(arguments: list[str], parser: argparse.ArgumentParser) -> str:
    """The error for `arguments` that `parser` does not know: each unknown flag with the nearest
    flags of `parser` it may be a typo of (difflib's similarity), e.g. `unrecognized argument --learnig_rate;
    did you mean --learning_rate?`. Values after an unknown flag are taken for its own."""
    flags = [arg for arg in arguments if arg.startswith("--") or (arg.startswith("-") and not _is_number(arg))]
    if not flags:
        return f"unrecognized arguments: {' '.join(arguments)}"
    known = sorted({option for action in parser._actions if action.help is not argparse.SUPPRESS
                    for option in action.option_strings})
    described = []
    for flag in flags:
        name = flag.split("=", 1)[0]
        similarity = {option: difflib.SequenceMatcher(None, name, option).ratio() for option in known}
        best = max(similarity.values(), default=0.0)
        # The near ones, and only those nearly as near as the nearest: --max_step is --max_steps,
        # not also --save_steps.
        nearest = [option for option in sorted(known, key=similarity.get, reverse=True)[:3]
                   if similarity[option] >= max(0.7, best - 0.1)]
        described.append((name, " or ".join(nearest)))
    if len(described) == 1:
        name, nearest = described[0]
        return f"unrecognized argument {name}" + (f"; did you mean {nearest}?" if nearest else
                                                   f" (`{parser.prog} --help` lists the flags)")
    return "unrecognized arguments " + ", ".join(name + (f" (did you mean {nearest}?)" if nearest else "")
                                                  for name, nearest in described)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


class _HelpFormatter(argparse.HelpFormatter):
    """Help lines end with the flag's default, unless it is None (the text says what None does)
    or the flag is a plain switch."""

    def _get_help_string(self, action):
        plain_switch = action.nargs == 0 and not isinstance(action, _BooleanFlag)
        if not action.option_strings or action.default in (None, argparse.SUPPRESS) or plain_switch:
            return action.help
        return f"{action.help or ''} (default: %(default)s)"


class _BooleanFlag(argparse.Action):
    """`--x` sets True, `--no_x` False: transformers' spelling of argparse.BooleanOptionalAction
    (whose `--no-x` is kept as a hidden alias, see `_add_train_flags`)."""

    def __init__(self, option_strings, dest, **kwargs):
        (flag,) = option_strings
        super().__init__([flag, f"--no_{flag[2:]}"], dest, nargs=0, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, not option_string.startswith("--no"))

    def format_usage(self) -> str:
        return " | ".join(self.option_strings)


@functools.cache
def _train_config_hints() -> dict[str, typing.Any]:
    return typing.get_type_hints(TrainConfig)  # 2.7 ms a call: once, not once a flag


def _flag_type(field: dataclasses.Field):
    hint = _train_config_hints()[field.name]
    if tuple[str, ...] in typing.get_args(hint):
        return tuple
    for candidate in (bool, int, float, str, pathlib.Path):
        if hint is candidate or candidate in typing.get_args(hint):
            return candidate
    raise TypeError(f"no flag type for {field.name}: {hint}")


def flag_choices() -> dict[str, tuple[str, ...]]:
    """The values each TrainConfig flag with a fixed set accepts: `CHOICES`, and the settings the
    tasks read (--task, --tag_scheme, --eval_mode: `names.TASK_SETTINGS`, which the task registry
    keeps current and which imports no jax, so `--help` reads it)."""
    return {**CHOICES, **names.TASK_SETTINGS}


def _searchable(name: str, kind: type, choices) -> typing.Callable[[str], typing.Any]:
    """`flaxheads search`'s reading of a train flag: a value, or a range or choices to search
    (`training.search_space.parse`), its errors in argparse's words."""
    def read(text: str):
        try:
            return search_space.parse(name, text, kind, choices)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    read.__name__ = kind.__name__
    return read


def _add_train_flags(parser: argparse.ArgumentParser, *, searchable: bool = False) -> None:
    """One flag per TrainConfig field, same name and default, its docstring as help and, for the
    fields in `flag_choices`, only those values; booleans get --x / --no_x. `searchable`: a
    number's or a choice's flag also takes a range or choices to search (`flaxheads search`)."""
    docs, choices = field_docs(), flag_choices()
    for field in dataclasses.fields(TrainConfig):
        kind = _flag_type(field)
        flag, doc = f"--{field.name}", docs[field.name].replace("%", "%%")
        default = COMMAND_LINE_DEFAULTS.get(field.name, field.default)
        if kind is bool:
            parser.add_argument(flag, action=_BooleanFlag, default=default, help=doc)
            parser.add_argument(f"--no-{field.name}", dest=field.name, action="store_false",
                                default=argparse.SUPPRESS, help=argparse.SUPPRESS)
        elif kind is tuple:  # a list of names: --lora_target_modules query value
            parser.add_argument(flag, nargs="+", default=default, help=doc)
        elif searchable and (kind in (int, float) or field.name in choices):
            parser.add_argument(flag, type=_searchable(field.name, kind, choices.get(field.name)), default=default,
                                help=doc)
        else:
            parser.add_argument(flag, type=kind, default=default, choices=choices.get(field.name), help=doc)


def train_config(args: argparse.Namespace) -> TrainConfig:
    """The TrainConfig that parsed `train` (or `evaluate`) flags describe."""
    return TrainConfig(**{field.name: getattr(args, field.name) for field in dataclasses.fields(TrainConfig)})


def _train(args) -> int:
    from flaxheads.tasks.runs import train

    config = train_config(args)
    results = train(config)
    print(json.dumps({k: results[k] for k in ("validation", "test") if k in results}, indent=2))
    if results.get("already_complete"):
        return 0
    if config.do_train:
        print(f"exported to {config.output_dir} after {results['steps']} steps in {results['seconds']:.0f} s")
        if results.get("report"):
            print("report: " + ", ".join(str(pathlib.Path(config.output_dir) / name) for name in results["report"]))
    else:
        print(f"scored without training (--no_do_train) in {results['seconds']:.0f} s")
    return 0


SEARCH_OUTPUT_DIR = "runs/minilm-movie_snippets-search"
"""`flaxheads search`'s default --output_dir: beside `flaxheads train`'s default run, not in it."""


def _search(args) -> int:
    from flaxheads.tasks.runs import search

    values, space = {}, {}
    for field in dataclasses.fields(TrainConfig):
        value = getattr(args, field.name)
        if isinstance(value, (search_space.Range, search_space.Choice)):
            space[field.name], value = value, COMMAND_LINE_DEFAULTS.get(field.name, field.default)
        values[field.name] = value
    if args.search_space:
        kinds = {field.name: _flag_type(field) for field in dataclasses.fields(TrainConfig)}
        given = search_space.from_json(args.search_space, kinds, flag_choices())
        twice = sorted(set(given) & set(space))
        if twice:
            raise ValueError(f"{', '.join(twice)} searched twice, by its flag and by --search_space: keep one")
        space.update(given)
    if not space:
        raise ValueError("flaxheads search needs something to search: give a range or choices, e.g. --learning_rate "
                         "1e-5:3e-4:log --warmup_ratio 0:0.2, or --search_space FILE_OR_JSON")
    config = TrainConfig(**values)
    print(f"search: {search_space.described(space)}; {args.n_trials} trials", file=sys.stderr)
    best = search(config, space, n_trials=args.n_trials, direction=args.direction, storage=args.storage,
                  study_name=args.study_name, timeout=args.timeout)
    summary = best.run_summary
    print(json.dumps({"best_run": best.run_id, "objective": best.objective, "hyperparameters": best.hyperparameters,
                      "best_model": str(summary.get("best_model")), "train_step_compilations": summary["compilations"]},
                     indent=2))
    print("report: " + ", ".join(str(path) for path in summary.get("report", ())))
    return 0


def _evaluate(args) -> int:
    from flaxheads import tasks
    from flaxheads.tasks.runs import open_model, scoring_source
    from flaxheads.tasks.sources import load_task

    config = train_config(args)
    model_folder = open_model(config)
    data = load_task(**scoring_source(config, model_folder))
    print(f"problem type {data.described}", file=sys.stderr)
    result = tasks.named(data.task).evaluate(model_folder, data, args.split, options=dict(
        max_seq_length=args.max_seq_length, batch_size=args.per_device_eval_batch_size,
        tokenizer_name=args.tokenizer_name, packing=config.packing, max_segments_per_row=config.max_segments_per_row,
        eval_mode=config.eval_mode))
    print(json.dumps(result, indent=2))
    return 0


def _predict(args) -> int:
    """The rows of the saved model's task (`Task.predict_command`: a text classifier's labels per
    text, a token classifier's tags per sentence, a multiple-choice model's choice per row of
    --input_file); a folder of no task's model is read as a text classifier (and refused as one)."""
    from flaxheads import tasks
    from flaxheads.inference import open_model_folder

    try:
        model_folder = open_model_folder(args.model_name_or_path)  # read once, passed along
    except (OSError, ValueError):
        model_folder = args.model_name_or_path  # no readable model: the text path says why, after its inputs
    kind = tasks.of_checkpoint(model_folder) or tasks.TASKS[tasks.DEFAULT]
    return _print_rows(kind.predict_command(model_folder, vars(args)))


def _serve(args) -> int:
    from flaxheads.serving import serve

    serve(args.model_dirs, host=args.host, port=args.port, max_batch_tokens=args.max_batch_tokens,
          max_concurrent_requests=args.max_concurrent_requests, max_client_batch_size=args.max_client_batch_size,
          payload_limit=args.payload_limit, max_input_length=args.max_input_length, packing=args.packing,
          graceful_timeout=args.graceful_timeout, log_level=args.log_level)
    return 0


def _report(args) -> int:
    from flaxheads.training.run_report import regenerate

    for path in regenerate(args.run_dir):
        print(path)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="flaxheads", description=__doc__)
    parser.add_argument("--compilation_cache", metavar="DIR|off",
                        help="jax's persistent compilation cache, so a repeated run compiles nothing: a folder, "
                             f"or off; default: ${compile_cache.ENV_VAR}, else {compile_cache.default_directory()}")
    sub = parser.add_subparsers(dest="command", required=True)

    def add_parser(name: str, **kwargs) -> argparse.ArgumentParser:
        return sub.add_parser(name, formatter_class=_HelpFormatter, **kwargs)

    p = add_parser("convert", help="convert a checkpoint directory between Hugging Face PyTorch and flaxheads")
    p.add_argument("src", help="checkpoint folder to read (Hugging Face PyTorch or flaxheads)")
    p.add_argument("dst", help="folder to write the converted checkpoint and the tokenizer files to")
    p.add_argument("--to", choices=["pytorch", "flaxheads", "flax"],
                   help="weight format to write: pytorch (what transformers loads) or flaxheads (flaxheads' own; "
                        "'flax' is its earlier name); default: pytorch for flaxheads sources, else flaxheads")
    p.add_argument("--head", choices=HEAD_NAMES, help="default: the checkpoint's own head")
    p.add_argument("--num_labels", type=int, help="labels of the head; default: the checkpoint's")
    p.add_argument("--ignore_mismatched_sizes", action="store_true",
                   help="start a new head where the checkpoint's has another size (e.g. another --num_labels)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the checkpoint files dst already holds (other files there are left alone)")
    p.set_defaults(run=_convert)

    p = add_parser("inspect", help="architecture, sizes, and which weights a head loads or creates")
    p.add_argument("path", help="checkpoint folder (Hugging Face PyTorch or flaxheads)")
    p.add_argument("--head", choices=HEAD_NAMES, help="head to show; default: the checkpoint's own")
    p.add_argument("--num_labels", type=int, help="labels of the head to show; default: the checkpoint's")
    p.add_argument("--ignore_mismatched_sizes", action="store_true",
                   help="show a new head where the checkpoint's has another size")
    p.set_defaults(run=_inspect)

    p = add_parser("train", help="fine-tune a classifier (no flags: MiniLM on movie_snippets)")
    _add_train_flags(p)
    p.set_defaults(run=_train)

    p = add_parser("search", help="hyperparameter search over train runs on Optuna (e.g. --learning_rate "
                                  "1e-5:3e-4:log --warmup_ratio 0:0.2), resumable, with pruning",
                   description="Trains --n_trials runs, each a run folder in --output_dir, with values from the ranges "
                               "(LOW:HIGH, LOW:HIGH:log, LOW:HIGH:STEP) and choices (A,B) given to train's flags or "
                               "in --search_space; scores each by --metric_for_best_model (default: the task's "
                               "metric). The study is stored in OUTPUT_DIR/optuna.db (or --storage): the same "
                               "command again resumes it, and several processes may share it.")
    _add_train_flags(p, searchable=True)
    p.add_argument("--n_trials", type=int, default=20,
                   help="trials the study should have finished (complete or pruned); a resumed search runs the rest")
    p.add_argument("--direction", choices=["minimize", "maximize"],
                   help="whether the objective is minimized or maximized; default: the metric's own direction")
    p.add_argument("--search_space", metavar="FILE_OR_JSON",
                   help='ranges and choices as JSON, e.g. \'{"learning_rate": "1e-5:3e-4:log", "lr_scheduler_type": '
                        '["linear", "cosine"]}\'')
    p.add_argument("--storage", help="Optuna storage shared by the search's processes: a database URL "
                                     "(sqlite:///PATH, postgresql://...) or journal:PATH; default: "
                                     "sqlite in OUTPUT_DIR/optuna.db")
    p.add_argument("--study_name", help="the study's name in the storage; default: flaxheads-search")
    p.add_argument("--timeout", type=float, help="seconds after which no new trial starts")
    p.set_defaults(run=_search, output_dir=SEARCH_OUTPUT_DIR)  # a search's folder, never train's default run

    p = add_parser("evaluate", help="metrics of a saved classifier on a data split")
    _add_train_flags(p)
    p.add_argument("--split", default="test", help="split of the data to evaluate on: train, validation or test")
    p.set_defaults(run=_evaluate)

    p = add_parser("predict", help="labels and probabilities for texts (a token classifier: tags per word; a "
                                   "multiple-choice model: the chosen index per row of --input_file)")
    p.add_argument("texts", nargs="*", help="texts to classify (and/or --input_file); for a token classifier, "
                                            "sentences of words separated by spaces")
    p.add_argument("--model_name_or_path", required=True, help="folder of a trained classifier (train's output_dir)")
    p.add_argument("--text_pair", nargs="+", dest="text_pairs", metavar="TEXT_PAIR",
                   help="the second text of each text, in order, for a model trained on text pairs")
    p.add_argument("--input_file", help='one text per line, UTF-8 ("-": standard input), or for a model trained on '
                                        'pairs "text<TAB>text_pair" per line; one output row per line')
    p.add_argument("--max_seq_length", type=int, default=128, help="longest input in tokens; longer texts are truncated")
    p.add_argument("--tokenizer_name", help="folder of the model's tokenizer, when the model folder has none")
    p.add_argument("--packing", action="store_true",
                   help="score the texts several to a row of max_seq_length tokens (one compiled shape)")
    p.add_argument("--stride", type=int,
                   help="token classifiers: a sentence longer than max_seq_length tokens is read in windows sharing "
                        "up to this many tokens; default: max_seq_length // 4")
    for name in ("context_column", "question_column", "choice_columns"):  # multiple choice: as train reads them
        p.add_argument(f"--{name}", nargs="+" if name == "choice_columns" else None,
                       help=field_docs()[name].replace("%", "%%"))
    p.add_argument("--question", nargs="+",
                   help="question-answering models: the question(s) to answer from --context")
    p.add_argument("--context", nargs="+", help="question-answering models: the context of each --question (one for "
                                                "all, or one per question)")
    for name in ("version_2_with_negative", "doc_stride", "n_best_size", "max_answer_length",
                 "null_score_diff_threshold"):  # question answering: as train reads them
        doc = field_docs()[name].replace("%", "%%")
        if name == "version_2_with_negative":
            p.add_argument(f"--{name}", action="store_true", help=doc)
        else:
            p.add_argument(f"--{name}", type=float if name == "null_score_diff_threshold" else int, help=doc)
    p.set_defaults(run=_predict)

    p = add_parser("serve", help="an HTTP server for trained models (text-embeddings-inference's routes, batched; "
                                 "docs/serving.md)")
    p.add_argument("model_dirs", nargs="+", metavar="MODEL_DIR",
                   help="folders of trained models (train's output_dir), each served under its folder's name, or "
                        "NAME=MODEL_DIR")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    p.add_argument("--port", type=int, default=8080, help="port to listen on")
    p.add_argument("--max_batch_tokens", type=int, default=16384,
                   help="padded tokens of one batch at most (requests queued together are batched up to it)")
    p.add_argument("--max_concurrent_requests", type=int, default=512,
                   help="requests in flight at most; beyond, the server answers 429")
    p.add_argument("--max_client_batch_size", type=int, default=32, help="inputs of one request at most (and choices of one multiple-choice input)")
    p.add_argument("--max_input_length", type=int,
                   help="tokens of one input at most (fewer shapes to compile); default: each model's limit")
    p.add_argument("--no_packing", dest="packing", action="store_false",
                   help="pad each input of a text classifier alone instead of packing short ones several to a row "
                        "(the answers are the same; packing pads less: docs/serving.md)")
    p.add_argument("--payload_limit", type=int, default=2_000_000, help="bytes of one request's body at most")
    p.add_argument("--graceful_timeout", type=float, default=30.0,
                   help="seconds SIGTERM waits for the requests in flight before the server exits")
    p.add_argument("--log_level", default="warning", choices=["critical", "error", "warning", "info", "debug"],
                   help="uvicorn's log level")
    p.set_defaults(run=_serve)

    p = add_parser("report", help="draw a finished run's report again (PNGs in RUN_DIR/report/)")
    p.add_argument("run_dir", metavar="RUN_DIR", help="the output_dir of a finished flaxheads train run")
    p.set_defaults(run=_report)

    from flaxheads.benchmarks import cli as bench_cli

    p = sub.add_parser("bench", help="train/eval steps vs transformers PyTorch (and HF Flax), conversion speed",
                       description=bench_cli.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    bench_cli.build_parser(p)
    p.set_defaults(run=bench_cli.run_args)

    from flaxheads.study import cli as study_cli

    p = sub.add_parser("study", help="which head works best: a grid of heads x data sets x seeds, and its report",
                       description=study_cli.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    study_cli.build_parser(p)
    p.set_defaults(run=study_cli.run_args)
    for p in sub.choices.values():
        p.set_defaults(command_parser=p)  # main() words errors in the flags of the command that ran
    return parser


_FLAG_OF_PARAMETER = {"scheme": "tag_scheme"}
"""Library parameters whose flag has another name: `flaxheads.tasks.token.tags`' `scheme=` is `--tag_scheme`
(`TrainConfig.tag_scheme`, passed on as `scheme`)."""


def _in_flag_terms(message: str, parser: argparse.ArgumentParser) -> str:
    """A library message in the words of this command line: `ignore_mismatched_sizes=True` becomes
    `--ignore_mismatched_sizes`, `num_labels=5` `--num_labels 5`, `head='cls'` `--head cls`, for
    the parameters that are flags of `parser` (under their own name or `_FLAG_OF_PARAMETER`'s);
    other parameters stay as they are."""
    flags = {option[2:] for action in parser._actions for option in action.option_strings if option.startswith("--")}
    for parameter_name, flag in _FLAG_OF_PARAMETER.items():
        if flag in flags:
            message = re.sub(rf"(?<![\w./-]){re.escape(parameter_name)}=", f"{flag}=", message)
    for name in sorted(flags):
        parameter = rf"(?<![\w./-]){re.escape(name)}="
        message = re.sub(parameter + r"True\b", f"--{name}", message)
        negative = next((f for f in (f"no_{name}", f"no-{name}") if f in flags), None)  # _BooleanFlag, BooleanOptionalAction
        if negative:
            message = re.sub(parameter + r"False\b", f"--{negative}", message)
        message = re.sub(parameter + r"(['\"])([\w./-]*)\1", rf"--{name} \2", message)
        message = re.sub(parameter + r"(?!True\b|False\b)(?=[^\s=])", f"--{name} ", message)
    # A library message may name the flag beside the parameter ("doc_stride=5 (--doc_stride)"): once is enough.
    return re.sub(r"(--([\w-]+)(?: [^\s()]+)?(?: or (?:less|more))?) \(--\2\)", r"\1", message)


def _in_a_job() -> bool:
    """Whether this process is one of a multi-process job (jax is imported only if it is)."""
    if "jax" not in sys.modules:
        return False
    from flaxheads.training import distributed

    return distributed.joined()


def _which_process() -> str:
    """Which process of a multi-process job stopped on the error (" (process 1 of 2)"); "" alone."""
    if not _in_a_job():
        return ""
    import jax

    return f" (process {jax.process_index()} of {jax.process_count()})"


def _peer_lost(error: BaseException) -> bool:
    """Whether `error` is a collective that failed because another process of the job is gone."""
    text = str(error)
    return type(error).__name__ in ("JaxRuntimeError", "XlaRuntimeError") and any(
        words in text for words in ("Connection reset by peer", "Connection closed by peer", "Socket closed",
                                    "Broken pipe"))


def _stopped(code: int) -> int:
    """`code`; a process of a multi-process job exits with it at once (`distributed.leave`)."""
    if _in_a_job():
        from flaxheads.training import distributed

        distributed.leave(code)
    return code


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if argv is None and args.command in host_memory.LONG_COMMANDS:  # the command line itself, not a caller's list
        host_memory.restart_with_huge_pages(sys.argv[1:])
    if argv is None and args.command != "bench":  # bench runs transformers' PyTorch models in this process
        quiet_imports.use_torch_free_transformers()
    quiet_imports.flax()  # before the command's first import of flax, without IPython
    notes.wording = functools.partial(_in_flag_terms, parser=args.command_parser)  # the notes it prints, too
    try:
        compile_cache.enable(args.compilation_cache)
        return args.run(args)
    except (ValueError, OSError, NotImplementedError, FloatingPointError, ModuleNotFoundError) as err:
        print(f"flaxheads {args.command}: error{_which_process()}: {_in_flag_terms(str(err), args.command_parser)}",
              file=sys.stderr)
        return _stopped(2)
    except KeyboardInterrupt:
        print(f"flaxheads {args.command}: interrupted", file=sys.stderr)
        return _stopped(130)
    except Exception as err:
        if _in_a_job():  # said now: the other processes' wait would otherwise hold it back
            if _peer_lost(err):
                print(f"flaxheads {args.command}: error{_which_process()}: another process of the job stopped, so "
                      f"this one cannot go on ({str(err).strip().splitlines()[0]}); the first error the job's "
                      "processes printed says why", file=sys.stderr)
            else:
                traceback.print_exc()
            _stopped(1)
        raise
    finally:
        notes.wording = None  # a caller of main() goes on in Python's words


def exit_process(code: int) -> typing.NoReturn:
    """Ends the command's process with exit status `code` once what a normal exit does for others
    is done (running threads joined, atexit handlers run, stdout and stderr flushed), without the
    interpreter's teardown: freeing jax's backends, compiled programs and every module took
    1.6-1.9 s after `flaxheads train` of the default job (measured 2026-11-27), none of it
    visible to the user. Every file a command writes is closed before it returns. For the command
    line only (`launcher` and `python -m flaxheads.cli`); a caller of `main` keeps its process."""
    # What the interpreter's exit does first: the threading exit hooks (which tell idle
    # concurrent.futures workers to stop), then it joins every non-daemon thread.
    shutdown_threads = getattr(threading, "_shutdown", None)
    if shutdown_threads is not None:
        shutdown_threads()
    else:  # not CPython: join what is running (an idle pool worker would wait forever here)
        for thread in threading.enumerate():
            if thread is not threading.main_thread() and not thread.daemon:
                thread.join()
    atexit._run_exitfuncs()  # then the atexit handlers: weakref finalizers, logging, multiprocessing
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed or broken pipe: nothing left to write to
            pass
    os._exit(code)


if __name__ == "__main__":
    exit_process(main())
