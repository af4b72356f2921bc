"""The backbone families the suite tests, one row each, and the tiny configs they start from.

Every scenario the families share is one test parametrized over `FAMILIES` (ids: the row names):

    tests/test_family_parity.py       the canonical head's logits, every hidden state, bfloat16 compute
    tests/test_family_heads.py        every other head on the family, its export and reload
    tests/test_family_conversion.py   PyTorch -> flaxheads -> PyTorch bit-identical, the flaxheads format,
                                      exports transformers loads, sharded and pytorch_model.bin files,
                                      the loading report of each checkpoint type
    tests/test_family_sharding.py     FSDP rules on 4 fake CPU devices
    tests/test_family_cli.py          inspect, train, evaluate, predict and convert on a tiny checkpoint
                                      with a tokenizer (token classification too, on the rows whose
                                      `cli.tokens` is set)
    tests/test_family_tasks.py        the logits and loss of every task (problem type) equal transformers'
    tests/test_family_tokens.py       token classification and multiple choice (`token_classifier`,
                                      `multiple_choice`): logits, loss, loading reports, exports
    tests/test_family_qa.py           question answering (`question_answering`): start and end logits,
                                      loss, loading reports, exports
    tests/test_packing_model.py       packed rows give each example's logits
    tests/test_family_inputs.py       inputs transformers cannot run (past the position table, token types
                                      or ids outside their tables) and mismatched shapes are refused
    tests/test_family_configs.py      config.json sizes that are not ints >= 1, and layer counts the weights
                                      do not have, are refused naming the field

What is particular to a family (a config switch, an error message, its own head on BERT) stays in
its own file (test_albert.py, test_decoders.py, ...), which builds checkpoints with the same
`hf_checkpoint` fixture (tests/conftest.py) and never imports another test module.

Adding a family
---------------
Add one `Family(...)` row to `FAMILIES` below: the tiny config, the transformers classes, the
canonical head, how its batches look. Every shared scenario then runs on it; the optional fields
say what the family adds or leaves out:

* `variants` / `paddings`: the configs and padding sides the canonical-head parity sweeps;
* `other_heads`: the heads besides its own to run on it (default: every head);
* `bf16_atol`, `padding_side`, `eager`, `load_options`: its tolerance, tokenizer side, attention;
* `reports`: the loading report each checkpoint type must give (`unused`, `newly_initialized`);
* `fsdp`: parameters the FSDP rules must split (or keep whole) and partition specs to check;
* `cli`: how to build a tiny checkpoint with a tokenizer (then the command line is tested on it);
* `packing`: config overrides for the packing test (None leaves the family out of it);
* `token_classifier` / `multiple_choice` / `question_answering`: transformers' classes for those
  tasks, when it has them.

A second config of the same transformers classes is a second row (`deberta-v2` beside
`deberta-v3`); pass `family=` to `hf_checkpoint` to pick it.

Each scenario keeps one case per family in the fast lane (`scripts/test.sh --fast`: the first
config variant, the "mean" head, the single-label task, ...) and marks the others `slow`
(`case(..., fast=...)` below).

Adding a task
-------------
A problem type transformers computes a loss for is one row of `TASKS` below (its `problem_type`,
`num_labels` and the labels of a batch of three): tests/test_family_tasks.py then checks its
logits and loss on every family. A new head joins `flaxheads.HEAD_NAMES`, which
tests/test_family_heads.py (every head on every family) and tests/test_packing_model.py (every
head on BERT) read; tests/test_bert.py holds the torch references of the heads transformers has
no class for.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from pathlib import Path
from typing import Callable

import numpy as np

TINY_CONFIG = dict(
    vocab_size=99,
    hidden_size=32,
    num_attention_heads=4,
    intermediate_size=37,
    max_position_embeddings=64,
    # Also the std of the heads flaxheads initialises: logits of order 1, not 1e-3.
    initializer_range=0.1,
)
"""The BERT-family tiny config; every row's config is of this size (odd MLP width, 4 heads)."""
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt")
"""MiniLM's WordPiece tokenizer files (flaxheads.shipped_model), copied next to tiny BERT-like models."""
WORDS = "a the film movie great good bad dull boring moving story plot worst best so and is was very".split()
"""The words of the small vocabularies built for the command-line checkpoints."""
EOS = 98
"""GPT-2's tiny <|endoftext|>: also its pad id in the shared scenarios."""
XLNET_PAD = 5


# ---------------------------------------------------------------------------------------------
# Random weights and batches


def randomize_(model, seed: int, norm_scales: str | None = r"(LayerNorm|layer_norm)\.weight$") -> None:
    """Draws every parameter afresh, LayerNorm and biases included: those matching the regex
    `norm_scales` around 1, the others around 0.

    transformers initialises biases to 0 and LayerNorms to (1, 0), and its 0.02 weights leave
    attention almost uniform: a conversion that swapped a LayerNorm's scale and bias, or
    dropped a bias, would still match. Larger, non-trivial values make parity mean something.
    """
    import torch

    generator = torch.Generator().manual_seed(seed)
    std = model.config.initializer_range
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator, dtype=torch.float32)
            is_norm_scale = norm_scales is not None and re.search(norm_scales, name) is not None
            param.copy_(1.0 + std * noise if is_norm_scale else std * noise)


def padded_batch(padding: str = "right", *, seq_len: int, seed: int = 0, pad_id: int = 0, lowest_id: int = 1,
                 highest_id: int = 99, token_types: bool = True) -> dict[str, np.ndarray]:
    """Three sequences of lengths (seq_len, seq_len - 3, 2) padded with `pad_id` on `padding`
    ("right", "left"; "none": all three full length), ids in [lowest_id, highest_id), the second
    half of each in segment 1 when `token_types`."""
    rng = np.random.default_rng(seed)
    lengths = np.array([seq_len] * 3 if padding == "none" else [seq_len, seq_len - 3, 2])
    positions = np.arange(seq_len)[None, :]
    start = seq_len - lengths[:, None] if padding == "left" else np.zeros_like(lengths[:, None])
    real = (positions >= start) & (positions < start + lengths[:, None])
    offset = positions - start
    ids = np.where(real, rng.integers(lowest_id, highest_id, (3, seq_len)), pad_id)
    batch = {"input_ids": ids, "attention_mask": real.astype(np.int64)}
    if token_types:
        batch["token_type_ids"] = np.where(real & (offset >= lengths[:, None] // 2), 1, 0)
    return batch


def xlnet_batch(padding: str = "left", *, seq_len: int = 10, seed: int = 0, token_types: bool = True):
    """Three sequences of lengths (10, 7, 2) padded on `padding` ("left", "right" or "none"), with
    XLNet's segment layout: A = 0, B = 1, <cls> = 2, padding = 3 (as XLNetTokenizer writes)."""
    rng = np.random.default_rng(seed)
    lengths = np.array([seq_len] * 3 if padding == "none" else [seq_len, seq_len - 3, 2])
    positions = np.arange(seq_len)[None, :]
    start = seq_len - lengths[:, None] if padding == "left" else np.zeros_like(lengths[:, None])
    real = (positions >= start) & (positions < start + lengths[:, None])
    offset = positions - start  # position within the sequence: the same tokens whatever the padding
    tokens = np.take_along_axis(rng.integers(6, 99, (3, seq_len)), np.clip(offset, 0, seq_len - 1), axis=1)
    batch = {"input_ids": np.where(real, tokens, XLNET_PAD), "attention_mask": real.astype(np.int64)}
    if token_types:
        segment = np.where(offset >= lengths[:, None] // 2, 1, 0)
        segment = np.where(offset == lengths[:, None] - 1, 2, segment)  # <cls> closes the sequence
        batch["token_type_ids"] = np.where(real, segment, 3)
    return batch


# ---------------------------------------------------------------------------------------------
# The rows


@dataclasses.dataclass(frozen=True)
class Fsdp:
    """What the FSDP rules do to the family's classifier on 4 fake devices (beside the checks every
    family gets: the train step's shardings follow the same rules, no bias or norm scale is split,
    the logits stay transformers')."""

    split: frozenset = frozenset()
    """Parameters that must be split (4 divides the dimension the rule splits)."""
    whole: frozenset = frozenset()
    """Parameters that must stay whole (4 does not divide it: 99 vocabulary rows, 37 MLP inputs)."""
    specs: tuple = ()
    """(parameter, partition spec) pairs to check exactly."""
    layout: str = "fsdp=4"
    overrides: tuple = ()
    """Config overrides of the classifier sharded (sorted (name, value) pairs)."""


@dataclasses.dataclass(frozen=True)
class Cli:
    """A tiny checkpoint with a tokenizer for the command-line lifecycle."""

    build: Callable[[Path], None]
    """Writes the checkpoint and its tokenizer into an empty folder."""
    inspect_names: tuple[str, ...] = ()
    """Names `flaxheads inspect` must print (the new head's, the unused pretraining head's)."""
    exported_names: tuple[str, ...] = ()
    """Tensors the trained run's model.safetensors must hold."""
    check: Callable | None = None
    """`check(result, tmp_path, capsys)`: what else the family's command line must do
    (result: family_parity.CliResult)."""
    tokens: bool = False
    """Whether the token-classification command line runs on it too (train on CoNLL, evaluate
    and predict without the train file: family_parity.check_token_cli_lifecycle); on a few rows
    only (each is a training run): a SentencePiece encoder, a left-padded decoder without a pad token."""


@dataclasses.dataclass(frozen=True)
class Family:
    name: str
    """The row's id in test names."""
    config: dict
    """transformers config arguments of the tiny model every checkpoint of the row starts from."""
    classifier: str
    """transformers' *ForSequenceClassification class."""
    base: str
    """transformers' bare model class (hidden states, no head)."""
    pretrained: str
    """A pretraining checkpoint class (masked LM, causal LM): a new head starts from it."""
    head: str
    """The canonical head: what *ForSequenceClassification computes."""
    batch: Callable[..., dict]
    """`batch(padding, seed=0)` -> numpy inputs of three sequences, padded on `padding`'s side."""
    paddings: tuple[str, ...] = ("right", "left")
    """The padding sides the parity tests cover."""
    padding_side: str = "right"
    """The side the data pipeline pads on: the family's tokenizers'."""
    variants: tuple = (("3_labels", (), 3),)
    """(id, config overrides as sorted pairs, num_labels) the canonical-head parity sweeps."""
    token_types: bool = False
    """Whether the family embeds token types (its batches carry them)."""
    layers_key: str = "num_hidden_layers"
    weights_layers_key: str | None = None
    """config.json's field counting the layers the weights hold, where it is not `layers_key`
    (under transformers' attribute_map): ALBERT's weights hold num_hidden_groups groups."""
    bf16_atol: float = 5e-2
    """bfloat16 compute (float32 parameters) against transformers' float32 logits, absolute..."""
    bf16_rtol: float | None = None
    """... and relative (None: bf16_atol)."""
    other_heads: tuple[str, ...] | None = None
    """The heads besides `head` tested on the family (None: every head)."""
    head_prefix: str = "head."
    """Where the export puts a head transformers has no class for (ModernBERT's own head is head.*)."""
    norm_scales: str | None = r"(LayerNorm|layer_norm)\.weight$"
    """Parameters drawn around 1 (norm scales); None: every parameter around 0 (Gemma's (1 + w))."""
    eager: bool = False
    """transformers' eager attention (the reference flaxheads matches bit for bit in float32)."""
    load_options: tuple = ()
    """from_pretrained keyword arguments every test passes (sorted pairs): GPT-2's pad id."""
    reports: tuple = ()
    """(architecture, config overrides as sorted pairs, unused, newly_initialized): the loading
    report of that checkpoint type (its classifier's is always empty: nothing new, nothing unused)."""
    fsdp: Fsdp | None = Fsdp()
    cli: Cli | None = None
    packing: tuple | None = ()
    """Config overrides for the packing test (sorted pairs); None leaves the row out."""
    family_of_classes: bool = True
    """Whether `hf_checkpoint` picks this row for its transformers classes (False: a second
    config of another row's classes, reached with family=name)."""
    token_classifier: str | None = None
    """transformers' *ForTokenClassification class (None: transformers has none for the family)."""
    multiple_choice: str | None = None
    """transformers' *ForMultipleChoice class (None: transformers has none for the family)."""
    question_answering: str | None = None
    """transformers' *ForQuestionAnswering class (None: transformers has none for the family)."""

    @property
    def config_class(self):
        import transformers

        return getattr(transformers, self.classifier).config_class

    @property
    def model_type(self) -> str:
        return self.config_class.model_type

    def hf_config(self, **overrides) -> dict:
        """config.json of the row's config with `overrides`, as transformers writes it."""
        return self.config_class(**{**self.config, **overrides}).to_dict()

    @property
    def sample_padding(self) -> str:
        """The padding side of the scenarios that take one: left where the family is tested on it."""
        return "left" if "left" in self.paddings else self.paddings[0]

    def configs(self) -> list[tuple[str, tuple]]:
        """(id, overrides) of the distinct configs among `variants` (num_labels aside)."""
        seen = {}
        for name, overrides, _ in self.variants:
            seen.setdefault(overrides, "default" if overrides == () else name)
        return [(name, overrides) for overrides, name in seen.items()]

    def architectures(self) -> set[str]:
        return {self.classifier, self.base, self.pretrained, *(r[0] for r in self.reports),
                *(c for c in (self.token_classifier, self.multiple_choice, self.question_answering) if c)}


def _pairs(**kwargs) -> tuple:
    return tuple(sorted(kwargs.items()))


# ---------------------------------------------------------------------------------------------
# Command-line checkpoints: a tiny model and a real tokenizer class over a small vocabulary


def _minilm_tokenizer(path: Path) -> None:
    import shutil

    from flaxheads.shipped_model import minilm_path

    for name in TOKENIZER_FILES:
        shutil.copy(minilm_path() / name, path / name)


def _save(model_class: str, config: dict, path: Path) -> None:
    import torch
    import transformers

    cls = getattr(transformers, model_class)
    torch.manual_seed(0)
    cls(cls.config_class(**config)).save_pretrained(path)


def _xlm_roberta_with_tokenizer(path: Path) -> None:
    """XLM-R's tokenizer over a small Unigram vocab (<s>=0, <pad>=1, </s>=2, <unk>=3, as its sentencepiece model)."""
    import transformers

    specials = [("<s>", 0.0), ("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("<mask>", 0.0)]
    pieces = [(f"\u2581{w}", -2.0) for w in WORDS] + [(c, -5.0) for c in "\u2581abcdefghijklmnopqrstuvwxyz,.!"]
    tokenizer = transformers.XLMRobertaTokenizer(vocab=specials + pieces)
    _save("XLMRobertaModel", {**XLM_ROBERTA.config, "vocab_size": len(tokenizer), "max_position_embeddings": 40,
                              "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}, path)
    tokenizer.save_pretrained(path)


def _distilbert_with_tokenizer(path: Path) -> None:
    import transformers

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS, ",", ".", "!"]
    (path / "vocab.txt").write_text("\n".join(vocab) + "\n")
    tokenizer = transformers.DistilBertTokenizer(vocab_file=str(path / "vocab.txt"))
    _save("DistilBertModel", {**DISTILBERT.config, "vocab_size": len(vocab), "dropout": 0.0,
                              "attention_dropout": 0.0, "seq_classif_dropout": 0.0}, path)
    tokenizer.save_pretrained(path)


_ALBERT_PIECES = ["<pad>", "<unk>", "[CLS]", "[SEP]", "[MASK]", "▁"] + list("abcdefghijklmnopqrstuvwxyz.,'!-")
_ALBERT_WORDS = ["the", "a", "and", "of", "to", "is", "it", "film", "movie", "good", "bad", "great", "dull", "story"]


def _albert_with_tokenizer(path: Path) -> None:
    """An `AlbertTokenizer` over a Unigram vocabulary of letters and a few words (what a
    spiece.model holds, built in memory), saved as tokenizer.json."""
    import transformers

    vocab = [(piece, 0.0 if i < 5 else -float(i)) for i, piece in enumerate(_ALBERT_PIECES)]
    vocab += [(f"▁{word}", -1.0) for word in _ALBERT_WORDS]
    tokenizer = transformers.AlbertTokenizer(vocab=vocab)
    _save("AlbertModel", {**ALBERT.config, "vocab_size": len(tokenizer), "classifier_dropout_prob": 0.0}, path)
    tokenizer.save_pretrained(path)
    assert tokenizer.pad_token_id == 0 and tokenizer("a good film")["input_ids"][0] == 2


def _electra_with_tokenizer(path: Path) -> None:
    """A tiny ElectraForPreTraining (discriminator) with MiniLM's BERT vocab.txt tokenizer."""
    _save("ElectraForPreTraining", {**ELECTRA.config, "vocab_size": 30522, "hidden_dropout_prob": 0.0,
                                    "attention_probs_dropout_prob": 0.0}, path)
    _minilm_tokenizer(path)


def _deberta_with_tokenizer(path: Path) -> None:
    """A tiny v3-like DebertaV2ForMaskedLM with MiniLM's BERT vocab.txt tokenizer."""
    _save("DebertaV2ForMaskedLM", {**DEBERTA_V3.config, "vocab_size": 30522, "hidden_dropout_prob": 0.0,
                                   "attention_probs_dropout_prob": 0.0, "legacy": False}, path)
    _minilm_tokenizer(path)


def _modernbert_with_tokenizer(path: Path) -> None:
    """A tiny ModernBertForMaskedLM with MiniLM's BERT vocab.txt tokenizer ([PAD] = 0, [CLS] = 101)."""
    _save("ModernBertForMaskedLM", {**MODERNBERT.config, "vocab_size": 30522, "cls_token_id": 101,
                                    "bos_token_id": 101, "sep_token_id": 102, "eos_token_id": 102}, path)
    _minilm_tokenizer(path)


_REVIEWS = ["a gorgeous, moving film", "tedious and dull", "what a great story", "the worst plot ever"] * 20


def _byte_level_bpe(special_tokens: list[str]):
    from tokenizers import ByteLevelBPETokenizer

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(_REVIEWS, vocab_size=300, special_tokens=special_tokens, show_progress=False)
    return bpe


def _gpt2_with_tokenizer(path: Path) -> None:
    """A tiny GPT2Model and a byte-level BPE tokenizer trained here (no pad token, eos only)."""
    import transformers

    tokenizer = transformers.GPT2TokenizerFast(tokenizer_object=_byte_level_bpe(["<|endoftext|>"]),
                                               eos_token="<|endoftext|>", bos_token="<|endoftext|>",
                                               unk_token="<|endoftext|>")
    eos = tokenizer.eos_token_id
    config = {**GPT2.config, "vocab_size": len(tokenizer), "bos_token_id": eos, "eos_token_id": eos,
              "pad_token_id": None, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}
    _save("GPT2Model", config, path)
    tokenizer.save_pretrained(path)
    assert tokenizer.pad_token is None


def _llama_with_tokenizer(path: Path) -> None:
    """A tiny LlamaForCausalLM and a byte-level BPE tokenizer with no pad token, as Llama's."""
    import transformers

    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=_byte_level_bpe(["<s>", "</s>"]),
                                                     bos_token="<s>", eos_token="</s>")
    config = {**TINY_CONFIG, "num_hidden_layers": 3, "vocab_size": len(tokenizer), "pad_token_id": None,
              "bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id, "num_key_value_heads": 2}
    _save("LlamaForCausalLM", config, path)
    tokenizer.save_pretrained(path)


def _albert_run_exports_every_pretrained_tensor_and_the_classifier(result, tmp_path, capsys) -> None:
    from safetensors.torch import load_file

    pretrained = load_file(result.source / "model.safetensors")
    exported = load_file(result.run / "model.safetensors")
    assert {f"albert.{k}" for k in pretrained} | {"classifier.weight", "classifier.bias"} == set(exported)


def _pad_less_run_pads_with_eos(result, tmp_path, capsys) -> None:
    """GPT-2 and Llama ship no pad token: the run pads with eos and says so."""
    import json

    import transformers

    exported = json.loads((result.run / "config.json").read_text())
    assert "sets no pad_token_id" in result.train_err
    assert exported["pad_token_id"] == exported["eos_token_id"] is not None
    tokenizer = transformers.AutoTokenizer.from_pretrained(result.run)
    assert tokenizer.pad_token_id in (None, exported["pad_token_id"])


def _llama_predict_refuses_empty_texts_and_ignores_token_types(result, tmp_path, capsys) -> None:
    import json
    import shutil

    import pytest

    import flaxheads
    from flaxheads.cli import main

    _pad_less_run_pads_with_eos(result, tmp_path, capsys)
    run = result.run
    # An empty text (no tokens at all with this tokenizer, which adds no BOS): refused, as transformers refuses it.
    assert main(["predict", "--model_name_or_path", str(run), "so dull", ""]) == 2
    assert "the text at index 1 of texts is blank" in capsys.readouterr().err
    with pytest.raises(ValueError, match="the text at index 0 of texts is blank"):
        flaxheads.pipeline(model=str(run))("")
    # A tokenizer saved to return token types (Llama has none) is read without them.
    typed = tmp_path / "typed"
    shutil.copytree(run, typed)
    tokenizer_config = json.loads((typed / "tokenizer_config.json").read_text())
    tokenizer_config["model_input_names"] = ["input_ids", "token_type_ids", "attention_mask"]
    (typed / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    texts = list(result.texts)
    assert main(["predict", "--model_name_or_path", str(run), *texts]) == 0
    plain = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert main(["predict", "--model_name_or_path", str(typed), *texts]) == 0
    assert [json.loads(line) for line in capsys.readouterr().out.splitlines()] == plain


def _modernbert_convert_of_the_masked_lm_keeps_its_head_and_tokenizer(result, tmp_path, capsys) -> None:
    from safetensors.torch import load_file

    from flaxheads.cli import main

    assert main(["convert", str(result.source), str(tmp_path / "source_flax")]) == 0
    assert main(["convert", str(tmp_path / "source_flax"), str(tmp_path / "source_pt"), "--to", "pytorch"]) == 0
    capsys.readouterr()
    assert (tmp_path / "source_pt" / "vocab.txt").is_file()
    exported = load_file(tmp_path / "source_pt" / "model.safetensors")
    assert "model.layers.1.attn_norm.weight" in exported and "head.norm.weight" in exported


# ---------------------------------------------------------------------------------------------
# Encoders

_BERT_HEAD = ["classifier.bias", "classifier.weight"]
_ROBERTA_HEAD = ["classifier.dense.bias", "classifier.dense.weight", "classifier.out_proj.bias",
                 "classifier.out_proj.weight"]
_ROBERTA_LM = ["lm_head.bias", "lm_head.dense.bias", "lm_head.dense.weight", "lm_head.layer_norm.bias",
               "lm_head.layer_norm.weight"]

BERT = Family(
    "bert", {**TINY_CONFIG, "num_hidden_layers": 2, "type_vocab_size": 2, "pad_token_id": 0},
    "BertForSequenceClassification", "BertModel", "BertForMaskedLM", "pooler",
    functools.partial(padded_batch, seq_len=10, lowest_id=3, token_types=True),
    token_classifier="BertForTokenClassification", multiple_choice="BertForMultipleChoice",
    question_answering="BertForQuestionAnswering",
    paddings=("right", "left", "none"),
    variants=(("1_label", (), 1), ("2_labels", (), 2), ("5_labels", (), 5)),
    token_types=True,
    reports=(
        ("BertModel", (), [], _BERT_HEAD),
        ("BertForMaskedLM", (), ["cls.predictions.bias", "cls.predictions.transform.LayerNorm.bias",
                                 "cls.predictions.transform.LayerNorm.weight", "cls.predictions.transform.dense.bias",
                                 "cls.predictions.transform.dense.weight"],
         ["bert.pooler.dense.bias", "bert.pooler.dense.weight", *_BERT_HEAD]),  # no pretrained pooler
    ),
    fsdp=Fsdp(split=frozenset({"backbone.layers.0.attention.query.kernel", "head.pooler.dense.kernel"}),
              whole=frozenset({"backbone.embeddings.word_embeddings.embedding"})),
    packing=_pairs(num_hidden_layers=4),  # concat_last4 on BERT
)
ROBERTA = Family(
    # RoBERTa's real layout: one token type, <pad> = 1, so position ids start at 2.
    "roberta", {**TINY_CONFIG, "num_hidden_layers": 2, "type_vocab_size": 1, "pad_token_id": 1, "bos_token_id": 0,
                "eos_token_id": 2},
    "RobertaForSequenceClassification", "RobertaModel", "RobertaForMaskedLM", "roberta",
    functools.partial(padded_batch, seq_len=10, pad_id=1, lowest_id=3, token_types=False),
    token_classifier="RobertaForTokenClassification", multiple_choice="RobertaForMultipleChoice",
    question_answering="RobertaForQuestionAnswering",
    paddings=("right", "left", "none"),
    variants=(("1_label", (), 1), ("2_labels", (), 2), ("5_labels", (), 5)),
    reports=(
        # The model's pooler is not the roberta head's dense layer: unused, as in transformers.
        ("RobertaModel", (), ["pooler.dense.bias", "pooler.dense.weight"], _ROBERTA_HEAD),
        ("RobertaForMaskedLM", (), _ROBERTA_LM, _ROBERTA_HEAD),
    ),
)
XLM_ROBERTA = Family(
    "xlm-roberta", {**ROBERTA.config},
    "XLMRobertaForSequenceClassification", "XLMRobertaModel", "XLMRobertaForMaskedLM", "roberta",
    functools.partial(padded_batch, seq_len=11, pad_id=1, lowest_id=3, token_types=False),
    token_classifier="XLMRobertaForTokenClassification", multiple_choice="XLMRobertaForMultipleChoice",
    question_answering="XLMRobertaForQuestionAnswering",
    variants=(("1_label", (), 1), ("2_labels", (), 2), ("5_labels", (), 5)),
    bf16_atol=0.02, bf16_rtol=1e-5,  # measured at most 0.005 on these tiny models
    reports=(
        ("XLMRobertaModel", (), ["pooler.dense.bias", "pooler.dense.weight"], _ROBERTA_HEAD),
        ("XLMRobertaForMaskedLM", (), _ROBERTA_LM, _ROBERTA_HEAD),
    ),
    fsdp=Fsdp(
        split=frozenset({"backbone.embeddings.position_embeddings.embedding",
                         "backbone.layers.1.attention.value.kernel", "backbone.layers.0.intermediate.kernel",
                         "head.dense.kernel", "head.out_proj.kernel"}),
        # 99 vocabulary rows and 37 feed-forward inputs do not divide by 4: those stay whole.
        whole=frozenset({"backbone.embeddings.word_embeddings.embedding", "backbone.layers.0.output.kernel"})),
    cli=Cli(_xlm_roberta_with_tokenizer, inspect_names=("classifier.out_proj.weight",), tokens=True),
)
_DISTILBERT_HEAD = ["classifier.bias", "classifier.weight", "pre_classifier.bias", "pre_classifier.weight"]
DISTILBERT = Family(
    # DistilBERT's own names where TINY_CONFIG's BERT names have no alias in its config.
    "distilbert", {**TINY_CONFIG, "num_hidden_layers": 2, "hidden_dim": 37, "pad_token_id": 0},
    "DistilBertForSequenceClassification", "DistilBertModel", "DistilBertForMaskedLM", "distilbert",
    functools.partial(padded_batch, seq_len=11, lowest_id=3, token_types=False),
    token_classifier="DistilBertForTokenClassification", multiple_choice="DistilBertForMultipleChoice",
    question_answering="DistilBertForQuestionAnswering",
    variants=(("1_label", (), 1), ("2_labels", (), 2), ("5_labels", (), 5),
              ("sinusoidal_relu", _pairs(sinusoidal_pos_embds=True, activation="relu"), 3),
              ("3_layers_gelu_new", _pairs(num_hidden_layers=3, activation="gelu_new", max_position_embeddings=20), 3)),
    bf16_atol=0.02, bf16_rtol=1e-5,  # measured at most 0.005 on these tiny models
    reports=(
        ("DistilBertModel", (), [], _DISTILBERT_HEAD),
        ("DistilBertForMaskedLM", (), ["vocab_layer_norm.bias", "vocab_layer_norm.weight", "vocab_projector.bias",
                                       "vocab_transform.bias", "vocab_transform.weight"], _DISTILBERT_HEAD),
    ),
    fsdp=Fsdp(split=frozenset({"backbone.embeddings.position_embeddings.embedding",
                               "backbone.layers.0.attention.query.kernel", "backbone.layers.1.intermediate.kernel",
                               "head.pre_classifier.kernel", "head.classifier.kernel"})),
    cli=Cli(_distilbert_with_tokenizer, inspect_names=("pre_classifier.weight",)),
)
ALBERT = Family(
    "albert", dict(
        vocab_size=99,
        embedding_size=24,  # != hidden_size: the factorised embedding projection is exercised
        hidden_size=36,  # 4 heads of 9: an odd head width
        num_attention_heads=4, intermediate_size=37, num_hidden_layers=3, max_position_embeddings=64,
        initializer_range=0.1,
    ),
    "AlbertForSequenceClassification", "AlbertModel", "AlbertForPreTraining", "pooler",
    functools.partial(padded_batch, seq_len=9, lowest_id=5, token_types=True),
    token_classifier="AlbertForTokenClassification", multiple_choice="AlbertForMultipleChoice",
    question_answering="AlbertForQuestionAnswering",
    # (num_hidden_groups, inner_group_num): one group as released ALBERTs, uneven groups (3 layers over
    # 2 groups: layers 0 and 1 use group 0), two layers per group, both at once.
    variants=(("groups1_inner1_2_labels", (), 2), ("groups2_inner1_3_labels", _pairs(num_hidden_groups=2), 3),
              ("groups1_inner2_1_label", _pairs(inner_group_num=2), 1),
              ("groups2_inner2_5_labels", _pairs(num_hidden_groups=2, inner_group_num=2), 5)),
    token_types=True,
    weights_layers_key="num_hidden_groups",
    # 8 bits of mantissa through 3 layers give differences of a few 1e-3 on logits of order 1 (measured 4.6e-3).
    bf16_atol=2e-2,
    packing=_pairs(inner_group_num=2),  # two layers per shared group, each pooled per segment
    reports=(
        ("AlbertModel", (), [], ["classifier.bias", "classifier.weight"]),
        # The pretrained pooler is kept; the masked-LM and sentence-order heads are not the classifier.
        ("AlbertForPreTraining", (), ["predictions.LayerNorm.bias", "predictions.LayerNorm.weight", "predictions.bias",
                                      "predictions.dense.bias", "predictions.dense.weight",
                                      "sop_classifier.classifier.bias", "sop_classifier.classifier.weight"],
         ["classifier.bias", "classifier.weight"]),
        # AlbertForMaskedLM builds AlbertModel(add_pooling_layer=False): no pretrained pooler exists.
        ("AlbertForMaskedLM", (), ["predictions.LayerNorm.bias", "predictions.LayerNorm.weight", "predictions.bias",
                                   "predictions.dense.bias", "predictions.dense.weight"],
         ["albert.pooler.bias", "albert.pooler.weight", "classifier.bias", "classifier.weight"]),
    ),
    fsdp=Fsdp(
        # Embeddings split by rows, kernels by input features, wherever 4 divides the dimension.
        split=frozenset({"backbone.embeddings.position_embeddings.embedding", "backbone.embedding_projection.kernel",
                         "backbone.groups.1.layers.1.attention.query.kernel",
                         "backbone.groups.0.layers.0.intermediate.kernel", "head.pooler.dense.kernel"}),
        whole=frozenset({"backbone.embeddings.word_embeddings.embedding", "backbone.groups.0.layers.0.output.kernel"}),
        overrides=_pairs(num_hidden_groups=2, inner_group_num=2)),
    cli=Cli(_albert_with_tokenizer, check=_albert_run_exports_every_pretrained_tensor_and_the_classifier),
)
_ELECTRA_HEAD = ["classifier.dense.bias", "classifier.dense.weight", "classifier.out_proj.bias",
                 "classifier.out_proj.weight"]
ELECTRA = Family(
    # Odd widths: 20-wide embeddings projected to 36 (head_dim 9), a 37-wide MLP.
    "electra", dict(vocab_size=99, embedding_size=20, hidden_size=36, num_attention_heads=4, intermediate_size=37,
                    max_position_embeddings=64, type_vocab_size=2, num_hidden_layers=2, initializer_range=0.1,
                    pad_token_id=0),
    "ElectraForSequenceClassification", "ElectraModel", "ElectraForPreTraining", "electra",
    functools.partial(padded_batch, seq_len=10, token_types=True),
    token_classifier="ElectraForTokenClassification", multiple_choice="ElectraForMultipleChoice",
    question_answering="ElectraForQuestionAnswering",
    variants=(("projected_3_labels", (), 3), ("same_width_2_labels", _pairs(embedding_size=36), 2),
              ("projected_1_label", (), 1)),
    token_types=True,
    bf16_atol=5e-2,  # measured max difference ~1e-2
    reports=(
        ("ElectraModel", (), [], _ELECTRA_HEAD),
        ("ElectraForPreTraining", (), ["discriminator_predictions.dense.bias", "discriminator_predictions.dense.weight",
                                   "discriminator_predictions.dense_prediction.bias",
                                   "discriminator_predictions.dense_prediction.weight"], _ELECTRA_HEAD),
        # generator_lm_head.weight is tied to the word embeddings and not saved.
        ("ElectraForMaskedLM", (), ["generator_lm_head.bias", "generator_predictions.LayerNorm.bias",
                                "generator_predictions.LayerNorm.weight", "generator_predictions.dense.bias",
                                "generator_predictions.dense.weight"], _ELECTRA_HEAD),
    ),
    # (embedding_size 20, hidden 36): the projection's rows split over the fsdp axis.
    fsdp=Fsdp(specs=(("backbone.embeddings_project.kernel", ["fsdp", "None"]),), layout="data=1,fsdp=4"),
    cli=Cli(_electra_with_tokenizer,
            inspect_names=("classifier.out_proj.weight", "discriminator_predictions.dense.weight"),
            exported_names=("electra.embeddings_project.weight", "classifier.out_proj.weight")),
)
_DEBERTA = dict(vocab_size=99, hidden_size=36, num_attention_heads=4, intermediate_size=37, num_hidden_layers=2,
                max_position_embeddings=64, initializer_range=0.1, pad_token_id=0, relative_attention=True)
_DEBERTA_HEAD = ["classifier.bias", "classifier.weight", "pooler.dense.bias", "pooler.dense.weight"]
_DEBERTA_MLM = ["lm_predictions.lm_head.LayerNorm.bias", "lm_predictions.lm_head.LayerNorm.weight",
                "lm_predictions.lm_head.bias", "lm_predictions.lm_head.dense.bias",
                "lm_predictions.lm_head.dense.weight"]
# The legacy head's decoder weight is tied to the word embeddings and not saved.
_DEBERTA_LEGACY_MLM = ["cls.predictions.bias", "cls.predictions.transform.LayerNorm.bias",
                       "cls.predictions.transform.LayerNorm.weight", "cls.predictions.transform.dense.bias",
                       "cls.predictions.transform.dense.weight"]
DEBERTA_SEQ_LEN = 40
"""Longer than max_relative_positions (16) and the 8 buckets: clipping and log buckets both act."""
DEBERTA_V3 = Family(
    # What DeBERTa-v3 checkpoints set, at toy size: shared keys, 8 log buckets over 16 positions, LayerNorm on
    # the position table, no absolute positions, no token types.
    "deberta-v3", {**_DEBERTA, "position_buckets": 8, "max_relative_positions": 16, "share_att_key": True,
                   "norm_rel_ebd": "layer_norm", "pos_att_type": "p2c|c2p", "type_vocab_size": 0,
                   "position_biased_input": False},
    "DebertaV2ForSequenceClassification", "DebertaV2Model", "DebertaV2ForMaskedLM", "deberta",
    functools.partial(padded_batch, seq_len=DEBERTA_SEQ_LEN, token_types=False),
    token_classifier="DebertaV2ForTokenClassification", multiple_choice="DebertaV2ForMultipleChoice",
    question_answering="DebertaV2ForQuestionAnswering",
    variants=(("3_labels", (), 3),
              # max_relative_positions unset (-> max_position_embeddings), c2p alone, separate key projection
              ("c2p_only_1_label", _pairs(pos_att_type="c2p", position_biased_input=True, position_buckets=-1,
                                          max_relative_positions=-1, share_att_key=False, norm_rel_ebd="none"), 1)),
    bf16_atol=1e-2,  # measured max 3.3e-3 on logits of order 1
    eager=True,
    reports=(
        ("DebertaV2Model", (), [], _DEBERTA_HEAD),
        ("DebertaV2ForMaskedLM", _pairs(legacy=False), _DEBERTA_MLM, _DEBERTA_HEAD),
        ("DebertaV2ForMaskedLM", _pairs(legacy=True), _DEBERTA_LEGACY_MLM, _DEBERTA_HEAD),
    ),
    cli=Cli(_deberta_with_tokenizer, inspect_names=("pooler.dense.weight", "lm_predictions.lm_head.dense.weight"),
            exported_names=("deberta.encoder.rel_embeddings.weight", "pooler.dense.weight")),
    packing=_pairs(position_buckets=4, max_relative_positions=8),
)
DEBERTA_V2 = Family(
    # DeBERTa-v2 xlarge's switches (ConvLayer with groups, absolute positions, token types, separate
    # position projections, no buckets), plus a factorised embedding and a non-default pooler.
    "deberta-v2", {**_DEBERTA, "max_relative_positions": 16, "pos_att_type": ["c2p", "p2c"], "conv_kernel_size": 3,
                   "conv_groups": 2, "conv_act": "gelu", "type_vocab_size": 2, "position_biased_input": True,
                   "embedding_size": 20, "pooler_hidden_act": "tanh", "cls_dropout": 0.3},
    "DebertaV2ForSequenceClassification", "DebertaV2Model", "DebertaV2ForMaskedLM", "deberta",
    functools.partial(padded_batch, seq_len=DEBERTA_SEQ_LEN, token_types=True),
    token_classifier="DebertaV2ForTokenClassification", multiple_choice="DebertaV2ForMultipleChoice",
    question_answering="DebertaV2ForQuestionAnswering",
    variants=(("2_labels", (), 2),),
    token_types=True,
    bf16_atol=1e-2,  # measured max 3.1e-3 on logits of order 1
    eager=True,
    reports=(
        ("DebertaV2Model", (), [], _DEBERTA_HEAD),
        ("DebertaV2ForMaskedLM", _pairs(legacy=True), _DEBERTA_LEGACY_MLM, _DEBERTA_HEAD),
    ),
    fsdp=Fsdp(
        # Position tables split by rows, kernels (the conv's too) by input features, where 4 divides the dimension.
        split=frozenset({"backbone.embeddings.embed_proj.kernel", "backbone.layers.1.attention.pos_key.kernel",
                         "backbone.layers.0.attention.pos_query.kernel", "head.dense.kernel"}),
        whole=frozenset({"backbone.embeddings.word_embeddings.embedding"}),
        specs=(("backbone.rel_embeddings.embedding", ["fsdp", "None"]),  # 2 * 16 rows
               ("backbone.conv.conv.kernel", ["None", "fsdp", "None"])),  # (width 3, in 36, out 36)
        overrides=_pairs(conv_groups=1)),
    other_heads=("mean",),  # every head runs on the v3 row: the same backbone code
    packing=_pairs(max_relative_positions=8),
    family_of_classes=False,
)
MODERNBERT_BIASES = _pairs(attention_bias=True, mlp_bias=True, norm_bias=True, classifier_bias=True)
MODERNBERT_SEQ_LEN = 13
_MODERNBERT_KERNELS = [f"backbone.layers.{i}.{name}.kernel" for i in range(4)
                       for name in ("attn.Wqkv", "attn.Wo", "mlp.Wi")] + ["head.dense.kernel", "head.classifier.kernel"]
MODERNBERT = Family(
    # 44 wide in 2 heads (head_dim 22: RoPE needs it even), a 37-wide GeGLU; 4 layers, global at 0 and 3,
    # a window of 4 (2 keys each side) on 13-token inputs; RoPE thetas far from the defaults.
    "modernbert", dict(vocab_size=99, hidden_size=44, num_attention_heads=2, intermediate_size=37,
                       num_hidden_layers=4, max_position_embeddings=64, global_attn_every_n_layers=3, local_attention=4,
                       global_rope_theta=500.0, local_rope_theta=77.0, initializer_range=0.1, pad_token_id=0,
                       bos_token_id=1, cls_token_id=1, eos_token_id=2, sep_token_id=2),
    "ModernBertForSequenceClassification", "ModernBertModel", "ModernBertForMaskedLM", "modernbert",
    functools.partial(padded_batch, seq_len=MODERNBERT_SEQ_LEN, lowest_id=3, token_types=False),
    token_classifier="ModernBertForTokenClassification", multiple_choice="ModernBertForMultipleChoice",
    question_answering="ModernBertForQuestionAnswering",
    variants=(("no_bias-cls-every3", (), 3),
              ("biases-mean-every2-silu", tuple(sorted(dict(MODERNBERT_BIASES, global_attn_every_n_layers=2,
                                                            classifier_pooling="mean",
                                                            classifier_activation="silu").items())), 1),
              ("3_layers-window6-cls-every2", _pairs(num_hidden_layers=3, global_attn_every_n_layers=2,
                                                     local_attention=6, norm_bias=True), 5)),
    norm_scales=r"norm\.weight$",
    eager=True,
    head_prefix="flaxheads_head.",
    reports=(
        ("ModernBertModel", (), [], ["classifier.bias", "classifier.weight", "head.dense.weight", "head.norm.weight"]),
        # The masked-LM head's head.dense/head.norm are the classification head's, as in transformers;
        # decoder.weight is tied to the token embeddings and not saved.
        ("ModernBertForMaskedLM", (), ["decoder.bias"], ["classifier.bias", "classifier.weight"]),
    ),
    # Kernels split by input features (44 and 37 rows: 4 divides 44 only), the 99-row vocabulary whole.
    fsdp=Fsdp(split=frozenset(_MODERNBERT_KERNELS),
              whole=frozenset({"backbone.embeddings.tok_embeddings.embedding",
                               *(f"backbone.layers.{i}.mlp.Wo.kernel" for i in range(4))}),
              overrides=MODERNBERT_BIASES),
    cli=Cli(_modernbert_with_tokenizer, inspect_names=("classifier.weight", "decoder.bias"),
            check=_modernbert_convert_of_the_masked_lm_keeps_its_head_and_tokenizer),
)
_XLNET_HEAD = ["logits_proj.bias", "logits_proj.weight", "sequence_summary.summary.bias",
               "sequence_summary.summary.weight"]
XLNET = Family(
    "xlnet", dict(vocab_size=99, d_model=32, n_head=4, d_inner=37, n_layer=2, initializer_range=0.1),
    "XLNetForSequenceClassification", "XLNetModel", "XLNetLMHeadModel", "summary",
    xlnet_batch,
    token_classifier="XLNetForTokenClassification", multiple_choice="XLNetForMultipleChoice",
    # XLNetForQuestionAnswering (the "squad" head) is tested in tests/test_xlnet_squad.py.
    question_answering="XLNetForQuestionAnsweringSimple",
    paddings=("left",),
    padding_side="left",
    variants=tuple((f"{summary_type}_{n}", _pairs(summary_type=summary_type), n)
                   for summary_type in ("last", "first", "mean", "cls_index") for n in (1, 2, 5)),
    token_types=True,
    layers_key="n_layer",
    reports=(
        ("XLNetModel", (), [], _XLNET_HEAD),
        ("XLNetLMHeadModel", (), ["lm_loss.bias"], _XLNET_HEAD),  # lm_loss.weight is tied to the embeddings
    ),
)
GPT2 = Family(
    "gpt2", dict(vocab_size=99, n_embd=32, n_layer=2, n_head=4, n_positions=64, n_inner=37, bos_token_id=EOS,
                 eos_token_id=EOS, pad_token_id=EOS, initializer_range=0.1),
    "GPT2ForSequenceClassification", "GPT2Model", "GPT2LMHeadModel", "last_token",
    # ids never 0 or 98: the pad ids the GPT-2 tests use
    functools.partial(padded_batch, seq_len=10, pad_id=EOS, highest_id=90, token_types=False),
    token_classifier="GPT2ForTokenClassification",  # no GPT2ForMultipleChoice in transformers
    question_answering="GPT2ForQuestionAnswering",
    paddings=("right", "left", "none"),
    variants=(("1_label", (), 1), ("2_labels", (), 2), ("5_labels", (), 5)),
    token_types=True,  # GPT-2 embeds token types with its word embeddings (wte)
    layers_key="n_layer",
    norm_scales=r"(^|\.)ln_[^.]*\.weight$",
    load_options=_pairs(pad_token_id=EOS),
    reports=(
        ("GPT2Model", (), [], ["score.weight"]),
        ("GPT2LMHeadModel", (), [], ["score.weight"]),  # transformers does not write the tied lm_head.weight
    ),
    cli=Cli(_gpt2_with_tokenizer, check=_pad_less_run_pads_with_eos),
)

# ---------------------------------------------------------------------------------------------
# Decoder LLMs: 32 wide, 4 query heads, 3 layers, sequences of 12 with sliding windows of 4-5

DECODER_SEQ_LEN = 12
_DECODER = dict(TINY_CONFIG, num_hidden_layers=3, pad_token_id=0, bos_token_id=1, eos_token_id=2)
_LLAMA3_ROPE = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                    original_max_position_embeddings=8)


def _decoder(name: str, prefix: str, overrides: dict, *, causal_lm: str | None = None, padding_side: str = "left",
             token_classifier: bool = True, question_answering: bool = True, **options) -> Family:
    """A decoder row: every other head runs on Llama; the others share its backbone code and run "mean".
    Token classifiers and question answering are transformers' `GenericForTokenClassification` and
    `GenericForQuestionAnswering`; no decoder has a multiple-choice class."""
    gemma = prefix.startswith("Gemma")  # ties lm_head to the embeddings: transformers does not write it
    causal_lm = causal_lm or f"{prefix}ForCausalLM"
    return Family(
        name, {**_DECODER, **overrides}, f"{prefix}ForSequenceClassification", f"{prefix}Model", causal_lm,
        "last_token", functools.partial(padded_batch, seq_len=DECODER_SEQ_LEN, token_types=False),
        # RMSNorm scales around 1; Gemma stores w of (1 + w) around 0.
        norm_scales=None if gemma else "norm",
        padding_side=padding_side,
        eager=True,
        reports=((f"{prefix}Model", (), [], ["score.weight"]),
                 (causal_lm, (), [] if gemma else ["lm_head.weight"], ["score.weight"])),
        # A dimension the 4 devices do not divide stays whole (vocab 99, intermediate 37).
        fsdp=Fsdp(split=frozenset({"backbone.layers.0.attention.query.kernel",
                                   "backbone.layers.1.attention.output.kernel", "backbone.layers.2.mlp.up.kernel",
                                   "head.score.kernel"})),
        packing=_pairs(num_hidden_layers=2),
        token_classifier=f"{prefix}ForTokenClassification" if token_classifier else None,
        question_answering=f"{prefix}ForQuestionAnswering" if question_answering else None,
        **{"other_heads": ("mean",), **options},
    )


LLAMA = _decoder("llama", "Llama", dict(num_key_value_heads=2, head_dim=12, attention_bias=True, mlp_bias=True,
                                        rope_scaling=_LLAMA3_ROPE, rope_theta=500.0),
                 other_heads=None,
                 cli=Cli(_llama_with_tokenizer, inspect_names=("score.weight", "lm_head.weight"),
                         check=_llama_predict_refuses_empty_texts_and_ignores_token_types, tokens=True))
LLAMA_LINEAR_ROPE = _decoder("llama_linear_rope", "Llama",
                             dict(num_key_value_heads=1, rope_scaling=dict(rope_type="linear", factor=2.0)),
                             family_of_classes=False)
LLAMA_LINEAR_ROPE = dataclasses.replace(LLAMA_LINEAR_ROPE, fsdp=None, packing=None)
DECODERS = (
    LLAMA,
    LLAMA_LINEAR_ROPE,
    _decoder("mistral", "Mistral", dict(num_key_value_heads=2, sliding_window=5)),
    _decoder("qwen2", "Qwen2", dict(num_key_value_heads=2, use_sliding_window=True, sliding_window=4,
                                    max_window_layers=1), padding_side="right"),
    _decoder("qwen3", "Qwen3", dict(num_key_value_heads=2, head_dim=12, attention_bias=True, use_sliding_window=True,
                                    sliding_window=4, max_window_layers=1), padding_side="right"),
    # transformers has no Gemma question answering (GemmaForQuestionAnswering, Gemma2's, Gemma3's).
    _decoder("gemma", "Gemma", dict(num_key_value_heads=1, head_dim=12), question_answering=False),
    _decoder("gemma2", "Gemma2", dict(num_key_value_heads=2, head_dim=12, sliding_window=4, query_pre_attn_scalar=10,
                                      attn_logit_softcapping=2.0), question_answering=False),
    # Gemma3's text-only causal LM is Gemma3ForCausalLM (Gemma3ForSequenceClassification is multimodal).
    _decoder("gemma3_text", "Gemma3Text", dict(num_key_value_heads=2, head_dim=12, sliding_window=4,
                                               query_pre_attn_scalar=10, rope_local_base_freq=100.0,
                                               sliding_window_pattern=2, rope_scaling=dict(rope_type="linear",
                                                                                           factor=2.0)),
             causal_lm="Gemma3ForCausalLM", token_classifier=False,  # transformers has no Gemma3 token classifier
             question_answering=False),
)

FAMILIES: dict[str, Family] = {row.name: row for row in (
    BERT, ROBERTA, XLM_ROBERTA, DISTILBERT, ALBERT, ELECTRA, DEBERTA_V3, DEBERTA_V2, MODERNBERT, XLNET, GPT2,
    *DECODERS,
)}


def family_of(architecture: str) -> Family:
    """The row whose transformers classes include `architecture` (the first with family_of_classes)."""
    for row in FAMILIES.values():
        if row.family_of_classes and architecture in row.architectures():
            return row
    prefix = re.match(r"[A-Z][A-Za-z0-9]*?(?=For|Model|LMHead)", architecture)
    for row in FAMILIES.values():
        if row.family_of_classes and prefix and row.classifier.startswith(prefix.group(0)):
            return row
    raise KeyError(f"no family row builds {architecture}")


def rows(*, having: str | None = None, fast: bool = True) -> list:
    """pytest params of every row (id: its name), those whose field `having` is set when given;
    marked `slow` unless `fast`."""
    return [case(row, id=row.name, fast=fast) for row in FAMILIES.values()
            if having is None or getattr(row, having) is not None]


def case(*values, id: str, fast: bool):
    """A pytest param, marked `slow` (left out of `scripts/test.sh --fast`) unless `fast`: the fast
    lane keeps one case of each scenario on each family, the full suite every case."""
    import pytest

    return pytest.param(*values, id=id, marks=() if fast else pytest.mark.slow)


# ---------------------------------------------------------------------------------------------
# Tasks: the problem types transformers' *ForSequenceClassification computes a loss for


@dataclasses.dataclass(frozen=True)
class Task:
    problem_type: str
    num_labels: int
    labels: np.ndarray
    """Labels of a batch of three, as transformers takes them."""


TASKS: dict[str, Task] = {
    "single_label": Task("single_label_classification", 3, np.array([0, 2, 1])),
    "multi_label": Task("multi_label_classification", 4, np.array([[1, 0, 1, 0], [0, 0, 0, 1], [1, 1, 0, 0]],
                                                                  np.float32)),
    "regression": Task("regression", 1, np.array([0.5, -1.0, 2.0], np.float32)),
    # Several outputs: transformers' MSELoss over the (batch, num_labels) logits, no squeeze.
    "regression_2_outputs": Task("regression", 2, np.array([[0.5, -1.0], [2.0, 0.0], [0.1, 0.3]], np.float32)),
}
"""Task id -> Task; pairwise reward models (flaxheads' own problem type) are tested in test_reward.py."""
