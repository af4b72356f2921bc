"""Text classification ("text-classification"): a label per text or text pair, the problem types of
`flaxheads.problem`. `model.py` (`SequenceClassifier`, `ClassifierConfig`), `task.py` (its `Task`),
`inference.py` (evaluate, predict, `TextScorer`), `pipeline.py` (transformers' text-classification
pipeline), `command.py` (`flaxheads predict`), `functional.py` (the Hugging Face Flax face)."""
