"""Hugging Face Flax training loops, written as transformers' examples/flax scripts write them, run
on flaxheads with only their model lines changed: run_flax_glue.py's (text classification, over
`flaxheads.FunctionalClassifier`), run_flax_ner.py's (token classification, over
`flaxheads.FunctionalTokenClassifier`) and question-answering/run_qa.py's (over
`flaxheads.FunctionalQuestionAnswering`, its windows and answers from `flaxheads.tasks.qa`).

Each loop follows its script's structure (run_flax_glue.py of transformers v4.40, run_flax_ner.py
of v4.22): a `train_state.TrainState` with `apply_fn=model.__call__` and `params=model.params`,
`optax.adamw(..., mask=...)`, `jax.pmap(train_step, axis_name="batch", donate_argnums=(0,))`, one
dropout key per device, `state.apply_fn(**batch, params=..., dropout_rng=..., train=True)[0]`,
`jax.lax.pmean` of the gradients, `replicate` / `unreplicate`, `shard`ed batches, an eval step
through `pad_shard_unpad`, and `model.save_pretrained(dir, params=...)`; run_flax_ner.py's also
builds an `AutoConfig` with the tags and passes it to `from_pretrained`, and scores tokens labelled
-100 as zero (`onehot(-100)` is all zeros); run_qa.py's (as transformers v4.20 has it) keeps the
two logits as `logits[0]`, `logits[1]` with `num_labels=max_seq_length`, evaluates the windows left
over from whole batches on one device and post-processes the concatenated logits into answers
(with the numpy fix docs/training.md shows). Only the lines marked "model line" differ from a
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


QA_SCRIPT = textwrap.dedent(
    """
    import json, sys
    from itertools import chain
    from typing import Callable

    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    from flax import struct, traverse_util
    from flax.jax_utils import replicate, unreplicate
    from flax.training import train_state
    from flax.training.common_utils import onehot, shard
    from transformers import AutoConfig, AutoTokenizer

    import flaxheads  # model line
    # run_qa.py's prepare_train_features / prepare_validation_features and utils_qa, as flaxheads has them
    from flaxheads.tasks.qa.data import qa_examples
    from flaxheads.tasks.qa.metrics import squad
    from flaxheads.tasks.qa.postprocess import postprocess_qa_predictions
    from flaxheads.tasks.qa.windows import train_features, validation_features

    model_path, output_dir, num_epochs = sys.argv[1], sys.argv[2], int(sys.argv[3])
    assert jax.local_device_count() == 2
    max_seq_length, doc_stride, seed = 48, 16, 42
    rows = json.loads(open(output_dir + "/data.json").read())
    config = AutoConfig.from_pretrained(model_path)
    tokenizer = AutoTokenizer.from_pretrained(model_path, use_fast=True)
    eval_examples = qa_examples(rows["validation"])
    train_dataset = train_features(qa_examples(rows["train"]), tokenizer, max_seq_length=max_seq_length,
                                   doc_stride=doc_stride)
    eval_dataset = validation_features(eval_examples, tokenizer, max_seq_length=max_seq_length, doc_stride=doc_stride)
    for features in (train_dataset, eval_dataset):
        del features["example_index"]  # run_qa's overflow_to_sample_mapping, which it pops too
    num_windows = lambda dataset: len(dataset["input_ids"])

    def create_train_state(model: flaxheads.FunctionalQuestionAnswering, learning_rate_fn, num_labels):  # model line
        class TrainState(train_state.TrainState):
            logits_fn: Callable = struct.field(pytree_node=False)
            loss_fn: Callable = struct.field(pytree_node=False)

        tx = optax.adamw(learning_rate=learning_rate_fn, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.01,
                         mask=flaxheads.decay_mask)  # model line

        def cross_entropy_loss(logits, labels):
            start_loss = optax.softmax_cross_entropy(logits[0], onehot(labels[0], num_classes=num_labels))
            end_loss = optax.softmax_cross_entropy(logits[1], onehot(labels[1], num_classes=num_labels))
            xentropy = (start_loss + end_loss) / 2.0
            return jnp.mean(xentropy)

        return TrainState.create(apply_fn=model.__call__, params=model.params, tx=tx, logits_fn=lambda logits: logits,
                                 loss_fn=cross_entropy_loss)

    def create_learning_rate_fn(train_ds_size, train_batch_size, num_train_epochs, num_warmup_steps, learning_rate):
        steps_per_epoch = train_ds_size // train_batch_size
        num_train_steps = steps_per_epoch * num_train_epochs
        warmup_fn = optax.linear_schedule(init_value=0.0, end_value=learning_rate, transition_steps=num_warmup_steps)
        decay_fn = optax.linear_schedule(init_value=learning_rate, end_value=0,
                                         transition_steps=num_train_steps - num_warmup_steps)
        return optax.join_schedules(schedules=[warmup_fn, decay_fn], boundaries=[num_warmup_steps])

    def select(dataset, index):
        # what `dataset[index]` gives for run_qa's datasets.Dataset: each column's rows as a list
        return {k: [v[i] for i in index] for k, v in dataset.items()}

    def train_data_collator(rng, dataset, batch_size):
        steps_per_epoch = num_windows(dataset) // batch_size
        perms = jax.random.permutation(rng, num_windows(dataset))
        perms = perms[: steps_per_epoch * batch_size]
        perms = perms.reshape((steps_per_epoch, batch_size))
        for perm in perms:
            batch = select(dataset, perm)
            batch = {k: np.array(v) for k, v in batch.items()}
            batch = shard(batch)
            yield batch

    def as_arrays(batch):
        # run_qa's `{k: np.array(v) for k, v in batch.items()}`, with the fix numpy >= 1.24 needs (docs/training.md):
        # offset_mapping's rows hold None beside pairs, which only an object array takes
        return {k: np.array(v, dtype=object if k == "offset_mapping" else None) for k, v in batch.items()}

    def eval_data_collator(dataset, batch_size):
        for i in range(num_windows(dataset) // batch_size):
            batch = select(dataset, range(i * batch_size, (i + 1) * batch_size))
            batch = as_arrays(batch)
            batch = shard(batch)
            yield batch

    def create_and_fill_np_array(start_or_end_logits, dataset, max_len):
        step = 0
        logits_concat = np.full((num_windows(dataset), max_len), -100, dtype=np.float64)
        for output_logit in start_or_end_logits:
            batch_size, cols = output_logit.shape
            if step + batch_size < num_windows(dataset):
                logits_concat[step: step + batch_size, :cols] = output_logit
            else:
                logits_concat[step:, :cols] = output_logit[: num_windows(dataset) - step]
            step += batch_size
        return logits_concat

    rng = jax.random.PRNGKey(seed)
    dropout_rngs = jax.random.split(rng, jax.local_device_count())
    train_batch_size = 4 * jax.local_device_count()
    eval_batch_size = 4 * jax.local_device_count()

    model = flaxheads.FunctionalQuestionAnswering.from_pretrained(  # model line
        model_path, config=config, cache_dir=None, revision="main", use_auth_token=None, seed=seed,
        dtype=getattr(jnp, "float32"))
    learning_rate_fn = create_learning_rate_fn(num_windows(train_dataset), train_batch_size, num_epochs, 1, 5e-3)
    state = create_train_state(model, learning_rate_fn, num_labels=max_seq_length)

    def train_step(state, batch, dropout_rng):
        dropout_rng, new_dropout_rng = jax.random.split(dropout_rng)
        start_positions = batch.pop("start_positions")
        end_positions = batch.pop("end_positions")
        targets = (start_positions, end_positions)

        def loss_fn(params):
            logits = state.apply_fn(**batch, params=params, dropout_rng=dropout_rng, train=True)
            return state.loss_fn(logits, targets)

        loss, grad = jax.value_and_grad(loss_fn)(state.params)
        grad = jax.lax.pmean(grad, "batch")
        new_state = state.apply_gradients(grads=grad)
        metrics = jax.lax.pmean({"loss": loss, "learning_rate": learning_rate_fn(state.step)}, axis_name="batch")
        return new_state, metrics, new_dropout_rng

    p_train_step = jax.pmap(train_step, axis_name="batch", donate_argnums=(0,))

    def eval_step(state, batch):
        logits = state.apply_fn(**batch, params=state.params, train=False)
        return state.logits_fn(logits)

    p_eval_step = jax.pmap(eval_step, axis_name="batch")

    state = replicate(state)
    losses = []
    for epoch in range(num_epochs):
        rng, input_rng = jax.random.split(rng)
        for batch in train_data_collator(input_rng, train_dataset, train_batch_size):
            state, train_metric, dropout_rngs = p_train_step(state, batch, dropout_rngs)
            losses.append(float(unreplicate(train_metric)["loss"]))

    all_start_logits, all_end_logits = [], []
    for batch in eval_data_collator(eval_dataset, eval_batch_size):
        _ = batch.pop("example_id")
        _ = batch.pop("offset_mapping")
        predictions = p_eval_step(state, batch)
        all_start_logits.append(np.array([pred for pred in chain(*predictions[0])]))
        all_end_logits.append(np.array([pred for pred in chain(*predictions[1])]))
    num_leftover_samples = num_windows(eval_dataset) % eval_batch_size
    if num_leftover_samples > 0:  # evaluated on one device, as run_qa evaluates them
        batch = select(eval_dataset, range(num_windows(eval_dataset) - num_leftover_samples, num_windows(eval_dataset)))
        batch = as_arrays(batch)
        _ = batch.pop("example_id")
        _ = batch.pop("offset_mapping")
        predictions = eval_step(unreplicate(state), batch)
        all_start_logits.append(np.array([pred for pred in predictions[0]]))
        all_end_logits.append(np.array([pred for pred in predictions[1]]))
    max_len = max([x.shape[1] for x in all_start_logits])
    outputs_numpy = (create_and_fill_np_array(all_start_logits, eval_dataset, max_len),
                     create_and_fill_np_array(all_end_logits, eval_dataset, max_len))
    answers = postprocess_qa_predictions(eval_examples, eval_dataset, outputs_numpy, n_best_size=20,
                                         max_answer_length=30)
    references = [{"id": ex.id, "answers": ex.answers} for ex in eval_examples]
    eval_metrics = squad(answers.for_metric(), references)

    params = jax.device_get(unreplicate(state.params))
    model.save_pretrained(output_dir + "/model", params=params)
    tokenizer.save_pretrained(output_dir + "/model")
    np.savez(output_dir + "/trained.npz", **traverse_util.flatten_dict(params, sep="/"))
    print(json.dumps({"losses": losses, "answers": answers.answers, "metrics": eval_metrics,
                      "windows": [num_windows(train_dataset), num_windows(eval_dataset)]}))
    """
)

QA_PEOPLE = ["Anna", "Peter", "Maria", "John", "Lena", "Omar"]
QA_CITIES = ["New York", "Buenos Aires", "Hong Kong", "Los Angeles", "San Diego", "Cape Town"]
"""Answers of two tokens: start and end differ, so logits read the wrong way round give other answers."""
QA_FILLER = ["the", "day", "was", "long", "and", "warm", "in", "town", "we", "saw", "a", "river"]


def _squad_like_rows(ids: range, seed: int) -> list[dict]:
    """SQuAD's flat records: where someone lives, said between filler words (the longer contexts
    overflow into a second window of 48 tokens)."""
    rng, rows = np.random.default_rng(seed), []
    for i in ids:
        person, city = rng.choice(QA_PEOPLE), rng.choice(QA_CITIES)
        before, after = (" ".join(rng.choice(QA_FILLER, size=rng.integers(2, 30))) for _ in range(2))
        context = f"{before}. {person} lives in {city}. {after}."
        rows.append({"id": f"q{i}", "question": f"Where does {person} live?", "context": context,
                     "answers": {"text": [city], "answer_start": [context.index(f" in {city}.") + 4]}})
    return rows


@pytest.fixture(scope="module")
def qa_bert(tmp_path_factory):
    """A bare one-layer BERT (its question-answering head starts new, as run_qa.py fine-tunes
    bert-base) with MiniLM's tokenizer: the script tokenises real text."""
    import shutil

    import torch
    import transformers

    from families import TOKENIZER_FILES
    from flaxheads.shipped_model import minilm_path

    path = tmp_path_factory.mktemp("qa_bert")
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                     intermediate_size=37, max_position_embeddings=64)
    transformers.BertModel(config).save_pretrained(path)
    for name in TOKENIZER_FILES:
        shutil.copy(minilm_path() / name, path / name)
    return path


QA_EPOCHS = 4


def test_run_qa_style_pmap_loop_trains_answers_and_saves_a_folder_holding_the_trained_weights(qa_bert, tmp_path):
    import torch
    import transformers

    from flaxheads.tasks.qa.data import qa_examples
    from flaxheads.tasks.qa.functional import FunctionalQuestionAnswering
    from flaxheads.tasks.qa.postprocess import postprocess_qa_predictions
    from flaxheads.tasks.qa.windows import validation_features

    data = {"train": _squad_like_rows(range(24), seed=0), "validation": _squad_like_rows(range(24, 35), seed=1)}
    (tmp_path / "data.json").write_text(json.dumps(data))
    env = cpu_devices_env(2)
    proc = subprocess.run([sys.executable, "-c", QA_SCRIPT, str(qa_bert), str(tmp_path), str(QA_EPOCHS)],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    losses = result["losses"]
    print("windows (train, eval)", result["windows"], "losses", [round(x, 3) for x in losses],
          "eval", result["metrics"])
    steps = QA_EPOCHS * (result["windows"][0] // 8)
    assert len(losses) == steps and np.isfinite(losses).all()
    assert np.mean(losses[-2:]) < 0.7 * np.mean(losses[:2])
    assert result["windows"][1] % 8 != 0  # the leftover windows took run_qa's one-device path
    contexts = {row["id"]: row["context"] for row in data["validation"]}
    assert list(result["answers"]) == list(contexts)
    assert all(answer and answer in contexts[key] for key, answer in result["answers"].items())
    assert result["metrics"]["exact_match"] > 30  # a random span of its context: ~5

    saved = tmp_path / "model"
    trained = dict(np.load(tmp_path / "trained.npz"))
    reloaded = traverse_util.flatten_dict(FunctionalQuestionAnswering.from_pretrained(saved).params, sep="/")
    assert reloaded.keys() == trained.keys()
    for key, value in trained.items():
        assert np.asarray(reloaded[key]).tobytes() == value.tobytes(), f"{key} is not the trained value"
    assert json.loads((saved / "config.json").read_text())["architectures"] == ["BertForQuestionAnswering"]

    # transformers reads the saved folder to the answers the script's pmap evaluation gave
    tokenizer = transformers.AutoTokenizer.from_pretrained(saved)
    examples = qa_examples(data["validation"])
    features = validation_features(examples, tokenizer, max_seq_length=48, doc_stride=16)
    torch_model = transformers.AutoModelForQuestionAnswering.from_pretrained(saved).eval()
    with torch.no_grad():
        out = torch_model(**{k: torch.from_numpy(np.asarray(features[k], np.int64))
                             for k in ("input_ids", "attention_mask", "token_type_ids")})
    answers = postprocess_qa_predictions(examples, features, (out.start_logits.numpy(), out.end_logits.numpy()))
    assert answers.answers == result["answers"]
