"""The last layer run only where the head reads it (`SequenceClassifier.runs_last_layer_at`): the
same logits, loss and gradients as the full computation, in training (dropout on: the same units
drop) and in eval mode, padded on either side and packed, on every family whose backbone can
(`LAST_LAYER_AT_POSITIONS`) and every head that reads the first token; fewer FLOPs; and the
cases that must keep the full computation (other heads, other backbones, LoRA dropout)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import flaxheads
from families import FAMILIES
from family_parity import flax_inputs
from flaxheads import lora
from flaxheads.backbones import dropout, stacking
from flaxheads.heads import HEAD_NAMES, HeadInputs

ATOL = 2e-6
"""Logits and gradients of the two paths: matmuls over P rows or T round differently, nothing else."""
FIRST_TOKEN_HEADS = ("pooler", "cls", "roberta", "electra", "distilbert", "deberta", "modernbert")
SUPPORTED = [name for name, row in FAMILIES.items() if name in ("bert", "roberta", "xlm-roberta", "electra", "distilbert")]


def _model(hf_checkpoint, row, head, layers: int = 2):
    checkpoint = hf_checkpoint(row.base, family=row.name, **{row.layers_key: layers})
    model = flaxheads.from_pretrained(checkpoint.path, head=head, num_labels=3, seed=1, **dict(row.load_options))
    model.train()
    return model


def _packed(batch) -> dict:
    """The batch's real tokens of rows 2 and 3 packed back to back into row 1's place: segment
    ids 1, 2 (and an absent third slot), positions restart per segment."""
    ids, mask = batch["input_ids"], batch["attention_mask"]
    tokens = [ids[r][mask[r] == 1] for r in (1, 2)]
    length = ids.shape[1]
    row = np.concatenate(tokens)[:length]
    segment = np.concatenate([np.full(len(t), s + 1) for s, t in enumerate(tokens)])[:length]
    pad = length - len(row)
    packed_ids = np.stack([np.pad(row, (0, pad)), ids[0]])
    segment_ids = np.stack([np.pad(segment, (0, pad)), np.ones(length, int)])
    return {"input_ids": packed_ids, "segment_ids": segment_ids}


def _value_and_grads(model, inputs: dict, *, skip: bool, num_segments: int | None = None, grads: bool = True):
    """(loss, logits, gradients) of a training-mode forward pass (dropout on); gradients None
    with grads=False (a forward pass compiles in a third of the time)."""
    graphdef, params = nnx.split(model)
    extra = {} if num_segments is None else {"num_segments": num_segments}

    def loss(params):
        merged = nnx.merge(graphdef, params)
        merged.skip_unread_positions = skip
        logits = merged(**inputs, **extra, rngs=nnx.Rngs(dropout=3))
        return jnp.sum(jnp.sin(3.0 * logits)), logits

    if not grads:
        return (*jax.jit(loss)(params), None)
    (value, logits), gradients = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
    return value, logits, gradients


def _assert_paths_agree(model, inputs: dict, what: str, num_segments: int | None = None, *,
                        grads: bool = True) -> None:
    skipped = _value_and_grads(model, inputs, skip=True, num_segments=num_segments, grads=grads)
    full = _value_and_grads(model, inputs, skip=False, num_segments=num_segments, grads=grads)
    np.testing.assert_allclose(skipped[1], full[1], atol=ATOL, rtol=1e-5, err_msg=f"{what}: logits")
    if not grads:
        return
    for (path, a), (_, b) in zip(jax.tree_util.tree_leaves_with_path(skipped[2]),
                                 jax.tree_util.tree_leaves_with_path(full[2])):
        # float32 rounding of sums over P rows or T: relative to the gradient's scale
        np.testing.assert_allclose(a, b, atol=ATOL + 2e-6 * float(np.abs(b).max()), rtol=1e-4,
                                   err_msg=f"{what}: gradient of {jax.tree_util.keystr(path)}")


def _head_inputs(inputs: dict, num_segments: int | None = None) -> HeadInputs:
    return HeadInputs((), inputs.get("attention_mask"), inputs["input_ids"], None, inputs.get("segment_ids"),
                      num_segments)


# Every family whose backbone runs the short layer, with its own head; BERT on each layout, the
# others on one each (the layouts differ only in where the read positions are). All share one
# layer module (encoder.EncoderLayer); gradients on BERT's layouts and on DistilBERT (no segment
# embeddings, its own config switches), training-mode logits (dropout on) on the others.
LAYOUTS = [("bert", "right"), ("bert", "left"), ("bert", "packed"), ("roberta", "left"), ("xlm-roberta", "packed"),
           ("electra", "right"), ("distilbert", "packed")]
GRADIENT_FAMILIES = ("bert", "distilbert")


@pytest.mark.slow
@pytest.mark.matrix()  # a third of the layouts a run (tests/conftest.py, MATRIX_PARTS)
@pytest.mark.parametrize(("name", "layout"), LAYOUTS, ids=[f"{name}-{layout}" for name, layout in LAYOUTS])
def test_the_last_layer_at_the_read_positions_trains_as_the_full_layer(hf_checkpoint, name, layout):
    row = FAMILIES[name]
    model = _model(hf_checkpoint, row, row.head)
    batch = row.batch("right" if layout == "packed" else layout)
    if layout == "packed":
        inputs, segments = flax_inputs(_packed(batch)), 3
    else:
        inputs, segments = flax_inputs(batch), None
    assert model.runs_last_layer_at(_head_inputs(inputs, segments)) is not None, "the short path is not taken"
    _assert_paths_agree(model, inputs, f"{row.head} on {name}, {layout}", segments, grads=name in GRADIENT_FAMILIES)


# The heads not above (electra is roberta's class with GELU), on BERT: training-mode logits (the
# gradient through the short layer is the layout test's; a head only picks the positions).
@pytest.mark.slow
@pytest.mark.parametrize("head", [h for h in FIRST_TOKEN_HEADS if h not in ("pooler", "electra")])
def test_every_first_token_head_reads_only_its_positions(hf_checkpoint, head):
    model = _model(hf_checkpoint, FAMILIES["bert"], head)
    inputs = flax_inputs(FAMILIES["bert"].batch("left"))
    assert model.runs_last_layer_at(_head_inputs(inputs)) is not None
    _assert_paths_agree(model, inputs, f"{head} on bert", grads=False)


@pytest.mark.slow
def test_the_short_path_does_less_work(hf_checkpoint):
    model = _model(hf_checkpoint, FAMILIES["bert"], "pooler")
    inputs = flax_inputs(FAMILIES["bert"].batch("right"))
    graphdef, params = nnx.split(model)

    def flops(skip: bool) -> float:
        def forward(params):
            merged = nnx.merge(graphdef, params)
            merged.skip_unread_positions = skip
            return merged(**inputs, rngs=nnx.Rngs(dropout=0))

        return jax.jit(forward).lower(params).compile().cost_analysis()["flops"]

    assert flops(True) < 0.95 * flops(False)


@pytest.mark.slow
def test_with_rematerialised_layers(hf_checkpoint):
    model = _model(hf_checkpoint, FAMILIES["bert"], "pooler")
    stacking.set_gradient_checkpointing(model.backbone)
    _assert_paths_agree(model, flax_inputs(FAMILIES["bert"].batch("right")), "pooler on bert, gradient checkpointing")


def test_scanned_layers_stay_one_scan_and_give_the_whole_last_layer(hf_checkpoint):
    model = _model(hf_checkpoint, FAMILIES["bert"], "pooler")
    model.eval()
    inputs = flax_inputs(FAMILIES["bert"].batch("right"))
    positions = jnp.zeros((inputs["input_ids"].shape[0], 1), jnp.int32)
    short = model.backbone(**inputs, last_layer_positions=positions).last_hidden_state
    stacking.set_scan_layers(model.backbone)
    scanned = model.backbone(**inputs, last_layer_positions=positions).last_hidden_state
    assert np.abs(np.asarray(short[:, 1:])).max() == 0.0  # the loop's short layer: the other rows are zeros
    np.testing.assert_allclose(scanned, model.backbone(**inputs).last_hidden_state, atol=1e-6)
    np.testing.assert_allclose(scanned[:, :1], short[:, :1], atol=ATOL)


@pytest.mark.parametrize("head", [h for h in HEAD_NAMES if h not in FIRST_TOKEN_HEADS])
def test_heads_that_read_more_keep_the_full_layer(hf_checkpoint, head):
    model = _model(hf_checkpoint, FAMILIES["bert"], head, layers=4)  # concat_last4 needs 4 layers
    inputs = flax_inputs(FAMILIES["bert"].batch("right"))
    assert model.runs_last_layer_at(_head_inputs(inputs)) is None


@pytest.mark.parametrize("name", [name for name in FAMILIES if name not in SUPPORTED])
def test_other_backbones_keep_the_full_layer(hf_checkpoint, name):
    row = FAMILIES[name]
    model = _model(hf_checkpoint, row, "cls")
    assert model.runs_last_layer_at(_head_inputs(flax_inputs(row.batch(row.sample_padding)))) is None


def test_lora_dropout_keeps_the_full_layer(hf_checkpoint):
    model = _model(hf_checkpoint, FAMILIES["bert"], "pooler")
    inputs = _head_inputs(flax_inputs(FAMILIES["bert"].batch("right")))
    targets = ("query", "value")
    assert model.with_lora(lora.LoRAConfig(r=2, target_modules=targets)).runs_last_layer_at(inputs) is not None
    assert model.with_lora(lora.LoRAConfig(r=2, dropout=0.1, target_modules=targets)).runs_last_layer_at(inputs) is None


@pytest.mark.parametrize("impl", ["threefry2x32", "rbg"])
@pytest.mark.parametrize("shape", [(2, 3, 6, 7), (2, 6, 8)])
def test_dropout_rows_are_the_full_masks_rows(impl, shape):
    key = jax.random.key(5, impl=impl)
    index = jnp.array([[0, 4, 4], [5, 1, 0]])
    axis = len(shape) - 2
    full, _ = dropout.keep_mask(key, 0.3, shape)
    index_b = index.reshape(2, *([1] * (axis - 1)), 3, 1)
    rows = dropout.Rows(axis, index_b, shape[axis])
    part, _ = dropout.keep_mask(key, 0.3, (*shape[:axis], 3, shape[-1]), rows=rows)
    expected = jnp.take_along_axis(full, jnp.broadcast_to(index_b, part.shape), axis=axis)
    np.testing.assert_array_equal(part, expected)
    assert 0.1 < float(1 - full.mean()) < 0.5
