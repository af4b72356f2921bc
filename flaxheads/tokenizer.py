"""The tokenizer a model reads its text with: finding and loading it, checking it is the model's,
the one decision of which id pads a model's batches, and the longest input a model can take.

Training, evaluation, prediction and the pipeline all come here, so a model and the batches it
reads always agree. Below training and inference; above the backbones and checkpoint folders.
"""

from __future__ import annotations

import copy
import dataclasses
import numbers
import os
import sys
from pathlib import Path

import jax

from flaxheads import notes, quiet_imports
from flaxheads.backbones import BackboneConfig, backbone_config_from_hf, backbone_spec
from flaxheads.conversion.model_folder import folder_of, open_checkpoint

VOCABULARY_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "spiece.model", "sentencepiece.bpe.model",
                    "tokenizer.model")
"""Files that carry a tokenizer's vocabulary; a folder with none of them has no tokenizer."""
UNKNOWN_LIMIT = 1_000_000
"""Tokenizers without a known length limit report an enormous `model_max_length`; anything from
here up means "no limit"."""


def note(message: str) -> None:
    """`message` on stderr as a note, from process 0 only."""
    if jax.process_index() == 0:
        print(f"note: {notes.worded(message)}", file=sys.stderr)


@dataclasses.dataclass(frozen=True)
class PadIds:
    """Which id pads a model's inputs, and the pad_token_id the model is loaded with."""

    input_ids: int
    """Fills the padded positions of `input_ids` in every batch the model reads."""
    model: int | None
    """The model's `pad_token_id` (None only when neither config nor tokenizer has one)."""


def pad_token_ids(tokenizer, config_pad_token_id: int | None) -> PadIds:
    """The pad ids of a model whose config.json says `config_pad_token_id`, read with `tokenizer`.

    The only place flaxheads decides a pad id; loading, training, evaluation and prediction all
    ask here, because the model and its batches must agree:

    - The model keeps config.json's pad id when it has one. GPT-2 has none (nor has its
      tokenizer a pad token): the tokenizer's pad token, else its end-of-text token, as
      transformers documents (`model.config.pad_token_id = tokenizer.eos_token_id`).
    - Batches pad `input_ids` with the model's id, not the tokenizer's, because the model is
      what reads them: the "last_token" head takes the last id that is not the model's pad id
      as the text's end, and RoBERTa counts positions over ids that are not its pad id. Encoders
      find real tokens through `attention_mask`, so for them any valid id would do.
    - With no pad id anywhere, heads find real tokens through `attention_mask`; id 0 pads.
    """
    model = config_pad_token_id
    if model is None:
        model = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return PadIds(input_ids=0 if model is None else model, model=model)


def load_tokenizer(model_dir: str | os.PathLike, tokenizer_name: str | os.PathLike | None = None):
    """(tokenizer, pad_token_id to load the model with) for the model in `model_dir`.

    The tokenizer comes from `tokenizer_name` when given, else from `model_dir`; either folder
    must hold tokenizer files: transformers would otherwise build an empty fallback tokenizer that
    reads every word as unknown. It pads on the side the model's family expects, and with the
    model's pad id (`pad_token_ids`): a tokenizer without a pad token (GPT-2) gets the model's,
    so the tokenizer saved with a trained model pads in transformers as flaxheads does.

    Raises ValueError naming `tokenizer_name=` for a folder without tokenizer files, and for a
    tokenizer whose ids do not fit the model's vocabulary (it is not the model's tokenizer).
    """
    checkpoint = open_checkpoint(model_dir)  # a folder, or a hub id in the huggingface_hub cache; read once
    model_dir = checkpoint.folder
    backbone = backbone_config_from_hf(checkpoint.config)
    if tokenizer_name:
        tokenizer = read_tokenizer(tokenizer_name)
    elif not has_vocabulary(model_dir):
        raise ValueError(
            f"{model_dir} holds no tokenizer (none of {', '.join(VOCABULARY_FILES)}), and text read with "
            "another tokenizer gives meaningless predictions. Pass the folder of the tokenizer the model was "
            "trained with as tokenizer_name=, or save it next to the model (tokenizer.save_pretrained)"
        )
    else:
        tokenizer = read_tokenizer(checkpoint)
    check_tokenizer_fits(tokenizer, backbone, f"the model in {model_dir}")
    tokenizer = for_model(tokenizer, backbone)
    tokenizer.padding_side = backbone_spec(backbone.model_type).padding_side
    pad_token_id = pad_token_ids(tokenizer, backbone.pad_token_id).model
    pad_token = None if pad_token_id is None else tokenizer.convert_ids_to_tokens(pad_token_id)
    if tokenizer.pad_token_id is None and pad_token is not None:
        tokenizer.pad_token = pad_token
    if backbone.pad_token_id is None and pad_token_id is not None:
        note(f"{model_dir} sets no pad_token_id; using the tokenizer's {tokenizer.pad_token!r} "
             f"(id {pad_token_id}), saved with the model")
    return tokenizer, pad_token_id


def for_model(tokenizer, backbone: BackboneConfig):
    """`tokenizer`, or a shallow copy of it that gives no token_type_ids where the backbone's
    family reads none (the decoder LLMs: a tokenizer saved with `return_token_type_ids` would
    otherwise make every batch fail). The caller's tokenizer is left as it is."""
    names = list(getattr(tokenizer, "model_input_names", []))
    if backbone_spec(backbone.model_type).token_types or "token_type_ids" not in names:
        return tokenizer
    adjusted = copy.copy(tokenizer)
    adjusted.model_input_names = [name for name in names if name != "token_type_ids"]
    return adjusted


def check_room_for_text(tokenizer, max_seq_length: int, *, pairs: bool = False) -> None:
    """ValueError when `max_seq_length` leaves no token for the text after the special tokens the
    tokenizer adds ([CLS] and [SEP], say): every example would read the same."""
    special = tokenizer.num_special_tokens_to_add(pair=pairs)
    if max_seq_length - special < 1 + int(pairs):
        raise ValueError(
            f"max_seq_length={max_seq_length} leaves no room for text: the tokenizer adds {special} special token(s) "
            f"to every {'pair' if pairs else 'text'}, so every example would be read as the same "
            f"{max_seq_length} tokens. Pass a max_seq_length of at least {special + 1 + int(pairs)} (128 is usual)"
        )


def read_tokenizer(folder: str | os.PathLike):
    """The transformers tokenizer saved in `folder`; ValueError if it holds none."""
    transformers = quiet_imports.transformers()

    folder = folder_of(folder)
    if not has_vocabulary(folder):
        raise ValueError(f"{folder} holds no tokenizer (none of {', '.join(VOCABULARY_FILES)}); pass the folder "
                         "of the tokenizer the model was trained with")
    try:
        return transformers.AutoTokenizer.from_pretrained(str(folder))
    except (OSError, ValueError) as err:
        raise ValueError(f"cannot load a tokenizer from {folder}: {err}") from None


def has_vocabulary(folder: str | os.PathLike) -> bool:
    """Whether `folder` holds a tokenizer's vocabulary file."""
    return any((Path(folder) / name).is_file() for name in VOCABULARY_FILES)


def check_tokenizer_fits(tokenizer, backbone: BackboneConfig, model: str) -> None:
    """ValueError if `tokenizer` has ids past the vocabulary of `model` (described in words):
    it is not that model's tokenizer, and its ids would index past the embeddings."""
    vocab_size = getattr(backbone, "vocab_size", None)
    if vocab_size is not None and len(tokenizer) > vocab_size:
        raise ValueError(
            f"the tokenizer {getattr(tokenizer, 'name_or_path', '')!r} has {len(tokenizer)} tokens and {model} "
            f"embeds only {vocab_size}: it is not this model's tokenizer. Pass the model's own tokenizer as "
            "tokenizer_name="
        )


def model_pad_token_id(model_dir: str | os.PathLike, tokenizer) -> int | None:
    """The pad_token_id to load the model in `model_dir` with, to read `tokenizer`'s batches."""
    backbone = backbone_config_from_hf(open_checkpoint(model_dir).config)
    return pad_token_ids(tokenizer, backbone.pad_token_id).model


def fitting_max_length(backbone: BackboneConfig, requested: int) -> int:
    """`requested` tokens, or the model's position limit (with a printed note) when it is shorter:
    positions past the learned embeddings have no meaning (transformers fails on them; an
    unchecked gather would silently clamp them). ValueError for a `requested` that is not an int
    of at least 1."""
    if isinstance(requested, bool) or not isinstance(requested, numbers.Integral) or requested < 1:
        raise ValueError(f"max_seq_length={requested!r}: it must be an int of at least 1 (tokens per text)")
    limit = backbone.max_sequence_length
    if limit is None or requested <= limit:
        return requested
    note(f"max_seq_length {requested} is longer than the {limit} positions the model's embeddings cover; "
         f"texts are truncated to {limit} tokens")
    return limit


def longest_input(backbone: BackboneConfig, tokenizer) -> int | None:
    """The most tokens a text may keep when the caller sets no limit: as many as the model's
    positions cover (transformers does not truncate, and fails past them), or the tokenizer's;
    None when neither sets one (relative positions, as XLNet's): texts are then not cut at all,
    as transformers' pipeline does not cut them."""
    limits = [backbone.max_sequence_length, tokenizer.model_max_length]
    known = [limit for limit in limits if limit is not None and limit < UNKNOWN_LIMIT]
    return min(known) if known else None


__all__ = [
    "VOCABULARY_FILES",
    "PadIds",
    "check_room_for_text",
    "check_tokenizer_fits",
    "for_model",
    "fitting_max_length",
    "has_vocabulary",
    "load_tokenizer",
    "longest_input",
    "model_pad_token_id",
    "note",
    "pad_token_ids",
    "read_tokenizer",
]
