"""Multiple choice ("multiple-choice"): the right one of each example's choices (SWAG, RACE).
`model.py` (`MultipleChoice`), `task.py` (its `Task`), `objective.py` (the loss and accuracy over
choices), `data.py` (choice files and columns, run_swag.py's rows), `inference.py` (evaluate,
predict), `pipeline.py` (`flaxheads.pipeline("multiple-choice")`), `command.py` (`flaxheads
predict`), `functional.py` (the Hugging Face Flax face)."""
