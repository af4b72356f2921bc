"""Scan over layers (`stacking.set_scan_layers`, `--scan_layers`): every family gives the loop's
hidden states and gradients, with the same dropout masks, and the jaxpr really holds a scan."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import transformers
from flax import nnx

import flaxheads
from flaxheads.backbones import backbone_config_from_hf, dropout, stacking

pytestmark = pytest.mark.slow  # a loop and a scan compiled with their gradients, per family

PAD = 0
SMALL = dict(vocab_size=99, hidden_size=32, num_attention_heads=4, intermediate_size=37)
# Two groups of layers to scan at least; BERT and GPT-2 keep their dropout, so the masks drawn
# inside the scan must equal the loop's.
TINY_HF = {
    "bert": transformers.BertConfig(**SMALL, num_hidden_layers=2, max_position_embeddings=64),
    "gpt2": transformers.GPT2Config(vocab_size=99, n_embd=32, n_layer=2, n_head=4, n_positions=64, n_inner=37,
                                    pad_token_id=PAD),
    "albert": transformers.AlbertConfig(**SMALL, embedding_size=16, num_hidden_layers=2, max_position_embeddings=64),
    "xlnet": transformers.XLNetConfig(vocab_size=99, d_model=32, n_layer=2, n_head=4, d_inner=37, pad_token_id=PAD),
    # Layer 0 runs on its own (the convolution follows it): layers 1-2 are scanned.
    "deberta-v2": transformers.DebertaV2Config(**SMALL, num_hidden_layers=3, relative_attention=True,
                                               position_buckets=8, max_relative_positions=16,
                                               pos_att_type=["p2c", "c2p"], conv_kernel_size=3),
    # Layer 0 has no attention norm: layers 1-4 are scanned, local and global in turn.
    "modernbert": transformers.ModernBertConfig(**SMALL, num_hidden_layers=5, local_attention=4,
                                                global_attn_every_n_layers=2, pad_token_id=PAD),
    "llama": transformers.LlamaConfig(**SMALL, num_hidden_layers=2, num_key_value_heads=2, pad_token_id=PAD),
    "gemma2": transformers.Gemma2Config(**SMALL, num_hidden_layers=4, num_key_value_heads=2, head_dim=8,
                                        sliding_window=4, pad_token_id=PAD),
}


def _model(family: str, *, scan: bool, checkpointing: bool = False) -> flaxheads.SequenceClassifier:
    backbone = backbone_config_from_hf(TINY_HF[family].to_dict())
    head = flaxheads.conversion.architecture_table(backbone.model_type).canonical_head
    model = flaxheads.SequenceClassifier(flaxheads.ClassifierConfig(backbone, head, num_labels=3), rngs=nnx.Rngs(0))
    stacking.set_scan_layers(model.backbone, scan)
    if checkpointing:
        stacking.set_gradient_checkpointing(model.backbone)
    return model


def _inputs() -> dict[str, jax.Array]:
    """Two rows of 9, the second right-padded."""
    ids = np.random.RandomState(0).randint(1, 98, (2, 9))
    mask = np.ones_like(ids)
    ids[1, 6:], mask[1, 6:] = PAD, 0
    return {"input_ids": jnp.asarray(ids), "attention_mask": jnp.asarray(mask)}


def _grads(model) -> tuple[dict[str, np.ndarray], str]:
    graphdef, params = nnx.split(model)

    def loss(params):
        m = nnx.merge(graphdef, params)
        logits = m(**_inputs(), rngs=nnx.Rngs(dropout=jax.random.key(3)))
        return optax.softmax_cross_entropy_with_integer_labels(logits, jnp.array([0, 2])).mean()

    traced = jax.jit(jax.grad(loss)).trace(params)
    grads = traced.lower().compile()(params)
    flat = {".".join(map(str, p)): np.asarray(v[...]) for p, v in nnx.to_flat_state(grads)}
    return flat, str(traced.jaxpr)


def _primitives(jaxpr: str) -> list[str]:
    return re.findall(r"= ([a-z_0-9]+)\[", jaxpr)


@pytest.mark.matrix()  # a third of the families a run (tests/conftest.py, MATRIX_PARTS)
@pytest.mark.parametrize("family", list(TINY_HF))
def test_scanned_layers_give_the_loops_hidden_states_and_gradients(family):
    loop, scan = _model(family, scan=False), _model(family, scan=True)
    for model in (loop, scan):
        model.eval()
    expected = loop.backbone(**_inputs()).hidden_states
    got = scan.backbone(**_inputs()).hidden_states
    assert len(got) == len(expected) == TINY_HF[family].num_hidden_layers + 1
    for e, g in zip(expected, got):
        np.testing.assert_allclose(np.asarray(g), np.asarray(e), atol=2e-6, rtol=1e-5)

    for model in (loop, scan):
        model.train()
    (plain, plain_jaxpr), (scanned, scanned_jaxpr) = _grads(loop), _grads(scan)
    assert plain.keys() == scanned.keys()
    diff = max(np.abs(plain[name] - scanned[name]).max() for name in plain)
    print(f"{family}: max |grad - grad with scan| = {diff:.2e}")
    assert diff < 1e-5
    assert "scan" in _primitives(scanned_jaxpr) and "scan" not in _primitives(plain_jaxpr)


def test_scan_with_gradient_checkpointing_and_packed_rows():
    segment_ids = jnp.array([[1, 1, 1, 2, 2, 3, 3, 3, 3], [1, 1, 2, 2, 2, 2, 0, 0, 0]])
    inputs = dict(_inputs(), segment_ids=segment_ids, num_segments=3)
    loop = _model("bert", scan=False)
    scan = _model("bert", scan=True, checkpointing=True)
    rngs = lambda: nnx.Rngs(dropout=jax.random.key(5))  # noqa: E731
    np.testing.assert_allclose(np.asarray(scan(**inputs, rngs=rngs())), np.asarray(loop(**inputs, rngs=rngs())),
                               atol=2e-6)
    plain, _ = _grads(loop)
    scanned, jaxpr = _grads(scan)
    assert max(np.abs(plain[name] - scanned[name]).max() for name in plain) < 1e-5
    primitives = _primitives(jaxpr)
    assert "scan" in primitives and any("remat" in p or "checkpoint" in p for p in primitives)


def test_a_scan_carries_dropout_keys_on_as_nnx_rngs_would():
    """The train step passes `dropout.DropoutKeys`: a scan carries its count and the head's dropout
    after the layers draws the key nnx.Rngs would."""
    scan = _model("bert", scan=True)
    key = jax.random.key(5)
    keys = dropout.DropoutKeys(key)
    with_keys = jax.jit(lambda ids, mask: scan(input_ids=ids, attention_mask=mask, rngs=keys))(
        *_inputs().values())
    with_rngs = scan(**_inputs(), rngs=nnx.Rngs(dropout=key))
    np.testing.assert_array_equal(np.asarray(with_keys), np.asarray(with_rngs))


def test_layers_that_do_not_repeat_run_as_a_loop():
    """ModernBERT's layers 1-3 with a global layer every 3 (local, local, global): no period gives
    two groups, so no scan."""
    config = transformers.ModernBertConfig(**SMALL, num_hidden_layers=4, local_attention=4,
                                           global_attn_every_n_layers=3, pad_token_id=PAD)
    backbone = backbone_config_from_hf(config.to_dict())
    model = flaxheads.SequenceClassifier(flaxheads.ClassifierConfig(backbone, "cls", num_labels=2),
                                         rngs=nnx.Rngs(0))
    model.eval()
    stacking.set_scan_layers(model.backbone)
    jaxpr = str(jax.make_jaxpr(lambda ids: model(ids))(_inputs()["input_ids"]))
    assert "scan" not in _primitives(jaxpr)


def test_train_config_scan_layers_scans_a_copy_and_leaves_the_callers_model_alone():
    from flaxheads.training.config import TrainConfig
    from flaxheads.training.trainer import _prepared

    model = _model("bert", scan=False)
    prepared = _prepared(model, TrainConfig(scan_layers=True))
    assert prepared is not model and not getattr(model.backbone, stacking.SCAN_LAYERS)
    jaxpr = str(jax.make_jaxpr(lambda ids: prepared(ids, rngs=nnx.Rngs(dropout=0)))(_inputs()["input_ids"]))
    assert "scan" in _primitives(jaxpr)
    assert _prepared(model, TrainConfig()) is model
