"""Sequence packing, data and training side: the packer, packed train/eval batches (resume,
accumulation, processes), the steps on (rows, S) logits, packed evaluation in dataset order, and
the settings packing refuses.

The model side (segment_ids in every backbone and head) is tested in test_packing_model.py. Here
the model is a stand-in that honours the packing contract: `_per_segment_call` runs the model on
each segment moved to the start of its row, so a packed row's slot s gets exactly the logits of
that example alone."""

from __future__ import annotations

import dataclasses
import math

import datasets
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import transformers
from flax import nnx

import flaxheads
from flaxheads import data, problem
from flaxheads.data.batching import BatchFormat, DataPosition, TrainBatches, eval_batches
from flaxheads.data.packing import EMPTY, RowPlan, default_max_segments, segments_per_row
from flaxheads.training.config import TrainConfig
from flaxheads.training.scoring import SplitScorer
from flaxheads.training.sharding import Layout
from flaxheads.tasks.choice.data import CHOICE_EXAMPLES
from flaxheads.tasks.token.word_task import TOKEN_EXAMPLES
from flaxheads.training.step import TrainState, make_train_step
from packed_data import T, MeanEmbedding, batch_format, numbered_split
from runs import cpu_devices_env

def _present(batch) -> np.ndarray:
    return batch["example_index"][batch["example_mask"] > 0]


# -- the packer -----------------------------------------------------------------------------------


def test_plan_places_every_example_exactly_once_within_row_length_and_max_segments():
    lengths = np.random.default_rng(1).integers(1, T + 1, 300)
    plan = RowPlan.build(lengths, T, 5)
    table = plan.rows(np.random.default_rng(2).permutation(300), lengths)
    assert sorted(table[table != EMPTY].tolist()) == list(range(300))
    assert np.all(np.where(table != EMPTY, lengths[np.maximum(table, 0)], 0).sum(axis=1) <= T)
    assert table.shape == (plan.num_rows, 5)
    # Slots fill from the first: no example after an empty slot.
    assert np.all(np.diff((table != EMPTY).astype(int), axis=1) <= 0)


def test_row_count_is_the_same_for_every_order_of_the_examples():
    lengths = np.random.default_rng(3).integers(1, 25, 200)
    plan = RowPlan.build(lengths, T, 4)
    for seed in range(3):
        table = plan.rows(np.random.default_rng(seed).permutation(200), lengths)
        assert len(table) == plan.num_rows and sorted(table[table != EMPTY].tolist()) == list(range(200))


def test_fill_rate_on_a_synthetic_length_distribution_is_above_97_percent():
    lengths = np.clip(np.random.default_rng(4).lognormal(3.2, 0.45, 5000).astype(int), 4, 128)
    plan = RowPlan.build(lengths, 128, default_max_segments(128))
    print(f"fill rate {plan.fill_rate(lengths):.4f}: {plan.num_rows} rows, bound {-(-lengths.sum() // 128)}")
    assert plan.fill_rate(lengths) > 0.97


def test_examples_without_tokens_or_longer_than_a_row_are_refused():
    with pytest.raises(ValueError, match="no tokens"):
        RowPlan.build(np.array([3, 0, 2]), T, 4)
    with pytest.raises(ValueError, match="max_seq_length"):
        RowPlan.build(np.array([3, T + 1]), T, 4)


# -- packed batches -------------------------------------------------------------------------------


def _assert_row_packs_its_examples(batch, row: int, split, max_segments: int) -> None:
    segments = batch["segment_ids"][row]
    used = segments[segments > 0]
    # 1, 1, ..., 2, 2, ..., k then only padding: contiguous, increasing from 1, right padded.
    assert used[0] == 1 and np.all(np.diff(used) >= 0) and np.all(np.diff(used) <= 1)
    assert np.all(segments[len(used):] == 0)
    assert np.all(batch["input_ids"][row, len(used):] == 7) and np.all(batch["token_type_ids"][row, len(used):] == 5)
    if batch["example_mask"][row].sum() == 0:  # a filler row: one example, masked, no index
        assert used.max() == 1 and np.all(batch["example_index"][row] == EMPTY)
        return
    for slot in range(max_segments):
        index = batch["example_index"][row, slot]
        assert (index != EMPTY) == (batch["example_mask"][row, slot] > 0) == (slot < used.max())
        if index == EMPTY:
            continue
        example = split[int(index)]
        for name in ("input_ids", "token_type_ids"):
            np.testing.assert_array_equal(batch[name][row][segments == slot + 1], example[name])
        assert batch["labels"][row, slot] == example["labels"]


def test_packed_rows_hold_each_example_contiguously_with_increasing_segment_ids_and_aligned_labels():
    split = numbered_split(token_types=True)
    fmt = batch_format(pad_token_type_id=5)
    for batch in eval_batches(split, fmt, global_batch_size=4):
        assert batch["input_ids"].shape == batch["segment_ids"].shape == (4, T)
        np.testing.assert_array_equal(batch["attention_mask"], batch["segment_ids"] > 0)
        for row in range(4):
            _assert_row_packs_its_examples(batch, row, split, fmt.max_segments)


def test_a_packed_epoch_trains_on_every_example_once_and_ends_with_masked_filler_rows():
    split = numbered_split()
    batches = TrainBatches(split, batch_format(), global_batch_size=4, seed=0)
    epoch = [next(batches) for _ in range(batches.batches_per_epoch)]
    assert sorted(np.concatenate([_present(b) for b in epoch]).tolist()) == list(range(len(split)))
    assert batches.position == DataPosition(1, 0)
    assert all(b["input_ids"].shape == (4, T) for b in epoch)  # one shape for the whole run
    rows = RowPlan.build(data.example_lengths(split), T, 4).num_rows
    assert batches.batches_per_epoch == -(-rows // 4) == data.batches_per_epoch(
        data.example_lengths(split), batch_format(), global_batch_size=4)
    filler = epoch[-1]["example_mask"].sum(axis=1) == 0
    assert filler.sum() == 4 * batches.batches_per_epoch - rows
    assert np.all(epoch[-1]["segment_ids"][filler].max(axis=1) == 1)  # a filler row is well formed


def test_packed_train_batches_are_deterministic_for_a_seed_and_reshuffled_each_epoch():
    split = numbered_split()
    first = TrainBatches(split, batch_format(), global_batch_size=4, seed=5)
    again = TrainBatches(split, batch_format(), global_batch_size=4, seed=5)
    for _ in range(first.batches_per_epoch):
        a, b = next(first), next(again)
        for name in a:
            np.testing.assert_array_equal(a[name], b[name])
    epoch0 = TrainBatches(split, batch_format(), global_batch_size=4, seed=5).batch_at(DataPosition(0, 0))
    epoch1 = first.batch_at(DataPosition(1, 0))
    assert not np.array_equal(epoch0["example_index"], epoch1["example_index"])


def test_packed_stream_resumed_at_a_position_yields_the_uninterrupted_batches():
    split = numbered_split()
    whole = TrainBatches(split, batch_format(), global_batch_size=4, seed=2, num_shards=2)
    expected = [next(whole) for _ in range(2 * whole.batches_per_epoch + 1)]
    start = DataPosition(1, 2)
    resumed = TrainBatches(split, batch_format(), global_batch_size=4, seed=2, num_shards=2, start=start)
    for batch in expected[whole.batches_per_epoch + 2:]:
        got = next(resumed)
        for name in batch:
            np.testing.assert_array_equal(got[name], batch[name])


def test_each_process_gets_its_rows_of_the_packed_global_batch():
    split = numbered_split(n=61)
    lengths = data.example_lengths(split)
    single = TrainBatches(split, batch_format(), global_batch_size=4, seed=1, num_shards=2)
    processes = []
    for p in range(2):
        rows = data.process_rows(len(split), 2, p, 2)
        processes.append(TrainBatches(split.select(rows), batch_format(), global_batch_size=4, seed=1, num_shards=2,
                                      process_index=p, process_count=2, lengths=lengths))
    assert processes[0].batches_per_epoch == processes[1].batches_per_epoch == single.batches_per_epoch
    for _ in range(single.batches_per_epoch):
        whole, parts = next(single), [next(p) for p in processes]
        for name in whole:
            np.testing.assert_array_equal(np.concatenate([part[name] for part in parts]), whole[name])


def test_accumulation_view_of_a_packed_batch_keeps_rows_and_slots():
    batch = next(TrainBatches(numbered_split(), batch_format(), global_batch_size=4, seed=0))
    view = data.accumulation_view(batch, 2)
    assert view["input_ids"].shape == view["segment_ids"].shape == (2, 2, T)
    assert view["labels"].shape == view["example_mask"].shape == (2, 2, 4)
    np.testing.assert_array_equal(view["labels"][1], batch["labels"][2:])


def test_multi_label_packed_labels_are_rows_by_slots_by_labels():
    split = numbered_split().map(lambda row: {"labels": [float(row["labels"] == k) for k in range(3)]})
    batch = next(eval_batches(split, batch_format(problem_type=data.MULTI_LABEL), global_batch_size=4))
    assert batch["labels"].shape == (4, 4, 3) and batch["labels"].dtype == np.float32
    index = batch["example_index"][0, 0]
    np.testing.assert_array_equal(batch["labels"][0, 0], split[int(index)]["labels"])


# -- refusals ---------------------------------------------------------------------------------------


def test_packing_preference_pairs_is_refused_naming_the_flag():
    with pytest.raises(ValueError, match="--packing.*preference pairs"):
        batch_format(problem_type=problem.PAIRWISE_REWARD, num_labels=1)


def test_max_segments_per_row_without_packing_is_refused_naming_both_flags():
    with pytest.raises(ValueError, match="packing=True"):
        TrainConfig(packing=False, max_segments_per_row=8)
    with pytest.raises(ValueError, match="at least 1"):
        TrainConfig(packing=True, max_segments_per_row=0)
    assert segments_per_row(True, None, 128) == 16 and segments_per_row(False, None, 128) == 0


# -- steps and evaluation with a model that honours the packing contract ----------------------------


@pytest.fixture
def contract_model(tiny_bert):
    """A real tiny BERT: `SequenceClassifier` honours the packing contract (tests/test_packing_model.py)."""
    model = flaxheads.from_pretrained(tiny_bert, num_labels=3)
    model.eval()
    return model


def _text_split(tiny_bert, n: int = 40):
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_bert)
    words = ["good", "bad", "film", "plot", "very", "not", "the", "a", "actor", "scene"]
    rng = np.random.default_rng(0)
    texts = [" ".join(rng.choice(words, rng.integers(1, 12))) for _ in range(n)]
    split = datasets.Dataset.from_dict({"text": texts, "label": [i % 3 for i in range(n)]})
    return data.tokenize_split(split, tokenizer, T), tokenizer


def test_packed_train_step_loss_equals_the_unpacked_loss(tiny_bert):
    split, tokenizer = _text_split(tiny_bert)
    graphdef, params = nnx.split(MeanEmbedding(len(tokenizer), 3, nnx.Rngs(0)))
    tx = optax.sgd(0.0)
    step = jax.jit(make_train_step(graphdef, tx, optax.constant_schedule(0.0), data.SINGLE_LABEL))
    state = TrainState(jnp.zeros((), jnp.int32), params, tx.init(params))
    padded = BatchFormat(max_seq_length=T, pad_token_id=tokenizer.pad_token_id, num_labels=3)
    packed = BatchFormat(max_seq_length=T, pad_token_id=tokenizer.pad_token_id, num_labels=3, max_segments=3)
    packed_batch = next(eval_batches(split, packed, global_batch_size=4))
    examples = np.sort(_present(packed_batch))
    unpacked_batch = next(eval_batches(split.select(examples.tolist()), padded, global_batch_size=len(examples)))
    rng = jax.random.key(0)
    _, packed_metrics = step(state, data.accumulation_view(packed_batch, 2), rng)
    _, unpacked_metrics = step(state, data.accumulation_view(unpacked_batch, 1), rng)
    assert float(packed_metrics["examples"]) == len(examples)
    np.testing.assert_allclose(float(packed_metrics["loss"]), float(unpacked_metrics["loss"]), rtol=1e-5)


@pytest.mark.slow
def test_packed_evaluation_gives_the_unpacked_metrics_and_logits_in_dataset_order(contract_model, tiny_bert):
    split, tokenizer = _text_split(tiny_bert)
    graphdef, params = nnx.split(contract_model)
    outputs = {}
    for segments in (0, 3):
        fmt = BatchFormat(max_seq_length=T, pad_token_id=tokenizer.pad_token_id, num_labels=3, max_segments=segments)
        scorer = SplitScorer(graphdef, {"test": data.OwnSplit(split, data.example_lengths(split))}, fmt,
                             Layout.create(), eval_batch=4)
        outputs[segments] = scorer.predict("test", params)
    padded, packed = outputs[0], outputs[3]
    np.testing.assert_allclose(packed.predictions, padded.predictions, atol=1e-5)
    np.testing.assert_array_equal(packed.label_ids, padded.label_ids)
    assert packed.metrics.keys() == padded.metrics.keys()
    for name in padded.metrics:
        np.testing.assert_allclose(packed.metrics[name], padded.metrics[name], rtol=1e-5)
    # The streaming path (Evaluator, used during training) counts the same examples.
    np.testing.assert_allclose(scorer.evaluator(params, split)["accuracy"], padded.metrics["accuracy"])


def test_packed_text_scorer_returns_the_unpacked_logits_in_the_texts_order(contract_model, tiny_bert):
    from flaxheads.tasks.classification.inference import TextScorer

    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_bert)
    texts = [f"text {i} " + "word " * (i % 5) for i in range(11)]
    packed = TextScorer(contract_model, tokenizer, max_seq_length=T, batch_size=2, packing=True,
                        max_segments_per_row=3).logits(texts)
    np.testing.assert_allclose(packed, TextScorer(contract_model, tokenizer, max_seq_length=T).logits(texts), atol=1e-5)


def test_packing_is_on_by_default_where_it_applies():
    cfg = TrainConfig(output_dir=None, dataset=None)
    assert cfg.packing is None
    assert [cfg.packing_applies(kind) for kind in (data.SINGLE_LABEL, data.MULTI_LABEL, problem.REGRESSION)] == [
        True] * 3
    assert not any(cfg.packing_applies(kind) for kind in (problem.PAIRWISE_REWARD, TOKEN_EXAMPLES, CHOICE_EXAMPLES))
    assert not TrainConfig(output_dir=None, train_sampling_strategy="sequential").packing_applies(data.SINGLE_LABEL)
    assert not TrainConfig(output_dir=None, packing=False).packing_applies(data.SINGLE_LABEL)
    assert TrainConfig(output_dir=None, packing=True, train_sampling_strategy="sequential").packing_applies(
        data.SINGLE_LABEL)


def test_trainer_packs_by_default_with_rows_that_hold_the_batch_size_in_examples(tiny_bert):
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_bert)
    texts = [f"text number {i} " + "word " * (i % 9) for i in range(64)]
    args = TrainConfig(output_dir=None, dataset=None, max_seq_length=T, per_device_train_batch_size=8,
                       num_train_epochs=2, disable_tqdm=True)

    def trainer(**changes):
        return flaxheads.Trainer(flaxheads.from_pretrained(tiny_bert, num_labels=3),
                                 dataclasses.replace(args, **changes),
                                 train_dataset=(texts, [str(i % 3) for i in range(64)]), tokenizer=tokenizer)

    fitted = trainer()
    assert fitted.args.packing  # packing=None (the default) became True for these labels
    lengths = fitted._tokenized_train.lengths
    # Train rows fit the longest example (rounded up to 16); evaluation rows stay T long.
    row_length = int(-(-lengths.max() // 16) * 16)
    assert row_length < T and (fitted.train_format.max_seq_length, fitted.batch_format.max_seq_length) == (
        row_length, T)
    rows = RowPlan.build(lengths, row_length, default_max_segments(row_length)).num_rows
    assert (fitted.train_format.max_segments, fitted.batch_format.max_segments) == (
        default_max_segments(row_length), default_max_segments(T))
    # A batch is the rows that hold 8 examples on average: 64 examples in `rows` rows.
    per_device = max(1, math.floor(8 * rows / 64 + 0.5))
    assert 1 < per_device < 8 and fitted.global_batch == per_device * jax.device_count()
    assert fitted.total_steps == 2 * -(-rows // fitted.global_batch)
    assert abs(fitted.total_steps - 2 * 64 // (8 * jax.device_count())) <= 2  # about the unpacked count

    fixed = trainer(packed_row_length=T, packed_batch_rows=2)
    assert fixed.train_format == fixed.batch_format and fixed.global_batch == 2 * jax.device_count()
    rows = RowPlan.build(lengths, T, default_max_segments(T)).num_rows
    assert fixed.total_steps == 2 * -(-rows // (2 * jax.device_count()))
    padded = trainer(packing=False)
    assert not padded.batch_format.packed and padded.total_steps == 2 * 64 // (8 * jax.device_count())


@pytest.mark.parametrize(("settings", "message"), [
    ({"packing": False, "packed_row_length": 16}, r"packed_row_length=16 applies to packed rows only: pass pa"),
    ({"packing": False, "packed_batch_rows": 4}, r"packed_batch_rows=4 applies to packed rows only"),
    ({"packed_batch_rows": 0}, r"packed_batch_rows=0: it must be at least 1"),
    ({"packing": True, "packed_row_length": 64}, r"packed_row_length=64 must be in \[1, max_seq_length=32\]"),
])
def test_a_packed_row_length_that_cannot_apply_is_refused_naming_the_fix(settings, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig(output_dir=None, max_seq_length=32, **settings)


@pytest.mark.slow  # a minute or two on a 2-core CPU: the stand-in runs BERT once per slot
def test_packed_trainer_run_trains_on_several_examples_per_row_and_predicts_in_dataset_order(
        contract_model, tiny_bert):
    from flaxheads.tasks.classification.inference import TextScorer

    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_bert)
    texts = [f"text {i} " + "word " * (i % 7) for i in range(24)]
    labels = [str(i % 3) for i in range(24)]
    args = TrainConfig(output_dir=None, dataset=None, max_seq_length=T, per_device_train_batch_size=2,
                       per_device_eval_batch_size=2, max_steps=2, packing=True, max_segments_per_row=2, packed_batch_rows=2,
                       learning_rate=1e-2, disable_tqdm=True, do_eval=False)
    trainer = flaxheads.Trainer(contract_model, args, train_dataset=(texts, labels), tokenizer=tokenizer)
    _, metrics, _ = trainer.train()
    rows = 2 * 2 * jax.device_count()
    assert rows < metrics["train_examples"] <= 2 * rows  # several examples in a row, at most S
    predicted = trainer.predict((texts, labels))
    expected = TextScorer(trainer.model, tokenizer, max_seq_length=T).logits(texts)
    np.testing.assert_allclose(predicted.predictions, expected, atol=1e-5)


def test_the_run_identity_records_packing_only_when_set():
    from flaxheads.training import run_dir

    task = data.load_in_memory({"train": (["a", "b"], [0, 1])}).task

    def identity(**settings):
        cfg = TrainConfig(output_dir=None, dataset=None, **settings)
        return run_dir.run_identity(cfg, task, {"model_type": "bert"}, "cls", 8, total_steps=10,
                                    model="sha256:model", tokenizer="tokenizer", best_metric="accuracy")["trained"]

    assert "packing" not in identity()  # earlier runs' checkpoint identities still match
    assert identity(packing=True)["packing"] == {"max_segments_per_row": 16}  # the default in effect
    assert identity(packing=True, max_segments_per_row=4)["packing"] == {"max_segments_per_row": 4}


_PMAP_VS_JIT = """
import jax, numpy as np, optax
from flax import nnx
from flaxheads import data
from flaxheads.training.parallel import JitParallel, PmapParallel
from flaxheads.training.sharding import Layout
from packed_data import MeanEmbedding, batch_format, numbered_split

batch = data.accumulation_view(next(data.TrainBatches(numbered_split(n=80), batch_format(), global_batch_size=8, seed=0)), 2)
graphdef, params = nnx.split(MeanEmbedding(80_000, 3, nnx.Rngs(0)))  # ids are 1000 * example + position
losses = {}
for runner_class in (JitParallel, PmapParallel):
    runner = runner_class(Layout.create(), graphdef, optax.sgd(0.1), optax.constant_schedule(0.1), data.SINGLE_LABEL,
                          params)
    state, losses[runner_class.name] = runner.init(params), []
    for _ in range(2):  # the second step sees the first's update
        state, metrics = runner.step(state, batch, jax.random.key(0))
        losses[runner_class.name].append(float(metrics["loss"]))
assert jax.device_count() == 2, jax.devices()
np.testing.assert_allclose(losses["pmap"], losses["jit"], rtol=1e-5)
print(losses)
"""


@pytest.mark.slow  # a subprocess with two CPU devices: about a minute on a busy 2-core CPU
def test_packed_batches_train_alike_under_pmap_and_jit_on_two_devices():
    import os
    import pathlib
    import subprocess
    import sys

    tests = pathlib.Path(__file__).parent
    env = cpu_devices_env(2, PYTHONPATH=os.pathsep.join([str(tests.parent), str(tests), os.environ.get("PYTHONPATH", "")]))
    result = subprocess.run([sys.executable, "-c", _PMAP_VS_JIT], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
