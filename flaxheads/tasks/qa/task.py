"""Extractive question answering ("question-answering"): the span of a context that answers a
question (SQuAD v1.1, v2.0), transformers' `*ForQuestionAnswering`; the loss is the mean of the
start and end cross entropies."""

from __future__ import annotations

from typing import Any

from flaxheads import data
from flaxheads.tasks.base import Task
from flaxheads.tasks.qa.model import CONVERSION_ROWS, QUESTION_ANSWERING, QuestionAnswering
from flaxheads.training.config import TrainConfig


class QuestionAnsweringTask(Task):
    name = QUESTION_ANSWERING
    model_class = QuestionAnswering
    noun = "question-answering model"
    problem = "question_answering"
    files = ("SQuAD files (SQuAD's nested JSON, or JSON / JSON Lines / CSV with id, question, context and answers "
             "columns)")
    conversion_rows = CONVERSION_ROWS
    """Each family's `*ForQuestionAnswering` (XLNet's two classes): `model.CONVERSION_ROWS`."""

    # -- data ----------------------------------------------------------------------------------
    # To come with the data readers (tasks/qa/data.py): reads, load_data, scoring_source, data_for,
    # in_memory, settings and setting_choices (doc_stride, n_best_size, max_answer_length,
    # version_2_with_negative, null_score_diff_threshold). Until then the base class refuses QA data.

    # -- the model -----------------------------------------------------------------------------

    def load_settings(self, data_task: data.TaskData, cfg: TrainConfig) -> dict[str, Any]:
        """The head is the family's own; `head` may name XLNet's other one ("squad",
        `XLNetForQuestionAnswering`), and `from_pretrained` refuses any other naming the family's."""
        return {"head": cfg.head}

    # -- training ------------------------------------------------------------------------------
    # To come with the objective and post-processing (tasks/qa/objective.py, postprocess.py,
    # metrics.py): check_settings (refusing packing, class weights, calibration, thresholds),
    # loss_options, objective (over `model.span_loss_terms` / `model.squad_loss_terms`, which
    # `QuestionAnswering.loss` reduces the same way), metric_names, default_metric ("f1"),
    # one_row_per_example (windows), scorer, predicted, format_predictions (predictions.json),
    # identity.

    # -- a trained model -----------------------------------------------------------------------
    # To come: evaluate, predict_command (tasks/qa/command.py), pipeline (tasks/qa/pipeline.py).


TASK = QuestionAnsweringTask()
"""Question answering ("question-answering"): a span of the context per question. `model.py`
(`QuestionAnswering`, its losses, each family's conversion row), `task.py` (its `Task`)."""
