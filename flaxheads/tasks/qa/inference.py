"""Evaluation and prediction with a saved question-answering model: what `flaxheads evaluate |
predict` do with SQuAD data and QA models. Both read examples as training does (`rows.py`,
run_qa.py's windows) and answer as training scores (`scoring.SpanSplitScorer`: run_qa.py's
post-processing), and refuse weights that were never trained.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from flax import nnx

from flaxheads import data
from flaxheads.inference import open_trained
from flaxheads.tasks.qa.data import QAExample
from flaxheads.tasks.qa.model import QuestionAnswering
from flaxheads.tasks.qa.objective import SpanObjective
from flaxheads.tasks.qa.rows import qa_task_data, tokenize_examples
from flaxheads.tasks.qa.scoring import SpanSplitScorer
from flaxheads.training.sharding import Layout


def refuse_beam_head(model: QuestionAnswering, what: str) -> None:
    """ValueError for XLNet's full head ("squad"), whose outputs are beams, not span logits."""
    if model.config.head == "squad":
        raise ValueError(f"{what} reads span logits, and this model's head is XLNetForQuestionAnswering's beam head "
                         "('squad'), whose answers come from postprocess_qa_predictions_with_beam_search "
                         "(flaxheads.tasks.qa.postprocess); train with head='linear' (XLNetForQuestionAnsweringSimple) "
                         "to use it here")


def evaluate_qa(model_dir: str | Path, task: data.TaskData, split: str, *, max_seq_length: int = 384,
                batch_size: int = 64, tokenizer_name: str | None = None) -> dict[str, Any]:
    """A saved (trained) QA model's scores on `split` of question-answering data
    (`rows.qa_task_data`): SQuAD's metrics and the loss, as `flaxheads train` reports them."""
    if split not in task.splits:
        raise ValueError(f"the data has no {split!r} split; it has {sorted(task.splits)}")
    scorer, params = _scorer(model_dir, task, split, max_seq_length=max_seq_length, batch_size=batch_size,
                             tokenizer_name=tokenizer_name, unlabelled=not task.source.labelled(split))
    return scorer.predict(split, params).metrics


def answer_questions(model_dir: str | Path, examples: Sequence[QAExample], *, max_seq_length: int = 384,
                     doc_stride: int | None = None, n_best_size: int | None = None,
                     max_answer_length: int | None = None, version_2_with_negative: bool = False,
                     null_score_diff_threshold: float | None = None, batch_size: int = 64,
                     tokenizer_name: str | None = None) -> list[dict[str, Any]]:
    """For each example, in order: {"id", "question", "answer", "probability"} (the answer's
    softmax share of its n-best list, run_qa.py's) as run_qa.py's post-processing answers with
    these options; under SQuAD v2 also "null_odds". Raises UntrainedModel for a model never
    trained."""
    examples = list(examples)
    task = qa_task_data({"train": examples, "test": examples}, version_2_with_negative=version_2_with_negative,
                        doc_stride=doc_stride, n_best_size=n_best_size or 20,
                        max_answer_length=max_answer_length or 30,
                        null_score_diff_threshold=null_score_diff_threshold or 0.0)
    scorer, params = _scorer(model_dir, task, "test", max_seq_length=max_seq_length, batch_size=batch_size,
                             tokenizer_name=tokenizer_name, unlabelled=True)
    scorer.predict("test", params)
    found = scorer.answers["test"]
    rows = []
    for example in examples:
        text = found.answers[example.id]
        best = next((entry for entry in found.nbest[example.id] if entry["text"] == text), None)
        row = {"id": example.id, "question": example.question, "answer": text,
               "probability": None if best is None else float(best["probability"])}
        if found.null_odds is not None:
            row["null_odds"] = found.null_odds[example.id]
        rows.append(row)
    return rows


def _scorer(model_dir, task: data.TaskData, split: str, *, max_seq_length: int, batch_size: int,
            tokenizer_name: str | None, unlabelled: bool) -> tuple[SpanSplitScorer, Any]:
    """The scorer of `split` for the trained model in `model_dir`, and the model's parameters."""
    model, tokenizer, max_seq_length = open_trained(model_dir, QuestionAnswering, max_seq_length=max_seq_length,
                                                    tokenizer_name=tokenizer_name)
    refuse_beam_head(model, "flaxheads evaluate and predict")
    source = task.source
    rows = tokenize_examples(source.examples[split], tokenizer, max_seq_length,
                             doc_stride=source.stride_for(max_seq_length), labelled=not unlabelled)
    batch_format = data.BatchFormat.for_task(task, tokenizer, max_seq_length,
                                             model_pad_token_id=model.config.backbone.pad_token_id)
    model.eval()
    graphdef, params = nnx.split(model)
    origins = rows.select_columns(list(task.rows.origin_columns))
    scorer = SpanSplitScorer(graphdef, {split: data.OwnSplit(rows, data.example_lengths(rows), origins)},
                             batch_format, Layout.create(), eval_batch=batch_size,
                             unlabelled=frozenset({split} if unlabelled else ()),
                             objective=SpanObjective(source.version_2_with_negative), qa=source)
    return scorer, params


__all__ = ["answer_questions", "evaluate_qa", "refuse_beam_head"]
