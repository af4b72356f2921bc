"""The configuration of the decoder LLM families (`flaxheads.backbones.decoder`): one frozen
dataclass for Llama, Mistral, Qwen2, Qwen3, Gemma, Gemma2 and Gemma3 text, with Hugging Face's
field names, and a `Family` per `model_type` saying which fields its config.json has and which
architectural switches it turns on.

config.json comes in two dialects: transformers 4.x (`rope_theta`, `rope_scaling`, Gemma3's
`rope_local_base_freq` and `sliding_window_pattern`) and transformers 5.x (`rope_parameters`,
nested by layer type for Gemma3). Both are read; configs are written in the 4.x dialect, which
both major versions of transformers read.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from flaxheads.backbones.interface import known_fields, require_multiple, require_sizes
from flaxheads.backbones.rope import Rope

FULL, SLIDING = "full_attention", "sliding_attention"


@dataclasses.dataclass(frozen=True)
class Family:
    """What one `model_type` is made of. The switches are architecture, not configuration: a
    Qwen2 config cannot turn off its q/k/v biases."""

    model_type: str
    fields: tuple[str, ...]
    """The config.json fields this family has (besides the rope ones), written back on export."""
    activation_field: str = "hidden_act"
    """Where config.json names the MLP activation (Gemma2/3: "hidden_activation")."""
    qkv_bias: bool | None = None
    """q/k/v projections have biases: True, False, or None to follow `attention_bias`."""
    output_bias: bool | None = None
    """o_proj has a bias: True, False, or None to follow `attention_bias`."""
    gemma_norms: bool = False
    """RMSNorm scales by (1 + w), w stored around 0; embeddings multiplied by sqrt(hidden_size)."""
    qk_norm: bool = False
    """RMSNorm over head_dim on every query and key head before RoPE (Qwen3, Gemma3)."""
    sandwich_norms: bool = False
    """RMSNorm on the attention and MLP outputs too, before the residual add (Gemma2, Gemma3)."""
    default_layer_types: str = "full"
    """How layers are sliding or global when config.json has no layer_types: "full", "all_sliding"
    (Mistral, when sliding_window is set), "qwen" (sliding from max_window_layers on when
    use_sliding_window), "alternate" (Gemma2: even layers slide), "pattern" (Gemma3: every
    sliding_window_pattern-th layer is global)."""
    attention_softcapping: bool = False
    """attn_logit_softcapping is applied (Gemma2). Gemma3's config has the field but transformers'
    Gemma3 attention never passes it on, so it is kept for the round trip only."""
    per_layer_type_rope: bool = False
    """Sliding layers have their own RoPE (Gemma3's rope_local_base_freq)."""
    layer_types_only_when_set: bool = False
    """Mistral: transformers 5 reads a mistral config.json that has layer_types as Ministral
    (`AutoConfig`: per-layer sliding windows, otherwise the same model), so an export writes
    layer_types only when they differ from the default; plain Mistral exports stay Mistral."""
    default_theta: float = 10000.0
    default_head_dim_from_hidden: bool = True
    defaults: tuple[tuple[str, Any], ...] = ()
    """Defaults of transformers' config class where they differ from `DecoderConfig`'s."""


_COMMON = (
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "max_position_embeddings", "initializer_range", "rms_norm_eps",
    "pad_token_id", "bos_token_id", "eos_token_id", "tie_word_embeddings", "attention_dropout",
)
_GEMMA = ("attention_bias", "query_pre_attn_scalar", "sliding_window", "layer_types",
          "attn_logit_softcapping", "final_logit_softcapping")
_GEMMA_DEFAULTS = (("vocab_size", 256000), ("pad_token_id", 0), ("eos_token_id", 1), ("bos_token_id", 2),
                   ("tie_word_embeddings", True), ("head_dim", 256), ("hidden_act", "gelu_pytorch_tanh"))
_GEMMA2_DEFAULTS = (*_GEMMA_DEFAULTS, ("sliding_window", 4096), ("query_pre_attn_scalar", 256))

FAMILIES: dict[str, Family] = {f.model_type: f for f in (
    Family("llama", (*_COMMON, "hidden_act", "attention_bias", "mlp_bias")),
    Family("mistral", (*_COMMON, "hidden_act", "sliding_window", "layer_types"), qkv_bias=False, output_bias=False,
           default_layer_types="all_sliding", layer_types_only_when_set=True, defaults=(("sliding_window", 4096),)),
    Family("qwen2", (*_COMMON, "hidden_act", "use_sliding_window", "sliding_window", "max_window_layers",
                     "layer_types"),
           qkv_bias=True, output_bias=False, default_layer_types="qwen", defaults=(("sliding_window", 4096),)),
    Family("qwen3", (*_COMMON, "hidden_act", "attention_bias", "use_sliding_window", "sliding_window",
                     "max_window_layers", "layer_types"), qk_norm=True, default_layer_types="qwen",
           default_head_dim_from_hidden=False, defaults=(("head_dim", 128), ("sliding_window", 4096))),
    Family("gemma", (*_COMMON, "hidden_act", "attention_bias"), gemma_norms=True,
           default_head_dim_from_hidden=False, defaults=_GEMMA_DEFAULTS),
    Family("gemma2", (*_COMMON, "hidden_activation", *_GEMMA), activation_field="hidden_activation",
           gemma_norms=True, sandwich_norms=True, attention_softcapping=True, default_layer_types="alternate",
           default_head_dim_from_hidden=False,
           defaults=(*_GEMMA2_DEFAULTS, ("attn_logit_softcapping", 50.0), ("final_logit_softcapping", 30.0))),
    Family("gemma3_text", (*_COMMON, "hidden_activation", *_GEMMA), activation_field="hidden_activation",
           gemma_norms=True, sandwich_norms=True, qk_norm=True, default_layer_types="pattern",
           per_layer_type_rope=True, default_theta=1_000_000.0, default_head_dim_from_hidden=False,
           defaults=(*_GEMMA2_DEFAULTS, ("vocab_size", 262208))),
)}


def family(model_type: str) -> Family:
    try:
        return FAMILIES[model_type]
    except KeyError:
        raise ValueError(f"DecoderConfig serves model_type {sorted(FAMILIES)}, not {model_type!r}") from None


@dataclasses.dataclass(frozen=True)
class DecoderConfig:
    """A decoder LLM backbone, with Hugging Face's field names. Build one with `from_hf_config`
    (which fills the family's defaults and normalises RoPE and layer types) or directly."""

    model_type: str = "llama"
    vocab_size: int = 32000
    hidden_size: int = 4096
    intermediate_size: int = 11008
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    num_key_value_heads: int | None = None
    """Grouped-query attention: query heads share key/value heads in groups; None = num_attention_heads."""
    head_dim: int | None = None
    """None = hidden_size // num_attention_heads; Qwen3 and Gemma set it independently."""
    hidden_act: str = "silu"
    """The MLP's gate activation (config.json's `hidden_activation` for Gemma2/3)."""
    max_position_embeddings: int = 2048
    initializer_range: float = 0.02
    rms_norm_eps: float = 1e-6
    pad_token_id: int | None = None
    """The "last_token" head reads the rightmost token that is not this id (see heads/last_token.py)."""
    bos_token_id: int | None = 1
    eos_token_id: int | tuple[int, ...] | None = 2
    tie_word_embeddings: bool = False
    """Kept for the round trip: the LM head is not part of a classifier."""
    rope: Rope = Rope()
    local_rope: Rope | None = None
    """RoPE of the sliding layers when the family has its own for them (Gemma3); else `rope`."""
    attention_bias: bool = False
    attention_dropout: float = 0.0
    mlp_bias: bool = False
    sliding_window: int | None = None
    """Sliding layers attend to keys at most sliding_window - 1 positions back (transformers' rule)."""
    use_sliding_window: bool = False
    """Qwen2/3: sliding_window applies only when this is true."""
    max_window_layers: int = 28
    layer_types: tuple[str, ...] | None = None
    """"full_attention" or "sliding_attention" per layer; `from_hf_config` always fills it."""
    query_pre_attn_scalar: float | None = None
    """Gemma2/3: attention logits are scaled by query_pre_attn_scalar**-0.5 instead of head_dim**-0.5."""
    attn_logit_softcapping: float | None = None
    """Gemma2: attention logits become cap * tanh(logits / cap) (see `attention_logit_cap`)."""
    final_logit_softcapping: float | None = None
    """Gemma2: applies to the language-model head only (as in transformers' *ForSequenceClassification,
    the classifier's logits are not capped); kept for the round trip."""
    classifier_dropout: float | None = None

    def __post_init__(self):
        fam = family(self.model_type)
        require_sizes(self, "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                      "max_position_embeddings", optional=("num_key_value_heads", "head_dim"))
        if self.num_key_value_heads is None:
            object.__setattr__(self, "num_key_value_heads", self.num_attention_heads)
        if self.head_dim is None:
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)
        require_multiple(num_attention_heads=self.num_attention_heads, num_key_value_heads=self.num_key_value_heads)
        for name in ("eos_token_id", "layer_types"):  # configs must hash: they are static in jit
            if isinstance(getattr(self, name), list):
                object.__setattr__(self, name, tuple(getattr(self, name)))
        if self.layer_types is None:
            types = default_layer_types(fam, self.num_hidden_layers, self.sliding_window, self.use_sliding_window,
                                        self.max_window_layers)
            object.__setattr__(self, "layer_types", types)
        if len(self.layer_types) != self.num_hidden_layers or set(self.layer_types) - {FULL, SLIDING}:
            raise ValueError(
                f"layer_types={list(self.layer_types)} must name {FULL!r} or {SLIDING!r} for each of the "
                f"{self.num_hidden_layers} layers"
            )

    @property
    def family(self) -> Family:
        return family(self.model_type)

    @classmethod
    def from_hf_config(cls, hf: dict[str, Any]) -> "DecoderConfig":
        """Reads a Hugging Face `config.json` dict of any of the `FAMILIES`, in the 4.x or 5.x dialect.
        NotImplementedError for features flaxheads does not implement (other RoPE types,
        Gemma3's bidirectional attention). A Mistral config.json with layer_types reads as
        transformers' AutoConfig reads it, as Ministral: sliding windows on the layers it names."""
        fam = family(hf.get("model_type"))
        if hf.get("use_bidirectional_attention"):
            raise NotImplementedError("use_bidirectional_attention=True is not implemented by flaxheads' decoders")
        values = {**dict(fam.defaults), **known_fields(hf, fam.fields)}
        if fam.activation_field != "hidden_act":
            values["hidden_act"] = hf.get(fam.activation_field) or "gelu_pytorch_tanh"
            values.pop(fam.activation_field, None)
        if fam.model_type == "gemma" and values.get("hidden_act") == "gelu":
            # The official Gemma releases say "gelu" but mean the tanh approximation; transformers
            # reads it so (GemmaConfig.__post_init__, transformers PR 29402).
            values["hidden_act"] = "gelu_pytorch_tanh"
        if "head_dim" not in hf and fam.default_head_dim_from_hidden:
            values.pop("head_dim", None)
        if "classifier_dropout" in hf:
            values["classifier_dropout"] = hf["classifier_dropout"]
        if values.get("layer_types") is None and fam.default_layer_types == "pattern":
            pattern = hf.get("sliding_window_pattern", 6)
            values["layer_types"] = tuple(SLIDING if (i + 1) % pattern else FULL
                                          for i in range(values["num_hidden_layers"]))
        values["rope"], values["local_rope"] = _rope_from_hf(hf, fam, values.get("max_position_embeddings", 2048))
        return cls(model_type=fam.model_type, **values)

    def to_hf_config(self) -> dict[str, Any]:
        """config.json fields (4.x RoPE dialect) from which `from_hf_config` rebuilds this config and
        transformers builds the same model."""
        fam = self.family
        out = {"model_type": self.model_type}
        for name in fam.fields:
            source = "hidden_act" if name == fam.activation_field else name
            value = getattr(self, source)
            if name == "layer_types" and fam.layer_types_only_when_set and value == default_layer_types(
                    fam, self.num_hidden_layers, self.sliding_window, self.use_sliding_window, self.max_window_layers):
                continue
            out[name] = list(value) if isinstance(value, tuple) else value
        out["rope_theta"] = self.rope.theta
        if self.rope.scaling_to_hf() is not None:
            out["rope_scaling"] = self.rope.scaling_to_hf()
        if fam.per_layer_type_rope:
            out["rope_local_base_freq"] = self.local_rope.theta
        if self.classifier_dropout is not None:
            out["classifier_dropout"] = self.classifier_dropout
        return out

    # The BackboneConfig protocol.
    @property
    def default_classifier_dropout(self) -> float:
        """classifier_dropout if set, else 0.1, as transformers' `GenericForTokenClassification`
        chooses for these families (they have no hidden dropout). The "last_token" head, their
        canonical one, has no dropout at all."""
        return 0.1 if self.classifier_dropout is None else self.classifier_dropout

    @property
    def max_sequence_length(self) -> None:
        """None: positions are rotary, so no table bounds the length (quality past
        max_position_embeddings is another matter)."""
        return None

    position_table_size = None
    token_type_vocab_size = None
    """Rotary positions and no token types (the backbone refuses token_type_ids)."""

    @property
    def effective_sliding_window(self) -> int | None:
        """The window the sliding layers use: Qwen2/3 ignore sliding_window unless use_sliding_window."""
        if self.family.default_layer_types == "qwen" and not self.use_sliding_window:
            return None
        return self.sliding_window

    def is_sliding(self, layer: int) -> bool:
        return self.layer_types[layer] == SLIDING and self.effective_sliding_window is not None

    def uses_local_rope(self, layer: int) -> bool:
        """Whether `layer` rotates with `local_rope` (Gemma3's sliding layers) rather than `rope`."""
        return self.family.per_layer_type_rope and self.layer_types[layer] == SLIDING

    @property
    def attention_scale(self) -> float:
        return (self.query_pre_attn_scalar if self.query_pre_attn_scalar is not None else self.head_dim) ** -0.5

    @property
    def attention_logit_cap(self) -> float | None:
        return self.attn_logit_softcapping if self.family.attention_softcapping else None

    @property
    def qkv_bias(self) -> bool:
        return self.attention_bias if self.family.qkv_bias is None else self.family.qkv_bias

    @property
    def output_bias(self) -> bool:
        return self.attention_bias if self.family.output_bias is None else self.family.output_bias


def default_layer_types(fam: Family, num_layers: int, sliding_window, use_sliding_window, max_window_layers):
    """transformers' layer types for a config.json without `layer_types`."""
    rule = fam.default_layer_types
    if rule == "all_sliding" and sliding_window is not None:
        return (SLIDING,) * num_layers
    if rule == "qwen" and use_sliding_window and sliding_window is not None:
        return tuple(SLIDING if i >= max_window_layers else FULL for i in range(num_layers))
    if rule == "alternate":
        return tuple(SLIDING if (i + 1) % 2 else FULL for i in range(num_layers))
    if rule == "pattern":
        return tuple(SLIDING if (i + 1) % 6 else FULL for i in range(num_layers))
    return (FULL,) * num_layers


def _rope_from_hf(hf: dict[str, Any], fam: Family, max_positions: int) -> tuple[Rope, Rope | None]:
    """(global RoPE, the sliding layers' own RoPE or None), from either config.json dialect, with
    transformers' precedence: rope_scaling, else rope_parameters; rope_theta fills a missing theta."""
    params = hf.get("rope_parameters") or {}
    theta = hf.get("rope_theta", fam.default_theta)
    if not fam.per_layer_type_rope:
        return Rope.from_hf(dict(hf.get("rope_scaling") or params), theta, max_positions), None
    if FULL in params or SLIDING in params:  # 5.x: nested by layer type
        full, local = params.get(FULL) or {}, params.get(SLIDING) or {}
    else:
        full, local = dict(hf.get("rope_scaling") or {}), {}
    local_theta = hf.get("rope_local_base_freq", 10000.0)
    return Rope.from_hf(full, theta, max_positions), Rope.from_hf(local, local_theta, max_positions)
