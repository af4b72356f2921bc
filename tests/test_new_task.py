"""A task is a folder and a row: a per-token regression task ("token-regression": a score for every
word) defined entirely in this test, on the library's building blocks, registered with
`flaxheads.tasks.register`, then trained, evaluated, used to predict and exported through the
command line and the Python API, with no change to any library file.

What it takes, all here: a model class (a `TokenClassifier` whose config names the task), its
conversion row (transformers has no such class: the export names one of the task's own), an
`Objective` (squared error over the scored tokens), a `RowMaker` (words to subword rows, the
score on each word's first subword), a scorer, and the `Task` that ties them together.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, ClassVar

import datasets
import jax.numpy as jnp
import numpy as np
import pytest
import transformers
from flax import nnx

import flaxheads
from flaxheads import conversion, data, tasks
from flaxheads.cli import main
from flaxheads.inference import open_trained
from flaxheads.problem import IGNORE_INDEX
from flaxheads.tasks.base import Task
from flaxheads.tasks.token.model import TokenClassifier, TokenClassifierConfig
from flaxheads.tasks.token.scoring import row_outputs
from flaxheads.training.config import TrainConfig
from flaxheads.training.objective import model_logits
from flaxheads.training.scoring import PredictionOutput, SplitScorer
from flaxheads.training.sharding import Layout

pytestmark = pytest.mark.slow  # every test trains or loads a model

NAME = "token-regression"


@dataclasses.dataclass(frozen=True)
class TokenRegressorConfig(TokenClassifierConfig):
    task: ClassVar[str] = NAME


class TokenRegressor(TokenClassifier):
    """A score per token: a token classifier's per-token Linear with one output."""

    config_class = TokenRegressorConfig


@dataclasses.dataclass(frozen=True)
class SquaredError:
    """The mean squared error over the scored tokens of a whole batch; a model's (B, T, 1) logits
    read as (B, T) scores."""

    metric_names = ("mse",)

    def logits(self, model, batch, rngs):
        return model_logits(model, batch, rngs)[..., 0]

    def loss_terms(self, logits, labels):
        scored = labels != IGNORE_INDEX
        return (jnp.sum(jnp.where(scored, jnp.square(logits - labels), 0.0), axis=-1),
                jnp.sum(scored, axis=-1).astype(jnp.float32))

    def eval_outputs(self, logits, labels):
        errors, scored = self.loss_terms(logits, labels)
        return {"loss": errors, "scored_tokens": scored}

    def metrics(self, logits, labels, thresholds=None):
        raise NotImplementedError("scored by TokenScores")


OBJECTIVE = SquaredError()
SCORES = data.ExampleFormat(token_labels=True, label_dtype="float32",
                            unpacked_because="token regression: each sentence is a row of its own")


def tokenize(tokenizer, words: list[list[str]], scores: list[list[float]] | None, max_seq_length: int) -> dict:
    """Subword rows of sentences, each word's score on its first subword (-100 elsewhere)."""
    encoded = tokenizer(words, is_split_into_words=True, truncation=True, max_length=max_seq_length)
    columns = {name: encoded[name] for name in ("input_ids", "attention_mask", "token_type_ids") if name in encoded}
    columns["length"] = [len(ids) for ids in encoded["input_ids"]]
    labels, firsts = [], []
    for row in range(len(words)):
        word_ids, previous, row_labels, row_firsts = encoded.word_ids(row), None, [], []
        for position, word in enumerate(word_ids):
            first = word is not None and word != previous
            row_labels.append(scores[row][word] if first and scores is not None else IGNORE_INDEX)
            if first:
                row_firsts.append(position)
            previous = word
        labels.append(row_labels)
        firsts.append(row_firsts)
    columns["labels"] = labels
    return columns, firsts


class ScoreRows:
    whole_split = False
    origin_columns = ()

    def tokenize(self, task, split, tokenizer, max_seq_length, *, cache_dir=None):
        rows = task.splits[split]
        columns, _ = tokenize(tokenizer, list(rows["tokens"]), list(rows["label"]), max_seq_length)
        return datasets.Dataset.from_dict(columns)


class TokenScores(SplitScorer):
    """The mean squared error of a split's scored tokens; predictions per row, trimmed."""

    def scores(self, split, params, *, max_batches=None):
        own = self.splits[split]
        _, loss = row_outputs(self.evaluator, self.layout, params, own.rows, own.lengths, max_batches=max_batches)
        return {"loss": loss} if max_batches is not None else {"mse": loss, "loss": loss}

    def predict(self, split, params):
        own = self.splits[split]
        logits, loss = row_outputs(self.evaluator, self.layout, params, own.rows, own.lengths)
        labelled = split not in self.unlabelled
        return PredictionOutput(logits, list(own.rows["labels"]) if labelled else None,
                                {"mse": loss, "loss": loss} if labelled else {})


def read(path) -> dict[str, list]:
    rows = [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
    return {"tokens": [row["words"] for row in rows], "label": [[float(s) for s in row["scores"]] for row in rows]}


class TokenRegression(Task):
    name = NAME
    model_class = TokenRegressor
    noun = "token regressor"
    problem = "token_regression"
    files = "JSON Lines files with a tokens and a scores list per line"
    conversion_rows = {"bert": conversion.TaskTable(
        "BertForTokenRegression", "linear", conversion.TABLES["bert"].task("token-classification").rules)}

    def reads(self, source):
        return bool(source.get("train_file")) and str(source["train_file"]).endswith(".scores.jsonl")

    def load_data(self, source):
        files = {split: source.get(f"{split}_file") for split in ("train", "validation", "test")}
        splits = {split: datasets.Dataset.from_dict(read(path)) for split, path in files.items() if path}
        splits.setdefault("train", next(iter(splits.values())))  # scoring a trained model: any split stands in
        return data.TaskData(datasets.DatasetDict(splits), None, 1, {0: "score"},
                             problem_type_reason="token_regression: a score per word", rows=ScoreRows(), task=NAME,
                             example_format=SCORES)

    def objective(self, data_task, loss_options):
        return OBJECTIVE

    def default_metric(self, data_task):
        return "mse"

    def scorer(self, graphdef, splits, batch_format, layout, *, data_task, config, args, source=None, **options):
        return TokenScores(graphdef, splits, batch_format, layout, **options, objective=OBJECTIVE)

    def predicted(self, logits, config, data_task):
        return [[round(float(x), 4) for x in row] for row in logits]

    def format_predictions(self, predicted, data_task):
        return "index\tscores\n" + "".join(f"{i}\t{' '.join(map(str, row))}\n" for i, row in enumerate(predicted))

    def evaluate(self, folder, data_task, split, *, options):
        model, tokenizer, max_seq_length = open_trained(folder, TokenRegressor, max_seq_length=options["max_seq_length"])
        rows = ScoreRows().tokenize(data_task, split, tokenizer, max_seq_length)
        graphdef, params = nnx.split(model)
        scorer = self.scorer(graphdef, {split: data.OwnSplit(rows, data.example_lengths(rows))},
                             data.BatchFormat.for_task(data_task, tokenizer, max_seq_length), Layout.create(),
                             data_task=data_task, config=model.config, args=None, eval_batch=options["batch_size"])
        return scorer.scores(split, params)

    def predict_command(self, folder, inputs: dict[str, Any]) -> list[dict]:
        model, tokenizer, max_seq_length = open_trained(folder, TokenRegressor, max_seq_length=inputs["max_seq_length"])
        sentences = [text.split() for text in inputs["texts"]]
        columns, firsts = tokenize(tokenizer, sentences, None, max_seq_length)
        answers = []
        for row, words in enumerate(sentences):
            scores = model(jnp.asarray([columns["input_ids"][row]]))[0, :, 0]
            answers.append({"words": words, "scores": [round(float(scores[p]), 4) for p in firsts[row]]})
        return answers


@pytest.fixture
def registered():
    task = tasks.register(TokenRegression())
    yield task
    tasks.unregister(NAME)


@pytest.fixture
def score_files(tmp_path) -> dict[str, Path]:
    rng = np.random.default_rng(0)
    words = ["the", "film", "was", "slow", "and", "very", "dull", "but", "moving", "great"]
    files = {}
    for split, count in (("train", 24), ("validation", 8)):
        lines = []
        for _ in range(count):
            tokens = list(rng.choice(words, size=int(rng.integers(2, 7))))
            lines.append(json.dumps({"words": tokens, "scores": [len(w) / 10 for w in tokens]}))
        files[split] = tmp_path / f"{split}.scores.jsonl"
        files[split].write_text("\n".join(lines) + "\n", encoding="utf-8")
    return files


def test_a_task_defined_outside_the_library_trains_evaluates_predicts_and_exports_from_the_command_line(
        registered, score_files, tiny_bert, tmp_path, capsys):
    out = tmp_path / "run"
    common = ["--max_seq_length", "16", "--per_device_train_batch_size", "8", "--per_device_eval_batch_size", "8"]

    assert main(["train", "--model_name_or_path", str(tiny_bert), "--train_file", str(score_files["train"]),
                 "--validation_file", str(score_files["validation"]), "--output_dir", str(out), "--max_steps", "6",
                 "--learning_rate", "1e-3", "--report_to", "none", "--disable_tqdm", "--do_predict", "--test_file",
                 str(score_files["validation"]), *common]) == 0, capsys.readouterr().err
    results = json.loads((out / "results.json").read_text())
    assert results["validation"]["mse"] >= 0 and set(results["validation"]) >= {"mse", "loss"}
    assert json.loads((out / "config.json").read_text())["architectures"] == ["BertForTokenRegression"]
    assert (out / "predict_results.txt").read_text().startswith("index\tscores\n")
    capsys.readouterr()

    assert main(["evaluate", "--model_name_or_path", str(out), "--task", NAME, "--validation_file",
                 str(score_files["validation"]), "--split", "validation", *common]) == 0
    printed = capsys.readouterr().out
    assert json.loads(printed[printed.index("{"):])["mse"] == pytest.approx(results["validation"]["mse"], rel=1e-5)

    assert main(["predict", "--model_name_or_path", str(out), "the film was great", "--max_seq_length", "16"]) == 0
    row = json.loads(capsys.readouterr().out.splitlines()[0])
    assert row["words"] == ["the", "film", "was", "great"] and len(row["scores"]) == 4


def test_a_task_defined_outside_the_library_trains_and_reloads_from_python(registered, score_files, tiny_bert,
                                                                         tmp_path):
    model = TokenRegressor.from_pretrained(tiny_bert, num_labels=1, id2label=["score"])
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_bert)
    task_data = flaxheads.data.load_task(train_file=score_files["train"], validation_file=score_files["validation"])
    assert task_data.task == NAME  # read as the registered task: its files say so

    trainer = flaxheads.Trainer(model, TrainConfig(output_dir=None, max_steps=4, max_seq_length=16, learning_rate=1e-3,
                                                   per_device_train_batch_size=8, report_to="none",
                                                   disable_tqdm=True), task=task_data, tokenizer=tokenizer)
    trained, metrics, _ = trainer.train()
    trained.save_pretrained(tmp_path / "export", tokenizer=tokenizer)
    reloaded = flaxheads.from_pretrained(tmp_path / "export", task=NAME)
    ids = jnp.asarray(tokenizer(["the film was dull"])["input_ids"])

    assert isinstance(reloaded, TokenRegressor) and set(metrics["validation"]) == {"mse", "loss"}
    assert trainer.evaluate()["mse"] == pytest.approx(metrics["validation"]["mse"], rel=1e-5)
    trained.eval()
    np.testing.assert_allclose(np.asarray(reloaded(ids)), np.asarray(trained(ids)), atol=1e-6)
    assert tasks.of_checkpoint(tmp_path / "export") is registered


def test_data_that_two_tasks_read_is_refused_naming_both(registered, tmp_path):
    both = tmp_path / "both.scores.jsonl"  # a tokens list (token classification's) in a file of scores
    both.write_text(json.dumps({"tokens": ["a"], "tags": ["O"], "words": ["a"], "scores": [0.5]}) + "\n")

    with pytest.raises(ValueError, match=r"token-classification and token-regression.*task="):
        flaxheads.data.load_task(train_file=both)
    assert flaxheads.data.load_task(train_file=both, task=NAME).task == NAME


def test_a_registered_task_leaves_no_trace_once_unregistered(tiny_bert):
    tasks.register(TokenRegression())
    tasks.unregister(NAME)

    assert NAME not in tasks.TASKS and NAME not in conversion.TABLES["bert"].task_tables
    with pytest.raises(ValueError, match=f"unknown task '{NAME}'"):
        flaxheads.from_pretrained(tiny_bert, task=NAME)
