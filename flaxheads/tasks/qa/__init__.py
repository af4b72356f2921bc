"""Extractive question answering ("question-answering"): the span of a context that answers a
question (SQuAD v1.1, v2.0), transformers' `*ForQuestionAnswering`. `model.py` (`QuestionAnswering`,
its loss, each family's conversion row), `data.py` (SQuAD files), `windows.py` (run_qa.py's
windows and labels), `rows.py` (the Trainer's data), `objective.py`, `postprocess.py` (run_qa.py's
answers), `metrics.py` (SQuAD's), `scoring.py`, `inference.py`, `command.py`, `pipeline.py`,
`task.py` (its `Task`)."""
