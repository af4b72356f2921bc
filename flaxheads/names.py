"""The names (and the one default) that `flaxheads ... --help` shows for things whose code imports
jax, flax or datasets: heads, built-in data sets, problem types, tasks, learning-rate schedules,
parallel modes. This module imports nothing, so the command line's help and its argument checks
cost no second of those imports (`tests/test_cli_parser.py` checks that in a fresh process).

A registry keeps its builders where they live (`flaxheads.heads.HEADS`, ...); its names are
written here once more because Python cannot read a dict's keys without running the module that
builds it. `tests/test_cli_parser.py` checks each table here against its owner's, so a new head
or data set that is missing here fails a test instead of the command line. A plain list of words
with no builders behind it lives here alone, and its owner imports it (`SCHEDULES`).
"""

from __future__ import annotations

HEAD_NAMES = ("pooler", "roberta", "cls", "mean", "mean_max", "attention", "concat_last4", "last_token", "summary",
              "electra", "distilbert", "deberta", "modernbert")
"""`flaxheads.heads.HEADS`'s names, in its order."""

BUILTIN_DATASET_NAMES = ("movie_snippets", "movie_snippets_regression", "sms_spam", "trec6")
"""`flaxheads.data.builtin.BUILTIN_DATASETS`'s names, in its order."""

PROBLEM_TYPES = ("regression", "single_label_classification", "multi_label_classification", "pairwise_reward")
"""`flaxheads.problem.PROBLEM_TYPES`: what a sequence classifier's labels may mean."""

TASKS = ("text-classification", "token-classification", "multiple-choice", "question-answering")
"""`flaxheads.tasks.TASKS`'s names: what a model is trained to answer, what `--task` may name."""

TASK_SETTINGS: dict[str, tuple[str, ...]] = {
    "task": TASKS, "tag_scheme": ("IOB1", "IOB2", "IOBES", "none"), "eval_mode": ("default", "strict")}
"""The values of the settings the tasks read (`--task`, and token classification's `--tag_scheme`
and `--eval_mode`): `flaxheads.tasks.setting_choices()`, which the registry publishes here as it
changes (a task registered beside the built-in ones adds its name and settings), so that
`TrainConfig` and the command line check them without importing any task."""

PARALLEL_MODES = ("jit", "pmap")
"""`flaxheads.training.parallel.PARALLEL`'s names."""

SCHEDULES = ("linear", "cosine", "constant")
"""The learning-rate decays after the warmup (`flaxheads.training.optim.learning_rate_schedule`)."""

PAD_TO_MULTIPLE_OF = 8
"""Default rounding of a batch's padded length (`flaxheads.data.batching`, `--pad_to_multiple_of`).
Measured on the default job's train split (length-grouped batches of 32, 227k real tokens):
multiples of 8 from 16 pad to 268k tokens in 9 shapes, multiples of 16 to 300k in 5, powers of
two to 338k in 4, padding each batch to its longest row to 237k in 52. Every shape is a
compilation, which the persistent compilation cache (`flaxheads.compile_cache`) makes a one-off,
so the finer rounding wins from the second run on."""
