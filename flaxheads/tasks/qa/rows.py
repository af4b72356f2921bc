"""Question-answering data as the Trainer takes it: the examples of each split (`data.QAExample`)
in a `TaskData`, and how they become rows (`QARows`: run_qa.py's windows, `windows.py`).

Each row is one window of an example's context beside its question, labelled with the answer's
start and end tokens (the CLS index where the window holds no answer), and keeps which example
it is of and each token's character span in the context (-1 outside it), which post-processing
turns back into answer text. A tokenizer that pads on the right gives rows of their own lengths
(a batch pads them after the tokens, so positions hold); one that pads on the left (XLNet) gives
rows of max_seq_length tokens, padded as run_qa pads them, so that no position moves.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import datasets
import numpy as np

from flaxheads.tasks.qa.model import QUESTION_ANSWERING
from flaxheads.data.batching import ExampleFormat
from flaxheads.data.task import LABEL, TaskData
from flaxheads.data.tokenization import LABELS, LENGTH
from flaxheads.tasks.qa import windows
from flaxheads.tasks.qa.data import QAExample

PROBLEM = "question_answering"
"""How messages and the run identity name what question-answering labels are (an answer span)."""
QA_EXAMPLES = ExampleFormat(
    label_width=2,
    unpacked_because="question answering: each window of a context is a row of its own, and its labels are "
                     "token positions in that row")
"""A row's label is its answer span: (start, end) token positions, (B, 2) int32 in a batch."""
ORIGINS = ("example_index", "offset_start", "offset_end")
"""The columns each row keeps to be post-processed: its example, and each token's character span
in the context (-1, -1 for the question, special and padding tokens)."""
DEFAULT_DOC_STRIDE = 128
"""run_qa.py's default --doc_stride (with its default max_seq_length, 384)."""


def default_doc_stride(max_seq_length: int) -> int:
    """run_qa.py's 128 context tokens shared by two windows, or a third of the window when that is
    fewer (128 of run_qa's 384; 42 of flaxheads' default 128, where 128 would leave no room)."""
    return min(DEFAULT_DOC_STRIDE, max_seq_length // 3)


@dataclasses.dataclass(frozen=True)
class QASource:
    """A question-answering task's examples and how they are read and answered (`TaskData.source`)."""

    examples: Mapping[str, tuple[QAExample, ...]]
    """Per split, its examples in file order."""
    version_2_with_negative: bool = False
    """SQuAD v2.0: some questions have no answer (the model may answer "")."""
    doc_stride: int | None = None
    """Context tokens two windows of an example share (run_qa's --doc_stride); None:
    `default_doc_stride` of the window."""
    n_best_size: int = 20
    max_answer_length: int = 30
    null_score_diff_threshold: float = 0.0

    def postprocess_options(self) -> dict[str, Any]:
        """`postprocess.postprocess_qa_predictions`' options these settings give."""
        return {"version_2_with_negative": self.version_2_with_negative, "n_best_size": self.n_best_size,
                "max_answer_length": self.max_answer_length,
                "null_score_diff_threshold": self.null_score_diff_threshold}

    def stride_for(self, max_seq_length: int) -> int:
        """The doc_stride in effect for windows of `max_seq_length` tokens."""
        return default_doc_stride(max_seq_length) if self.doc_stride is None else self.doc_stride

    def labelled(self, split: str) -> bool:
        """Whether the examples of `split` carry answers to score against (SQuAD v2's unanswerable
        questions count as answered with "")."""
        examples = self.examples[split]
        return self.version_2_with_negative or any(example.answerable for example in examples)


class QARows:
    """Question-answering rows (`TaskData.rows`): each example's windows (`windows.validation_features`
    with labels), with the `ORIGINS` columns."""

    whole_split = True
    origin_columns = ORIGINS

    def tokenize(self, task: TaskData, split: str, tokenizer, max_seq_length: int, *, cache_dir=None):
        source: QASource = task.source
        return tokenize_examples(source.examples[split], tokenizer, max_seq_length,
                                 doc_stride=source.stride_for(max_seq_length), labelled=source.labelled(split))


QA_ROWS = QARows()


def tokenize_examples(examples: Sequence[QAExample], tokenizer, max_seq_length: int, *, doc_stride: int,
                      labelled: bool = True) -> datasets.Dataset:
    """The windows of `examples` as rows: `input_ids`, `attention_mask` (`token_type_ids`),
    `labels` ((start, end) per row, when `labelled`), `length` and the `ORIGINS` columns. ValueError
    as `windows.check_windows_fit` (a question that leaves a window no room for the context)."""
    windows.check_windows_fit(examples, tokenizer, max_seq_length=max_seq_length, doc_stride=doc_stride)
    full = tokenizer.padding_side == "left"  # rows of one length: a batch's padding moves no position
    features = windows.validation_features(examples, tokenizer, max_seq_length=max_seq_length, doc_stride=doc_stride,
                                           pad_to_max_length=full, with_labels=labelled)
    columns: dict[str, list] = {name: [np.asarray(row, np.int32).tolist() for row in features[name]]
                                for name in windows.INPUT_COLUMNS if name in features}
    columns[LENGTH] = [len(row) for row in columns["input_ids"]]
    if labelled:
        columns[LABELS] = np.stack([features["start_positions"], features["end_positions"]], axis=1).tolist()
    columns["example_index"] = np.asarray(features["example_index"], np.int64).tolist()
    columns["offset_start"] = [[-1 if span is None else span[0] for span in row] for row in features["offset_mapping"]]
    columns["offset_end"] = [[-1 if span is None else span[1] for span in row] for row in features["offset_mapping"]]
    return datasets.Dataset.from_dict(columns)


def features_of(origins, examples: Sequence[QAExample]) -> list[dict[str, Any]]:
    """The rows' `ORIGINS` as post-processing reads its features: {"example_id", "offset_mapping"}
    (None outside the context) per row."""
    columns = origins.to_dict() if isinstance(origins, datasets.Dataset) else origins
    return [{"example_id": examples[index].id,
             "offset_mapping": [None if start < 0 else (start, end) for start, end in zip(starts, ends)]}
            for index, starts, ends in zip(columns["example_index"], columns["offset_start"], columns["offset_end"])]


def qa_task_data(examples: Mapping[str, Sequence[QAExample]], *, version_2_with_negative: bool = False,
                 doc_stride: int | None = None, n_best_size: int = 20, max_answer_length: int = 30,
                 null_score_diff_threshold: float = 0.0) -> TaskData:
    """The splits' examples as the `TaskData` the Trainer takes: per split its id, question and
    context columns (and the answers' count as `label`), task question answering; its `source`
    the `QASource` (the examples and how they are windowed and answered). ValueError for options
    out of range, naming them."""
    for name, value in (("n_best_size", n_best_size), ("max_answer_length", max_answer_length)):
        if value < 1:
            raise ValueError(f"{name}={value}: give 1 or more (run_qa.py's defaults: n_best_size=20, "
                             "max_answer_length=30)")
    if doc_stride is not None and doc_stride < 0:
        raise ValueError(f"doc_stride={doc_stride} is negative; give the number of context tokens two windows share "
                         f"(run_qa.py's default: {DEFAULT_DOC_STRIDE} of 384)")
    splits = datasets.DatasetDict({
        name: datasets.Dataset.from_dict({"id": [e.id for e in split], "question": [e.question for e in split],
                                          "context": [e.context for e in split],
                                          LABEL: [len(e.answer_texts) for e in split]})
        for name, split in examples.items()})
    source = QASource({name: tuple(split) for name, split in examples.items()}, version_2_with_negative,
                      doc_stride, n_best_size, max_answer_length,
                      null_score_diff_threshold)
    kind = "SQuAD v2.0 (unanswerable questions allowed)" if version_2_with_negative else "SQuAD v1.1"
    return TaskData(splits, None, 2, {0: "start", 1: "end"},
                    problem_type_reason=f"{PROBLEM}: answer spans in contexts, {kind}", rows=QA_ROWS,
                    task=QUESTION_ANSWERING, example_format=QA_EXAMPLES, source=source)


__all__ = ["DEFAULT_DOC_STRIDE", "ORIGINS", "PROBLEM", "QA_EXAMPLES", "QA_ROWS", "QARows", "QASource",
           "default_doc_stride", "features_of", "qa_task_data", "tokenize_examples"]
