"""Dropout's random bits (jax's threefry bit for bit, 16 bits per decision, the same mask sharded),
and train/eval mode: `model.train()` / `model.eval()` switch every dropout, `rngs` feeds the masks."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import flaxheads
from flaxheads.backbones import EncoderConfig, GPT2Config, XLNetConfig, dropout
from flaxheads.tasks.classification.model import ClassifierConfig, SequenceClassifier
from flaxheads.training import step as train_steps
from runs import cpu_devices_env


@pytest.mark.parametrize("shape", [(), (1,), (7,), (3, 5), (2, 3, 4, 6)])
@pytest.mark.parametrize("seed", [0, 2**31 + 17])
def test_random_bits_are_jax_threefry_bits(shape, seed):
    key = jax.random.fold_in(jax.random.key(seed), 3)
    ours = jax.jit(dropout.random_bits, static_argnums=1)(key, shape)
    assert ours.dtype == jnp.uint32
    np.testing.assert_array_equal(np.asarray(ours), np.asarray(jax.random.bits(key, shape, jnp.uint32)))
    raw = jax.random.key_data(key)  # old-style uint32[2] keys give the same bits
    np.testing.assert_array_equal(np.asarray(dropout.random_bits(raw, shape)), np.asarray(ours))


def test_other_key_implementations_go_to_jax():
    key = jax.random.key(0, impl="rbg")
    np.testing.assert_array_equal(
        np.asarray(dropout.random_bits(key, (4, 8))), np.asarray(jax.random.bits(key, (4, 8), jnp.uint32))
    )


@pytest.mark.parametrize("rate", [0.1, 0.5, 0.9])
def test_keep_mask_keeps_the_right_fraction_and_dropout_is_unbiased(rate):
    shape = (64, 128, 129)  # odd last axis: low and high halves of the last word
    keep, keep_prob = dropout.keep_mask(jax.random.key(1), rate, shape)
    assert keep.shape == shape and keep.dtype == jnp.bool_
    assert keep_prob == (65536 - round(rate * 65536)) / 65536
    n = np.prod(shape)
    sigma = np.sqrt(keep_prob * (1 - keep_prob) / n)
    assert abs(float(keep.mean()) - keep_prob) < 6 * sigma
    # the low and high halves of a word decide independently
    pairs = np.asarray(keep[..., :64]).astype(float), np.asarray(keep[..., 64:128]).astype(float)
    assert abs(np.corrcoef(pairs[0].ravel(), pairs[1].ravel())[0, 1]) < 0.01

    class Rngs:  # what dropout.apply needs of nnx.Rngs
        def dropout(self):
            return jax.random.key(2)

    out = dropout.apply(jnp.ones(shape), rate, Rngs())
    kept = np.asarray(out) != 0
    np.testing.assert_allclose(np.asarray(out)[kept], 1 / keep_prob, rtol=1e-6)
    assert abs(float(out.mean()) - 1.0) < 6 * sigma / keep_prob


@pytest.mark.parametrize("key", [7, jax.random.key(3), jax.random.PRNGKey(3)], ids=["int", "typed", "raw"])
def test_dropout_keys_are_the_keys_of_an_nnx_rngs_stream(key):
    rngs, keys = nnx.Rngs(dropout=key), dropout.DropoutKeys(key)
    for _ in range(4):
        np.testing.assert_array_equal(jax.random.key_data(keys.dropout()), jax.random.key_data(rngs.dropout()))
    # handed to a scan as an nnx.Rngs and taken back, the stream goes on where it was
    carried = keys.as_rngs()
    np.testing.assert_array_equal(jax.random.key_data(carried.dropout()), jax.random.key_data(rngs.dropout()))
    keys.follow(carried)
    np.testing.assert_array_equal(jax.random.key_data(keys.dropout()), jax.random.key_data(rngs.dropout()))


def test_tracing_the_train_step_builds_no_tracer_error_messages(monkeypatch):
    """nnx.Rngs counts its keys in an array variable; updating it under a trace made flax ask the
    traced count for its sharding, and jax's AttributeError message walked the whole trace each
    time (a third of the MiniLM train step's tracing). The step's DropoutKeys count in Python."""
    from jax._src.interpreters import partial_eval

    calls = []
    original = partial_eval.DynamicJaxprTracer._origin_msg
    monkeypatch.setattr(partial_eval.DynamicJaxprTracer, "_origin_msg",
                        lambda self: calls.append(1) or original(self))
    model = _model("bert-pooler")
    graphdef, params = nnx.split(model)
    tx = optax.adamw(1e-3)
    state = train_steps.TrainState(jnp.zeros((), jnp.int32), params, tx.init(params))
    step = train_steps.make_train_step(graphdef, tx, optax.constant_schedule(1e-3), "single_label_classification")
    batch = {name: value[None] for name, value in INPUTS.items()}
    batch.update(labels=jnp.array([[0, 2]]), example_mask=jnp.ones((1, 2)))
    jax.make_jaxpr(step)(state, batch, jax.random.key(0))
    assert not calls


def test_bad_rates_are_refused():
    with pytest.raises(ValueError, match=r"dropout rate 1.0: it must be in \[0, 1\)"):
        dropout.keep_mask(jax.random.key(0), 1.0, (4,))


@pytest.mark.slow  # a subprocess on 4 fake devices
def test_a_batch_sharded_over_devices_draws_the_same_mask():
    script = textwrap.dedent("""
        import jax, numpy as np
        from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
        from flaxheads.backbones import dropout
        mesh = Mesh(np.array(jax.devices()), ("data",))
        key = jax.random.key(5)
        f = lambda k: dropout.keep_mask(k, 0.1, (8, 12, 16, 16))[0]
        whole = jax.jit(f)(key)
        sharded = jax.jit(f, out_shardings=NamedSharding(mesh, P("data")))(key)
        assert len(sharded.sharding.device_set) == 4
        assert np.array_equal(np.asarray(whole), np.asarray(sharded))
        print("same")
    """)
    env = cpu_devices_env(4)
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "same"


# ---------------------------------------------------------------------------------------------
# Train/eval mode: `model.train()` / `model.eval()` switch every dropout; `rngs` feeds the masks

_ENCODER = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
                max_position_embeddings=64, initializer_range=0.1)
# Every dropout-carrying head, each on a backbone family (dropout rates: the configs' defaults, 0.1).
MODELS = {
    "bert-pooler": (EncoderConfig(**_ENCODER), "pooler", {}),
    "roberta-roberta": (EncoderConfig(**_ENCODER, model_type="roberta", pad_token_id=1, type_vocab_size=1,
                                      position_ids_from_padding=True), "roberta", {}),
    "bert-mean": (EncoderConfig(**_ENCODER), "mean", {}),
    "gpt2-last_token": (GPT2Config(vocab_size=99, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                                   initializer_range=0.1, pad_token_id=0), "last_token", {}),
    "xlnet-summary": (XLNetConfig(vocab_size=99, d_model=32, n_head=4, d_inner=37, n_layer=2, initializer_range=0.1),
                      "summary", {"summary_first_dropout": 0.2}),
}
# Logits of `_model(name)` on INPUTS with rngs=nnx.Rngs(dropout=7), computed before train/eval
# modes existed (dropout was then active whenever rngs was given): the masks must not change.
EARLIER_DROPOUT_LOGITS = {
    "bert-pooler": [[-0.408749, 0.323682, 0.236559], [-0.151589, 0.178706, 0.024963]],
    "roberta-roberta": [[-0.586056, -0.196214, -0.271246], [-0.295227, -0.39905, -0.35242]],
    "bert-mean": [[-0.361262, -0.018854, 0.185343], [0.045064, -0.177475, 0.860716]],
    "gpt2-last_token": [[0.939483, 0.070722, 0.610459], [0.348012, -1.091429, 0.286503]],
    "xlnet-summary": [[-0.057052, -0.126405, -0.218784], [-0.199002, -0.079975, -0.158646]],
}
INPUTS = dict(
    input_ids=jnp.array([[5, 6, 7, 8, 9, 10], [11, 12, 13, 14, 0, 0]], jnp.int32),
    attention_mask=jnp.array([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]], jnp.int32),
)


def _model(name: str, **backbone_overrides) -> SequenceClassifier:
    backbone, head, options = MODELS[name]
    if backbone_overrides:
        backbone = dataclasses.replace(backbone, **backbone_overrides)
    config = ClassifierConfig(backbone=backbone, head=head, num_labels=3, head_options=tuple(options.items()))
    return SequenceClassifier(config, rngs=nnx.Rngs(0))


def _modes(model: nnx.Module) -> dict[str, bool]:
    """'backbone.layers.0.attention' -> its `deterministic`, for every module that has one."""
    return {
        ".".join(map(str, path)): node.deterministic
        for path, node in nnx.iter_graph(model)
        if isinstance(node, nnx.Module) and hasattr(node, "deterministic")
    }


# The fast lane keeps BERT's pooler head; the other models compile their own dropout programs.
FAST_MODELS = [pytest.param(name, marks=() if name == "bert-pooler" else pytest.mark.slow) for name in MODELS]


@pytest.mark.parametrize("name", FAST_MODELS)
def test_a_constructed_model_is_in_train_mode_and_eval_train_flip_every_dropout(name):
    model = _model(name)
    modes = _modes(model)
    assert modes and not any(modes.values())
    assert any(".attention" in path for path in modes)  # attention-probability dropout
    if name != "gpt2-last_token":  # the only head without dropout, as GPT2ForSequenceClassification
        assert "head" in modes

    model.eval()
    assert all(_modes(model).values())
    model.train()
    assert not any(_modes(model).values())


@pytest.mark.slow
@pytest.mark.parametrize("name", FAST_MODELS)
def test_eval_mode_turns_dropout_off_even_with_rngs(name):
    model = _model(name)
    model.eval()

    without = np.asarray(model(**INPUTS))
    with_rngs = np.asarray(model(**INPUTS, rngs=nnx.Rngs(dropout=7)))

    np.testing.assert_array_equal(with_rngs, without)


@pytest.mark.parametrize("name", FAST_MODELS)
@pytest.mark.slow  # train-mode dropout compiled per model
def test_train_mode_draws_the_masks_of_earlier_releases_and_a_new_mask_per_key(name):
    model = _model(name)

    logits = np.asarray(model(**INPUTS, rngs=nnx.Rngs(dropout=7)))
    other_key = np.asarray(model(**INPUTS, rngs=nnx.Rngs(dropout=8)))
    model.eval()
    deterministic = np.asarray(model(**INPUTS))

    np.testing.assert_allclose(logits, EARLIER_DROPOUT_LOGITS[name], atol=1e-5)
    assert np.max(np.abs(logits - other_key)) > 1e-3
    assert np.max(np.abs(logits - deterministic)) > 1e-3


@pytest.mark.parametrize("name", FAST_MODELS)
def test_train_mode_without_rngs_raises_naming_the_fix(name):
    model = _model(name)

    with pytest.raises(ValueError, match=r"train mode.*pass rngs=nnx\.Rngs\(dropout=key\), or call model\.eval\(\)"):
        model(**INPUTS)


def test_train_mode_without_rngs_is_fine_when_every_dropout_rate_is_zero():
    model = _model("bert-pooler", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    logits = np.asarray(model(**INPUTS))
    model.eval()
    np.testing.assert_array_equal(logits, np.asarray(model(**INPUTS)))


@pytest.mark.slow
def test_attention_takes_the_fused_kernel_in_eval_mode_and_not_with_train_mode_dropout(monkeypatch):
    calls = []
    fused = jax.nn.dot_product_attention
    monkeypatch.setattr(jax.nn, "dot_product_attention", lambda *a, **k: calls.append(1) or fused(*a, **k))
    model = _model("bert-pooler")

    model(**INPUTS, rngs=nnx.Rngs(dropout=0))
    in_train_mode = len(calls)
    model.eval()
    model(**INPUTS, rngs=nnx.Rngs(dropout=0))

    assert in_train_mode == 0
    assert len(calls) == 2  # one per layer


def test_from_pretrained_and_load_backbone_return_eval_mode(hf_checkpoint):
    checkpoint = hf_checkpoint("BertForSequenceClassification", num_labels=2)
    model = flaxheads.from_pretrained(checkpoint.path)
    backbone, _ = flaxheads.load_backbone(checkpoint.path)

    assert model.backbone.layers[0].attention.deterministic is True
    assert model.head.deterministic is True
    assert all(_modes(model).values()) and all(_modes(backbone).values())


@pytest.mark.slow  # traces and compiles a train step
def test_train_and_eval_steps_are_the_same_programs_whichever_mode_the_graphdef_was_split_in():
    # One dropout (the head's) keeps the compilation of the train step short on CPU.
    model = _model("bert-pooler", num_hidden_layers=1, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                   classifier_dropout=0.1)
    train_graphdef, params = nnx.split(model)
    model.eval()
    eval_graphdef, _ = nnx.split(model)
    assert train_graphdef != eval_graphdef
    schedule = optax.constant_schedule(1e-3)
    tx = optax.sgd(schedule)
    state = train_steps.TrainState(jnp.zeros((), jnp.int32), params, tx.init(params))
    batch = {**INPUTS, "labels": jnp.array([0, 2]), "example_mask": jnp.ones(2)}
    stacked = jax.tree.map(lambda x: x[None], batch)  # one micro-batch
    key = jax.random.key(0)

    def programs(graphdef):
        train_step = train_steps.make_train_step(graphdef, tx, schedule, "single_label_classification")
        eval_step = train_steps.make_eval_step(graphdef, "single_label_classification")
        return train_step, eval_step, str(jax.make_jaxpr(train_step)(state, stacked, key)), str(
            jax.make_jaxpr(eval_step)(params, batch))

    train_step, eval_step, *from_eval_mode = programs(eval_graphdef)
    _, _, *from_train_mode = programs(train_graphdef)
    _, metrics = jax.jit(train_step)(state, stacked, key)
    logits = jax.jit(eval_step)(params, batch)["logits"]

    assert from_eval_mode == from_train_mode  # hence the same loss, gradients and logits
    # the train step's dropout was on (a graphdef split in eval mode) and the eval step's off
    assert abs(float(metrics["loss"]) - float(model.loss(logits, batch["labels"]))) > 1e-4
