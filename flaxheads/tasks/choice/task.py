"""Multiple choice ("multiple-choice"): the right one of each example's choices (SWAG, RACE), each
choice read as the pair (context, choice) as run_swag.py does, transformers' `*ForMultipleChoice`;
the metric is accuracy."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from flaxheads import data
from flaxheads.conversion.table import MULTIPLE_CHOICE
from flaxheads.tasks.base import Task
from flaxheads.tasks.choice import data as choice_data
from flaxheads.tasks.choice.command import predict_rows
from flaxheads.tasks.choice.inference import evaluate_choices
from flaxheads.tasks.choice.model import MultipleChoice
from flaxheads.tasks.choice.objective import OBJECTIVE, ChoiceObjective
from flaxheads.tokenizer import check_room_for_text
from flaxheads.training.config import TrainConfig
from flaxheads.training.scoring import SplitScorer


class MultipleChoiceTask(Task):
    name = MULTIPLE_CHOICE
    model_class = MultipleChoice
    noun = "multiple-choice model"
    problem = choice_data.PROBLEM
    settings = ("context_column", "question_column", "choice_columns")
    files = "choice files (CSV, JSON or JSON Lines with a context column, choice columns and a label column)"
    settings_are = "name multiple-choice columns"

    # -- data ----------------------------------------------------------------------------------

    def reads(self, source: Mapping[str, Any]) -> bool:
        train_file = source.get("train_file")
        return bool(source.get("choice_columns")) or bool(
            train_file and choice_data.looks_like_choice_file(train_file, source.get("text_column") or "text"))

    def load_data(self, source: Mapping[str, Any]) -> data.TaskData:
        if not source.get("train_file"):
            raise ValueError(f"task={self.name!r} reads {self.files}: give a train_file")
        return choice_data.load_choice_files(
            train_file=source["train_file"], validation_file=source.get("validation_file"),
            test_file=source.get("test_file"), label_column=source.get("label_column") or "label",
            context_column=source.get("context_column"), question_column=source.get("question_column"),
            choice_columns=source.get("choice_columns"))

    def data_for(self, given: data.InMemoryTask, split: str, dataset, column_args: dict[str, Any]):
        raise NotImplementedError("evaluate(dataset) and predict(dataset) take texts; for multiple choice give the "
                                  "Trainer the data as task= (flaxheads.data.choice_task) and call them without a "
                                  "dataset")

    # -- the model -----------------------------------------------------------------------------

    def load_settings(self, data_task: data.TaskData, cfg: TrainConfig) -> dict[str, Any]:
        return {"head": cfg.head}  # its family's one-output head; the loader refuses another

    # -- training ------------------------------------------------------------------------------

    def check_settings(self, args: TrainConfig, data_task: data.TaskData, *, tokenizer, max_seq_length: int) -> None:
        super().check_settings(args, data_task, tokenizer=tokenizer, max_seq_length=max_seq_length)
        check_room_for_text(tokenizer, max_seq_length, pairs=True)

    def objective(self, data_task: data.TaskData, loss_options: Mapping[str, Any]) -> ChoiceObjective:
        return OBJECTIVE

    def scorer(self, graphdef, splits, batch_format, layout, *, data_task: data.TaskData, config, args: TrainConfig,
               source: Any = None, **options) -> SplitScorer:
        return SplitScorer(graphdef, splits, batch_format, layout, **options, objective=OBJECTIVE)  # no classes

    def predicted(self, logits, config, data_task: data.TaskData) -> list:
        return [int(i) for i in np.asarray(logits).argmax(axis=-1)]

    def format_predictions(self, predicted: list, data_task: data.TaskData) -> str:
        """predict_results.txt of multiple choice: a header, then "index<TAB>prediction<TAB>choice" per
        example: the chosen index and the text read as that choice (tabs and line ends as spaces)."""
        choices = data_task.splits["test"][choice_data.CHOICES]
        lines = ["index\tprediction\tchoice"]
        for index, (choice, texts) in enumerate(zip(predicted, choices)):
            lines.append(f"{index}\t{choice}\t{' '.join(texts[choice].split())}")
        return "\n".join(lines) + "\n"

    # -- a trained model -----------------------------------------------------------------------

    def evaluate(self, folder, data_task: data.TaskData, split: str, *, options: Mapping[str, Any]) -> dict:
        return evaluate_choices(folder, data_task, split, max_seq_length=options["max_seq_length"],
                                batch_size=options["batch_size"], tokenizer_name=options.get("tokenizer_name"))

    def predict_command(self, folder, inputs: Mapping[str, Any]) -> list[dict]:
        return predict_rows(folder, inputs)

    def pipeline(self, model, tokenizer, **options):
        from flaxheads.tasks.choice.pipeline import multiple_choice_pipeline

        return multiple_choice_pipeline(model, tokenizer, **options)


TASK = MultipleChoiceTask()
