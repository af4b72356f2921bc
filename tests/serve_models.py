"""Tiny trained models of every task `flaxheads serve` answers, saved as a trained model is (every
weight in the folder, the tokenizer beside it): a random BERT per task over a small WordPiece
vocabulary, in seconds and with no training. tests/test_serve.py serves them."""

from __future__ import annotations

import json
from pathlib import Path

WORDS = "a the film movie great good bad dull boring moving story plot worst best so and is was very".split()
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ",", "?", ".", *WORDS]
MAX_POSITIONS = 64
TAGS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]


def _config(**extra):
    import transformers

    return transformers.BertConfig(vocab_size=len(VOCAB), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                   intermediate_size=37, max_position_embeddings=MAX_POSITIONS, initializer_range=0.3,
                                   hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, **extra)


def _tokenizer(folder: Path):
    import transformers

    (folder / "vocab.txt").write_text("\n".join(VOCAB) + "\n", encoding="utf-8")
    tokenizer = transformers.BertTokenizerFast(str(folder / "vocab.txt"), model_max_length=MAX_POSITIONS)
    tokenizer.save_pretrained(folder)


def _flaxheads_section(folder: Path, **section) -> None:
    path = folder / "config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    config.setdefault("flaxheads", {}).update(section)
    path.write_text(json.dumps(config, indent=2), encoding="utf-8")


def build(root: Path) -> dict[str, Path]:
    """{name: folder} of: `sentiment` (3 labels), `topics` (multi-label, tuned thresholds),
    `ranker` (a cross-encoder: one score for a text pair), `reward` (a pairwise reward model),
    `tagger` (token classification), `reader` (question answering), `chooser` (multiple choice)."""
    import torch
    import transformers

    models = {
        "sentiment": (transformers.BertForSequenceClassification,
                      dict(id2label={0: "negative", 1: "neutral", 2: "positive"}), {}),
        "topics": (transformers.BertForSequenceClassification,
                   dict(id2label={0: "plot", 1: "acting", 2: "music"}, problem_type="multi_label_classification"),
                   {"thresholds": {"plot": 0.3, "acting": 0.5, "music": 0.7}}),
        "ranker": (transformers.BertForSequenceClassification, dict(num_labels=1, problem_type="regression"),
                   {"text_pair": True}),
        "reward": (transformers.BertForSequenceClassification, dict(num_labels=1),
                   {"problem_type": "pairwise_reward"}),
        "tagger": (transformers.BertForTokenClassification, dict(id2label=dict(enumerate(TAGS))), {}),
        "reader": (transformers.BertForQuestionAnswering, dict(), {}),
        "chooser": (transformers.BertForMultipleChoice, dict(), {}),
    }
    folders = {}
    for seed, (name, (cls, config, section)) in enumerate(models.items()):
        folder = root / name
        torch.manual_seed(seed)
        cls(_config(**config)).save_pretrained(folder)
        _tokenizer(folder)
        if section:
            _flaxheads_section(folder, **section)
        folders[name] = folder
    return folders
