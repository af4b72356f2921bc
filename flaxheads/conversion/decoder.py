"""Conversion tables for the decoder LLMs: Llama, Mistral, Qwen2, Qwen3, Gemma, Gemma2, Gemma3 text.

Their `*Model`, `*ForCausalLM` and `*ForSequenceClassification` keep the base model under
`model.`; the classifier is transformers' `GenericForSequenceClassification`: a bias-free
`score` on the last non-pad token, flaxheads' "last_token" head. A `*ForCausalLM` checkpoint's
`lm_head.weight` (absent from the file when tied to the embeddings) is reported unused.

One rule list serves every family: a rule whose parameter a model lacks (biases, q/k norms) is
dropped for that model (`conversion.rules.backbone_rules`). Only the meaning of
`post_attention_layernorm` differs: the norm before the MLP in Llama's layout, the norm on the
attention output in Gemma2/3's sandwich layout (which names the pre-MLP norm
`pre_feedforward_layernorm`).
"""

from __future__ import annotations

from flaxheads.conversion.table import (
    LINEAR, TOKEN_CLASSIFICATION, ArchitectureTable, Rule, embedding, linear, token_classification,
)

_LAYER = "{base}layers.{i}"


def _rms_norm(hf: str, flax: str) -> list[Rule]:
    return [Rule(f"{hf}.weight", f"{flax}.scale")]


def _backbone(sandwich: bool) -> tuple[Rule, ...]:
    after_attention = "attention_output_norm" if sandwich else "mlp_norm"
    return (
        *embedding("{base}embed_tokens", "token_embeddings"),
        *_rms_norm(f"{_LAYER}.input_layernorm", "layers.{i}.attention_norm"),
        *linear(f"{_LAYER}.self_attn.q_proj", "layers.{i}.attention.query"),
        *linear(f"{_LAYER}.self_attn.k_proj", "layers.{i}.attention.key"),
        *linear(f"{_LAYER}.self_attn.v_proj", "layers.{i}.attention.value"),
        *linear(f"{_LAYER}.self_attn.o_proj", "layers.{i}.attention.output"),
        *_rms_norm(f"{_LAYER}.self_attn.q_norm", "layers.{i}.attention.query_norm"),
        *_rms_norm(f"{_LAYER}.self_attn.k_norm", "layers.{i}.attention.key_norm"),
        *_rms_norm(f"{_LAYER}.post_attention_layernorm", f"layers.{{i}}.{after_attention}"),
        *(_rms_norm(f"{_LAYER}.pre_feedforward_layernorm", "layers.{i}.mlp_norm") if sandwich else ()),
        *(_rms_norm(f"{_LAYER}.post_feedforward_layernorm", "layers.{i}.mlp_output_norm") if sandwich else ()),
        *linear(f"{_LAYER}.mlp.gate_proj", "layers.{i}.mlp.gate"),
        *linear(f"{_LAYER}.mlp.up_proj", "layers.{i}.mlp.up"),
        *linear(f"{_LAYER}.mlp.down_proj", "layers.{i}.mlp.down"),
        *_rms_norm("{base}norm", "final_norm"),
    )


def _table(model_type: str, name: str, *, sandwich: bool = False, token_classifier: bool = True) -> ArchitectureTable:
    return ArchitectureTable(
        model_type=model_type,
        base_prefix="model",
        base_architecture=f"{name}Model",
        classification_architecture=f"{name}ForSequenceClassification",
        canonical_head="last_token",
        backbone=_backbone(sandwich),
        # `score` is a bias-free nn.Linear outside the base model: "score.weight", no prefix.
        heads={"last_token": (Rule("score.weight", "score.kernel", LINEAR),)},
        # GenericForTokenClassification: dropout, then `score` with a bias (unless the config sets
        # token_classification_bias=False), on every token.
        tasks={TOKEN_CLASSIFICATION: token_classification(f"{name}ForTokenClassification", "score")}
        if token_classifier else {},
    )


LLAMA = _table("llama", "Llama")
MISTRAL = _table("mistral", "Mistral")
QWEN2 = _table("qwen2", "Qwen2")
QWEN3 = _table("qwen3", "Qwen3")
GEMMA = _table("gemma", "Gemma")
GEMMA2 = _table("gemma2", "Gemma2", sandwich=True)
# transformers has no Gemma3 token classifier (Gemma3ForSequenceClassification is multimodal).
GEMMA3_TEXT = _table("gemma3_text", "Gemma3Text", sandwich=True, token_classifier=False)

DECODER_TABLES = (LLAMA, MISTRAL, QWEN2, QWEN3, GEMMA, GEMMA2, GEMMA3_TEXT)
