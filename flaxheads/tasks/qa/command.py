"""`flaxheads predict` on a saved question-answering model: `--question` and `--context` (one
each, or as many questions as contexts, in pairs), or `--input_file`, a SQuAD file (its answers,
if any, are not needed); one row per question, {"id", "question", "answer", "probability"} (and
"null_odds" under SQuAD v2)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flaxheads.tasks.qa.data import QAExample, read_qa_file
from flaxheads.tasks.qa.inference import answer_questions


def predict_rows(folder, inputs: Mapping[str, Any]) -> list[dict[str, Any]]:
    questions, contexts = list(inputs.get("question") or ()), list(inputs.get("context") or ())
    input_file = inputs.get("input_file")
    given = [flag for flag, on in (("texts", inputs.get("texts")), ("--text_pair", inputs.get("text_pairs")),
                                   ("--packing", inputs.get("packing")),
                                   ("--stride", inputs.get("stride") is not None)) if on]
    if given or not (questions or contexts or input_file) or (input_file and (questions or contexts)) \
            or input_file == "-":
        raise ValueError("the model is a question-answering model: give --question and --context (a question about a "
                         "context; several of each, in pairs), or --input_file, a SQuAD file (nested JSON, or JSON / "
                         "JSON Lines / CSV with question and context columns)"
                         + (f", and leave {' and '.join(given)} out" if given else ""))
    if input_file:
        examples = read_qa_file(input_file, version_2_with_negative=bool(inputs.get("version_2_with_negative")),
                                labelled=False)
    else:
        if len(contexts) == 1 and len(questions) > 1:
            contexts *= len(questions)  # several questions about one context
        if len(questions) != len(contexts) or not questions:
            raise ValueError(f"{len(questions)} --question and {len(contexts)} --context: give one context, or one per "
                             "question, in the same order")
        examples = [QAExample(str(i), question, context) for i, (question, context) in enumerate(zip(questions,
                                                                                                     contexts))]
        for example in examples:
            if not example.question.strip() or not example.context.strip():
                raise ValueError(f"question {int(example.id) + 1} has a blank question or context: give both")
    return answer_questions(folder, examples, max_seq_length=inputs["max_seq_length"],
                            doc_stride=inputs.get("doc_stride"), n_best_size=inputs.get("n_best_size"),
                            max_answer_length=inputs.get("max_answer_length"),
                            version_2_with_negative=bool(inputs.get("version_2_with_negative")),
                            null_score_diff_threshold=inputs.get("null_score_diff_threshold"),
                            tokenizer_name=inputs.get("tokenizer_name"))


__all__ = ["predict_rows"]
