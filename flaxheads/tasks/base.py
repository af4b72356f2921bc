"""The `Task` protocol: what a task is to the rest of flaxheads.

A task is what a model is trained to answer, named once by transformers' pipeline name
("text-classification", "token-classification", "multiple-choice"): its model class, how its
data is read and becomes rows, its loss, metrics and predictions, how a trained model of it
evaluates, predicts and answers as a pipeline. The trainer (`tasks/runs.py` over
`training.trainer`), the command line, evaluation and prediction, the pipeline factory and the
conversion of a folder ask a `Task` from the registry (`flaxheads.tasks.TASKS`) and never branch on
a task's name or model class.

A new task subclasses `Task`, fills in its model class and the methods its data needs, and is
registered (`flaxheads.tasks.register`). The defaults below are those of a task whose examples
carry one label each and whose model is a `PretrainedModel` loaded by `from_pretrained`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from flaxheads import data
from flaxheads.model import saved_task
from flaxheads.training.config import TrainConfig
from flaxheads.training.objective import Objective


class Task:
    """What one task is. Subclasses set the class attributes and override what differs."""

    name: ClassVar[str]
    """Its one name, transformers' pipeline name (the registry's key, `TaskData.task`,
    `config_class.task`, the conversion tables' key)."""
    aliases: ClassVar[tuple[str, ...]] = ()
    """Other names of its pipeline, transformers' aliases (`flaxheads.pipeline("ner")`)."""
    model_class: ClassVar[type]
    """The model the task trains: a `PretrainedModel` whose `config_class.task` is `name`."""
    problem: ClassVar[str]
    """How run.json's identity and messages name what the labels are (a problem type for text
    classification: the data's own)."""
    settings: ClassVar[tuple[str, ...]] = ()
    """The `TrainConfig` / `load_task` settings only this task reads (refused for other tasks' data)."""
    setting_choices: ClassVar[dict[str, tuple[str, ...]]] = {}
    """The valid values of the `TrainConfig` settings this task reads that have a fixed set (the
    command line's choices; `check_settings` checks them)."""
    files: ClassVar[str] = ""
    """What files the task reads, for messages ("" : it reads text-classification files too)."""
    settings_are: ClassVar[str] = ""
    """What its `settings` do, for messages ("label token classification data")."""
    noun: ClassVar[str] = "model"
    """What its model is called in messages ("token classifier")."""
    conversion_rows: ClassVar[Mapping[str, Any]] = {}
    """A task registered beside the built-in ones: each family's transformers class for it
    (`conversion.TaskTable` by `model_type`), which `register` adds to the conversion tables. The
    built-in tasks' rows are in the tables themselves (`conversion/<family>.py`)."""

    def holds(self, hf: Mapping[str, Any]) -> bool:
        """Whether a saved config.json (`model.saved_config`) is of this task's model: its
        architectures name the task's transformers class."""
        return saved_task(hf) == self.name

    def given(self, source: Mapping[str, Any]) -> list[str]:
        """`name=value` of each of this task's `settings` that `source` gives (for messages)."""
        return given_settings(source, self.settings)

    def problem_name(self, data_task: data.TaskData) -> str:
        """What the labels are, as the run identity records it ("problem_type")."""
        return self.problem

    # -- data ----------------------------------------------------------------------------------

    def reads(self, source: Mapping[str, Any]) -> bool:
        """Whether data that names no task (`load_task(task=None)`) is this task's, from its files
        or settings (`source`: `load_task`'s arguments)."""
        return False

    def load_data(self, source: Mapping[str, Any]) -> data.TaskData:
        """The data `source` (`load_task`'s arguments) names, read as this task's."""
        raise NotImplementedError(f"{self.name} reads no data files")

    def scoring_source(self, folder, source: dict[str, Any]) -> dict[str, Any]:
        """`source` completed from the trained model in `folder` to score it without a train file
        (its labels); as it is by default."""
        return source

    def data_for(self, data_task: data.TaskData, split: str, dataset, column_args: dict[str, Any]
                 ) -> data.InMemoryTask:
        """`dataset` (held in Python) as split `split` of data like `data_task`, with its classes
        (`Trainer.evaluate(dataset)` / `predict(dataset)`)."""
        raise NotImplementedError(f"evaluate(dataset) and predict(dataset) take texts; for {self.name} give the "
                                  "Trainer the data as task= and call them without a dataset")

    def unlabelled_splits(self, data_task: data.TaskData) -> frozenset[str]:
        """The splits of `data_task` read from files that carry no labels (to predict, not score)."""
        return frozenset()

    def in_memory(self, splits: Mapping[str, Any], column_args: dict[str, Any]) -> data.InMemoryTask:
        """`Trainer(train_dataset=..., ...)`'s splits held in Python, read with `column_args`."""
        raise ValueError(f"a {self.model_class.__name__} trains on {self.name} data: pass it as task= "
                         f"(TaskData), not as train_dataset / eval_dataset / test_dataset")

    # -- the model -----------------------------------------------------------------------------

    def load_settings(self, data_task: data.TaskData, cfg: TrainConfig) -> dict[str, Any]:
        """`from_pretrained`'s head and label settings for a model that trains on `data_task`."""
        return {"num_labels": data_task.num_labels,
                "id2label": [data_task.id2label[i] for i in range(data_task.num_labels)]}

    def fit_config(self, config, data_task: data.TaskData, args: TrainConfig):
        """The model's config fitted to the data (its labels), or ValueError naming what to change
        when the model cannot learn them."""
        return config

    # -- training ------------------------------------------------------------------------------

    def check_settings(self, args: TrainConfig, data_task: data.TaskData, *, tokenizer, max_seq_length: int) -> None:
        """ValueError naming a setting this task's data cannot take (before anything is trained)."""
        for name, choices in self.setting_choices.items():
            value = getattr(args, name)
            if value is not None and value not in choices:
                raise ValueError(f"{name}={value!r}: choose one of {', '.join(choices)}")
        refused = [name for name, on in (("calibrate=True", args.calibrate), ("tune_thresholds=True",
                                                                               args.tune_thresholds),
                                         (f"class_weights={args.class_weights!r}", args.class_weights is not None),
                                         (f"label_smoothing_factor={args.label_smoothing_factor}",
                                          bool(args.label_smoothing_factor))) if on]
        if refused:
            raise ValueError(f"{' and '.join(refused)} apply to text classification, and the data is "
                             f"{data_task.described}: leave {'them' if len(refused) > 1 else 'it'} out")

    def loss_options(self, args: TrainConfig, data_task: data.TaskData) -> dict[str, Any]:
        """The training loss's options the settings give (recorded in the run identity)."""
        return {}

    def objective(self, data_task: data.TaskData, loss_options: Mapping[str, Any]) -> Objective:
        """What the train and eval steps compute for this task's batches."""
        raise NotImplementedError

    def default_metric(self, data_task: data.TaskData) -> str:
        """The metric the best model follows unless metric_for_best_model names another."""
        return "accuracy"

    def metric_names(self, data_task: data.TaskData) -> tuple[str, ...]:
        """The metrics an evaluation reports (what metric_for_best_model may name, with "loss")."""
        return self.objective(data_task, {}).metric_names

    def one_row_per_example(self, data_task: data.TaskData) -> bool:
        """Whether each example is one row (else the rows are known once the split is tokenised)."""
        return data_task.rows is None or not data_task.rows.whole_split

    def scorer(self, graphdef, splits, batch_format, layout, *, data_task: data.TaskData, config, args: TrainConfig,
               source: Any = None, **options):
        """The scorer of the tokenised `splits` (`training.scoring.SplitScorer` or a subclass);
        `source`: another `TaskData.source` than `data_task`'s (data given to evaluate)."""
        from flaxheads.training.scoring import SplitScorer

        return SplitScorer(graphdef, splits, batch_format, layout, **options,
                           objective=self.objective(data_task, {}))

    def predicted(self, logits, config, data_task: data.TaskData) -> list:
        """Per example of a split, what the model predicts (as predict_results.txt writes it)."""
        raise NotImplementedError

    def format_predictions(self, predicted: list, data_task: data.TaskData) -> str:
        """predict_results.txt of `predicted` (run_glue's: a header, then index<TAB>prediction)."""
        from flaxheads.training.scoring import format_predictions

        return format_predictions(predicted)

    def write_predictions(self, output_dir, predicted: list, data_task: data.TaskData, scorer, *,
                          overwrite: bool) -> list:
        """Writes the test split's predictions into a run's `output_dir` (predict_results.txt of
        `format_predictions`; `scorer` scored the split) and returns the paths written."""
        from flaxheads.training import run_dir

        return [run_dir.write_predictions(output_dir, self.format_predictions(predicted, data_task),
                                          overwrite=overwrite)]

    def identity(self, data_task: data.TaskData, args: TrainConfig) -> dict[str, dict[str, Any]]:
        """What the run identity records of this task beyond what every run records:
        {"trained": {...}, "settings": {...}}, each entry only when it applies (earlier runs'
        identities hold)."""
        return {"trained": {}, "settings": {}}

    # -- a trained model -----------------------------------------------------------------------

    def evaluate(self, folder, data_task: data.TaskData, split: str, *, options: Mapping[str, Any]) -> dict:
        """A saved model's scores on `split` of `data_task` (`flaxheads evaluate`)."""
        raise NotImplementedError(f"flaxheads evaluate does not score {self.name} models yet")

    def predict_command(self, folder, inputs: Mapping[str, Any]) -> list[dict]:
        """`flaxheads predict`'s rows for a saved model of this task: `inputs` are the command's
        arguments (texts, input_file, text_pairs, max_seq_length, ...)."""
        raise NotImplementedError(f"flaxheads predict does not answer for {self.name} models yet")

    def pipeline(self, model, tokenizer, **options):
        """A pipeline answering as transformers' pipeline of this task (`flaxheads.pipeline`)."""
        raise ValueError(f"flaxheads.pipeline has no {self.name!r} pipeline")

    def has_pipeline(self) -> bool:
        return type(self).pipeline is not Task.pipeline

    def __repr__(self) -> str:
        return f"<task {self.name}>"


def given_settings(source: Mapping[str, Any], names: Sequence[str]) -> list[str]:
    """`name=value` of each setting in `names` that `source` gives (not None, not False)."""
    shown = []
    for name in names:
        value = source.get(name)
        if value is None or value is False or value == ():
            continue
        shown.append(f"{name}=True" if value is True else f"{name}={value!r}")
    return shown
