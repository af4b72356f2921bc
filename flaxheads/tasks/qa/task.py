"""Extractive question answering ("question-answering"): the span of a context that answers a
question (SQuAD v1.1, v2.0), transformers' `*ForQuestionAnswering`; the loss is the mean of the
start and end cross entropies, the windows and answers run_qa.py's, the metrics SQuAD's."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flaxheads import data
from flaxheads.tasks.base import Task, given_settings
from flaxheads.tasks.qa import data as qa_data
from flaxheads.tasks.qa.model import CONVERSION_ROWS, QUESTION_ANSWERING, QuestionAnswering
from flaxheads.tasks.qa.objective import SpanObjective
from flaxheads.tasks.qa.rows import PROBLEM, QASource, qa_task_data
from flaxheads.tasks.qa.windows import check_windows_fit
from flaxheads.training.config import TrainConfig

SETTINGS = ("version_2_with_negative", "doc_stride", "n_best_size", "max_answer_length", "null_score_diff_threshold")
"""run_qa.py's flags, which only question answering reads."""


class QuestionAnsweringTask(Task):
    name = QUESTION_ANSWERING
    model_class = QuestionAnswering
    noun = "question-answering model"
    problem = PROBLEM
    settings = SETTINGS
    files = ("SQuAD files (SQuAD's nested JSON, or JSON / JSON Lines / CSV with id, question, context and answers "
             "columns)")
    settings_are = "are run_qa.py's question-answering settings"
    conversion_rows = CONVERSION_ROWS
    """Each family's `*ForQuestionAnswering` (XLNet's two classes): `model.CONVERSION_ROWS`."""

    # -- data ----------------------------------------------------------------------------------

    def reads(self, source: Mapping[str, Any]) -> bool:
        """SQuAD data: the train file's first records (`data.looks_like_qa_file`); without a train
        file, a validation or test file that holds it."""
        files = [source.get("train_file")] if source.get("train_file") else [source.get("validation_file"),
                                                                               source.get("test_file")]
        return any(path and qa_data.looks_like_qa_file(path, labelled=False) for path in files)

    def given(self, source: Mapping[str, Any]) -> list[str]:
        return given_settings(source, SETTINGS)

    def load_data(self, source: Mapping[str, Any]) -> data.TaskData:
        files = {split: source.get(f"{split}_file") for split in ("train", "validation", "test")}
        if not any(files.values()):
            raise ValueError(f"task={self.name!r} reads {self.files}: give a train_file (or, to score a trained "
                             "model, a validation_file or test_file)")
        v2 = bool(source.get("version_2_with_negative"))
        examples = {split: qa_data.read_qa_file(path, version_2_with_negative=v2, labelled=None if split == "test"
                                                else True)
                    for split, path in files.items() if path}
        if "train" not in examples:  # scoring a trained model: the first split stands in for the train split
            examples = {"train": next(iter(examples.values())), **examples}
        return qa_task_data(examples, version_2_with_negative=v2, doc_stride=source.get("doc_stride"),
                            n_best_size=source.get("n_best_size") or 20,
                            max_answer_length=source.get("max_answer_length") or 30,
                            null_score_diff_threshold=source.get("null_score_diff_threshold") or 0.0)

    def scoring_source(self, folder, source: dict[str, Any]) -> dict[str, Any]:
        """Validation and test files alone are read as question answering: the folder's model says so."""
        return {**source, "task": source.get("task") or self.name}

    def unlabelled_splits(self, data_task: data.TaskData) -> frozenset[str]:
        """The splits whose examples carry no answers (a SQuAD v1.1 test file to predict)."""
        qa: QASource = data_task.source
        return frozenset(split for split in qa.examples if not qa.labelled(split))

    def data_for(self, given: data.InMemoryTask, split: str, dataset, column_args: dict[str, Any]
                 ) -> data.InMemoryTask:
        qa: QASource = given.task.source
        examples = qa_data.qa_examples(dataset, version_2_with_negative=qa.version_2_with_negative)
        labelled = any(example.answerable for example in examples) or qa.version_2_with_negative
        task = qa_task_data({"train": examples, split: examples}, version_2_with_negative=qa.version_2_with_negative,
                            doc_stride=qa.doc_stride, n_best_size=qa.n_best_size,
                            max_answer_length=qa.max_answer_length,
                            null_score_diff_threshold=qa.null_score_diff_threshold)
        return data.InMemoryTask(task, frozenset() if labelled else frozenset({split}), (split,))

    # -- the model -----------------------------------------------------------------------------

    def load_settings(self, data_task: data.TaskData, cfg: TrainConfig) -> dict[str, Any]:
        """The head is the family's own; `head` may name XLNet's other one ("squad",
        `XLNetForQuestionAnswering`), and `from_pretrained` refuses any other naming the family's."""
        return {"head": cfg.head}

    def fit_config(self, config, data_task: data.TaskData, args: TrainConfig):
        if config.head == "squad":
            raise ValueError("head='squad' (XLNetForQuestionAnswering's beam head) is not trained by flaxheads' "
                             "Trainer yet: its loss needs the gold start inside the forward pass and its answers "
                             "come from beams. Train XLNet with head='linear' (XLNetForQuestionAnsweringSimple), or "
                             "use QuestionAnswering.loss in your own loop")
        return config

    # -- training ------------------------------------------------------------------------------

    def check_settings(self, args: TrainConfig, data_task: data.TaskData, *, tokenizer, max_seq_length: int) -> None:
        super().check_settings(args, data_task, tokenizer=tokenizer, max_seq_length=max_seq_length)
        source: QASource = data_task.source
        if source.null_score_diff_threshold and not source.version_2_with_negative:
            raise ValueError(f"null_score_diff_threshold={source.null_score_diff_threshold} decides when SQuAD v2's "
                             "null answer wins, and version_2_with_negative is off: pass version_2_with_negative=True "
                             "(--version_2_with_negative), or leave the threshold out")
        for split, examples in source.examples.items():
            if split != "train" or args.do_train:
                check_windows_fit(examples, tokenizer, max_seq_length=max_seq_length,
                                  doc_stride=source.stride_for(max_seq_length))

    def objective(self, data_task: data.TaskData, loss_options: Mapping[str, Any]) -> SpanObjective:
        return SpanObjective(data_task.source.version_2_with_negative)

    def default_metric(self, data_task: data.TaskData) -> str:
        return "f1"

    def scorer(self, graphdef, splits, batch_format, layout, *, data_task: data.TaskData, config, args: TrainConfig,
               source: Any = None, **options):
        from flaxheads.tasks.qa.scoring import SpanSplitScorer

        qa = source or data_task.source
        return SpanSplitScorer(graphdef, splits, batch_format, layout, **options,
                               objective=SpanObjective(qa.version_2_with_negative), qa=qa)

    def predicted(self, logits, config, data_task: data.TaskData) -> list:
        return list(logits)  # the scorer's predictions are the answers' texts already

    def format_predictions(self, predicted: list, data_task: data.TaskData) -> str:
        from flaxheads.tasks.qa.scoring import format_answers

        return format_answers(predicted, data_task.source.examples["test"])

    def write_predictions(self, output_dir, predicted: list, data_task: data.TaskData, scorer, *,
                          overwrite: bool) -> list:
        """predict_results.txt, and run_qa.py's predict_predictions.json and
        predict_nbest_predictions.json (and predict_null_odds.json under SQuAD v2)."""
        from flaxheads.tasks.qa.postprocess import write_predictions

        written = super().write_predictions(output_dir, predicted, data_task, scorer, overwrite=overwrite)
        return written + write_predictions(output_dir, scorer.answers["test"], prefix="predict", overwrite=overwrite)

    def identity(self, data_task: data.TaskData, args: TrainConfig) -> dict[str, dict[str, Any]]:
        """How contexts become windows, and how answers are read from them (the metrics)."""
        qa: QASource = data_task.source
        return {"trained": {"question_answering": {"doc_stride": qa.doc_stride,
                                                   "version_2_with_negative": qa.version_2_with_negative}},
                "settings": {"answers": {"n_best_size": qa.n_best_size, "max_answer_length": qa.max_answer_length,
                                         "null_score_diff_threshold": qa.null_score_diff_threshold}}}

    # -- a trained model -----------------------------------------------------------------------

    def evaluate(self, folder, data_task: data.TaskData, split: str, *, options: Mapping[str, Any]) -> dict:
        from flaxheads.tasks.qa.inference import evaluate_qa

        if options.get("packing"):
            raise ValueError("packing=True (--packing) does not apply to question answering: each window of a "
                             "context is a row of its own. Evaluate without packing")
        return evaluate_qa(folder, data_task, split, max_seq_length=options["max_seq_length"],
                           batch_size=options["batch_size"], tokenizer_name=options.get("tokenizer_name"))

    def predict_command(self, folder, inputs: Mapping[str, Any]) -> list[dict]:
        from flaxheads.tasks.qa.command import predict_rows

        return predict_rows(folder, inputs)

    def pipeline(self, model, tokenizer, **options):
        from flaxheads.tasks.qa.pipeline import question_answering_pipeline

        return question_answering_pipeline(model, tokenizer, **options)


TASK = QuestionAnsweringTask()
