"""Sequence packing, model side: the logits of packed rows equal those of each example run alone.

For every backbone family and every head that makes sense on it, three examples of different
lengths are packed into two rows (5 + 7 tokens, then 4, then trailing padding), so the second
example starts mid-row (left context), windows shorter than an example slide inside it, and one
example ends in the pad id (the "last_token" rule applies inside the segment). The packed
(batch, S, num_labels) logits must equal each example's logits alone, batch 1 and unpadded.

Tiny flax models built from small configs (no torch): packed-vs-unpacked flaxheads is what is
tested here; parity with transformers is tested in each family's own file. Every parameter is
perturbed at random, LayerNorm scales and biases included, so no term hides at its init value.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from flaxheads import ClassifierConfig, SequenceClassifier
from flaxheads.backbones import backbone_config_from_hf, segments

TINY = dict(vocab_size=99, hidden_size=32, num_attention_heads=4, intermediate_size=37, num_hidden_layers=2,
            max_position_embeddings=64, initializer_range=0.1)
DECODER = dict(TINY, num_key_value_heads=2, pad_token_id=0, bos_token_id=1, eos_token_id=2)
DEBERTA = dict(TINY, hidden_size=36, pad_token_id=0, relative_attention=True)

# family -> (config.json dict, whether it embeds token types, its own head and options).
FAMILIES = {
    "bert": (dict(TINY, model_type="bert", num_hidden_layers=4, pad_token_id=0), True, "pooler", {}),
    "roberta": (dict(TINY, model_type="roberta", type_vocab_size=1, pad_token_id=1), False, "roberta", {}),
    "xlm-roberta": (dict(TINY, model_type="xlm-roberta", type_vocab_size=1, pad_token_id=1), False, "roberta", {}),
    "electra": (dict(TINY, model_type="electra", embedding_size=24, pad_token_id=0), True, "electra", {}),
    "albert": (dict(TINY, model_type="albert", embedding_size=24, num_hidden_groups=1, inner_group_num=2,
                    pad_token_id=0), True, "pooler", {}),
    "distilbert": (dict(model_type="distilbert", vocab_size=99, dim=32, n_layers=2, n_heads=4, hidden_dim=37,
                        max_position_embeddings=64, initializer_range=0.1, pad_token_id=0), False, "distilbert", {}),
    "gpt2": (dict(model_type="gpt2", vocab_size=99, n_embd=32, n_layer=2, n_head=4, n_inner=37, n_positions=64,
                  initializer_range=0.1, pad_token_id=0), True, "last_token", {}),
    "xlnet": (dict(model_type="xlnet", vocab_size=99, d_model=32, n_head=4, d_inner=37, n_layer=2,
                   initializer_range=0.1, pad_token_id=0), True, "summary", {}),
    "deberta-v3": (dict(DEBERTA, model_type="deberta-v2", position_buckets=4, max_relative_positions=8,
                        share_att_key=True, norm_rel_ebd="layer_norm", pos_att_type="p2c|c2p", type_vocab_size=0,
                        position_biased_input=False), False, "deberta", {}),
    # v2 xlarge's switches: absolute positions, token types, the ConvLayer (grouped) and a factorised embedding.
    "deberta-v2": (dict(DEBERTA, model_type="deberta-v2", max_relative_positions=8, pos_att_type=["c2p", "p2c"],
                        conv_kernel_size=3, conv_groups=2, conv_act="gelu", type_vocab_size=2,
                        position_biased_input=True, embedding_size=20), True, "deberta", {}),
    "modernbert": (dict(TINY, model_type="modernbert", num_hidden_layers=3, global_attn_every_n_layers=2,
                        local_attention=4, global_rope_theta=500.0, local_rope_theta=77.0, pad_token_id=0),
                   False, "modernbert", {}),
    "llama": (dict(DECODER, model_type="llama", head_dim=12, attention_bias=True, rope_theta=500.0), False,
              "last_token", {}),
    "mistral": (dict(DECODER, model_type="mistral", sliding_window=5), False, "last_token", {}),
    "qwen2": (dict(DECODER, model_type="qwen2", use_sliding_window=True, sliding_window=5, max_window_layers=1),
              False, "last_token", {}),
    "qwen3": (dict(DECODER, model_type="qwen3", head_dim=12, use_sliding_window=True, sliding_window=5,
                   max_window_layers=1), False, "last_token", {}),
    "gemma": (dict(DECODER, model_type="gemma", num_key_value_heads=1, head_dim=12), False, "last_token", {}),
    "gemma2": (dict(DECODER, model_type="gemma2", head_dim=12, sliding_window=5, query_pre_attn_scalar=10,
                    attn_logit_softcapping=2.0), False, "last_token", {}),
    "gemma3_text": (dict(DECODER, model_type="gemma3_text", head_dim=12, sliding_window=5, query_pre_attn_scalar=10,
                         rope_local_base_freq=100.0, sliding_window_pattern=2), False, "last_token", {}),
}

# Every head once on BERT (with each summary_type and ModernBERT pooling), each family's own head.
BERT_HEADS = [
    ("pooler", {}), ("roberta", {}), ("electra", {}), ("cls", {}), ("mean", {}), ("concat_last4", {}),
    ("last_token", {}), ("distilbert", {}), ("deberta", {}), ("modernbert", {"classifier_pooling": "cls"}),
    ("modernbert", {"classifier_pooling": "mean"}), ("summary", {"summary_type": "last"}),
    ("summary", {"summary_type": "first"}), ("summary", {"summary_type": "mean"}),
    ("summary", {"summary_type": "cls_index"}),
]
CASES = [("bert", head, options) for head, options in BERT_HEADS] + [
    (family, head, options) for family, (_, _, head, options) in FAMILIES.items() if family != "bert"
] + [("modernbert", "modernbert", {"classifier_pooling": "mean"}), ("gpt2", "mean", {}), ("llama", "cls", {})]

LENGTHS = (5, 7, 4)
"""Three examples: rows [ex0 ex1 pad pad], [ex2 pad ...] of length ROW."""
ROW = 14
ATOL = 1e-5


def _case_id(case) -> str:
    family, head, options = case
    return "-".join([family, head, *map(str, options.values())])


@functools.lru_cache(maxsize=None)
def _model(family: str, head: str, options: tuple) -> SequenceClassifier:
    """A tiny eval-mode classifier with every parameter perturbed (built once per case)."""
    hf, _, _, _ = FAMILIES[family]
    config = ClassifierConfig(backbone_config_from_hf(hf), head=head, num_labels=3, head_options=options)
    model = SequenceClassifier(config, rngs=nnx.Rngs(0))
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    leaves, treedef = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(1), len(leaves))
    leaves = [x + 0.1 * jax.random.normal(k, x.shape, x.dtype) for x, k in zip(leaves, keys)]
    model = nnx.merge(graphdef, jax.tree.unflatten(treedef, leaves), rest)
    model.eval()
    return model


def _examples(pad_id: int, pairs: bool) -> list[dict[str, np.ndarray]]:
    """Three examples; the last ends in the pad id, the second is a pair of token types."""
    rng = np.random.default_rng(0)
    out = []
    for i, length in enumerate(LENGTHS):
        ids = rng.integers(3, 99, size=length).astype(np.int32)
        ids[ids == pad_id] = 3
        if i == 2:
            ids[-1] = pad_id
        example = {"input_ids": ids}
        if pairs:
            example["token_type_ids"] = (np.arange(length) >= length // 2).astype(np.int32) * (i == 1)
        out.append(example)
    return out


def _pack(examples: list[dict[str, np.ndarray]], rows: list[list[int]]) -> dict[str, np.ndarray]:
    """Rows of ROW tokens: the examples listed per row back to back, then padding (segment 0)."""
    packed = {key: np.zeros((len(rows), ROW), np.int32) for key in (*examples[0], "segment_ids")}
    for r, members in enumerate(rows):
        at = 0
        for s, index in enumerate(members, start=1):
            length = len(examples[index]["input_ids"])
            for key, values in examples[index].items():
                packed[key][r, at:at + length] = values
            packed["segment_ids"][r, at:at + length] = s
            at += length
    return packed


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_packed_logits_equal_each_example_alone(case):
    family, head, options = case
    hf, pairs, _, _ = FAMILIES[family]
    model = _model(family, head, tuple(sorted(options.items())))
    pad_id = hf["pad_token_id"]
    examples = _examples(pad_id, pairs)
    rows = [[0, 1], [2]]
    packed = _pack(examples, rows)
    # summary_type="cls_index": each example's position 2, counted from its segment's start.
    cls_index = {"cls_index": np.full((2, 2), 2, np.int32)} if options.get("summary_type") == "cls_index" else {}
    logits = model(
        jnp.asarray(packed["input_ids"]),
        attention_mask=jnp.asarray(packed["segment_ids"] > 0, jnp.int32),
        token_type_ids=jnp.asarray(packed["token_type_ids"]) if pairs else None,
        segment_ids=jnp.asarray(packed["segment_ids"]),
        num_segments=2,
        **{k: jnp.asarray(v) for k, v in cls_index.items()},
    )
    assert logits.shape == (2, 2, 3) and logits.dtype == jnp.float32
    assert np.isfinite(np.asarray(logits)).all()
    worst = 0.0
    for r, members in enumerate(rows):
        for s, index in enumerate(members):
            alone = {k: jnp.asarray(v[None]) for k, v in examples[index].items()}
            expected = model(
                alone["input_ids"], token_type_ids=alone.get("token_type_ids"),
                cls_index=jnp.asarray([2], jnp.int32) if cls_index else None,
            )[0]
            worst = max(worst, float(np.abs(np.asarray(logits[r, s]) - np.asarray(expected)).max()))
            np.testing.assert_allclose(np.asarray(logits[r, s]), np.asarray(expected), atol=ATOL, rtol=0,
                                       err_msg=f"{family}/{head}: row {r} segment {s + 1}")
    print(f"{family}/{head}{options or ''}: max |packed - alone| = {worst:.2e}")


def test_packed_logits_without_num_segments_raise_naming_it():
    model = _model("bert", "cls", ())
    ids = jnp.ones((1, ROW), jnp.int32)
    with pytest.raises(ValueError, match="num_segments"):
        model(ids, segment_ids=ids)


def test_packed_cls_index_of_one_position_per_row_is_refused():
    model = _model("bert", "summary", (("summary_type", "cls_index"),))
    ids = jnp.ones((2, ROW), jnp.int32)
    with pytest.raises(ValueError, match=r"\(2, 3\)"):
        model(ids, segment_ids=ids, num_segments=3, cls_index=jnp.zeros((2,), jnp.int32))


def test_positions_restart_at_every_segment_and_the_padding():
    ids = jnp.asarray([[1, 1, 1, 2, 2, 0, 0], [1, 1, 1, 1, 1, 1, 1]])
    np.testing.assert_array_equal(segments.positions(ids), [[0, 1, 2, 0, 1, 0, 1], [0, 1, 2, 3, 4, 5, 6]])
    np.testing.assert_array_equal(segments.starts(ids, 3), [[0, 3, 0], [0, 0, 0]])
    np.testing.assert_array_equal(segments.ends(ids, 3), [[2, 4, 6], [6, 6, 6]])


def test_attention_mask_keeps_each_segment_and_the_padding_apart():
    mask = np.asarray(segments.attention_mask(jnp.asarray([[1, 1, 2, 0]])))[0, 0]
    np.testing.assert_array_equal(mask, [[1, 1, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]])


def test_packed_logits_under_jit_equal_eager_ones():
    """The train/eval steps jit the model with num_segments static: the shape checks must trace."""
    model = _model("bert", "mean", ())
    packed = _pack(_examples(0, pairs=False), [[0, 1], [2]])
    ids, segment_ids = jnp.asarray(packed["input_ids"]), jnp.asarray(packed["segment_ids"])
    graphdef, state = nnx.split(model)

    @functools.partial(jax.jit, static_argnames="num_segments")
    def forward(state, ids, segment_ids, num_segments):
        return nnx.merge(graphdef, state)(ids, segment_ids=segment_ids, num_segments=num_segments)

    np.testing.assert_allclose(forward(state, ids, segment_ids, 2), model(ids, segment_ids=segment_ids, num_segments=2),
                               atol=ATOL, rtol=0)
