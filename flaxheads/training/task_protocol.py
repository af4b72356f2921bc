"""What the Trainer asks of a task: the part of `flaxheads.tasks.Task` that training calls.

Training knows no task: everything that differs between tasks (how a model's config fits the
data, the loss, the scorer, the predictions, what the run identity records) is asked of the
task's object, given to the Trainer as `kind`. `flaxheads.tasks.Task` implements this protocol
(and more: reading data, evaluating and predicting with saved models, pipelines).
"""

from __future__ import annotations

from typing import Any, Mapping, Protocol

from flaxheads import data
from flaxheads.training.config import TrainConfig
from flaxheads.training.objective import Objective


class TaskKind(Protocol):
    name: str
    """The task's name in `flaxheads.tasks.TASKS` (transformers' pipeline name)."""

    def in_memory(self, splits: Mapping[str, Any], column_args: dict[str, Any]) -> data.InMemoryTask:
        """The Trainer's `train_dataset` / `eval_dataset` / `test_dataset` as the task's data."""

    def unlabelled_splits(self, data_task: data.TaskData) -> frozenset[str]:
        """The splits of data read from files that carry no labels (to predict, not score)."""

    def data_for(self, splits: data.InMemoryTask, split: str, dataset, column_args: dict[str, Any]
                 ) -> data.InMemoryTask:
        """`dataset` as split `split` of data like the run's (`Trainer.evaluate(dataset)`)."""

    def check_settings(self, args: TrainConfig, data_task: data.TaskData, *, tokenizer, max_seq_length: int) -> None:
        """ValueError naming a setting the task's data cannot take."""

    def fit_config(self, config, data_task: data.TaskData, args: TrainConfig):
        """The model's config fitted to the data's labels (ValueError naming what to change)."""

    def loss_options(self, args: TrainConfig, data_task: data.TaskData) -> dict[str, Any]:
        """The training loss's options the settings give."""

    def objective(self, data_task: data.TaskData, loss_options: Mapping[str, Any]) -> Objective:
        """What the train and eval steps compute."""

    def metric_names(self, data_task: data.TaskData) -> tuple[str, ...]:
        """The metrics an evaluation reports."""

    def default_metric(self, data_task: data.TaskData) -> str:
        """The metric the best model follows unless metric_for_best_model names another."""

    def one_row_per_example(self, data_task: data.TaskData) -> bool:
        """Whether each example is one row (else the rows are known once a split is tokenised)."""

    def scorer(self, graphdef, splits, batch_format, layout, *, data_task: data.TaskData, config, args: TrainConfig,
               source: Any = None, **options):
        """The scorer (`scoring.SplitScorer`) of tokenised splits."""

    def predicted(self, logits, config, data_task: data.TaskData) -> list:
        """What the model predicts per example, from a split's logits."""

    def format_predictions(self, predicted: list, data_task: data.TaskData) -> str:
        """predict_results.txt of the predictions."""

    def write_predictions(self, output_dir, predicted: list, data_task: data.TaskData, scorer, *,
                          overwrite: bool) -> list:
        """Writes the test split's predictions into `output_dir`; the paths written."""

    def problem_name(self, data_task: data.TaskData) -> str:
        """What the labels are, as the run identity records it ("problem_type")."""

    def identity(self, data_task: data.TaskData, args: TrainConfig) -> dict[str, dict[str, Any]]:
        """The task's own entries of the run identity: {"trained": {...}, "settings": {...}}."""


__all__ = ["TaskKind"]
