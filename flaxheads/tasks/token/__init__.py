"""Token classification ("token-classification"): a tag per word (NER, POS). `model.py`
(`TokenClassifier`), `task.py` (its `Task`), `objective.py` (the loss over scored tokens), word data
(`word_files.py`, `word_task.py`, `subwords.py`: run_ner.py's subword labels, `windows.py`: long
sentences), `tags.py` (tag schemes), `entity_metrics.py` (seqeval's numbers), `scoring.py` (word-level
scores of a run), `inference.py` (evaluate, predict, `TokenScorer`), `pipeline.py` (transformers'
token-classification pipeline), `command.py` (`flaxheads predict`), `functional.py` (the Hugging Face Flax
face)."""
