"""Extractive question answering ("question-answering"): the span of a context that answers a
question (SQuAD v1.1, v2.0), transformers' `*ForQuestionAnswering`. `model.py` (`QuestionAnswering`,
its loss, each family's conversion row), `task.py` (its `Task`)."""
