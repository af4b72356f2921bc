"""Text classification ("text-classification"): a label per text or text pair, the problem types
of `flaxheads.problem` (single-label, multi-label, regression, pairwise reward), transformers'
`*ForSequenceClassification` and every head of `flaxheads.heads`."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Mapping
from typing import Any

from flaxheads import data, problem
from flaxheads.conversion.table import SEQUENCE_CLASSIFICATION, TOKEN_CLASSIFICATION
from flaxheads.data.files import MissingColumn
from flaxheads.model import FLAXHEADS_CONFIG_KEY
from flaxheads.tasks.classification.command import predict_rows
from flaxheads.tasks.classification.inference import evaluate
from flaxheads.tasks.classification.model import ClassifierConfig, SequenceClassifier, saved_classes
from flaxheads.tasks.classification.pipeline import text_classification_pipeline
from flaxheads.tasks.base import Task
from flaxheads.tokenizer import check_room_for_text
from flaxheads.training import calibration, metrics
from flaxheads.training.config import TrainConfig
from flaxheads.training.loop import print0
from flaxheads.training.objective import ProblemObjective
from flaxheads.training.scoring import SplitScorer, describe_predictions


class TextClassification(Task):
    name = SEQUENCE_CLASSIFICATION
    aliases = ("sentiment-analysis",)
    model_class = SequenceClassifier
    noun = "sequence classifier"

    # -- data ----------------------------------------------------------------------------------

    def holds(self, hf: Mapping[str, Any]) -> bool:
        """A `*ForSequenceClassification`, or a flaxheads export of a head transformers has no class
        for (on the bare backbone class: config.json's flaxheads section names the head)."""
        return super().holds(hf) or "head" in (hf.get(FLAXHEADS_CONFIG_KEY) or {})

    def reads(self, source: Mapping[str, Any]) -> bool:
        return True  # what no other task claims is text: the registry asks this task last

    def load_data(self, source: Mapping[str, Any]) -> data.TaskData:
        columns = {name: source.get(name) for name in ("text_column", "text_pair_column", "label_column",
                                                        "problem_type", "num_labels", "chosen_column",
                                                        "rejected_column")}
        columns = {name: value for name, value in columns.items() if value is not None or name in (
            "text_pair_column", "problem_type", "num_labels")}
        train_file, validation_file, test_file = (source.get(f"{split}_file") for split in ("train", "validation",
                                                                                           "test"))
        class_names = source.get("class_names")
        if train_file or (class_names is not None and (validation_file or test_file)):
            try:
                return data.load_local_files(train_file=train_file, validation_file=validation_file,
                                             test_file=test_file, class_names=None if train_file else class_names,
                                             **columns)
            except MissingColumn as error:
                if source.get("task") is None and train_file and str(train_file).lower().endswith(".tsv"):
                    # A .tsv is a table of texts or CoNLL columns; it was read as a table.
                    raise ValueError(f"{error} ({train_file} was read as a table of texts and labels; if it holds "
                                     f"words and their tags in CoNLL columns, pass task='{TOKEN_CLASSIFICATION}')"
                                     ) from error
                raise
        if validation_file or test_file:
            # Without this, the built-in or hub data set below would be scored instead of the user's file.
            named = " and ".join(f"{flag}={path}" for flag, path in (("validation_file", validation_file),
                                                                      ("test_file", test_file)) if path)
            raise ValueError(f"{named} without a train_file: text classification reads its classes from the train "
                             "file, or from a trained classifier's config.json (and this model is none). Give the "
                             "train_file (--train_file) as well, or a trained sequence classifier")
        if source.get("dataset_name"):
            return data.load_named_dataset(source["dataset_name"], **columns)
        if source.get("dataset"):
            return data.load_builtin(source["dataset"], seed=source.get("seed", 0))
        raise ValueError("no data: give a train_file, a dataset_name (a hub data set) or a dataset (a built-in one)")

    def scoring_source(self, folder, source: dict[str, Any]) -> dict[str, Any]:
        """A trained classifier's classes and problem type (config.json; a problem_type given wins),
        so that validation or test files are read alone, against them."""
        classes = saved_classes(folder)
        if classes is not None and (source.get("validation_file") or source.get("test_file")):
            source = {**source, "class_names": classes.names,
                      "problem_type": source.get("problem_type") or classes.problem_type}
        return source

    def in_memory(self, splits: Mapping[str, Any], column_args: dict[str, Any]) -> data.InMemoryTask:
        return data.load_in_memory(splits, **column_args)

    def data_for(self, given: data.InMemoryTask, split: str, dataset, column_args: dict[str, Any]
                 ) -> data.InMemoryTask:
        return data.load_in_memory({split: dataset}, beside=given.source_train, **column_args)

    # -- the model -----------------------------------------------------------------------------

    def load_settings(self, data_task: data.TaskData, cfg: TrainConfig) -> dict[str, Any]:
        return {**super().load_settings(data_task, cfg), "head": cfg.head, "problem_type": data_task.problem_type}

    def fit_config(self, config: ClassifierConfig, data_task: data.TaskData, args: TrainConfig) -> ClassifierConfig:
        """The model's config with the data's problem type and class names (its decision
        thresholds dropped when the run trains it further), or ValueError naming what to change
        when the model cannot learn these labels."""
        reason = data_task.described
        if config.num_labels != data_task.num_labels:
            raise ValueError(
                f"the model has {config.num_labels} labels but the data has {data_task.num_labels} ({reason}). Load "
                f"the model with from_pretrained(..., num_labels={data_task.num_labels}) (and "
                "ignore_mismatched_sizes=True when its checkpoint has a trained head of another size), or, for class "
                f"ids the train data does not all use, pass TrainConfig(num_labels={config.num_labels})"
            )
        if config.problem_type not in (None, data_task.problem_type):
            raise ValueError(
                f"the model is set up for {config.problem_type} but the data reads as {reason}. Pass "
                f"TrainConfig(problem_type={config.problem_type!r}) to read the labels so, or load the model with "
                f"from_pretrained(..., problem_type={data_task.problem_type!r})"
            )
        names = tuple(data_task.id2label[i] for i in range(data_task.num_labels))
        default = tuple(data.task.default_id2label(data_task.num_labels).values())
        if names == default:
            names = config.labels
        elif config.labels not in (None, default, names):
            raise ValueError(
                f"the model's classes are {list(config.labels)} but the data's are {list(names)} (class ids by "
                "the sorted names of the train labels): give the data the model's classes, or load the model with "
                f"from_pretrained(..., id2label={list(names)}) to relabel its head"
            )
        config = dataclasses.replace(config, problem_type=data_task.problem_type, labels=names,
                                     text_pair=data_task.has_text_pair)
        if args.do_train and config.thresholds is not None:
            print0("note: the model's decision thresholds are dropped: they were tuned for the weights this run "
                   "trains further (tune_thresholds=True tunes new ones)", file=sys.stderr)
            config = dataclasses.replace(config, thresholds=None)
        return config

    # -- training ------------------------------------------------------------------------------

    def check_settings(self, args: TrainConfig, data_task: data.TaskData, *, tokenizer, max_seq_length: int) -> None:
        if args.tune_thresholds and data_task.problem_type != problem.MULTI_LABEL:
            raise ValueError(f"tune_thresholds=True tunes the decision thresholds of {problem.MULTI_LABEL}, and the "
                             f"data reads as {data_task.problem_type}: leave tune_thresholds out")
        if args.calibrate:
            calibration.check_problem_type(data_task.problem_type)
        if data_task.problem_type != problem.PAIRWISE_REWARD:
            check_room_for_text(tokenizer, max_seq_length, pairs=data_task.has_text_pair)

    def loss_options(self, args: TrainConfig, data_task: data.TaskData) -> dict[str, Any]:
        """{"class_weights": weights in class-id order (resolved from the train split for
        "balanced")} and {"label_smoothing": f}, each only when set; ValueError naming the setting
        when it does not fit the problem type or the number of classes."""
        options: dict[str, Any] = {}
        if args.label_smoothing_factor:
            if data_task.problem_type != problem.SINGLE_LABEL:
                raise ValueError(f"label_smoothing_factor={args.label_smoothing_factor} smooths single-label targets, "
                                 f"but the data reads as {data_task.problem_type}: leave it out")
            options["label_smoothing"] = float(args.label_smoothing_factor)
        if args.class_weights is None:
            return options
        if data_task.problem_type not in (problem.SINGLE_LABEL, problem.MULTI_LABEL):
            raise ValueError(f"class_weights={args.class_weights!r} weights classes, but the data reads as "
                             f"{data_task.problem_type}, which has none: leave class_weights out")
        weights = args.class_weight_values()
        if weights is None:
            weights = problem.balanced_class_weights(data_task.splits["train"][data.task.LABEL],
                                                     data_task.problem_type, data_task.num_labels)
        if len(weights) != data_task.num_labels:
            names = [data_task.id2label[i] for i in range(data_task.num_labels)]
            raise ValueError(f"class_weights={args.class_weights!r} gives {len(weights)} weight(s) but the data has "
                             f"{data_task.num_labels} classes ({', '.join(names)}, in this order): give one weight per "
                             "class")
        options["class_weights"] = tuple(weights)
        return options

    def objective(self, data_task: data.TaskData, loss_options: Mapping[str, Any]) -> ProblemObjective:
        return ProblemObjective(data_task.problem_type, **loss_options)

    def default_metric(self, data_task: data.TaskData) -> str:
        return "mse" if data_task.problem_type == problem.REGRESSION else "accuracy"

    def metric_names(self, data_task: data.TaskData) -> tuple[str, ...]:
        """The problem type's metrics; two classes add the positive class's f1, precision and recall."""
        if data_task.problem_type == problem.SINGLE_LABEL:
            return metrics.single_label_names(data_task.num_labels)
        return super().metric_names(data_task)

    def scorer(self, graphdef, splits, batch_format, layout, *, data_task: data.TaskData, config, args: TrainConfig,
               source: Any = None, **options) -> SplitScorer:
        return SplitScorer(graphdef, splits, batch_format, layout, **options, class_names=config.label_names,
                           thresholds=config.thresholds, objective=self.objective(data_task, {}))

    def predicted(self, logits, config: ClassifierConfig, data_task: data.TaskData) -> list:
        return describe_predictions(data_task.problem_type, logits, config.label_names, config.thresholds)

    def problem_name(self, data_task: data.TaskData) -> str:
        return data_task.problem_type

    # -- a trained model -----------------------------------------------------------------------

    def evaluate(self, folder, data_task: data.TaskData, split: str, *, options: Mapping[str, Any]) -> dict:
        return evaluate(folder, data_task, split, max_seq_length=options["max_seq_length"],
                        batch_size=options["batch_size"], tokenizer_name=options.get("tokenizer_name"),
                        packing=bool(options.get("packing")), max_segments_per_row=options.get("max_segments_per_row"))

    def predict_command(self, folder, inputs: Mapping[str, Any]) -> list[dict]:
        return predict_rows(folder, inputs)

    def pipeline(self, model, tokenizer, **options):
        return text_classification_pipeline(model, tokenizer, **options)


TASK = TextClassification()
