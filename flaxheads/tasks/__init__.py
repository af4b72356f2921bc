"""Tasks: what a model is trained to answer, each by its one name (transformers' pipeline name:
"text-classification", "token-classification", "multiple-choice"), each in its own folder here
(`classification/`, `token/`, `choice/`: its model, its `Task`, data, scoring, inference,
pipeline) behind one protocol (`base.Task`) and one registry (`registry.TASKS`).

    flaxheads.tasks.TASKS["token-classification"]    # its Task: model class, data, loss, scorer, pipeline
    flaxheads.tasks.register(MyTask())                # a new task: its folder and this one line

The trainer, the command line, evaluation and prediction, the pipeline factory and conversion ask
the task's `Task`; nothing outside this package branches on a task's name or model class.

The registry's names (`TASKS`, `register`, `named`, `of_model`, `of_checkpoint`, `from_pretrained`,
`pipeline`, ...) are imported from `registry` on first use, so that a task's light modules (its
tag schemes, say) import without every task's models.
"""

from __future__ import annotations

import importlib

_REGISTRY_NAMES = ("DEFAULT", "MODELS", "PIPELINES", "TASKS", "Task", "from_pretrained", "named", "of_checkpoint",
                   "of_model", "pipeline", "register", "setting_choices", "unregister")


def __getattr__(name: str):
    """A name of the registry (`registry.py`), imported on first use and kept."""
    if name not in _REGISTRY_NAMES:
        raise AttributeError(f"module 'flaxheads.tasks' has no attribute {name!r}")
    value = getattr(importlib.import_module("flaxheads.tasks.registry"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_REGISTRY_NAMES})


__all__ = list(_REGISTRY_NAMES)
