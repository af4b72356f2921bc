"""Extractive question answering through `flaxheads train | evaluate | predict` and the Trainer on a
tiny BERT: a train step's loss equals PyTorch's `BertForQuestionAnswering` on the same windows, a
run learns (its exact match far above a random span's), reports SQuAD's metrics, writes run_qa.py's
predictions, exports a transformers `BertForQuestionAnswering` whose logits give the same answers,
and what does not apply to question answering is refused before the output folder is touched."""

from __future__ import annotations

import json
import random
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch
import transformers
from flax import nnx

import flaxheads
from families import randomize_
from flaxheads import data
from flaxheads.cli import main
from flaxheads.tasks.qa.data import read_qa_file
from flaxheads.tasks.qa.objective import SpanObjective
from flaxheads.tasks.qa.postprocess import postprocess_qa_predictions
from flaxheads.tasks.qa.rows import qa_task_data
from flaxheads.tasks.qa.windows import validation_features
from flaxheads.training.config import TrainConfig
from flaxheads.training.step import TrainState, make_eval_step, make_train_step

PEOPLE = ["Anna", "Peter", "Maria", "John", "Lena", "Omar"]
CITIES = ["Berlin", "Paris", "Rome", "Madrid", "Vienna", "Oslo"]
FRUITS = ["apples", "pears", "plums", "grapes", "lemons", "figs"]
FILLER = ["the", "day", "was", "long", "and", "warm", "in", "town", "we", "saw", "a", "river"]
MAX_SEQ_LENGTH, DOC_STRIDE = 48, 12
"""Windows of 48 tokens sharing 12: the longer contexts below take two or three."""


def squad_row(i: int, rng: random.Random, *, answered: bool = True) -> dict:
    """A question about a sentence hidden between filler words (up to ~70 words: several windows)."""
    person, city, fruit = rng.choice(PEOPLE), rng.choice(CITIES), rng.choice(FRUITS)
    before = " ".join(rng.choice(FILLER) for _ in range(rng.randint(2, 35)))
    after = " ".join(rng.choice(FILLER) for _ in range(rng.randint(2, 35)))
    context = f"{before}. {person} lives in {city} and likes {fruit}. {after}."
    question, answer = rng.choice([(f"Where does {person} live?", city), (f"What does {person} like?", fruit)])
    row = {"id": f"q{i}", "question": question, "context": context}
    if answered:
        start = context.index(f" {answer}") + 1
        row["answers"] = {"text": [answer], "answer_start": [start]}
    return row


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def squad(tmp_path_factory) -> dict[str, Path]:
    folder, rng = tmp_path_factory.mktemp("squad"), random.Random(0)
    return {"train": write_jsonl(folder / "train.jsonl", [squad_row(i, rng) for i in range(160)]),
            "validation": write_jsonl(folder / "dev.jsonl", [squad_row(i, rng) for i in range(160, 200)]),
            "test": write_jsonl(folder / "test.jsonl", [squad_row(i, rng, answered=False) for i in range(200, 208)])}


def _data_flags(files) -> list[str]:
    return ["--train_file", str(files["train"]), "--validation_file", str(files["validation"])]


def test_squad_data_is_read_as_question_answering_and_windowed(tiny_bert, squad):
    task = flaxheads.data.load_task(train_file=squad["train"], validation_file=squad["validation"])
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_bert)
    rows = task.rows.tokenize(task, "validation", tokenizer, MAX_SEQ_LENGTH)
    examples = task.source.examples["validation"]

    assert task.task == "question-answering" and len(examples) == 40
    assert len(rows) > len(examples)  # long contexts overflow into several windows
    assert max(rows["length"]) <= MAX_SEQ_LENGTH
    for row in rows.select(range(12)):  # each labelled window's span is its answer's text, or CLS
        start, end = row["labels"]
        example = examples[row["example_index"]]
        if start == 0:
            continue
        text = example.context[row["offset_start"][start]:row["offset_end"][end]]
        assert text == example.answer_texts[0]


@pytest.mark.slow
def test_a_train_step_has_the_loss_and_logits_of_pytorch_bert_for_question_answering(tiny_bert, squad, tmp_path):
    reference = transformers.BertForQuestionAnswering.from_pretrained(tiny_bert, initializer_range=0.2).eval()
    randomize_(reference, seed=0)  # every parameter drawn: a swapped tensor shows
    reference.save_pretrained(tmp_path / "qa")
    model = flaxheads.QuestionAnswering.from_pretrained(tmp_path / "qa")
    task = flaxheads.data.load_task(train_file=squad["train"], doc_stride=DOC_STRIDE)
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_bert)
    fmt = data.BatchFormat.for_task(task, tokenizer, MAX_SEQ_LENGTH)
    batch = next(data.eval_batches(data.tokenize_task(task, tokenizer, MAX_SEQ_LENGTH)["train"], fmt,
                                   global_batch_size=8))
    objective = SpanObjective()
    graphdef, params = nnx.split(model)
    step = jax.jit(make_train_step(graphdef, optax.sgd(0.0), optax.constant_schedule(0.0), objective))
    state = TrainState(jnp.zeros((), jnp.int32), params, optax.sgd(0.0).init(params))

    _, metrics = step(state, {k: v[None] for k, v in batch.items()}, jax.random.key(0))
    logits = np.asarray(make_eval_step(graphdef, objective)(params, batch)["logits"])
    labels = torch.from_numpy(np.asarray(batch["labels"]).astype(np.int64))
    with torch.no_grad():
        expected = reference(**{k: torch.from_numpy(np.asarray(batch[k]).astype(np.int64))
                                for k in ("input_ids", "attention_mask", "token_type_ids")},
                             start_positions=labels[:, 0], end_positions=labels[:, 1])

    print("max difference", np.max(np.abs(logits[..., 0] - expected.start_logits.numpy())),
          abs(float(metrics["loss"]) - expected.loss.item()))
    assert (np.asarray(batch["labels"])[:, 0] > 0).any()  # some windows hold their answer: a real comparison
    np.testing.assert_allclose(logits[..., 0], expected.start_logits.numpy(), atol=1e-5)
    np.testing.assert_allclose(logits[..., 1], expected.end_logits.numpy(), atol=1e-5)
    np.testing.assert_allclose(float(metrics["loss"]), expected.loss.item(), atol=1e-5)


@pytest.fixture(scope="module")
def qa_run(tiny_bert, squad, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("qa_run") / "run"
    code = main(["train", "--model_name_or_path", str(tiny_bert), *_data_flags(squad), "--test_file",
                 str(squad["test"]), "--do_predict", "--output_dir", str(out), "--max_seq_length", str(MAX_SEQ_LENGTH),
                 "--doc_stride", str(DOC_STRIDE), "--per_device_train_batch_size", "16",
                 "--per_device_eval_batch_size", "32", "--learning_rate", "5e-3", "--max_steps", "60",
                 "--logging_steps", "10", "--eval_steps", "30", "--save_steps", "1000", "--report_to", "none",
                 "--disable_tqdm", "--warmup_ratio", "0.1", "--seed", "0"])
    assert code == 0
    return out


def random_span_exact_match(path: Path, seed: int = 0) -> float:
    """The exact match (%) of answering each question with a random span of one to three words of
    its context: the floor a model that learned nothing reaches."""
    rng, examples = random.Random(seed), read_qa_file(path)
    hits = 0
    for example in examples:
        words = example.context.split()
        start = rng.randrange(len(words))
        guess = " ".join(words[start:start + rng.randint(1, 3)]).strip(".")
        hits += guess in example.answer_texts
    return 100.0 * hits / len(examples)


@pytest.mark.slow
def test_a_run_learns_reports_squad_metrics_and_writes_run_qa_predictions(qa_run, squad):
    results = json.loads((qa_run / "results.json").read_text())
    losses = [json.loads(line)["loss"] for line in (qa_run / "metrics.jsonl").read_text().splitlines()
              if '"train"' in line or "grad_norm" in line]
    baseline = random_span_exact_match(squad["validation"])
    print("validation", results["validation"], "random spans", baseline, "losses", losses[:2], losses[-2:])

    assert set(results["validation"]) == {"exact_match", "f1", "loss"}
    assert results["best"]["metric"] == "f1" and results["steps"] == 60
    assert losses[-1] < 0.6 * losses[0]
    assert results["validation"]["exact_match"] > baseline + 30
    predicted = json.loads((qa_run / "predict_predictions.json").read_text())
    lines = (qa_run / "predict_results.txt").read_text().splitlines()
    assert list(predicted) == [f"q{i}" for i in range(200, 208)]
    assert lines[0] == "index\tid\tprediction" and lines[1] == f"0\tq200\t{predicted['q200']}"
    nbest = json.loads((qa_run / "predict_nbest_predictions.json").read_text())
    assert nbest["q200"][0]["text"] == predicted["q200"]


@pytest.mark.slow
def test_the_export_is_a_transformers_bert_for_question_answering_giving_the_same_answers(qa_run, squad):
    reference = transformers.AutoModelForQuestionAnswering.from_pretrained(qa_run).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(qa_run)
    examples = read_qa_file(squad["test"], labelled=False)
    features = validation_features(examples, tokenizer, max_seq_length=MAX_SEQ_LENGTH, doc_stride=DOC_STRIDE)
    with torch.no_grad():
        out = reference(**{k: torch.from_numpy(np.asarray(features[k], np.int64))
                           for k in ("input_ids", "attention_mask", "token_type_ids")})
    ours = flaxheads.QuestionAnswering.from_pretrained(qa_run)(features["input_ids"], features["attention_mask"],
                                                               features["token_type_ids"])
    rows = [{"example_id": i, "offset_mapping": m} for i, m in zip(features["example_id"], features["offset_mapping"])]
    answers = postprocess_qa_predictions([{"id": e.id, "context": e.context} for e in examples], rows,
                                         (out.start_logits.numpy(), out.end_logits.numpy())).answers

    assert type(reference).__name__ == "BertForQuestionAnswering"
    np.testing.assert_allclose(np.asarray(ours.start_logits), out.start_logits.numpy(), atol=1e-5)
    np.testing.assert_allclose(np.asarray(ours.end_logits), out.end_logits.numpy(), atol=1e-5)
    assert answers == json.loads((qa_run / "predict_predictions.json").read_text())


@pytest.mark.slow
def test_evaluate_and_predict_answer_as_the_run_did(qa_run, squad, capsys):
    results = json.loads((qa_run / "results.json").read_text())
    predicted = json.loads((qa_run / "predict_predictions.json").read_text())
    shape = ["--max_seq_length", str(MAX_SEQ_LENGTH), "--doc_stride", str(DOC_STRIDE)]
    capsys.readouterr()

    assert main(["evaluate", "--model_name_or_path", str(qa_run), "--validation_file", str(squad["validation"]),
                 "--split", "validation", *shape]) == 0
    evaluated = json.loads(capsys.readouterr().out)
    assert {k: evaluated[k] for k in ("exact_match", "f1")} == {k: results["validation"][k]
                                                                for k in ("exact_match", "f1")}
    np.testing.assert_allclose(evaluated["loss"], results["validation"]["loss"], rtol=1e-5)

    assert main(["predict", "--model_name_or_path", str(qa_run), "--input_file", str(squad["test"]), *shape]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert {row["id"]: row["answer"] for row in rows} == predicted

    first = json.loads(squad["test"].read_text().splitlines()[0])
    assert main(["predict", "--model_name_or_path", str(qa_run), "--question", first["question"], "--context",
                 first["context"], *shape]) == 0
    (row,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert row["answer"] == predicted["q200"] and 0 < row["probability"] <= 1

    assert main(["predict", "--model_name_or_path", str(qa_run), "Where does Anna live?"]) == 2
    assert "question-answering model: give --question and --context" in capsys.readouterr().err


@pytest.mark.slow
def test_the_trainer_trains_on_squad_v2_examples_held_in_python(tiny_bert):
    rng = random.Random(1)
    rows = [squad_row(i, rng, answered=i % 3 != 0) for i in range(24)]
    for row in rows:
        row.setdefault("answers", {"text": [], "answer_start": []})
    examples = flaxheads.tasks.qa.data.qa_examples(rows, version_2_with_negative=True)
    task = qa_task_data({"train": examples, "validation": examples[:12]}, version_2_with_negative=True)
    model = flaxheads.QuestionAnswering.from_pretrained(tiny_bert)
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_bert)
    trainer = flaxheads.Trainer(model, TrainConfig(output_dir=None, max_steps=2, per_device_train_batch_size=8,
                                                   per_device_eval_batch_size=16, max_seq_length=MAX_SEQ_LENGTH,
                                                   report_to="none", disable_tqdm=True),
                                task=task, tokenizer=tokenizer)

    trained, metrics, _ = trainer.train()

    assert isinstance(trained, flaxheads.QuestionAnswering)
    assert {"exact", "f1", "HasAns_exact", "NoAns_exact", "best_f1", "loss"} <= set(metrics["validation"])
    again = trainer.evaluate(rows[:12])
    assert again["exact"] == metrics["validation"]["exact"]


# ---------------------------------------------------------------------------------------------
# What does not apply to question answering: refused before the output folder is touched


@pytest.mark.parametrize("flags, message", [
    (["--packing"], r"--packing.*question answering"),
    (["--class_weights", "balanced"], r"--class_weights balanced.*apply to text classification"),
    (["--calibrate"], r"--calibrate.*apply to text classification"),
    (["--tune_thresholds"], r"--tune_thresholds.*apply to text classification"),
    (["--head", "mean"], r"--head mean.*question-answering model.*BertForQuestionAnswering"),
    (["--null_score_diff_threshold", "1.5"], r"--null_score_diff_threshold 1.5.*--version_2_with_negative"),
    (["--max_seq_length", "8"], r"leaves no token of the context.*--max_seq_length"),
], ids=["packing", "class_weights", "calibrate", "thresholds", "head", "null_threshold", "no_room"])
def test_what_does_not_apply_to_question_answering_is_refused_before_the_folder(flags, message, tiny_bert, squad,
                                                                                tmp_path, capsys):
    import re

    out = tmp_path / "run"
    code = main(["train", "--model_name_or_path", str(tiny_bert), *_data_flags(squad), "--output_dir", str(out),
                 "--max_steps", "1", *flags])
    err = capsys.readouterr().err
    assert code == 2, err
    assert re.search(message, err, re.S), err
    assert not out.exists()
