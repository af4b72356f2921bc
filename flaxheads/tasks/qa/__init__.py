"""Extractive question answering ("question-answering"): SQuAD-style data, run_qa.py's windows."""
