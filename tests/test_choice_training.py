"""Multiple choice through `flaxheads train | evaluate | predict` and the Trainer on a tiny BERT:
examples are tokenised and batched as transformers' run_swag.py does, a train step's loss and the
logits equal PyTorch's `BertForMultipleChoice` on the same batch, the run reports accuracy and
exports a transformers `BertForMultipleChoice`, and bad files are refused naming file, row and fix."""

from __future__ import annotations

import csv
import json
from itertools import chain
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
from flaxheads.training.config import TrainConfig
from flaxheads.tasks.choice.objective import OBJECTIVE as CHOICE_OBJECTIVE
from flaxheads.training.step import TrainState, make_eval_step, make_train_step

_PEOPLE = ["A man", "The woman", "A child", "Someone"]
_ACTS = ["opens the door", "picks up a ball", "sits at the piano", "walks to the car"]
_ENDINGS = ["and walks inside.", "and throws it far.", "and starts to play.", "and drives away."]
SWAG_COLUMNS = ["video-id", "startphrase", "sent1", "sent2", "ending0", "ending1", "ending2", "ending3", "label"]


def _swag_row(i: int) -> dict:
    """A SWAG-like row: the right ending follows the act, the others are the other acts' endings."""
    act = i % 4
    label = (i * 7) % 4
    others = [e for k, e in enumerate(_ENDINGS) if k != act]
    endings = others[:label] + [_ENDINGS[act]] + others[label:]
    sent1 = f"{_PEOPLE[i % 4]} {_ACTS[act]}."
    sent2 = "Then the person"
    return {"video-id": f"v{i}", "startphrase": f"{sent1} {sent2}", "sent1": sent1, "sent2": sent2,
            **{f"ending{k}": e for k, e in enumerate(endings)}, "label": label}


def _write_csv(path: Path, rows: list[dict], columns=SWAG_COLUMNS) -> Path:
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    return path


@pytest.fixture(scope="module")
def swag(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("swag")
    return {"train": _write_csv(folder / "train.csv", [_swag_row(i) for i in range(24)]),
            "validation": _write_csv(folder / "val.csv", [_swag_row(i) for i in range(24, 32)]),
            "test": _write_csv(folder / "test.csv", [_swag_row(i) for i in range(32, 38)])}


def _data_flags(files) -> list[str]:
    return ["--train_file", str(files["train"]), "--validation_file", str(files["validation"]),
            "--test_file", str(files["test"])]


def _run_swag_features(tokenizer, rows: list[dict], max_seq_length: int) -> dict[str, list]:
    """transformers' examples/pytorch/multiple-choice/run_swag.py preprocess_function, verbatim in
    substance: the context repeated per ending, the header joined to each ending by a space."""
    ending_names = [f"ending{i}" for i in range(4)]
    first_sentences = [[row["sent1"]] * 4 for row in rows]
    second_sentences = [[f"{row['sent2']} {row[end]}" for end in ending_names] for row in rows]
    first_sentences = list(chain(*first_sentences))
    second_sentences = list(chain(*second_sentences))
    tokenized = tokenizer(first_sentences, second_sentences, truncation=True, max_length=max_seq_length)
    return {k: [v[i: i + 4] for i in range(0, len(v), 4)] for k, v in tokenized.items()}


def test_choice_files_are_tokenised_and_batched_as_run_swag_does(tiny_bert, swag):
    task = flaxheads.data.load_task(train_file=swag["train"])
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_bert)
    rows = [_swag_row(i) for i in range(24)]

    assert task.task == flaxheads.MULTIPLE_CHOICE and task.problem_type is None and task.num_labels == 4
    assert "'sent1'" in task.problem_type_reason and "'sent2' + 'ending0'..'ending3'" in task.problem_type_reason
    tokenized = data.tokenize_task(task, tokenizer, 24)["train"]
    expected = _run_swag_features(tokenizer, rows, 24)
    for name in ("input_ids", "attention_mask", "token_type_ids"):
        assert tokenized[name] == expected[name], name
    assert tokenized["labels"] == [row["label"] for row in rows]

    fmt = data.BatchFormat.for_task(task, tokenizer, 24)
    batch = next(data.eval_batches(tokenized, fmt, global_batch_size=8))
    assert batch["input_ids"].shape[:2] == (8, 4) and batch["labels"].shape == (8,)


def test_a_list_of_choices_reads_as_the_numbered_columns_do(tmp_path):
    rows = [_swag_row(i) for i in range(6)]
    listed = tmp_path / "listed.jsonl"
    listed.write_text("".join(json.dumps({"context": r["sent1"], "choices": [r[f"ending{k}"] for k in range(4)],
                                          "label": r["label"]}) + "\n" for r in rows), encoding="utf-8")
    numbered = _write_csv(tmp_path / "numbered.csv", rows)

    from_list = flaxheads.data.load_task(train_file=listed)
    from_columns = flaxheads.data.load_task(train_file=numbered, question_column=None, context_column="sent1",
                                            choice_columns=("ending0", "ending1", "ending2", "ending3"))

    assert from_list.task == flaxheads.MULTIPLE_CHOICE
    assert from_list.splits["train"]["choices"] == [[r[f"ending{k}"] for k in range(4)] for r in rows]
    assert from_columns.splits["train"]["choices"] == from_list.splits["train"]["choices"]
    assert from_list.splits["train"]["label"] == from_columns.splits["train"]["label"]


def _torch_batch(batch: dict) -> dict:
    return {k: torch.from_numpy(np.asarray(batch[k]).astype(np.int64))
            for k in ("input_ids", "attention_mask", "token_type_ids", "labels")}


@pytest.mark.slow
def test_a_train_step_has_the_loss_and_logits_of_pytorch_bert_for_multiple_choice(tiny_bert, swag, tmp_path):
    reference = transformers.BertForMultipleChoice.from_pretrained(tiny_bert, initializer_range=0.2).eval()
    randomize_(reference, seed=0)  # every parameter drawn, LayerNorm scales included: a swapped tensor shows
    reference.save_pretrained(tmp_path / "mc")
    model = flaxheads.MultipleChoice.from_pretrained(tmp_path / "mc")
    task = flaxheads.data.load_task(train_file=swag["train"])
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_bert)
    fmt = data.BatchFormat.for_task(task, tokenizer, 32)
    batch = next(data.eval_batches(data.tokenize_task(task, tokenizer, 32)["train"], fmt,
                                   global_batch_size=8))
    graphdef, params = nnx.split(model)
    step = jax.jit(make_train_step(graphdef, optax.sgd(0.0), optax.constant_schedule(0.0), CHOICE_OBJECTIVE))
    state = TrainState(jnp.zeros((), jnp.int32), params, optax.sgd(0.0).init(params))

    _, metrics = step(state, {k: v[None] for k, v in batch.items()}, jax.random.key(0))
    logits = make_eval_step(graphdef, CHOICE_OBJECTIVE)(params, batch)["logits"]
    with torch.no_grad():
        expected = reference(**_torch_batch(batch))

    print("max difference", np.max(np.abs(np.asarray(logits) - expected.logits.numpy())),
          abs(float(metrics["loss"]) - expected.loss.item()))
    assert np.ptp(expected.logits.numpy(), axis=-1).max() > 0.1  # the choices' scores differ: a real comparison
    np.testing.assert_allclose(np.asarray(logits), expected.logits.numpy(), atol=1e-5)
    np.testing.assert_allclose(float(metrics["loss"]), expected.loss.item(), atol=1e-5)
    np.testing.assert_allclose(float(flaxheads.tasks.choice.model.choice_loss(logits, jnp.asarray(batch["labels"]))),
                               expected.loss.item(), atol=1e-5)


@pytest.fixture(scope="module")
def choice_run(tiny_bert, swag, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("choice_run") / "run"
    code = main(["train", "--model_name_or_path", str(tiny_bert), *_data_flags(swag), "--output_dir", str(out),
                 "--max_seq_length", "32", "--per_device_train_batch_size", "8", "--per_device_eval_batch_size", "8",
                 "--learning_rate", "3e-3", "--max_steps", "6", "--logging_steps", "3", "--eval_steps", "3",
                 "--save_steps", "100", "--report_to", "none", "--disable_tqdm", "--do_predict", "--warmup_ratio",
                 "0"])
    assert code == 0
    return out


@pytest.mark.slow
def test_train_reports_accuracy_and_exports_a_transformers_bert_for_multiple_choice(choice_run, swag):
    results = json.loads((choice_run / "results.json").read_text())
    lines = (choice_run / "predict_results.txt").read_text().splitlines()
    test_rows = [_swag_row(i) for i in range(32, 38)]
    chosen = [int(line.split("\t")[1]) for line in lines[1:]]

    assert lines[0] == "index\tprediction\tchoice" and len(chosen) == len(test_rows)
    assert results["test"]["accuracy"] == np.mean([c == r["label"] for c, r in zip(chosen, test_rows)])
    assert set(results["validation"]) == {"accuracy", "loss"}
    assert results["best"]["metric"] == "accuracy" and results["steps"] == 6
    assert lines[1].split("\t")[2] == f"{test_rows[0]['sent2']} {test_rows[0][f'ending{chosen[0]}']}"

    reference = transformers.AutoModelForMultipleChoice.from_pretrained(choice_run).eval()
    assert type(reference).__name__ == "BertForMultipleChoice"
    tokenizer = transformers.AutoTokenizer.from_pretrained(choice_run)
    features = _run_swag_features(tokenizer, test_rows, 32)
    enc = tokenizer.pad({k: list(chain(*v)) for k, v in features.items()}, return_tensors="np")
    inputs = {k: v.reshape(len(test_rows), 4, -1) for k, v in enc.items()}
    ours = flaxheads.MultipleChoice.from_pretrained(choice_run)(inputs["input_ids"], inputs["attention_mask"],
                                                                 inputs["token_type_ids"])
    with torch.no_grad():
        theirs = reference(**{k: torch.from_numpy(v) for k, v in inputs.items()}).logits.numpy()
    print("max difference", np.max(np.abs(np.asarray(ours) - theirs)))
    np.testing.assert_allclose(np.asarray(ours), theirs, atol=1e-5)
    assert list(np.argmax(theirs, axis=-1)) == chosen


@pytest.mark.slow
def test_evaluate_and_predict_answer_as_the_run_did(choice_run, swag, capsys):
    results = json.loads((choice_run / "results.json").read_text())
    chosen = [int(line.split("\t")[1]) for line in (choice_run / "predict_results.txt").read_text().splitlines()[1:]]
    capsys.readouterr()

    assert main(["evaluate", "--model_name_or_path", str(choice_run), *_data_flags(swag), "--split", "test",
                 "--max_seq_length", "32"]) == 0
    evaluated = json.loads(capsys.readouterr().out)
    assert evaluated["accuracy"] == results["test"]["accuracy"]
    np.testing.assert_allclose(evaluated["loss"], results["test"]["loss"], rtol=1e-5)

    assert main(["predict", "--model_name_or_path", str(choice_run), "--input_file", str(swag["test"]),
                 "--max_seq_length", "32"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [row["label"] for row in rows] == chosen
    first = _swag_row(32)
    assert rows[0]["context"] == first["sent1"]
    assert rows[0]["choice"] == f"{first['sent2']} {first[f'ending{chosen[0]}']}"
    np.testing.assert_allclose(sum(rows[0]["probabilities"]), 1.0, rtol=1e-6)

    assert main(["predict", "--model_name_or_path", str(choice_run), "A man opens the door."]) == 2
    assert "multiple-choice model: give its examples as --input_file" in capsys.readouterr().err


@pytest.mark.slow
def test_the_trainer_trains_on_choices_held_in_python(tiny_bert):
    rows = [_swag_row(i) for i in range(8)]
    task = flaxheads.data.choice_task({"train": rows, "validation": rows[:4]})
    model = flaxheads.MultipleChoice.from_pretrained(tiny_bert)
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_bert)
    trainer = flaxheads.Trainer(model, TrainConfig(output_dir=None, max_steps=2, per_device_train_batch_size=4,
                                                   per_device_eval_batch_size=4, max_seq_length=32,
                                                   report_to="none", disable_tqdm=True),
                                task=task, tokenizer=tokenizer)

    trained, metrics, _ = trainer.train()

    assert isinstance(trained, flaxheads.MultipleChoice)
    assert set(metrics["validation"]) == {"accuracy", "loss"}
    with pytest.raises(NotImplementedError, match="choice_task"):
        trainer.evaluate(rows[:4])


# ---------------------------------------------------------------------------------------------
# Bad input: each refused naming the file, the row and the fix; nothing is written


def _refused(tiny_bert, tmp_path, capsys, train: Path, *flags: str) -> str:
    out = tmp_path / "run"
    code = main(["train", "--model_name_or_path", str(tiny_bert), "--train_file", str(train),
                 "--output_dir", str(out), *flags])
    assert code == 2
    assert not out.exists()
    return capsys.readouterr().err


def test_an_empty_choice_is_refused_naming_its_line_not_left_out(tiny_bert, tmp_path, capsys):
    rows = [_swag_row(i) for i in range(5)]
    rows[2]["ending1"] = ""
    err = _refused(tiny_bert, tmp_path, capsys, _write_csv(tmp_path / "train.csv", rows))

    assert "line 4 of " in err and "train.csv: the choice 'ending1' is empty" in err  # line 1 is the header
    assert "give every choice its text" in err


def test_a_list_of_choices_of_another_length_is_refused_naming_the_row(tiny_bert, tmp_path, capsys):
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps({"question": "q", "choices": ["a", "b", "c"][: 3 - (i == 1)], "label": 0})
                             + "\n" for i in range(3)), encoding="utf-8")
    err = _refused(tiny_bert, tmp_path, capsys, train)

    assert "line 2 of " in err and "train.jsonl has 2 choices and most rows have 3" in err


def test_a_label_outside_the_choices_is_refused_naming_the_row(tiny_bert, tmp_path, capsys):
    rows = [_swag_row(i) for i in range(5)]
    rows[4]["label"] = 4
    err = _refused(tiny_bert, tmp_path, capsys, _write_csv(tmp_path / "train.csv", rows))

    assert "line 6 of " in err and "train.csv: the label 4 is outside 0..3" in err and "counted from 0" in err


def test_a_missing_column_is_refused_naming_the_columns_found_and_the_flag(tiny_bert, tmp_path, capsys):
    rows = [{k: v for k, v in _swag_row(i).items() if k != "label"} for i in range(3)]
    train = _write_csv(tmp_path / "train.csv", rows, [c for c in SWAG_COLUMNS if c != "label"])
    err = _refused(tiny_bert, tmp_path, capsys, train)
    assert "has no column 'label'" in err and "'ending3'" in err and "--label_column" in err

    err = _refused(tiny_bert, tmp_path, capsys, _write_csv(tmp_path / "other.csv", [_swag_row(0)]),
                   "--choice_columns", "ending0", "ending9")
    assert "has no column 'ending9'" in err and "--choice_columns" in err


def test_choices_that_cannot_be_told_apart_are_refused_naming_both_sets(tmp_path):
    train = tmp_path / "train.jsonl"
    train.write_text(json.dumps({"context": "c", "choices": ["a", "b"], "option0": "a", "option1": "b", "label": 0})
                     + "\n", encoding="utf-8")

    with pytest.raises(ValueError, match=r"several sets of choice columns \('option0'..'option1', the list "
                                         r"'choices'\).*choice_columns="):
        flaxheads.data.load_task(train_file=train, task="multiple-choice")


def test_a_validation_file_with_another_number_of_choices_is_refused(tmp_path):
    train = _write_csv(tmp_path / "train.csv", [_swag_row(i) for i in range(3)])
    columns = [c for c in SWAG_COLUMNS if c != "ending3"]
    short = _write_csv(tmp_path / "dev.csv", [{k: _swag_row(0)[k] for k in columns}], columns)

    with pytest.raises(ValueError, match=r"dev.csv has no column 'ending3'"):
        flaxheads.data.load_task(train_file=train, validation_file=short)


def test_packing_and_a_sequence_classifier_are_refused_for_choices(tiny_bert, swag, tmp_path, capsys):
    err = _refused(tiny_bert, tmp_path, capsys, swag["train"], "--packing", "--max_seq_length", "32")
    assert "--packing" in err and "multiple choice" in err

    task = flaxheads.data.load_task(train_file=swag["train"])
    model = flaxheads.from_pretrained(tiny_bert, num_labels=4)
    with pytest.raises(ValueError, match=r"multiple-choice model learns.*MultipleChoice.from_pretrained"):
        flaxheads.Trainer(model, TrainConfig(output_dir=None), task=task,
                          tokenizer=transformers.AutoTokenizer.from_pretrained(tiny_bert))
