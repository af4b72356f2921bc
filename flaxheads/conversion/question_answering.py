"""Question answering's rows of the conversion tables: each family's `*ForQuestionAnswering` and its
head's tensors. They live with the tables, not in the task's folder, so that every checkpoint of
such a class is known for what it is whichever model class loads it (a `TokenClassifier` loading a
`ModernBertForQuestionAnswering`, whose head's tensors have a token classifier's names, is refused
naming the task, not filled with the other task's weights); `flaxheads.tasks.qa` holds the rest of
the task."""

from __future__ import annotations

from flaxheads.conversion.table import LINEAR, Rule, TaskTable, layer_norm, linear

QUESTION_ANSWERING = "question-answering"
"""The task's name, transformers' pipeline name (`*ForQuestionAnswering`)."""

_SPAN = tuple(linear("qa_outputs", "classifier"))
_SQUAD = (
    *linear("start_logits.dense", "start_logits.dense"),
    *linear("end_logits.dense_0", "end_logits.dense_0"),
    *layer_norm("end_logits.LayerNorm", "end_logits.layer_norm"),
    *linear("end_logits.dense_1", "end_logits.dense_1"),
    *linear("answer_class.dense_0", "answer_class.dense_0"),
    Rule("answer_class.dense_1.weight", "answer_class.dense_1.kernel", LINEAR),  # bias=False in transformers
)


def _span(architecture: str, base_prefix: str | None = None, **options) -> TaskTable:
    return TaskTable(architecture, "linear", _SPAN, base_prefix=base_prefix, **options)


CONVERSION_ROWS: dict[str, TaskTable] = {
    "bert": _span("BertForQuestionAnswering"),
    "roberta": _span("RobertaForQuestionAnswering"),
    "xlm-roberta": _span("XLMRobertaForQuestionAnswering"),
    "distilbert": _span("DistilBertForQuestionAnswering"),
    "albert": _span("AlbertForQuestionAnswering"),
    "electra": _span("ElectraForQuestionAnswering"),
    "deberta-v2": _span("DebertaV2ForQuestionAnswering"),
    "modernbert": TaskTable("ModernBertForQuestionAnswering", "modernbert", (
        *linear("head.dense", "dense"), *layer_norm("head.norm", "norm"), *linear("classifier", "classifier"))),
    "xlnet": _span("XLNetForQuestionAnsweringSimple", other_heads={"squad": _SQUAD},
                   head_classes={"squad": "XLNetForQuestionAnswering"}),
    "gpt2": _span("GPT2ForQuestionAnswering"),
    # GenericForQuestionAnswering; Llama's, Qwen2's and Qwen3's keep the base model under `transformer`
    # (transformers' backward compatibility), Mistral's under `model` as its other classes.
    "llama": _span("LlamaForQuestionAnswering", "transformer"),
    "mistral": _span("MistralForQuestionAnswering"),
    "qwen2": _span("Qwen2ForQuestionAnswering", "transformer"),
    "qwen3": _span("Qwen3ForQuestionAnswering", "transformer"),
}
"""Each family's transformers class for question answering and its head's tensors (the task's rows
of the conversion tables, `Task.conversion_rows`)."""


__all__ = ["CONVERSION_ROWS", "QUESTION_ANSWERING"]
