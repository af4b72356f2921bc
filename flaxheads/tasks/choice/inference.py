"""Evaluation and prediction with a saved multiple-choice model: what `flaxheads evaluate |
predict` do with multiple-choice data and models. Both read examples as training does
(`tasks.choice.data`) and refuse weights that were never trained.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import datasets
import numpy as np
from flax import nnx

from flaxheads import data, problem
from flaxheads.conversion.table import MULTIPLE_CHOICE
from flaxheads.inference import checkpoint_task, open_trained
from flaxheads.tasks.choice.data import CHOICE_EXAMPLES, CHOICE_ROWS, CHOICES, read_choice_file
from flaxheads.tasks.choice.model import MultipleChoice
from flaxheads.tasks.choice.objective import OBJECTIVE
from flaxheads.tokenizer import check_room_for_text
from flaxheads.training import metrics as metrics_lib
from flaxheads.training.scoring import PredictionOutput, SplitScorer
from flaxheads.training.sharding import Layout


def is_multiple_choice(model_dir: str | os.PathLike) -> bool:
    """Whether `model_dir` holds a multiple-choice model (config.json names a `*ForMultipleChoice`)."""
    try:
        return checkpoint_task(model_dir) == MULTIPLE_CHOICE
    except (OSError, ValueError):
        return False  # not a readable model folder: loading it says what is wrong, in its own words


def evaluate_choices(model_dir: str | Path, task: data.TaskData, split: str, *, max_seq_length: int = 128,
                     batch_size: int = 64, tokenizer_name: str | None = None) -> dict[str, float]:
    """{"accuracy", "loss"} of a saved (trained) multiple-choice model on `split` of
    multiple-choice data (`tasks.choice.data.load_choice_files`), as `flaxheads train` reports them."""
    if split not in task.splits:
        raise ValueError(f"the data has no {split!r} split; it has {sorted(task.splits)}")
    return _scored(model_dir, task, split, max_seq_length=max_seq_length, batch_size=batch_size,
                   tokenizer_name=tokenizer_name).metrics


def predict_choices(model_dir: str | Path, path: str | os.PathLike, *, max_seq_length: int = 128,
                    batch_size: int = 64, tokenizer_name: str | None = None, **columns) -> list[dict[str, Any]]:
    """For each row of the choice file `path` (labels are not needed; `columns` as
    `data.read_choice_file` takes them), in order: {"context", "label": the chosen index,
    "choice": the text read as that choice, "probabilities": one per choice}. Raises
    UntrainedModel for a model never trained, and FloatingPointError naming a row whose scores
    are not finite."""
    rows, read = read_choice_file(path, **columns)
    if data.task.LABEL in rows.column_names:
        rows = rows.remove_columns(data.task.LABEL)
    # The scorer takes labelled splits: a placeholder label, and the split marked unlabelled.
    rows = rows.add_column(data.task.LABEL, [0] * len(rows), feature=datasets.Value("int64"))
    num_choices = len(rows[0][CHOICES])
    task = data.TaskData(datasets.DatasetDict({"train": rows, "test": rows}), None, num_choices,
                         read.choice_names(num_choices), rows=CHOICE_ROWS, task=MULTIPLE_CHOICE,
                         example_format=CHOICE_EXAMPLES)
    logits = _scored(model_dir, task, "test", max_seq_length=max_seq_length, batch_size=batch_size,
                     tokenizer_name=tokenizer_name, unlabelled=True).predictions
    bad = np.flatnonzero(~np.isfinite(logits).all(axis=-1))
    if bad.size:
        row = data.files.file_places(Path(path), str(path)).at(int(bad[0]))
        raise FloatingPointError(f"the model in {model_dir} gives non-finite scores for {row}; no choice is reported")
    probabilities = metrics_lib.probabilities(problem.SINGLE_LABEL, logits)  # a softmax over each row's choices
    return [{"context": row[data.task.TEXT], "label": int(np.argmax(p)), "choice": row[CHOICES][np.argmax(p)],
             "probabilities": [float(x) for x in p]} for row, p in zip(rows, probabilities)]


def _scored(model_dir, task: data.TaskData, split: str, *, max_seq_length: int, batch_size: int,
            tokenizer_name: str | None, unlabelled: bool = False) -> PredictionOutput:
    model, tokenizer, max_seq_length = open_trained(model_dir, MultipleChoice, max_seq_length=max_seq_length,
                                                    tokenizer_name=tokenizer_name)
    check_room_for_text(tokenizer, max_seq_length, pairs=True)
    rows = CHOICE_ROWS.tokenize(task, split, tokenizer, max_seq_length)
    batch_format = data.BatchFormat.for_task(task, tokenizer, max_seq_length,
                                             model_pad_token_id=model.config.backbone.pad_token_id)
    model.eval()
    graphdef, params = nnx.split(model)
    scorer = SplitScorer(graphdef, {split: data.OwnSplit(rows, data.example_lengths(rows))}, batch_format,
                         Layout.create(), eval_batch=batch_size, unlabelled=frozenset({split} if unlabelled else ()),
                         objective=OBJECTIVE)
    return scorer.predict(split, params)


__all__ = ["evaluate_choices", "is_multiple_choice", "predict_choices"]
