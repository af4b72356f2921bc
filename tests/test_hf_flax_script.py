"""Hugging Face Flax training loops, written as transformers' examples/flax scripts write them, run
on flaxheads with only their model lines changed: run_flax_glue.py's (text classification, over
`flaxheads.FunctionalClassifier`) and run_flax_ner.py's (token classification, over
`flaxheads.FunctionalTokenClassifier`).

Each loop follows its script's structure (run_flax_glue.py of transformers v4.40, run_flax_ner.py
of v4.22): a `train_state.TrainState` with `apply_fn=model.__call__` and `params=model.params`,
`optax.adamw(..., mask=...)`, `jax.pmap(train_step, axis_name="batch", donate_argnums=(0,))`, one
dropout key per device, `state.apply_fn(**batch, params=..., dropout_rng=..., train=True)[0]`,
`jax.lax.pmean` of the gradients, `replicate` / `unreplicate`, `shard`ed batches, an eval step
through `pad_shard_unpad`, and `model.save_pretrained(dir, params=...)`; run_flax_ner.py's also
builds an `AutoConfig` with the tags and passes it to `from_pretrained`, and scores tokens labelled
-100 as zero (`onehot(-100)` is all zeros). Only the lines marked "model line" differ from a
Hugging Face Flax script. Each runs on two fake CPU devices in a fresh process (XLA_FLAGS must be
set before jax starts).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from flax import traverse_util

from flaxheads.tasks.classification.functional import FunctionalClassifier
from flaxheads.tasks.token.functional import FunctionalTokenClassifier
from runs import cpu_devices_env

pytestmark = pytest.mark.slow  # a training loop in a subprocess on 2 fake devices

STEPS = 10

SCRIPT = textwrap.dedent(
    """
    import json, sys
    from typing import Callable

    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    from flax import struct, traverse_util
    from flax.jax_utils import pad_shard_unpad, replicate, unreplicate
    from flax.training import train_state
    from flax.training.common_utils import onehot, shard

    import flaxheads  # model line

    model_path, output_dir, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    assert jax.local_device_count() == 2
    num_labels = 2
    model = flaxheads.FunctionalClassifier.from_pretrained(model_path, num_labels=num_labels)  # model line
    decay_mask_fn = flaxheads.decay_mask  # model line

    class TrainState(train_state.TrainState):
        logits_fn: Callable = struct.field(pytree_node=False)
        loss_fn: Callable = struct.field(pytree_node=False)

    def cross_entropy_loss(logits, labels):
        return jnp.mean(optax.softmax_cross_entropy(logits, onehot(labels, num_classes=num_labels)))

    learning_rate_fn = optax.linear_schedule(init_value=5e-3, end_value=0.0, transition_steps=steps)
    tx = optax.adamw(learning_rate=learning_rate_fn, b1=0.9, b2=0.999, eps=1e-6, weight_decay=0.01,
                     mask=decay_mask_fn)
    state = TrainState.create(apply_fn=model.__call__, params=model.params, tx=tx,
                              logits_fn=lambda logits: logits.argmax(-1), loss_fn=cross_entropy_loss)

    def train_step(state, batch, dropout_rng):
        dropout_rng, new_dropout_rng = jax.random.split(dropout_rng)
        targets = batch.pop("labels")

        def loss_fn(params):
            logits = state.apply_fn(**batch, params=params, dropout_rng=dropout_rng, train=True)[0]
            return state.loss_fn(logits, targets)

        loss, grad = jax.value_and_grad(loss_fn)(state.params)
        grad = jax.lax.pmean(grad, "batch")
        new_state = state.apply_gradients(grads=grad)
        metrics = jax.lax.pmean({"loss": loss, "learning_rate": learning_rate_fn(state.step)}, axis_name="batch")
        return new_state, metrics, new_dropout_rng

    p_train_step = jax.pmap(train_step, axis_name="batch", donate_argnums=(0,))

    def eval_step(state, batch):
        logits = state.apply_fn(**batch, params=state.params, train=False)[0]
        return state.logits_fn(logits)

    p_eval_step = jax.pmap(eval_step, axis_name="batch")

    # 16 examples, label 1 when token 7 occurs: learnable in a few steps.
    data_rng = np.random.default_rng(0)
    input_ids = data_rng.integers(10, 99, size=(16, 12))
    labels = (np.arange(16) % 2).astype(np.int32)
    input_ids[labels == 1, 3] = 7
    dataset = {"input_ids": input_ids, "attention_mask": np.ones_like(input_ids),
               "token_type_ids": np.zeros_like(input_ids), "labels": labels}

    rng = jax.random.PRNGKey(3)
    dropout_rngs = jax.random.split(rng, jax.local_device_count())
    state = replicate(state)
    losses = []
    for step in range(steps):
        batch = shard({k: v[(step % 2) * 8:(step % 2) * 8 + 8] for k, v in dataset.items()})
        state, train_metric, dropout_rngs = p_train_step(state, batch, dropout_rngs)
        losses.append(float(unreplicate(train_metric)["loss"]))

    eval_batch = {k: v for k, v in dataset.items() if k != "labels"}
    predictions = pad_shard_unpad(p_eval_step)(state, eval_batch, min_device_batch=4)
    params = jax.device_get(unreplicate(state.params))
    model.save_pretrained(output_dir, params=params)
    np.savez(output_dir + "/trained.npz", **traverse_util.flatten_dict(params, sep="/"))
    print(json.dumps({"losses": losses, "predictions": np.asarray(predictions).tolist()}))
    """
)


def _run_script(model_path, output_dir, script: str = SCRIPT) -> dict:
    env = cpu_devices_env(2)
    proc = subprocess.run([sys.executable, "-c", script, str(model_path), str(output_dir), str(STEPS)],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_run_flax_glue_style_pmap_loop_trains_and_saves_a_folder_holding_the_trained_weights(hf_checkpoint, tmp_path):
    checkpoint = hf_checkpoint("BertForSequenceClassification", num_labels=2)
    result = _run_script(checkpoint.path, tmp_path)
    losses = result["losses"]
    print("losses", [round(x, 4) for x in losses])
    assert len(losses) == STEPS and np.isfinite(losses).all()
    assert np.mean(losses[-2:]) < 0.7 * np.mean(losses[:2])
    assert len(result["predictions"]) == 16

    trained = dict(np.load(tmp_path / "trained.npz"))
    reloaded = traverse_util.flatten_dict(FunctionalClassifier.from_pretrained(tmp_path).params, sep="/")
    initial = traverse_util.flatten_dict(FunctionalClassifier.from_pretrained(checkpoint.path).params, sep="/")
    assert reloaded.keys() == trained.keys()
    for key, value in trained.items():
        assert np.asarray(reloaded[key]).tobytes() == value.tobytes(), f"{key} is not the trained value"
    assert not np.array_equal(np.asarray(initial["head/classifier/kernel"]), trained["head/classifier/kernel"])


TAGS = ["O", "B-PER", "I-PER"]

NER_SCRIPT = textwrap.dedent(
    """
    import json, sys
    from typing import Callable

    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    from flax import struct, traverse_util
    from flax.jax_utils import pad_shard_unpad, replicate, unreplicate
    from flax.training import train_state
    from flax.training.common_utils import onehot, shard
    from transformers import AutoConfig

    import flaxheads  # model line

    model_path, output_dir, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    assert jax.local_device_count() == 2
    label_list = ["O", "B-PER", "I-PER"]
    label_to_id = {label: i for i, label in enumerate(label_list)}
    num_labels = len(label_list)
    config = AutoConfig.from_pretrained(model_path, num_labels=num_labels, label2id=label_to_id,
                                        id2label={i: label for label, i in label_to_id.items()}, finetuning_task="ner")
    model = flaxheads.FunctionalTokenClassifier.from_pretrained(  # model line
        model_path, config=config, cache_dir=None, revision="main", token=None, trust_remote_code=False)
    decay_mask_fn = flaxheads.decay_mask  # model line

    class TrainState(train_state.TrainState):
        logits_fn: Callable = struct.field(pytree_node=False)
        loss_fn: Callable = struct.field(pytree_node=False)

    def cross_entropy_loss(logits, labels):
        # run_flax_ner.py's loss: a label of -100 one-hot encodes to zeros, so it adds nothing to the sum
        return jnp.mean(optax.softmax_cross_entropy(logits, onehot(labels, num_classes=num_labels)))

    learning_rate_fn = optax.join_schedules(
        [optax.linear_schedule(0.0, 5e-3, 1), optax.linear_schedule(5e-3, 0.0, steps - 1)], boundaries=[1])
    tx = optax.adamw(learning_rate=learning_rate_fn, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.01,
                     mask=decay_mask_fn)
    state = TrainState.create(apply_fn=model.__call__, params=model.params, tx=tx,
                              logits_fn=lambda logits: logits.argmax(-1), loss_fn=cross_entropy_loss)

    def train_step(state, batch, dropout_rng):
        dropout_rng, new_dropout_rng = jax.random.split(dropout_rng)
        targets = batch.pop("labels")

        def loss_fn(params):
            logits = state.apply_fn(**batch, params=params, dropout_rng=dropout_rng, train=True)[0]
            return state.loss_fn(logits, targets)

        loss, grad = jax.value_and_grad(loss_fn)(state.params)
        grad = jax.lax.pmean(grad, "batch")
        new_state = state.apply_gradients(grads=grad)
        metrics = jax.lax.pmean({"loss": loss, "learning_rate": learning_rate_fn(state.step)}, axis_name="batch")
        return new_state, metrics, new_dropout_rng

    p_train_step = jax.pmap(train_step, axis_name="batch", donate_argnums=(0,))

    def eval_step(state, batch):
        logits = state.apply_fn(**batch, params=state.params, train=False)[0]
        return state.logits_fn(logits)

    p_eval_step = jax.pmap(eval_step, axis_name="batch")

    # 16 sentences padded to 12 tokens: token 7 is a name (B-PER, then I-PER for a following 8), the
    # rest O; -100 on the first token (as on [CLS]) and on padding, as run_flax_ner.py labels them.
    data_rng = np.random.default_rng(0)
    input_ids = data_rng.integers(10, 99, size=(16, 12))
    input_ids[::2, 4], input_ids[::4, 5], input_ids[1::3, 9] = 7, 8, 7
    attention_mask = (np.arange(12)[None, :] < 12 - np.arange(16)[:, None] % 4).astype(np.int32)
    labels = np.where(input_ids == 7, 1, 0)
    labels[(input_ids == 8) & (np.roll(input_ids, 1, axis=1) == 7)] = 2
    labels[:, 0] = -100
    labels[attention_mask == 0] = -100
    input_ids[attention_mask == 0] = 0
    dataset = {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": np.zeros_like(input_ids),
               "labels": labels}

    rng = jax.random.PRNGKey(42)
    dropout_rngs = jax.random.split(rng, jax.local_device_count())
    state = replicate(state)
    losses = []
    for step in range(steps):
        batch = shard({k: v[(step % 2) * 8:(step % 2) * 8 + 8] for k, v in dataset.items()})
        state, train_metric, dropout_rngs = p_train_step(state, batch, dropout_rngs)
        losses.append(float(unreplicate(train_metric)["loss"]))

    # 11 sentences: pad_shard_unpad pads them to a multiple of 2 devices x 4, and drops the padding.
    eval_batch = {k: v[:11] for k, v in dataset.items()}
    eval_labels = eval_batch.pop("labels")
    predictions = np.array(pad_shard_unpad(p_eval_step)(state, eval_batch, min_device_batch=4))
    scored = eval_labels != -100
    params = jax.device_get(unreplicate(state.params))
    model.save_pretrained(output_dir, params=params)
    np.savez(output_dir + "/trained.npz", **traverse_util.flatten_dict(params, sep="/"))
    print(json.dumps({"losses": losses, "predictions_shape": predictions.shape,
                      "accuracy": float((predictions == eval_labels)[scored].mean())}))
    """
)


def test_run_flax_ner_style_pmap_loop_trains_and_saves_a_folder_holding_the_trained_weights_and_tags(
        hf_checkpoint, tmp_path):
    # A pretrained encoder, whose token head starts new as in run_flax_ner.py; one layer, since compiling is
    # this test's time and jax's pmap compiles such a train step twice (the first call, then the next).
    checkpoint = hf_checkpoint("BertModel", num_hidden_layers=1)
    result = _run_script(checkpoint.path, tmp_path, NER_SCRIPT)
    losses = result["losses"]
    print("losses", [round(x, 4) for x in losses], "eval token accuracy", result["accuracy"])
    assert len(losses) == STEPS and np.isfinite(losses).all()
    assert np.mean(losses[-2:]) < 0.7 * np.mean(losses[:2])
    assert result["predictions_shape"] == [11, 12]

    trained = dict(np.load(tmp_path / "trained.npz"))
    reloaded_model = FunctionalTokenClassifier.from_pretrained(tmp_path)
    reloaded = traverse_util.flatten_dict(reloaded_model.params, sep="/")
    assert reloaded.keys() == trained.keys()
    for key, value in trained.items():
        assert np.asarray(reloaded[key]).tobytes() == value.tobytes(), f"{key} is not the trained value"
    assert reloaded_model.config.id2label == dict(enumerate(TAGS))
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == ["BertForTokenClassification"]
    assert config["label2id"] == {tag: i for i, tag in enumerate(TAGS)}
