"""The registry of tasks: every `Task` by its one name (transformers' pipeline name), and the
entry points that dispatch on them: `from_pretrained` and `pipeline` (which the package
re-exports), the task of a model or of a saved model folder, and the settings tasks read.
`flaxheads.tasks` exposes every name here."""

from __future__ import annotations

from collections.abc import Callable

from flaxheads import conversion, names
from flaxheads.inference import open_model_folder, other_task
from flaxheads.model import PretrainedModel, saved_config
from flaxheads.tasks.base import Task
from flaxheads.tasks.choice.task import TASK as MULTIPLE_CHOICE
from flaxheads.tasks.classification.task import TASK as TEXT_CLASSIFICATION
from flaxheads.tasks.qa.task import TASK as QUESTION_ANSWERING
from flaxheads.tasks.token.task import TASK as TOKEN_CLASSIFICATION

TASKS: dict[str, Task] = {task.name: task for task in (TEXT_CLASSIFICATION, TOKEN_CLASSIFICATION, MULTIPLE_CHOICE,
                                                       QUESTION_ANSWERING)}
"""Every task by its name. A new task is one folder plus one `register` call (or line here)."""

DEFAULT = TEXT_CLASSIFICATION.name
"""The task of data that no other task claims, and of `from_pretrained` without task=."""


def register(task: Task) -> Task:
    """Adds `task` to `TASKS` (its aliases name its pipeline too); ValueError when its name or an
    alias is taken by another task."""
    taken = {name: other for other in TASKS.values() for name in (other.name, *other.aliases) if other is not task
             and other.name != task.name}
    clash = next((name for name in (task.name, *task.aliases) if name in taken), None)
    if clash is not None:
        raise ValueError(f"task name {clash!r} is taken by {taken[clash]!r}: give {task!r} another name")
    conversion.add_task_rows(task.name, dict(task.conversion_rows))
    TASKS[task.name] = task
    _publish_settings()
    return task


def unregister(name: str) -> Task:
    """Takes the task `name` out of `TASKS` and its rows out of the conversion tables (a task
    registered for a while: a test's, say); KeyError for a task that is not registered."""
    task = TASKS.pop(name)
    for model_type in task.conversion_rows:
        conversion.TABLES[model_type].tasks.pop(name, None)
    _publish_settings()
    return task


def named(name: str) -> Task:
    """The task called `name`; ValueError naming the tasks. (A task's aliases name its pipeline
    only, as in transformers: `pipeline("ner")`.)"""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; choose one of {tuple(TASKS)}")
    return TASKS[name]


def of_model(model) -> Task:
    """The task whose model class `model` is an instance of (its config's task)."""
    task_name = getattr(getattr(model, "config", None), "task", None)
    task = TASKS.get(task_name)
    if task is None or not isinstance(model, task.model_class):
        raise ValueError(f"{type(model).__name__} is no model of a registered task ({', '.join(TASKS)}): pass a "
                         "flaxheads model (flaxheads.from_pretrained(path, task=...))")
    return task


def of_checkpoint(folder) -> Task | None:
    """The task whose model a checkpoint folder holds (`Task.holds`: the transformers class its
    config.json names, or what a flaxheads export records); None for a bare or pretraining
    checkpoint, whose head any task would start anew, and for a folder that is not a readable
    model (loading it says what is wrong, in its own words)."""
    hf = saved_config(folder)
    if hf is None:
        return None
    return next((task for task in TASKS.values() if task.holds(hf)), None)


MODELS: dict[str, type] = {name: task.model_class for name, task in TASKS.items()}
"""The model class of each task, by its name (`*ForSequenceClassification`,
`*ForTokenClassification`, `*ForMultipleChoice`): a view of `TASKS` taken at import."""


def from_pretrained(path, *, task: str = DEFAULT, **options):
    """`TASKS[task].model_class.from_pretrained(path, **options)`: a `SequenceClassifier` by
    default, a `TokenClassifier` for task="token-classification", a `MultipleChoice` for
    task="multiple-choice", a `QuestionAnswering` for task="question-answering" (options:
    `SequenceClassifier.from_pretrained`'s). ValueError naming the tasks for an unknown one; a
    checkpoint of another task's transformers class is refused with the task to pass."""
    return named(task).model_class.from_pretrained(path, **options)


PIPELINES: dict[str, Callable] = {name: task.pipeline for task in TASKS.values() if task.has_pipeline()
                                  for name in (task.name, *task.aliases)}
"""The pipeline builder of each task with a pipeline, by transformers' pipeline names and aliases."""


def pipeline(task: str = DEFAULT, model=None, tokenizer=None, **options):
    """A pipeline answering as `transformers.pipeline(task, model=..., tokenizer=..., **options)`,
    over a flaxheads model in memory or the folder of a trained one (`Task.pipeline`).

    - "text-classification" ("sentiment-analysis"): `text_classification_pipeline`; options
      `max_seq_length`, `batch_size`.
    - "token-classification" ("ner"): `token_classification_pipeline`; options
      `aggregation_strategy`, `ignore_labels`, `stride`, `batch_size`.
    - "multiple-choice": `multiple_choice_pipeline` (per example the choice picked, as `flaxheads
      predict` answers); options `max_seq_length`, `batch_size`.

    ValueError naming the tasks for an unknown one; a model of another task is refused naming the
    task that reads it.
    """
    with_pipelines = [name for name, one in TASKS.items() if one.has_pipeline()]
    chosen = next((one for one in TASKS.values() if task == one.name or task in one.aliases), None)
    if chosen is None or not chosen.has_pipeline():
        names = [n for name in with_pipelines for n in (name, *TASKS[name].aliases)]
        raise ValueError(f"flaxheads.pipeline answers task={' or '.join(map(repr, names))}, not {task!r}")
    if model is not None and not isinstance(model, PretrainedModel):
        model = open_model_folder(model)  # read once: the task's pipeline takes the opened folder
        theirs = of_checkpoint(model)
        if theirs is not None and theirs is not chosen:
            raise ValueError(other_task(f"{model} holds a {theirs.name} model", theirs.name, task,
                                        has_pipeline=theirs.has_pipeline()))
    elif model is not None and model.config.task != chosen.name and model.config.task in TASKS:
        theirs = TASKS[model.config.task]
        raise ValueError(other_task(f"model= is a {type(model).__name__}", theirs.name, task,
                                    has_pipeline=theirs.has_pipeline()))
    return chosen.pipeline(model, tokenizer, **options)


def setting_choices() -> dict[str, tuple[str, ...]]:
    """The valid values of the `TrainConfig` settings that tasks read (`task` itself, and each
    task's `setting_choices`): what the command line's flags accept beside `config.CHOICES`."""
    choices: dict[str, tuple[str, ...]] = {"task": tuple(TASKS)}
    for task in TASKS.values():
        choices.update(task.setting_choices)
    return choices


def _publish_settings() -> None:
    """`names.TASK_SETTINGS` made `setting_choices()`: where TrainConfig and the command line read them."""
    names.TASK_SETTINGS.clear()
    names.TASK_SETTINGS.update(setting_choices())


__all__ = ["DEFAULT", "MODELS", "PIPELINES", "TASKS", "Task", "from_pretrained", "named", "of_checkpoint", "of_model",
           "pipeline", "register", "setting_choices", "unregister"]
