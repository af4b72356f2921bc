"""The BERT-style encoder: one Flax NNX module serving BERT, RoBERTa, XLM-RoBERTa, ELECTRA and
DistilBERT, the families told apart by config switches (DistilBERT's own config names live in
distilbert.py)."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from flaxheads.backbones import attention, dropout, layers, segments, stacking
from flaxheads.backbones.interface import BackboneOutput, known_fields, require_multiple, require_sizes

_ENCODER_FAMILIES = ("bert", "roberta", "xlm-roberta", "electra", "distilbert")
# transformers' RobertaConfig / XLMRobertaConfig / ElectraConfig defaults where they differ from
# BertConfig's (the dataclass defaults below): a config.json that leaves them out means these.
_FAMILY_DEFAULTS: dict[str, dict[str, Any]] = {
    "roberta": {"pad_token_id": 1, "vocab_size": 50265},
    "xlm-roberta": {"pad_token_id": 1},
    "electra": {"embedding_size": 128, "hidden_size": 256, "num_attention_heads": 4, "intermediate_size": 1024},
}
# Families with fairseq's position ids (counted from pad_token_id + 1).
_FAIRSEQ_POSITIONS = ("roberta", "xlm-roberta")


@dataclasses.dataclass(frozen=True)
class EncoderConfig:
    """Architecture of a BERT-style encoder, with the same field names as Hugging Face's config."""

    model_type: str = "bert"
    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    """0: no token-type embeddings; token_type_ids are then ignored (DistilBERT)."""
    layer_norm_eps: float = 1e-12
    initializer_range: float = 0.02
    pad_token_id: int | None = 0
    classifier_dropout: float | None = None
    position_ids_from_padding: bool = False
    """RoBERTa: position ids count non-pad tokens from `pad_token_id + 1` (fairseq's layout);
    BERT: positions are 0..T-1 whatever the padding."""
    embedding_size: int | None = None
    """ELECTRA: width of the embeddings (and their LayerNorm), projected to hidden_size by
    `embeddings_project` when the two differ; None (the other families): hidden_size."""
    attention_output_dropout: bool = True
    """BERT: dropout on the attention output before its residual; DistilBERT has none there."""
    sinusoidal_position_embeddings: bool = False
    """DistilBERT's `sinusoidal_pos_embds`: a fresh model's position table is sin/cos, not random
    (loaded checkpoints carry the table; it stays a trainable parameter, as in transformers 5)."""

    def __post_init__(self):
        if self.model_type not in _ENCODER_FAMILIES:
            raise ValueError(f"EncoderConfig serves {_ENCODER_FAMILIES}, not {self.model_type!r}")
        require_sizes(self, "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                      "max_position_embeddings", optional=("embedding_size",))
        require_sizes(self, "type_vocab_size", at_least=0)
        require_multiple(hidden_size=self.hidden_size, num_attention_heads=self.num_attention_heads)
        if self.position_ids_from_padding and self.pad_token_id is None:
            raise ValueError("position_ids_from_padding needs pad_token_id")
        if self.embedding_size is not None and self.model_type != "electra":
            raise ValueError(f"embedding_size is ELECTRA's; model_type {self.model_type!r} embeds at hidden_size")

    @classmethod
    def from_hf_config(cls, hf: dict[str, Any]) -> "EncoderConfig":
        """Reads a Hugging Face `config.json` dict of model_type bert, roberta, xlm-roberta or
        electra (DistilBERT's names are read by `DistilBertConfig`)."""
        kind = hf.get("position_embedding_type", "absolute")
        if kind != "absolute":
            raise NotImplementedError(
                f"position_embedding_type={kind!r} is not supported; flaxheads encoders use "
                "absolute position embeddings only"
            )
        for flag in ("is_decoder", "add_cross_attention"):
            if hf.get(flag):
                raise NotImplementedError(f"{flag}=True: flaxheads encoders are bidirectional only")
        fields = {f.name for f in dataclasses.fields(cls)} - set(_SWITCHES)
        if hf["model_type"] != "electra":
            fields -= {"embedding_size"}
        known = {**_FAMILY_DEFAULTS.get(hf["model_type"], {}), **known_fields(hf, fields)}
        return cls(**known, position_ids_from_padding=hf["model_type"] in _FAIRSEQ_POSITIONS)

    def to_hf_config(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        for switch in _SWITCHES:
            del out[switch]
        if self.model_type == "electra":  # always written: transformers' default (128) may differ
            out["embedding_size"] = self.embedding_width
        else:
            del out["embedding_size"]
        out["position_embedding_type"] = "absolute"
        return out

    @property
    def default_classifier_dropout(self) -> float:
        """Hugging Face's rule: classifier_dropout if set, else hidden_dropout_prob."""
        return self.hidden_dropout_prob if self.classifier_dropout is None else self.classifier_dropout

    @property
    def max_sequence_length(self) -> int:
        """RoBERTa's positions start at pad_token_id + 1, so its 514 embeddings cover 512 tokens."""
        offset = self.pad_token_id + 1 if self.position_ids_from_padding else 0
        return self.max_position_embeddings - offset

    @property
    def position_table_size(self) -> int:
        return self.max_position_embeddings

    @property
    def token_type_vocab_size(self) -> int | None:
        """None without token-type embeddings (type_vocab_size 0: token_type_ids are ignored)."""
        return self.type_vocab_size or None

    @property
    def embedding_width(self) -> int:
        return self.hidden_size if self.embedding_size is None else self.embedding_size

    @property
    def projects_embeddings(self) -> bool:
        """ELECTRA with embedding_size != hidden_size: the model has `embeddings_project`."""
        return self.embedding_width != self.hidden_size

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


_SWITCHES = ("position_ids_from_padding", "attention_output_dropout", "sinusoidal_position_embeddings")
"""EncoderConfig fields that no Hugging Face config.json spells: set by the family."""


def sinusoidal_table(num_positions: int, dim: int) -> np.ndarray:
    """transformers' `create_sinusoidal_embeddings`: sin on even columns, cos on odd ones."""
    pos_P1 = np.arange(num_positions)[:, None]
    j_D = np.arange(dim)
    angles = pos_P1 / np.power(10000, 2 * (j_D // 2) / dim)
    return np.where(j_D % 2 == 0, np.sin(angles), np.cos(angles)).astype(np.float32)


class Embeddings(nnx.Module):
    """Word + token type + position embeddings -> LayerNorm -> dropout, `features` wide
    (`cfg.embedding_width` unless given: ALBERT and ELECTRA embed into a narrower `embedding_size`)."""

    def __init__(self, cfg: EncoderConfig, *, features: int | None = None, dtype, param_dtype, rngs: nnx.Rngs):
        kw = dict(init_std=cfg.initializer_range, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.cfg = cfg
        features = features or cfg.embedding_width
        self.word_embeddings = layers.embed(cfg.vocab_size, features, **kw)
        self.position_embeddings = layers.embed(cfg.max_position_embeddings, features, **kw)
        if cfg.sinusoidal_position_embeddings:
            table = sinusoidal_table(cfg.max_position_embeddings, features)
            self.position_embeddings.embedding[...] = jnp.asarray(table, param_dtype)
        self.token_type_embeddings = (
            layers.embed(cfg.type_vocab_size, features, **kw) if cfg.type_vocab_size else None
        )
        self.layer_norm = layers.layer_norm(
            features, eps=cfg.layer_norm_eps, dtype=dtype, param_dtype=param_dtype, rngs=rngs
        )
        self.deterministic = False
        """Eval mode: no dropout. `model.train()` / `model.eval()` set it (see `layers`)."""

    def default_position_ids(self, input_ids_BT: jax.Array, segment_ids_BT: jax.Array | None = None) -> jax.Array:
        """The family's positions; with `segment_ids` (packed rows) they restart at every segment."""
        if self.cfg.position_ids_from_padding:
            # fairseq/RoBERTa: pads keep position pad_token_id, real tokens count from pad_token_id+1.
            is_real = (input_ids_BT != self.cfg.pad_token_id).astype(jnp.int32)
            counted = jnp.cumsum(is_real, axis=1) if segment_ids_BT is None else segments.segment_cumsum(
                is_real, segment_ids_BT)
            return counted * is_real + self.cfg.pad_token_id
        if segment_ids_BT is not None:
            return segments.positions(segment_ids_BT)
        return jnp.broadcast_to(jnp.arange(input_ids_BT.shape[1]), input_ids_BT.shape)

    def __call__(self, input_ids_BT, token_type_ids_BT, position_ids_BT, rngs, segment_ids_BT=None) -> jax.Array:
        if position_ids_BT is None:
            position_ids_BT = self.default_position_ids(input_ids_BT, segment_ids_BT)
        x = self.word_embeddings(input_ids_BT)
        if self.token_type_embeddings is not None:  # summed in transformers' order: words, types, positions
            if token_type_ids_BT is None:
                token_type_ids_BT = jnp.zeros_like(input_ids_BT)
            x = x + self.token_type_embeddings(token_type_ids_BT)
        x = x + self.position_embeddings(position_ids_BT)
        return dropout.apply(self.layer_norm(x), self.cfg.hidden_dropout_prob, rngs, deterministic=self.deterministic)


class SelfAttention(nnx.Module):
    def __init__(self, cfg: EncoderConfig, *, dtype, param_dtype, rngs: nnx.Rngs):
        self.cfg = cfg
        d = cfg.hidden_size
        kw = dict(init_std=cfg.initializer_range, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.query = layers.dense(d, d, **kw)
        self.key = layers.dense(d, d, **kw)
        self.value = layers.dense(d, d, **kw)
        self.output = layers.dense(d, d, **kw)
        self.deterministic = False

    def __call__(self, x_BTD: jax.Array, mask_BT: jax.Array | None, rngs,
                 query_rows: dropout.Rows | None = None, segment_ids_BT: jax.Array | None = None) -> jax.Array:
        """Attention output at every position, or with `query_rows` (`EncoderLayer`) at those
        positions only: (batch, P, hidden) from queries there over every key. `segment_ids_BT`:
        packed rows' ids, for a fused kernel (`mask_BT` is then their block-diagonal mask)."""
        b, t, _ = x_BTD.shape
        x_BPD = x_BTD if query_rows is None else segments.gather(x_BTD, query_rows.index)
        p = x_BPD.shape[1]
        n, h = self.cfg.num_attention_heads, self.cfg.head_dim  # hidden splits as (heads, head_dim)
        context_BPNH = attention.attend(
            self.query(x_BPD).reshape(b, p, n, h),
            self.key(x_BTD).reshape(b, t, n, h),
            self.value(x_BTD).reshape(b, t, n, h),
            mask_BT,
            dropout_rate=self.cfg.attention_probs_dropout_prob,
            deterministic=self.deterministic,
            rngs=rngs,
            query_rows=query_rows,
            segment_ids_BT=segment_ids_BT,
        )
        return self.output(context_BPNH.reshape(b, p, -1))


class EncoderLayer(nnx.Module):
    """Post-LayerNorm transformer block (BERT): x = LN(x + attn(x)); x = LN(x + mlp(x)).

    `mlp_dropout=False` leaves out the dropout on the feed-forward output, as ALBERT's layer does
    (transformers' `AlbertLayer` defines that dropout but never applies it). `attention` replaces
    BERT's `SelfAttention` (DeBERTa's disentangled attention); keyword arguments of the call are
    passed on to it."""

    def __init__(
        self, cfg: EncoderConfig, *, mlp_dropout: bool = True, attention: nnx.Module | None = None,
        dtype, param_dtype, rngs: nnx.Rngs,
    ):
        self.cfg = cfg
        self.mlp_dropout = mlp_dropout
        kw = dict(init_std=cfg.initializer_range, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        norm = dict(eps=cfg.layer_norm_eps, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.attention = (
            attention if attention is not None
            else SelfAttention(cfg, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        )
        self.attention_norm = layers.layer_norm(cfg.hidden_size, **norm)
        self.intermediate = layers.dense(cfg.hidden_size, cfg.intermediate_size, **kw)
        self.output = layers.dense(cfg.intermediate_size, cfg.hidden_size, **kw)
        self.output_norm = layers.layer_norm(cfg.hidden_size, **norm)
        self.act = layers.activation(cfg.hidden_act)
        self.deterministic = False

    def __call__(self, x_BTD, mask_BT, rngs, *, positions_BP: jax.Array | None = None,
                 **attention_inputs) -> jax.Array:
        """The layer's output (batch, T, hidden); with `positions_BP` (batch, P) only at those
        positions, (batch, P, hidden), equal to the full output's rows there (dropout included:
        the same units drop). Keys and values still come from every position; the queries,
        feed-forward and norms run for P positions instead of T (what a head that reads the
        first token needs of the last layer)."""
        rows = None
        if positions_BP is not None:
            rows = dropout.Rows(1, positions_BP, x_BTD.shape[1])
            attention_inputs["query_rows"] = rows
            if mask_BT is not None and mask_BT.ndim == 4:  # per-query masks (packed rows): those queries' rows
                mask_BT = jnp.take_along_axis(mask_BT, positions_BP[:, None, :, None], axis=2)

        def drop(y):
            return dropout.apply(y, self.cfg.hidden_dropout_prob, rngs, deterministic=self.deterministic,
                                 rows=None if rows is None else dropout.Rows(1, positions_BP[..., None], rows.length))

        attended = self.attention(x_BTD, mask_BT, rngs, **attention_inputs)
        if self.cfg.attention_output_dropout:
            attended = drop(attended)
        if positions_BP is not None:
            x_BTD = segments.gather(x_BTD, positions_BP)
        x_BTD = self.attention_norm(x_BTD + attended)
        mlp_BTD = self.output(self.act(self.intermediate(x_BTD)))
        return self.output_norm(x_BTD + (drop(mlp_BTD) if self.mlp_dropout else mlp_BTD))


class Encoder(nnx.Module):
    """BERT, RoBERTa, XLM-RoBERTa, ELECTRA or DistilBERT (`transformers.BertModel`, `RobertaModel`,
    `XLMRobertaModel`, `ElectraModel`, `DistilBertModel`) in Flax NNX.

    ELECTRA with embedding_size != hidden_size projects the embeddings (after their LayerNorm and
    dropout, as transformers does) with `embeddings_project`; its hidden_states[0] is the projection.

    `dtype` is the compute dtype (bfloat16 allowed), `param_dtype` the storage dtype.
    `add_pooling_layer` gives the standalone backbone BERT's pooler; classifiers built by
    flaxheads keep the pooler in the "pooler" head instead, so heads stay backbone-agnostic.
    Built in train mode (dropout on, `rngs` needed at call time); `.eval()` turns dropout off.
    """

    LAST_LAYER_AT_POSITIONS = True
    """The call takes `last_layer_positions` (`SequenceClassifier.runs_last_layer_at`)."""

    def __init__(
        self,
        cfg: EncoderConfig,
        *,
        dtype=jnp.float32,
        param_dtype=jnp.float32,
        add_pooling_layer: bool = False,
        rngs: nnx.Rngs,
    ):
        self.cfg = cfg
        self.embeddings = Embeddings(cfg, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.embeddings_project = (
            layers.dense(
                cfg.embedding_width, cfg.hidden_size,
                init_std=cfg.initializer_range, dtype=dtype, param_dtype=param_dtype, rngs=rngs,
            )
            if cfg.projects_embeddings
            else None
        )
        self.layers = nnx.List(
            [EncoderLayer(cfg, dtype=dtype, param_dtype=param_dtype, rngs=rngs) for _ in range(cfg.num_hidden_layers)]
        )
        self.pooler = (
            layers.Pooler(cfg.hidden_size, init_std=cfg.initializer_range, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
            if add_pooling_layer
            else None
        )

    def __call__(
        self,
        input_ids: jax.Array,
        attention_mask: jax.Array | None = None,
        token_type_ids: jax.Array | None = None,
        position_ids: jax.Array | None = None,
        *,
        segment_ids: jax.Array | None = None,
        last_layer_positions: jax.Array | None = None,
        rngs: nnx.Rngs | None = None,
    ) -> BackboneOutput:
        """input_ids, attention_mask (1 = real token), token_type_ids, position_ids: (batch, seq) ints.

        `segment_ids` (batch, seq) packs several examples per row (`segments`): attention stays
        within a segment (attention_mask is then not read) and positions restart at each one.
        `last_layer_positions` (batch, P) ints: the last layer runs at those positions only
        (`EncoderLayer`), and the last hidden state holds its output there and zeros elsewhere;
        for a caller that reads nothing else of it (a first-token head). Every other layer's
        states are whole. Ignored with scanned layers (`stacking.set_scan_layers`): the last
        hidden state is then whole.
        `rngs` (an `nnx.Rngs` with a `dropout` stream) draws the dropout masks in train mode;
        eval mode ignores it. ValueError in train mode without it (non-zero dropout rates)."""
        x_BTD = self.embeddings(input_ids, token_type_ids, position_ids, rngs, segment_ids)
        if self.embeddings_project is not None:
            x_BTD = self.embeddings_project(x_BTD)  # (B, T, embedding_size) -> (B, T, hidden)
        packed = {}
        if segment_ids is not None:
            attention_mask = segments.attention_mask(segment_ids)
            packed = {"segment_ids_BT": segment_ids}  # for a fused attention kernel
        # Scanned layers stay one scan over the whole stack: the short last layer is for the loop.
        if last_layer_positions is None or not len(self.layers) or getattr(self, stacking.SCAN_LAYERS, False):
            hidden_states = stacking.run_layers(self, self.layers, x_BTD, attention_mask, rngs=rngs, **packed)
        else:
            hidden_states = stacking.run_layers(self, list(self.layers)[:-1], x_BTD, attention_mask, rngs=rngs,
                                                **packed)
            rows_BPD = stacking.run_layer(self, self.layers[-1], hidden_states[-1], attention_mask, rngs,
                                          positions_BP=last_layer_positions, **packed)
            hidden_states.append(segments.scatter(rows_BPD, last_layer_positions, x_BTD.shape[1]))
        x_BTD = hidden_states[-1]
        pooled = None if self.pooler is None else self.pooler(x_BTD)
        return BackboneOutput(x_BTD, tuple(hidden_states), pooled)
