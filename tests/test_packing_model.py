"""Sequence packing, model side: the logits of packed rows equal those of each example run alone.

For every backbone family and every head that makes sense on it, three examples of different
lengths are packed into two rows (5 + 7 tokens, then 4, then trailing padding), so the second
example starts mid-row (left context), windows shorter than an example slide inside it, and one
example ends in the pad id (the "last_token" rule applies inside the segment). The packed
(batch, S, num_labels) logits must equal each example's logits alone, batch 1 and unpadded.

Tiny flax models built from the families' configs (tests/families.py; no torch weights): packed-vs-
unpacked flaxheads is what is tested here; parity with transformers is in the family tests. Every parameter is
perturbed at random, LayerNorm scales and biases included, so no term hides at its init value.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from families import FAMILIES
from flaxheads import ClassifierConfig, SequenceClassifier, TokenClassifier
from flaxheads.backbones import backbone_config_from_hf, segments
from flaxheads.conversion import architecture_table
from flaxheads.heads import HeadInputs, pooling
from flaxheads.tasks.token.model import TokenClassifierConfig

PACKED = {name: row for name, row in FAMILIES.items() if row.packing is not None}
"""The families of tests/families.py, each with its config overrides for packing (`Family.packing`)."""

# Every head once on BERT (with each summary_type and ModernBERT pooling), each family's own head.
BERT_HEADS = [
    ("pooler", {}), ("roberta", {}), ("electra", {}), ("cls", {}), ("mean", {}), ("mean_max", {}), ("attention", {}),
    ("concat_last4", {}),
    ("last_token", {}), ("distilbert", {}), ("deberta", {}), ("modernbert", {"classifier_pooling": "cls"}),
    ("modernbert", {"classifier_pooling": "mean"}), ("summary", {"summary_type": "last"}),
    ("summary", {"summary_type": "first"}), ("summary", {"summary_type": "mean"}),
    ("summary", {"summary_type": "cls_index"}),
]
CASES = [("bert", head, options) for head, options in BERT_HEADS] + [
    (name, row.head, {}) for name, row in PACKED.items() if name != "bert"
] + [("modernbert", "modernbert", {"classifier_pooling": "mean"}), ("gpt2", "mean", {}), ("gpt2", "mean_max", {}),
    ("gpt2", "attention", {}), ("llama", "cls", {})]

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
    row = PACKED[family]
    config = ClassifierConfig(backbone_config_from_hf(row.hf_config(**dict(row.packing))), head=head, num_labels=3,
                              head_options=options)
    return _perturbed(SequenceClassifier(config, rngs=nnx.Rngs(0)))


def _perturbed(model):
    """`model` in eval mode with every parameter moved by 0.1 * N(0, 1)."""
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    leaves, treedef = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(1), len(leaves))
    leaves = [x + 0.1 * jax.random.normal(k, x.shape, x.dtype) for x, k in zip(leaves, keys)]
    model = nnx.merge(graphdef, jax.tree.unflatten(treedef, leaves), rest)
    model.eval()
    return model


@functools.lru_cache(maxsize=None)
def _forward(family: str, head: str, options: tuple):
    """`_model(...)` as the test calls it. BERT's cases (every head) run eagerly: they share the
    backbone's compiled operations, so each new head compiles only its own. Every other family
    runs under jit, as the train and eval steps run it: one compilation per input shape instead
    of one per operation (a DeBERTa case: 8 s instead of 100). test_packed_logits_under_jit_equal_
    eager_ones checks that both give the same logits."""
    model = _model(family, head, options)
    if family == "bert":
        return model
    graphdef, state = nnx.split(model)

    @functools.partial(jax.jit, static_argnames="num_segments")
    def forward(state, input_ids, **inputs):
        return nnx.merge(graphdef, state)(input_ids, **inputs)

    return functools.partial(forward, state)


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


FAST_CASE = ("gemma2", "last_token", {})
"""The one case the fast lane (`-m "not slow"`) keeps: the sweep compiles every family."""


@pytest.mark.matrix("case.0", "case.1")
@pytest.mark.parametrize("case", [
    pytest.param(case, id=_case_id(case), marks=() if case == FAST_CASE else pytest.mark.slow) for case in CASES
])
def test_packed_logits_equal_each_example_alone(case):
    family, head, options = case
    pairs = PACKED[family].token_types
    model = _forward(family, head, tuple(sorted(options.items())))
    pad_id = _model(family, head, tuple(sorted(options.items()))).config.backbone.pad_token_id
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


TOKEN_FAMILIES = ("bert", "modernbert", "gemma2")
"""Token classifiers packed: BERT's linear head on token types, ModernBERT's own head over local
attention windows, a decoder with sliding windows and soft-capped attention."""


@pytest.mark.parametrize("family", [pytest.param(name, marks=() if name == "gemma2" else pytest.mark.slow)
                                    for name in TOKEN_FAMILIES])
def test_packed_token_logits_equal_each_example_alone(family):
    """A token's logits do not depend on its row-mates: each example's slice of a packed row
    equals its logits run alone."""
    row = PACKED[family]
    backbone = backbone_config_from_hf(row.hf_config(**dict(row.packing)))
    config = TokenClassifierConfig(backbone, head=architecture_table(backbone.model_type).default_head(
        TokenClassifierConfig.task), num_labels=4)
    graphdef, state = nnx.split(_perturbed(TokenClassifier(config, rngs=nnx.Rngs(0))))
    model = jax.jit(lambda state, ids, **inputs: nnx.merge(graphdef, state)(ids, **inputs))
    examples = _examples(backbone.pad_token_id, row.token_types)
    rows = [[0, 1], [2]]
    packed = {k: jnp.asarray(v) for k, v in _pack(examples, rows).items()}

    logits = model(state, packed["input_ids"], token_type_ids=packed.get("token_type_ids") if row.token_types else None,
                   segment_ids=packed["segment_ids"])

    assert logits.shape == (2, ROW, 4) and np.isfinite(np.asarray(logits)).all()
    worst = 0.0
    for r, members in enumerate(rows):
        start = 0
        for index in members:
            alone = {k: jnp.asarray(v[None]) for k, v in examples[index].items()}
            expected = np.asarray(model(state, alone["input_ids"], token_type_ids=alone.get("token_type_ids"))[0])
            ours = np.asarray(logits[r, start:start + len(expected)])
            worst = max(worst, float(np.abs(ours - expected).max()))
            np.testing.assert_allclose(ours, expected, atol=ATOL, rtol=0, err_msg=f"{family}: row {r}, example {index}")
            start += len(expected)
    print(f"{family} token classifier: max |packed - alone| = {worst:.2e}")


def test_packed_logits_without_num_segments_raise_naming_it():
    model = _model("bert", "cls", ())
    ids = jnp.ones((1, ROW), jnp.int32)
    with pytest.raises(ValueError, match="num_segments"):
        model(ids, segment_ids=ids)


@pytest.mark.slow  # builds a perturbed 4-layer BERT eagerly
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


@pytest.mark.slow  # builds a perturbed 4-layer BERT and compiles it
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


# -- pooling against numpy, padded on either side and packed ----------------------------------------

QUERY = np.random.default_rng(2).normal(size=8).astype(np.float32)


def _softmax_pool(hidden_TD: np.ndarray) -> np.ndarray:
    scores_T = hidden_TD @ QUERY
    weights_T = np.exp(scores_T - scores_T.max())
    return (weights_T / weights_T.sum()) @ hidden_TD


POOLING_REFERENCES = {
    "masked_mean": (lambda inputs: pooling.masked_mean(inputs), lambda h: h.mean(axis=0)),
    "masked_max": (lambda inputs: pooling.masked_max(inputs), lambda h: h.max(axis=0)),
    "mean_max": (lambda inputs: pooling.mean_max(inputs), lambda h: np.concatenate([h.mean(axis=0), h.max(axis=0)])),
    "attention": (lambda inputs: pooling.attention_pool(inputs, inputs.hidden_states[-1] @ QUERY), _softmax_pool),
}
"""Pooling function -> its numpy reference on one example's real tokens (T, D) alone."""


@pytest.mark.parametrize("layout", ["right", "left", "packed"])
@pytest.mark.parametrize("name", sorted(POOLING_REFERENCES))
def test_pooling_equals_numpy_on_each_examples_real_tokens(name, layout):
    pool, reference = POOLING_REFERENCES[name]
    hidden_BTD = np.random.default_rng(3).normal(size=(2, 9, 8)).astype(np.float32)
    lengths = [[4, 3], [9]] if layout == "packed" else [[4], [9]]
    segment_ids = np.zeros((2, 9), np.int32)
    spans = []  # (row, slot, start, end) of every example
    for row, row_lengths in enumerate(lengths):
        at = 9 - sum(row_lengths) if layout == "left" else 0
        for slot, length in enumerate(row_lengths):
            segment_ids[row, at:at + length] = slot + 1
            spans.append((row, slot, at, at + length))
            at += length
    if layout == "packed":
        inputs = HeadInputs((jnp.asarray(hidden_BTD),), None, None, segment_ids=jnp.asarray(segment_ids), num_segments=2)
    else:
        inputs = HeadInputs((jnp.asarray(hidden_BTD),), jnp.asarray(segment_ids > 0, jnp.int32), None)
    pooled = np.asarray(pool(inputs))
    for row, slot, start, end in spans:
        got = pooled[row, slot] if layout == "packed" else pooled[row]
        np.testing.assert_allclose(got, reference(hidden_BTD[row, start:end]), atol=1e-5, rtol=1e-5,
                                   err_msg=f"{name}, {layout}: row {row} example {slot + 1}")
