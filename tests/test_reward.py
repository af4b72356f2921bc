"""Pairwise reward models (`problem_type="pairwise_reward"`): the Bradley-Terry loss, pair
accuracy, the chosen/rejected data format and its errors, and training a tiny BERT on a toy
preference through the Trainer API and the command line."""

from __future__ import annotations

import json
import math
import random

import jax.numpy as jnp
import numpy as np
import pytest
import transformers

import flaxheads
from flaxheads import data, problem
from flaxheads.cli import main
from flaxheads.training import metrics

WORDS = "the a movie film plot actor scene story music ending long short".split()


def _pairs(count: int, seed: int) -> list[dict[str, str]]:
    """A learnable preference: every chosen text ends with "excellent", no rejected one has it."""
    rng = random.Random(seed)

    def sentence():
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 8)))

    return [{"chosen": f"{sentence()} excellent", "rejected": sentence()} for _ in range(count)]


def _args(**overrides) -> flaxheads.TrainConfig:
    settings = dict(output_dir=None, dataset=None, max_seq_length=16, per_device_train_batch_size=16,
                    per_device_eval_batch_size=32, learning_rate=1e-3, max_steps=24, warmup_ratio=0.0,
                    logging_steps=8, eval_strategy="no", disable_tqdm=True, seed=0)
    return flaxheads.TrainConfig(**{**settings, **overrides})


@pytest.fixture(scope="module")
def tokenizer(tiny_bert):
    return transformers.AutoTokenizer.from_pretrained(tiny_bert)


def _write_jsonl(path, rows) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return str(path)


def test_bradley_terry_loss_equals_the_hand_computed_value():
    rewards = jnp.array([[2.0, 0.5], [-1.0, 1.0], [-200.0, 0.0]])
    losses = problem.per_example_loss(rewards, jnp.zeros(3), problem.PAIRWISE_REWARD)
    # -log sigmoid(d) = log(1 + exp(-d)); d = -200 would underflow sigmoid to 0 (loss inf) in float32.
    expected = [math.log1p(math.exp(-1.5)), math.log1p(math.exp(2.0)), 200.0]
    np.testing.assert_allclose(np.asarray(losses), expected, rtol=1e-6)
    assert losses.dtype == jnp.float32


def test_bradley_terry_margin_is_subtracted_from_the_reward_difference():
    losses = problem.per_example_loss(jnp.array([[2.0, 0.5]]), jnp.array([1.0]), problem.PAIRWISE_REWARD)
    np.testing.assert_allclose(np.asarray(losses), [math.log1p(math.exp(-0.5))], rtol=1e-6)


def test_pair_accuracy_counts_ties_as_wrong():
    rewards = np.array([[1.0, 0.0], [0.5, 0.5], [0.0, 1.0], [3.0, 1.0]])
    result = metrics.compute_metrics(problem.PAIRWISE_REWARD, rewards, np.zeros(4))
    assert result["accuracy"] == 0.5  # the tie in row 1 is not a right ranking
    assert result["margin"] == pytest.approx((1.0 + 0.0 - 1.0 + 2.0) / 4)


def test_pairs_file_without_rejected_column_names_the_flag(tmp_path):
    train = _write_jsonl(tmp_path / "train.jsonl", [{"chosen": "good", "answer": "bad"}])
    with pytest.raises(ValueError, match=r"'rejected' \(set by --rejected_column\).*'answer'"):
        data.load_local_files(train_file=train, problem_type="pairwise_reward")


def test_in_memory_pairs_without_rejected_column_name_the_parameter():
    with pytest.raises(ValueError, match=r"'rejected' \(set by rejected_column=\)"):
        data.load_in_memory({"train": [{"chosen": "good", "other": "bad"}]}, problem_type="pairwise_reward")


def test_pairs_with_three_labels_name_num_labels_1(tmp_path):
    train = _write_jsonl(tmp_path / "train.jsonl", _pairs(4, seed=0))
    with pytest.raises(ValueError, match=r"num_labels=3.*num_labels=1"):
        data.load_local_files(train_file=train, num_labels=3)


def test_reward_model_with_three_labels_names_num_labels_1(tiny_bert, tokenizer):
    model = flaxheads.from_pretrained(tiny_bert, num_labels=3)
    with pytest.raises(ValueError, match=r"num_labels=1"):
        flaxheads.Trainer(model, _args(), train_dataset=_pairs(8, seed=0), tokenizer=tokenizer)


def test_pairs_are_detected_by_their_columns_and_batched_side_by_side(tokenizer):
    task = data.load_in_memory({"train": _pairs(5, seed=1)}).task
    assert task.problem_type == problem.PAIRWISE_REWARD and task.num_labels == 1
    tokenized = data.tokenize_split(task.splits["train"], tokenizer, 16)
    batch_format = data.BatchFormat.for_task(task, tokenizer, 16)
    batch = next(data.eval_batches(tokenized, batch_format, global_batch_size=8))
    assert batch["input_ids"].shape == (8, 2, 16) and batch["labels"].shape == (8,)
    chosen = tokenizer("the excellent")["input_ids"]  # the chosen side ends with "excellent", the rejected not
    assert (batch["input_ids"][:5, 0] == chosen[-2]).any(axis=1).all()
    assert not (batch["input_ids"][:5, 1] == chosen[-2]).any()


@pytest.mark.slow  # a training run
def test_training_on_a_toy_preference_ranks_held_out_pairs(tiny_bert, tokenizer):
    model = flaxheads.from_pretrained(tiny_bert, num_labels=1)
    trainer = flaxheads.Trainer(model, _args(), train_dataset=_pairs(192, seed=0), eval_dataset=_pairs(64, seed=1),
                                tokenizer=tokenizer)
    before = trainer.evaluate()
    output = trainer.train()
    after = output.metrics["validation"]
    print(f"held-out pair accuracy {before['accuracy']:.2f} -> {after['accuracy']:.2f}, loss {before['loss']:.3f} -> "
          f"{after['loss']:.3f}")
    assert after["accuracy"] >= 0.9 and after["loss"] < before["loss"]


@pytest.mark.slow  # a training run
def test_cli_trains_evaluates_and_scores_a_reward_model_from_pairs_jsonl(tiny_bert, tmp_path, capsys):
    train = _write_jsonl(tmp_path / "train.jsonl", _pairs(192, seed=0))
    held_out = _write_jsonl(tmp_path / "dev.jsonl", _pairs(64, seed=1))
    out = tmp_path / "run"
    common = ["--model_name_or_path", str(tiny_bert), "--train_file", train, "--validation_file", held_out,
              "--max_seq_length", "16", "--per_device_eval_batch_size", "32"]
    assert main(["train", *common, "--output_dir", str(out), "--max_steps", "24", "--learning_rate", "1e-3",
                 "--per_device_train_batch_size", "16", "--warmup_ratio", "0", "--eval_strategy", "no",
                 "--report_to", "none", "--disable_tqdm"]) == 0
    capsys.readouterr()
    config = json.loads((out / "config.json").read_text())
    assert config["problem_type"] is None and config["num_labels"] == 1
    assert config["flaxheads"]["problem_type"] == "pairwise_reward"
    transformers.AutoConfig.from_pretrained(out)  # transformers accepts the export's config
    assert flaxheads.from_pretrained(out).config.problem_type == "pairwise_reward"

    assert main(["evaluate", *common[2:], "--model_name_or_path", str(out), "--split", "validation"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert set(result) == {"accuracy", "margin", "loss"} and result["accuracy"] >= 0.9

    assert main(["predict", "--model_name_or_path", str(out), "the plot excellent", "the plot"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [set(row) for row in rows] == [{"text", "score"}] * 2 and rows[0]["score"] > rows[1]["score"]


def test_margin_column_becomes_the_pair_labels_and_is_zero_without_one(tmp_path):
    rows = [{"chosen": "good", "rejected": "bad", "margin": 1.5}, {"chosen": "fine", "rejected": "poor", "margin": 0}]
    train = _write_jsonl(tmp_path / "train.jsonl", rows)
    plain = _write_jsonl(tmp_path / "dev.jsonl", [{"chosen": "good", "rejected": "bad"}])
    task = data.load_local_files(train_file=train, validation_file=plain)
    assert task.splits["train"]["label"] == [1.5, 0.0] and task.splits["validation"]["label"] == [0.0]
    with pytest.raises(ValueError, match=r"the 'margin' column holds 'big' at index 0 of the train data"):
        data.load_in_memory({"train": [{"chosen": "a", "rejected": "b", "margin": "big"}]})
