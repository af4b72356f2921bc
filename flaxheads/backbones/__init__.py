"""Backbones by Hugging Face `model_type`. Each family lives in its own file."""

from __future__ import annotations

import dataclasses
from typing import Any

from flax import nnx

from flaxheads.backbones.albert import Albert, AlbertConfig
from flaxheads.backbones.deberta import DebertaV2, DebertaV2Config
from flaxheads.backbones.decoder import Decoder
from flaxheads.backbones.decoder_config import FAMILIES as DECODER_FAMILIES, DecoderConfig
from flaxheads.backbones.distilbert import DistilBert, DistilBertConfig
from flaxheads.backbones.encoder import Encoder, EncoderConfig
from flaxheads.backbones.gpt2 import GPT2, GPT2Config
from flaxheads.backbones.interface import BackboneConfig, BackboneOutput
from flaxheads.backbones.modernbert import ModernBert, ModernBertConfig
from flaxheads.backbones.xlnet import XLNet, XLNetConfig


@dataclasses.dataclass(frozen=True)
class BackboneSpec:
    config_cls: type
    module_cls: type
    padding_side: str
    """Where tokenizers should pad for this family's canonical head ("right" or "left")."""
    token_types: bool = True
    """Whether the family reads token_type_ids; the decoder LLMs have none (a tokenizer that gives
    them anyway has them dropped, `flaxheads.tokenizer.for_model`)."""


BACKBONES: dict[str, BackboneSpec] = {
    "bert": BackboneSpec(EncoderConfig, Encoder, padding_side="right"),
    "roberta": BackboneSpec(EncoderConfig, Encoder, padding_side="right"),
    "electra": BackboneSpec(EncoderConfig, Encoder, padding_side="right"),
    "xlm-roberta": BackboneSpec(EncoderConfig, Encoder, padding_side="right"),
    "distilbert": BackboneSpec(DistilBertConfig, DistilBert, padding_side="right"),
    # The last_token head finds the last real token on either side; right is transformers' GPT-2 default.
    "gpt2": BackboneSpec(GPT2Config, GPT2, padding_side="right"),
    # XLNet was pretrained with left padding and its "summary" head reads the last token.
    "xlnet": BackboneSpec(XLNetConfig, XLNet, padding_side="left"),
    "albert": BackboneSpec(AlbertConfig, Albert, padding_side="right"),
    "deberta-v2": BackboneSpec(DebertaV2Config, DebertaV2, padding_side="right"),
    "modernbert": BackboneSpec(ModernBertConfig, ModernBert, padding_side="right"),
    # Decoder LLMs: the padding side of transformers' tokenizer for each family (Llama's and
    # Gemma's tokenizers pad left, Qwen2's right; Mistral ships Llama's). The last_token head
    # reads the last real token on either side.
    **{model_type: BackboneSpec(DecoderConfig, Decoder, padding_side="right" if model_type.startswith("qwen") else
                                "left", token_types=False) for model_type in DECODER_FAMILIES},
}


def backbone_spec(model_type: str | None) -> BackboneSpec:
    try:
        return BACKBONES[model_type]
    except KeyError:
        raise ValueError(
            f"model_type {model_type!r} is not supported; flaxheads has backbones for {sorted(BACKBONES)}"
        ) from None


def backbone_config_from_hf(hf_config: dict[str, Any]) -> BackboneConfig:
    """The backbone config for a Hugging Face `config.json` dict; ValueError for unknown model types."""
    return backbone_spec(hf_config.get("model_type")).config_cls.from_hf_config(hf_config)


def build_backbone(cfg: BackboneConfig, *, dtype, param_dtype, rngs: nnx.Rngs, add_pooling_layer: bool = False):
    spec = backbone_spec(cfg.model_type)
    module = spec.module_cls(cfg, dtype=dtype, param_dtype=param_dtype, add_pooling_layer=add_pooling_layer, rngs=rngs)
    # Layers whose attention kernel depends on the padding side (`attention.kernel`) learn the
    # family's, the side flaxheads' tokenizers pad (`tokenizer.py`): a static choice, no run-time check.
    module.set_attributes(padding_side=spec.padding_side, raise_if_not_found=False)
    return module


__all__ = [
    "Albert",
    "AlbertConfig",
    "BACKBONES",
    "BackboneConfig",
    "BackboneOutput",
    "DebertaV2",
    "DebertaV2Config",
    "DistilBert",
    "Decoder",
    "DecoderConfig",
    "DistilBertConfig",
    "Encoder",
    "EncoderConfig",
    "GPT2",
    "GPT2Config",
    "ModernBert",
    "ModernBertConfig",
    "XLNet",
    "XLNetConfig",
    "backbone_config_from_hf",
    "backbone_spec",
    "build_backbone",
]
