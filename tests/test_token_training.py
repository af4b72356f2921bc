"""Token classification through `flaxheads train | evaluate | predict` on a tiny BERT: the run's
entity metrics are seqeval's on its own predictions, its export is a transformers
`*ForTokenClassification`, and its loss is PyTorch's `CrossEntropyLoss(ignore_index=-100)`."""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

import flaxheads
from flaxheads import problem
from flaxheads.cli import main
from flaxheads.tasks.token.model import token_loss, token_loss_terms
from flaxheads.tasks.token.entity_metrics import entity_report
from flaxheads.tasks.token.scoring import tag_confusion

def _data_flags(conll) -> list[str]:
    return ["--train_file", str(conll["train"]), "--validation_file", str(conll["validation"]),
            "--test_file", str(conll["test"])]


@pytest.fixture(scope="module")
def token_run(tiny_bert, conll, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("token_run") / "run"
    code = main(["train", "--model_name_or_path", str(tiny_bert), *_data_flags(conll),
                 "--output_dir", str(out), "--max_seq_length", "16", "--per_device_train_batch_size", "4",
                 "--per_device_eval_batch_size", "8", "--learning_rate", "3e-3", "--max_steps", "8",
                 "--logging_steps", "4", "--eval_steps", "4", "--save_steps", "100", "--report_to", "none",
                 "--disable_tqdm", "--do_predict", "--warmup_ratio", "0"])
    assert code == 0
    return out


@pytest.mark.slow
def test_token_loss_terms_give_pytorch_cross_entropy_with_ignore_index_over_the_whole_batch():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(3, 7, 5)).astype(np.float32)
    labels = rng.integers(0, 5, size=(3, 7))
    labels[rng.random((3, 7)) < 0.4] = -100
    mask = np.array([1.0, 1.0, 0.0], np.float32)  # a filler row counts for nothing

    numerators, denominators = token_loss_terms(jnp.asarray(logits), jnp.asarray(labels))
    ours = float(jnp.sum(numerators * mask) / jnp.sum(denominators * mask))
    reference = torch.nn.CrossEntropyLoss(ignore_index=-100)(torch.from_numpy(logits[:2]).reshape(-1, 5),
                                                              torch.from_numpy(labels[:2]).reshape(-1)).item()

    print("max difference", abs(ours - reference))
    np.testing.assert_allclose(ours, reference, rtol=1e-6)
    np.testing.assert_allclose(ours, float(token_loss(jnp.asarray(logits[:2]), jnp.asarray(labels[:2]))), rtol=1e-6)


@pytest.mark.slow
def test_train_reports_seqeval_entity_metrics_of_its_own_predictions_and_exports_a_transformers_tagger(
    token_run, conll, tiny_bert
):
    results = json.loads((token_run / "results.json").read_text())
    tags = [line.split("\t")[1].split() for line in (token_run / "predict_results.txt").read_text().splitlines()[1:]]
    task = flaxheads.data.load_word_files(train_file=conll["train"], test_file=conll["test"])
    expected = entity_report(task.splits["test"].tags, tags)

    assert results["reports"]["test"] == {**expected, **tag_confusion(task.splits["test"].tags, tags, task.label_names)}
    for name in ("f1", "precision", "recall", "accuracy"):
        assert results["test"][name] == expected[name], name
    assert results["test"]["macro_f1"] == expected["macro_avg"]["f1"]
    assert results["best"]["metric"] == "f1" and results["steps"] == 8
    assert set(results["validation"]) >= {"f1", "precision", "recall", "accuracy", "loss"}
    assert [len(t) for t in tags] == [len(s) for s in task.splits["test"].tokens]  # windows merged back to words

    reference = transformers.AutoModelForTokenClassification.from_pretrained(token_run).eval()
    assert type(reference).__name__ == "BertForTokenClassification"
    assert list(reference.config.id2label.values()) == list(task.label_names)
    tokenizer = transformers.AutoTokenizer.from_pretrained(token_run)
    enc = tokenizer([["Anna", "met", "the", "EU", "in", "Paris", "."], ["Berlin"]], is_split_into_words=True,
                    padding=True, return_tensors="np")
    ours = flaxheads.TokenClassifier.from_pretrained(token_run)(enc["input_ids"], enc["attention_mask"],
                                                                 enc["token_type_ids"])
    with torch.no_grad():
        theirs = reference(**{k: torch.from_numpy(v) for k, v in enc.items()}).logits.numpy()
    print("max difference", np.max(np.abs(np.asarray(ours) - theirs)))
    np.testing.assert_allclose(np.asarray(ours), theirs, atol=1e-5)


@pytest.mark.slow  # token_run, the module's training run, is built by the first test that asks
def test_evaluate_and_predict_answer_as_the_run_did(token_run, conll, capsys):
    results = json.loads((token_run / "results.json").read_text())
    capsys.readouterr()
    assert main(["evaluate", "--model_name_or_path", str(token_run), *_data_flags(conll), "--split", "test",
                 "--max_seq_length", "16"]) == 0
    evaluated = json.loads(capsys.readouterr().out)
    assert evaluated["report"] == results["reports"]["test"]
    np.testing.assert_allclose(evaluated["loss"], results["test"]["loss"], rtol=1e-5)

    task = flaxheads.data.load_word_files(train_file=conll["train"], test_file=conll["test"])
    first = task.splits["test"].tokens[0]
    assert main(["predict", "--model_name_or_path", str(token_run), "--max_seq_length", "16", " ".join(first)]) == 0
    (row,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    predicted = (token_run / "predict_results.txt").read_text().splitlines()[1].split("\t")[1].split()
    assert row["words"] == first and row["tags"] == predicted
    assert all(set(e) == {"type", "start", "end", "text"} for e in row["entities"])


@pytest.mark.slow  # token_run, the module's training run, is built by the first test that asks
def test_evaluate_and_scoring_without_a_train_file_read_the_tags_from_the_model(token_run, conll, tmp_path, capsys):
    results = json.loads((token_run / "results.json").read_text())
    capsys.readouterr()
    assert main(["evaluate", "--model_name_or_path", str(token_run), "--test_file", str(conll["test"]), "--split",
                 "test", "--max_seq_length", "16"]) == 0
    assert json.loads(capsys.readouterr().out)["report"] == results["reports"]["test"]

    scored = tmp_path / "scored"
    assert main(["train", "--model_name_or_path", str(token_run), "--test_file", str(conll["test"]), "--no_do_train",
                 "--do_predict", "--output_dir", str(scored), "--max_seq_length", "16", "--report_to", "none"]) == 0
    assert (scored / "predict_results.txt").read_text() == (token_run / "predict_results.txt").read_text()


@pytest.mark.slow
def test_trainer_evaluate_and_predict_take_sentences_in_memory_as_the_files_give_them(token_run, conll):
    words = flaxheads.data.load_word_files(train_file=conll["train"], validation_file=conll["validation"],
                                           test_file=conll["test"])
    model = flaxheads.TokenClassifier.from_pretrained(token_run)
    trainer = flaxheads.Trainer(model, flaxheads.TrainConfig(output_dir=None, do_train=False, max_seq_length=16,
                                                             per_device_eval_batch_size=8),
                                task=flaxheads.data.token_task_data(words),
                                tokenizer=transformers.AutoTokenizer.from_pretrained(token_run))
    validation, test = words.splits["validation"], words.splits["test"]
    from_files = trainer.predict()

    assert trainer.evaluate((validation.tokens, validation.tags)) == trainer.evaluate()
    # A datasets split whose ClassLabel numbers the tags in its own order.
    names = sorted(words.label_names, reverse=True)
    ids = [[names.index(tag) for tag in tags] for tags in test.tags]
    features = datasets.Features({"tokens": datasets.List(datasets.Value("string")),
                                  "ner_tags": datasets.List(datasets.ClassLabel(names=names))})
    in_memory = trainer.predict(datasets.Dataset.from_dict({"tokens": test.tokens, "ner_tags": ids}, features=features))
    assert in_memory.metrics == from_files.metrics and in_memory.metrics["f1"] >= 0
    for ours, theirs in zip(in_memory.predictions, from_files.predictions, strict=True):
        np.testing.assert_array_equal(ours, theirs)
    untagged = trainer.predict(test.tokens)  # words alone: tags to predict, nothing to score
    assert untagged.label_ids is None and untagged.metrics == {}
    assert trainer.predicted_labels(untagged.predictions) == trainer.predicted_labels(from_files.predictions)
    with pytest.raises(ValueError, match=r"sentence 1, word 1 \('Anna'\)"):
        trainer.evaluate(([["Anna", "sings"]], [["B-ART", "O"]]))


def test_packing_is_refused_for_token_classification(tiny_bert, conll, tmp_path, capsys):
    code = main(["train", "--model_name_or_path", str(tiny_bert), "--train_file", str(conll["train"]),
                 "--output_dir", str(tmp_path / "run"), "--packing", "--max_seq_length", "16"])

    assert code == 2
    err = capsys.readouterr().err
    assert "--packing" in err and "token classification" in err
    assert not (tmp_path / "run").exists()


def test_a_data_error_names_the_file_sentence_and_word(tiny_bert, tmp_path, capsys):
    bad = tmp_path / "train.jsonl"
    bad.write_text(json.dumps({"tokens": ["EU", "rejects"], "ner_tags": ["B-ORG", "O"]}) + "\n"
                   + json.dumps({"tokens": ["Peter", "Blackburn"], "ner_tags": ["B-PER"]}) + "\n", encoding="utf-8")

    code = main(["train", "--model_name_or_path", str(tiny_bert), "--train_file", str(bad),
                 "--output_dir", str(tmp_path / "run")])

    assert code == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "sentence 2" in err


def test_evaluate_refuses_a_model_whose_token_head_was_never_trained(tiny_bert, conll, capsys):
    code = main(["evaluate", "--model_name_or_path", str(tiny_bert), *_data_flags(conll), "--split", "test"])

    assert code == 2
    assert "random values" in capsys.readouterr().err


@pytest.mark.slow
def test_gradient_accumulation_gives_the_loss_and_gradient_of_the_whole_batch_tokens(tiny_bert):
    import optax
    from flax import nnx

    from flaxheads.tasks.token.objective import OBJECTIVE as TOKEN_OBJECTIVE
    from flaxheads.training.step import TrainState, make_train_step

    model = flaxheads.TokenClassifier.from_pretrained(tiny_bert, num_labels=3, classifier_dropout=0.0)
    graphdef, params = nnx.split(model)
    rng = np.random.default_rng(0)
    ids = rng.integers(1000, 2000, size=(4, 8)).astype(np.int32)
    mask = np.ones((4, 8), np.int32)
    labels = rng.integers(0, 3, size=(4, 8)).astype(np.int32)
    labels[0, 1:] = -100  # micro-batches with very different token counts: 1 + 8 against 16
    labels[1, :] = -100
    labels[1, 2] = 2
    batch = {"input_ids": ids, "attention_mask": mask, "labels": labels, "example_mask": np.ones(4, np.float32)}
    step = jax.jit(make_train_step(graphdef, optax.sgd(1.0), optax.constant_schedule(1.0), TOKEN_OBJECTIVE))
    state = TrainState(jnp.zeros((), jnp.int32), params, optax.sgd(1.0).init(params))

    whole = step(state, {k: v[None] for k, v in batch.items()}, jax.random.key(0))
    halves = step(state, {k: v.reshape(2, 2, *v.shape[1:]) for k, v in batch.items()}, jax.random.key(0))

    model.eval()
    expected = float(token_loss(model(ids, mask), jnp.asarray(labels)))
    np.testing.assert_allclose(float(whole[1]["loss"]), expected, rtol=1e-5)
    np.testing.assert_allclose(float(halves[1]["loss"]), expected, rtol=1e-5)
    np.testing.assert_allclose(float(halves[1]["grad_norm"]), float(whole[1]["grad_norm"]), rtol=1e-4)


def test_the_task_is_read_from_the_data_shape_or_set_with_task(tmp_path, conll):
    from flaxheads.data import load_task

    words = tmp_path / "train.jsonl"
    words.write_text(json.dumps({"tokens": ["EU", "rejects"], "tags": ["B-ORG", "O"]}) + "\n", encoding="utf-8")
    texts = tmp_path / "texts.csv"
    texts.write_text("text,label\nfine film,pos\ndull film,neg\n", encoding="utf-8")

    assert load_task(train_file=conll["train"]).task == flaxheads.TOKEN_CLASSIFICATION
    found = load_task(train_file=words, label_all_tokens=True, stride=3)
    assert found.source.task.label_names == ("B-ORG", "O") and found.source.label_all_tokens and found.source.stride == 3
    assert load_task(train_file=texts).problem_type == problem.SINGLE_LABEL
    with pytest.raises(ValueError, match="label_all_tokens=True label token classification data"):
        load_task(train_file=texts, label_all_tokens=True)
    with pytest.raises(ValueError, match=r"texts\.csv"):
        load_task(train_file=texts, task="token-classification")
