"""DeBERTa-v2 and DeBERTa-v3 (`transformers.DebertaV2Model`, model_type "deberta-v2") in Flax NNX.

A DeBERTa layer is BERT's post-LayerNorm `EncoderLayer` with another attention; what differs:

- **Disentangled attention.** Besides content->content scores q.k, each head scores
  content->position (`c2p`: the query against the key's relative-position embedding) and
  position->content (`p2c`: the key against the query's), as `pos_att_type` lists. All three are
  scaled by 1/sqrt(head_dim * (1 + len(pos_att_type))) and summed before the softmax.
- **Relative positions.** Query t and key s are `t - s` apart, clipped to the span of the
  shared `rel_embeddings` table (2 * position_buckets rows, else 2 * max_relative_positions);
  with `position_buckets` > 0, distances beyond half a bucket are log-bucketed
  (`make_log_bucket_position`). `share_att_key` projects the position embeddings with the
  content query/key projections instead of `pos_query_proj` / `pos_key_proj`; `norm_rel_ebd`
  "layer_norm" normalises the table once per forward pass.
- **Embeddings.** Words, then positions (only with `position_biased_input`; DeBERTa-v3 has none),
  then token types (only when type_vocab_size > 0), projected by `embed_proj` (no bias) when
  embedding_size != hidden_size, then a LayerNorm at hidden_size; padded positions are zeroed.
- **Masking.** Attention masks query *and* key padding (transformers' mask is mask_t * mask_s), so
  a padded query averages every value, as torch's softmax over a row of equal scores does.
- **ConvLayer** (`conv_kernel_size` > 0, DeBERTa-v2 xlarge): after the first layer,
  LN(layer_0 + act(conv(embeddings))) with padding zeroed before the activation and after the norm.

Packed rows (`segment_ids`, see `segments`): relative positions depend on t - s alone, so the
block-diagonal mask makes them exact; absolute positions (position_biased_input) restart per
segment; the ConvLayer reads no neighbour across a segment's edge (as the zero padding of an
example run alone).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from flaxheads.backbones import attention, dropout, layers, segments, stacking
from flaxheads.backbones.encoder import EncoderLayer
from flaxheads.backbones.interface import BackboneOutput, known_fields, require_multiple, require_sizes

POSITION_ATTENTION_TYPES = ("c2p", "p2c")


@dataclasses.dataclass(frozen=True)
class DebertaV2Config:
    """Architecture of a DeBERTa-v2/v3, with the field names and defaults of Hugging Face's
    `DebertaV2Config` (and of the fields its modeling code reads with `getattr`)."""

    model_type: str = "deberta-v2"
    vocab_size: int = 128100
    hidden_size: int = 1536
    num_hidden_layers: int = 24
    num_attention_heads: int = 24
    intermediate_size: int = 6144
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 0
    """0 (DeBERTa-v3): no token-type embeddings; token_type_ids are then ignored."""
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-7
    relative_attention: bool = False
    """Whether attention adds the c2p / p2c relative-position scores (and the model has
    `rel_embeddings`). Every released checkpoint sets it."""
    max_relative_positions: int = -1
    """< 1: max_position_embeddings."""
    position_buckets: int = -1
    """> 0: log-bucketed relative positions with this many buckets each way (v3: 256)."""
    pos_att_type: tuple[str, ...] = ()
    """Among ("c2p", "p2c"); config.json spells it "p2c|c2p" or as a list."""
    share_att_key: bool = False
    """Position embeddings projected by the content query/key projections (v3)."""
    norm_rel_ebd: str = "none"
    """"layer_norm": the relative-position table goes through `rel_embeddings_norm` (v3)."""
    position_biased_input: bool = True
    """Absolute position embeddings added to the input (v2 base); v3 has none."""
    embedding_size: int | None = None
    """Width of the token embeddings, projected by `embed_proj` when != hidden_size; None: hidden_size."""
    conv_kernel_size: int = 0
    """> 0: the ConvLayer after the first layer (v2 xlarge: 3)."""
    conv_groups: int = 1
    conv_act: str = "tanh"
    pooler_dropout: float = 0.0
    """Dropout on the first token before the "deberta" head's dense (`ContextPooler`)."""
    pooler_hidden_act: str = "gelu"
    """Activation after the "deberta" head's dense."""
    cls_dropout: float | None = None
    """Dropout before the classifier; None: hidden_dropout_prob (as transformers)."""
    pad_token_id: int | None = 0
    bos_token_id: int | None = None
    eos_token_id: int | None = None

    classifier_dropout_key: ClassVar[str] = "cls_dropout"
    """The config.json field transformers reads the classifier's dropout from."""
    attention_output_dropout: ClassVar[bool] = True
    """Read by the shared `EncoderLayer`: DeBERTa drops the attention output out as BERT does."""

    def __post_init__(self):
        if self.model_type != "deberta-v2":
            raise ValueError(f"DebertaV2Config serves model_type 'deberta-v2', not {self.model_type!r}")
        require_sizes(self, "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                      "max_position_embeddings", optional=("embedding_size",))
        require_sizes(self, "type_vocab_size", at_least=0)
        require_multiple(hidden_size=self.hidden_size, num_attention_heads=self.num_attention_heads)
        unknown = set(self.pos_att_type) - set(POSITION_ATTENTION_TYPES)
        if unknown:
            raise ValueError(f"pos_att_type {sorted(unknown)}: DeBERTa's are {POSITION_ATTENTION_TYPES}")
        if self.conv_kernel_size > 0 and self.conv_kernel_size % 2 == 0:
            # transformers pads (k - 1) // 2 on each side: an even kernel shortens the sequence and fails there too.
            raise ValueError(f"conv_kernel_size={self.conv_kernel_size}: it must be odd (or 0 for no ConvLayer)")
        if self.conv_kernel_size > 0:
            require_multiple(hidden_size=self.hidden_size, conv_groups=self.conv_groups)

    @classmethod
    def from_hf_config(cls, hf: dict[str, Any]) -> "DebertaV2Config":
        """Reads a Hugging Face `config.json` dict of model_type deberta-v2.

        Raises NotImplementedError for settings transformers' classifier cannot run either
        (attention_head_size or pooler_hidden_size other than the ones hidden_size implies)."""
        known = known_fields(hf, cls)
        kind = known.get("pos_att_type") or ()
        if isinstance(kind, str):
            kind = [x.strip() for x in kind.lower().split("|")]
        known["pos_att_type"] = tuple(kind)
        config = cls(**known)  # the sizes checked before they are divided
        hidden, heads = config.hidden_size, config.num_attention_heads
        if hf.get("attention_head_size", hidden // heads) * heads != hidden:
            raise NotImplementedError(
                f"attention_head_size={hf['attention_head_size']} with {heads} heads is not hidden_size={hidden} "
                "wide; flaxheads' DeBERTa (like transformers' output projection) needs heads * head size == hidden_size"
            )
        if hf.get("pooler_hidden_size", hidden) != hidden:
            raise NotImplementedError(
                f"pooler_hidden_size={hf['pooler_hidden_size']} != hidden_size={hidden}: DebertaV2ForSequenceClassification "
                "cannot run it either (its classifier reads hidden_size features)"
            )
        return config

    def to_hf_config(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["pos_att_type"] = list(self.pos_att_type)
        out["pooler_hidden_size"] = self.hidden_size
        if self.embedding_size is None:
            del out["embedding_size"]
        return out

    @property
    def classifier_dropout(self) -> float | None:
        """DeBERTa's classifier dropout is `cls_dropout`; this is the interface's spelling."""
        return self.cls_dropout

    @property
    def default_classifier_dropout(self) -> float:
        """`DebertaV2ForSequenceClassification`'s rule: cls_dropout if set, else hidden_dropout_prob."""
        return self.hidden_dropout_prob if self.cls_dropout is None else self.cls_dropout

    @property
    def deberta_options(self) -> dict[str, Any]:
        """The "deberta" head's options as this config.json sets them (`ContextPooler`'s)."""
        return {"pooler_dropout": self.pooler_dropout, "pooler_hidden_act": self.pooler_hidden_act}

    @property
    def max_sequence_length(self) -> int | None:
        """Absolute positions limit the input; relative ones alone do not (longer distances share
        the outermost bucket)."""
        return self.max_position_embeddings if self.position_biased_input else None

    @property
    def position_table_size(self) -> int | None:
        """Only v2's absolute positions (position_biased_input) are a table; relative ones are bucketed."""
        return self.max_position_embeddings if self.position_biased_input else None

    @property
    def token_type_vocab_size(self) -> int | None:
        """None without token-type embeddings (type_vocab_size 0, v3: token_type_ids are ignored)."""
        return self.type_vocab_size or None

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def embedding_width(self) -> int:
        return self.hidden_size if self.embedding_size is None else self.embedding_size

    @property
    def attention_span(self) -> int:
        """Relative distances each way the position table covers (transformers' `pos_ebd_size`)."""
        if self.position_buckets > 0:
            return self.position_buckets
        return self.max_relative_positions if self.max_relative_positions >= 1 else self.max_position_embeddings

    @property
    def bucket_max_position(self) -> int:
        return self.max_relative_positions if self.max_relative_positions >= 1 else self.max_position_embeddings

    @property
    def score_scale(self) -> float:
        """1 / sqrt(head_dim * (1 + number of position score types)): every score's scale."""
        return 1.0 / math.sqrt(self.head_dim * (1 + len(self.pos_att_type)))


def make_log_bucket_position(relative_pos: np.ndarray, bucket_size: int, max_position: int) -> np.ndarray:
    """transformers' `make_log_bucket_position`, in float32 as torch computes it: distances
    within half a bucket stay, longer ones become mid + ceil(log(|d| / mid) / log((max - 1) / mid)
    * (mid - 1)), signed."""
    sign = np.sign(relative_pos)
    mid = bucket_size // 2
    inside = (relative_pos < mid) & (relative_pos > -mid)
    abs_pos = np.where(inside, mid - 1, np.abs(relative_pos)).astype(np.float32)
    ratio = np.log(abs_pos / np.float32(mid)) / np.log(np.float32((max_position - 1) / mid))
    log_pos = np.ceil(ratio * np.float32(mid - 1)) + np.float32(mid)
    return np.where(abs_pos <= mid, relative_pos.astype(np.float32), log_pos * sign)


def relative_positions(length: int, bucket_size: int = -1, max_position: int = -1) -> np.ndarray:
    """(length, length) int relative positions query - key (`build_relative_position`),
    log-bucketed when both `bucket_size` and `max_position` are > 0."""
    ids = np.arange(length)
    rel_TS = ids[:, None] - ids[None, :]
    if bucket_size > 0 and max_position > 0:
        rel_TS = make_log_bucket_position(rel_TS, bucket_size, max_position)
    return rel_TS.astype(np.int64)


class DebertaEmbeddings(nnx.Module):
    """`DebertaV2Embeddings`: words (+ positions) (+ token types) -> [embed_proj] -> LayerNorm ->
    zeroed at padding -> dropout."""

    def __init__(self, cfg: DebertaV2Config, *, dtype, param_dtype, rngs: nnx.Rngs):
        kw = dict(init_std=cfg.initializer_range, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.cfg = cfg
        width = cfg.embedding_width
        self.word_embeddings = layers.embed(cfg.vocab_size, width, **kw)
        self.position_embeddings = (
            layers.embed(cfg.max_position_embeddings, width, **kw) if cfg.position_biased_input else None
        )
        self.token_type_embeddings = layers.embed(cfg.type_vocab_size, width, **kw) if cfg.type_vocab_size else None
        self.embed_proj = (
            layers.dense(width, cfg.hidden_size, use_bias=False, **kw) if width != cfg.hidden_size else None
        )
        self.layer_norm = layers.layer_norm(
            cfg.hidden_size, eps=cfg.layer_norm_eps, dtype=dtype, param_dtype=param_dtype, rngs=rngs
        )
        self.deterministic = False

    def __call__(self, input_ids_BT, mask_BT, token_type_ids_BT, position_ids_BT, rngs) -> jax.Array:
        x = self.word_embeddings(input_ids_BT)
        if self.position_embeddings is not None:  # summed in transformers' order: words, positions, types
            if position_ids_BT is None:
                position_ids_BT = jnp.broadcast_to(jnp.arange(input_ids_BT.shape[1]), input_ids_BT.shape)
            x = x + self.position_embeddings(position_ids_BT)
        if self.token_type_embeddings is not None:
            if token_type_ids_BT is None:
                token_type_ids_BT = jnp.zeros_like(input_ids_BT)
            x = x + self.token_type_embeddings(token_type_ids_BT)
        if self.embed_proj is not None:
            x = self.embed_proj(x)
        x = self.layer_norm(x) * mask_BT[..., None].astype(x.dtype)
        return dropout.apply(x, self.cfg.hidden_dropout_prob, rngs, deterministic=self.deterministic)


class DisentangledSelfAttention(nnx.Module):
    """`DisentangledSelfAttention` + its output projection (`DebertaV2SelfOutput.dense`); the
    shared `EncoderLayer` adds dropout, the residual and the LayerNorm."""

    def __init__(self, cfg: DebertaV2Config, *, dtype, param_dtype, rngs: nnx.Rngs):
        self.cfg = cfg
        d = cfg.hidden_size
        kw = dict(init_std=cfg.initializer_range, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.query = layers.dense(d, d, **kw)
        self.key = layers.dense(d, d, **kw)
        self.value = layers.dense(d, d, **kw)
        separate = cfg.relative_attention and not cfg.share_att_key
        self.pos_key = layers.dense(d, d, **kw) if separate and "c2p" in cfg.pos_att_type else None
        self.pos_query = layers.dense(d, d, **kw) if separate and "p2c" in cfg.pos_att_type else None
        self.output = layers.dense(d, d, **kw)
        self.deterministic = False

    def __call__(self, x_BTD, mask_BT, rngs, *, rel_embeddings_PD=None, relative_pos_TT=None) -> jax.Array:
        """`mask_BT` 1 = real token, or a (batch, 1, query, key) bool mask (packed rows);
        `rel_embeddings_PD` the (normalised) position table and `relative_pos_TT` the (bucketed)
        query - key distances, with relative_attention."""
        cfg = self.cfg
        b, t, _ = x_BTD.shape
        heads = (b, t, cfg.num_attention_heads, cfg.head_dim)  # hidden splits as (heads, head_dim)
        query_BTNH = self.query(x_BTD).reshape(heads)
        key_BTNH = self.key(x_BTD).reshape(heads)
        bias_BNTT = None
        if cfg.relative_attention:
            bias_BNTT = self.position_scores(query_BTNH, key_BTNH, rel_embeddings_PD, relative_pos_TT, rngs)
        if mask_BT.ndim == 4:
            pair_mask_B1TT = mask_BT
        else:
            mask_BT = mask_BT.astype(bool)
            pair_mask_B1TT = mask_BT[:, None, :, None] & mask_BT[:, None, None, :]
        context_BTNH = attention.attend(
            query_BTNH, key_BTNH, self.value(x_BTD).reshape(heads), pair_mask_B1TT,
            bias_BNTS=bias_BNTT,
            scale=cfg.score_scale,
            dropout_rate=cfg.attention_probs_dropout_prob,
            deterministic=self.deterministic,
            rngs=rngs,
        )
        return self.output(context_BTNH.reshape(b, t, -1))

    def position_scores(self, query_BTNH, key_BTNH, rel_embeddings_PD, relative_pos_TT, rngs) -> jax.Array:
        """The c2p + p2c scores (batch, heads, query, key), scaled (`disentangled_attention_bias`)."""
        cfg = self.cfg
        span = cfg.attention_span
        rel_PD = dropout.apply(
            rel_embeddings_PD[: 2 * span], cfg.hidden_dropout_prob, rngs, deterministic=self.deterministic
        )
        per_head = (rel_PD.shape[0], cfg.num_attention_heads, cfg.head_dim)
        b, t = query_BTNH.shape[:2]
        scores_BNTT = jnp.zeros((b, cfg.num_attention_heads, t, t), query_BTNH.dtype)
        if "c2p" in cfg.pos_att_type:
            pos_key_PNH = (self.key if cfg.share_att_key else self.pos_key)(rel_PD).reshape(per_head)
            c2p_BNTP = jnp.einsum("BTNH,PNH->BNTP", query_BTNH, pos_key_PNH)
            index_TT = jnp.clip(relative_pos_TT + span, 0, 2 * span - 1)
            c2p_BNTT = jnp.take_along_axis(c2p_BNTP, jnp.broadcast_to(index_TT, scores_BNTT.shape), axis=-1)
            scores_BNTT = scores_BNTT + c2p_BNTT * cfg.score_scale
        if "p2c" in cfg.pos_att_type:
            pos_query_PNH = (self.query if cfg.share_att_key else self.pos_query)(rel_PD).reshape(per_head)
            p2c_BNSP = jnp.einsum("BSNH,PNH->BNSP", key_BTNH, pos_query_PNH)
            # Row s (a key) reads the position -(s - t) for every query t, then the axes swap to (query, key).
            index_ST = jnp.clip(-relative_pos_TT + span, 0, 2 * span - 1)
            p2c_BNST = jnp.take_along_axis(p2c_BNSP, jnp.broadcast_to(index_ST, scores_BNTT.shape), axis=-1)
            scores_BNTT = scores_BNTT + jnp.swapaxes(p2c_BNST, -1, -2) * cfg.score_scale
        return scores_BNTT


class ConvLayer(nnx.Module):
    """`ConvLayer`: LN(residual + act(conv(x) zeroed at padding)), zeroed at padding."""

    def __init__(self, cfg: DebertaV2Config, *, dtype, param_dtype, rngs: nnx.Rngs):
        self.cfg = cfg
        k = cfg.conv_kernel_size
        self.conv = nnx.Conv(
            cfg.hidden_size, cfg.hidden_size, kernel_size=(k,), padding=[((k - 1) // 2, (k - 1) // 2)],
            feature_group_count=cfg.conv_groups, dtype=dtype, param_dtype=param_dtype,
            kernel_init=nnx.initializers.normal(cfg.initializer_range), bias_init=nnx.initializers.zeros, rngs=rngs,
        )
        self.layer_norm = layers.layer_norm(
            cfg.hidden_size, eps=cfg.layer_norm_eps, dtype=dtype, param_dtype=param_dtype, rngs=rngs
        )
        self.act = layers.activation(cfg.conv_act)
        self.deterministic = False

    def __call__(self, x_BTD, residual_BTD, mask_BT, rngs, segment_ids_BT=None) -> jax.Array:
        mask_BT1 = mask_BT[..., None].astype(x_BTD.dtype)
        conv_BTD = self.conv(x_BTD) if segment_ids_BT is None else self.conv_within_segments(x_BTD, segment_ids_BT)
        out_BTD = conv_BTD * mask_BT1
        out_BTD = self.act(dropout.apply(out_BTD, self.cfg.hidden_dropout_prob, rngs, deterministic=self.deterministic))
        return self.layer_norm(residual_BTD + out_BTD) * mask_BT1

    def conv_within_segments(self, x_BTD: jax.Array, segment_ids_BT: jax.Array) -> jax.Array:
        """`self.conv(x)` with every tap that would read another segment reading zero instead,
        as the conv's zero padding does at the edges of an example run alone: the same kernel,
        applied tap by tap to shifted copies of x."""
        kernel_KIO = self.conv.kernel[...].astype(x_BTD.dtype)
        taps, groups = kernel_KIO.shape[0], self.cfg.conv_groups
        b, t, d = x_BTD.shape
        half = (taps - 1) // 2
        # A grouped conv's output channel o reads the inputs of group o // (d / groups).
        kernel_KIGM = kernel_KIO.reshape(taps, d // groups, groups, d // groups)
        padded_BPD = jnp.pad(x_BTD, ((0, 0), (half, half), (0, 0)))
        padded_ids_BP = jnp.pad(segment_ids_BT, ((0, 0), (half, half)), constant_values=-1)
        out_BTD = jnp.zeros_like(x_BTD)
        for tap in range(taps):
            same_BT1 = (padded_ids_BP[:, tap:tap + t] == segment_ids_BT)[..., None]
            shifted_BTGI = jnp.where(same_BT1, padded_BPD[:, tap:tap + t], 0).reshape(b, t, groups, d // groups)
            out_BTD = out_BTD + jnp.einsum("BTGI,IGM->BTGM", shifted_BTGI, kernel_KIGM[tap]).reshape(b, t, d)
        if self.conv.bias is not None:
            out_BTD = out_BTD + self.conv.bias[...].astype(x_BTD.dtype)
        return out_BTD


class DebertaV2(nnx.Module):
    """DeBERTa-v2/v3 (`transformers.DebertaV2Model`) in Flax NNX.

    `dtype` is the compute dtype (bfloat16 allowed), `param_dtype` the storage dtype. DeBERTa
    has no BERT pooler: `add_pooling_layer` is accepted for the interface and must be False (the
    "deberta" head holds `ContextPooler`). Built in train mode (dropout on, `rngs` needed at
    call time); `.eval()` turns dropout off.
    """

    def __init__(
        self,
        cfg: DebertaV2Config,
        *,
        dtype=jnp.float32,
        param_dtype=jnp.float32,
        add_pooling_layer: bool = False,
        rngs: nnx.Rngs,
    ):
        if add_pooling_layer:
            raise ValueError("DeBERTa has no pooler in its base model; use the \"deberta\" head (ContextPooler)")
        self.cfg = cfg
        kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.embeddings = DebertaEmbeddings(cfg, **kw)
        self.layers = nnx.List([
            EncoderLayer(cfg, attention=DisentangledSelfAttention(cfg, **kw), **kw) for _ in range(cfg.num_hidden_layers)
        ])
        self.rel_embeddings = (
            layers.embed(2 * cfg.attention_span, cfg.hidden_size, init_std=cfg.initializer_range, **kw)
            if cfg.relative_attention else None
        )
        self.rel_embeddings_norm = (
            layers.layer_norm(cfg.hidden_size, eps=cfg.layer_norm_eps, **kw)
            if "layer_norm" in _norm_rel_ebd(cfg) else None
        )
        self.conv = ConvLayer(cfg, **kw) if cfg.conv_kernel_size > 0 else None

    def relative_inputs(self, length: int) -> dict[str, jax.Array]:
        """The position table (normalised with norm_rel_ebd) and the (length, length) relative
        positions every layer's attention reads; {} without relative_attention."""
        if self.rel_embeddings is None:
            return {}
        table_PD = self.rel_embeddings.embedding[...]
        if self.rel_embeddings_norm is not None:
            table_PD = self.rel_embeddings_norm(table_PD)
        positions = relative_positions(length, self.cfg.position_buckets, self.cfg.bucket_max_position)
        return {"rel_embeddings_PD": table_PD, "relative_pos_TT": jnp.asarray(positions, jnp.int32)}

    def __call__(
        self,
        input_ids: jax.Array,
        attention_mask: jax.Array | None = None,
        token_type_ids: jax.Array | None = None,
        position_ids: jax.Array | None = None,
        *,
        segment_ids: jax.Array | None = None,
        rngs: nnx.Rngs | None = None,
    ) -> BackboneOutput:
        """input_ids, attention_mask (1 = real token), token_type_ids, position_ids: (batch, seq) ints.

        position_ids move the absolute position embeddings only (with position_biased_input);
        relative positions always count 0..T-1, as in transformers. `segment_ids` (batch, seq)
        packs several examples per row (module doc); attention_mask is then `segment_ids > 0`.
        `rngs` (an `nnx.Rngs` with a `dropout` stream) draws the dropout masks in train mode;
        eval mode ignores it."""
        if segment_ids is not None:
            attention_mask = (segment_ids > 0).astype(jnp.int32)
            if position_ids is None:
                position_ids = segments.positions(segment_ids)
        mask_BT = jnp.ones_like(input_ids) if attention_mask is None else attention_mask
        attention_mask_BT = mask_BT if segment_ids is None else segments.attention_mask(segment_ids)
        embedded_BTD = self.embeddings(input_ids, mask_BT, token_type_ids, position_ids, rngs)
        relative = self.relative_inputs(input_ids.shape[1])
        x_BTD = stacking.run_layer(self, self.layers[0], embedded_BTD, attention_mask_BT, rngs, **relative)
        if self.conv is not None:  # after the first layer only
            x_BTD = self.conv(embedded_BTD, x_BTD, mask_BT, rngs, segment_ids)
        hidden_states = [embedded_BTD] + stacking.run_layers(
            self, self.layers[1:], x_BTD, attention_mask_BT, rngs=rngs, **relative)
        x_BTD = hidden_states[-1]
        return BackboneOutput(x_BTD, tuple(hidden_states), None)


def _norm_rel_ebd(cfg: DebertaV2Config) -> list[str]:
    return [x.strip() for x in cfg.norm_rel_ebd.lower().split("|")]
