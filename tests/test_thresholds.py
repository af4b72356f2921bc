"""Multi-label decision thresholds: each label's tuned threshold is the F1 maximum (a brute-force
search with scikit-learn agrees), the metrics, reports and predictions decide with it, the export
records it in config.json, and predict, evaluate and the pipeline apply it, saying 0.5 where none
were tuned."""

from __future__ import annotations

import json

import numpy as np
import pytest
import sklearn.metrics
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import flaxheads
from flaxheads import problem
from flaxheads import thresholds as thresholds_lib
from flaxheads.cli import main
from flaxheads.tasks.classification.model import ClassifierConfig
from flaxheads.training import class_metrics
from flaxheads.training import metrics as metrics_lib
from flaxheads.training.config import TrainConfig
from flaxheads.tasks.runs import train

NAMES = ("politics", "sports", "tech")


def _brute_force_best_f1(scores: np.ndarray, truth: np.ndarray) -> float:
    cuts = np.concatenate([[scores.min() - 1.0], np.unique(scores)])
    return max(sklearn.metrics.f1_score(truth, scores > cut, zero_division=0) for cut in cuts)


@pytest.mark.slow
def test_tuned_thresholds_reach_the_best_f1_of_every_label():
    rng = np.random.default_rng(0)
    z = rng.normal(size=(300, 3))
    labels = (z + rng.normal(size=z.shape) > 0.7).astype(np.float32)

    tuned = thresholds_lib.tune(z, labels, NAMES)

    decided = thresholds_lib.decide(z, tuned["thresholds"])
    for c, name in enumerate(NAMES):
        best = _brute_force_best_f1(z[:, c], labels[:, c] > 0.5)
        f1 = sklearn.metrics.f1_score(labels[:, c], decided[:, c])
        assert f1 == pytest.approx(best, abs=1e-12)
        assert tuned["per_label"][name]["f1"] == pytest.approx(f1, abs=1e-12)
        assert tuned["per_label"][name]["f1_at_default"] == pytest.approx(
            sklearn.metrics.f1_score(labels[:, c], z[:, c] > 0), abs=1e-12)
        assert tuned["per_label"][name]["f1"] >= tuned["per_label"][name]["f1_at_default"]


@settings(max_examples=60, deadline=None)
@given(scores=hnp.arrays(np.float64, st.integers(thresholds_lib.MIN_EXAMPLES, 60),
                         elements=st.sampled_from([-2.0, -0.5, 0.0, 0.25, 1.0, 3.0])),
       seed=st.integers(0, 2**16), share=st.sampled_from([0.02, 0.5, 0.98]))
def test_tuning_finds_the_f1_maximum_even_with_ties(scores, seed, share):
    truth = np.random.default_rng(seed).random(len(scores)) < share
    labels = np.stack([truth, np.arange(len(truth)) % 2 == 0], axis=1).astype(np.float32)  # "b": always tunable
    tuned = thresholds_lib.tune(np.stack([scores, scores], axis=1), labels, ["a", "b"])
    row = tuned["per_label"]["a"]
    if truth.all() or not truth.any():  # nothing to learn a threshold from: 0.5 kept, as for no positive
        assert row["threshold"] == 0.5 and not row["tuned"] and not row["at_bound"]
        return
    decided = thresholds_lib.decide(scores[:, None], tuned["thresholds"][:1])[:, 0]
    assert sklearn.metrics.f1_score(truth, decided) == pytest.approx(_brute_force_best_f1(scores, truth), abs=1e-12)
    assert row["at_bound"] == bool(decided.all())


def test_of_equally_good_thresholds_the_one_nearest_the_default_wins():
    # Positives at 1 and 2, negatives at -3 and -2: every cut in (-2, 1) is perfect; 0 is among them.
    scores = np.array([[-3.0], [-2.0], [1.0], [2.0]] * 8)
    tuned = thresholds_lib.tune(scores, np.array([[0], [0], [1], [1]] * 8), ["a"])
    assert tuned["thresholds"] == (pytest.approx(1 / (1 + np.exp(0.5))),)  # the midpoint -0.5 is nearest 0


def test_a_threshold_below_every_score_is_reported_at_the_bound_with_a_warning():
    # "a": positives score lowest, so predicting every text is its best F1; "b": positives score highest.
    scores = np.concatenate([np.linspace(-3, -1, 24), np.linspace(1, 3, 8)])
    labels = np.stack([np.arange(32) < 24, np.arange(32) >= 24], axis=1).astype(np.float32)

    tuned = thresholds_lib.tune(np.stack([scores, scores], axis=1), labels, ["a", "b"])

    assert tuned["per_label"]["a"]["at_bound"] and tuned["per_label"]["a"]["tuned"]
    assert tuned["per_label"]["b"]["at_bound"] is False and tuned["per_label"]["b"]["f1"] == 1.0
    assert thresholds_lib.decide(scores[:, None], tuned["thresholds"][:1]).all()
    assert len(tuned["warnings"]) == 1 and tuned["warnings"][0].startswith("a: its threshold")
    assert "at the bound of the search" in tuned["warnings"][0]


@pytest.mark.parametrize(("labels", "named"), [
    (np.eye(3)[np.arange(29) % 3], r"which has 29 example\(s\): too few to tune on \(at least 30\)"),
    (np.zeros((40, 3)), r"none of its labels \(politics, sports, tech\) is both present and absent"),
    (np.ones((40, 3)), r"none of its labels .* is both present and absent"),
])
def test_validation_labels_nothing_can_be_tuned_on_are_refused_with_the_fix(labels, named):
    with pytest.raises(ValueError, match=named + r".*or leave tune_thresholds out"):
        thresholds_lib.tune(np.zeros(labels.shape), labels, NAMES)


def test_a_run_whose_validation_split_cannot_tune_thresholds_is_refused_before_training(tiny_bert, tmp_path):
    data = _tagged(tmp_path)
    rows = [{"text": "goal match", "tags": ["sports"]}] * 40  # politics and tech absent, sports always present
    (tmp_path / "validation.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    with pytest.raises(ValueError, match=r"tune_thresholds=True tunes on the validation split, and none of its labels"):
        train(TrainConfig(model_name_or_path=str(tiny_bert), **data, output_dir=str(tmp_path / "run"), max_steps=1,
                          tune_thresholds=True))
    assert not (tmp_path / "run").exists()


def test_the_default_threshold_is_logit_above_zero_and_cutoffs_invert_the_sigmoid():
    logits = np.array([[-0.1, 0.0, 0.1]])
    assert thresholds_lib.decide(logits).tolist() == [[False, False, True]]
    assert thresholds_lib.decide(logits, None).tolist() == (logits > 0).tolist()
    cut = thresholds_lib.cutoffs([0.2, 0.5, 0.9], 3)
    np.testing.assert_allclose(1 / (1 + np.exp(-cut)), [0.2, 0.5, 0.9], rtol=1e-15)
    with pytest.raises(ValueError, match="2 decision thresholds for 3 labels"):
        thresholds_lib.cutoffs([0.2, 0.5], 3)
    with pytest.raises(ValueError, match="strictly between 0 and 1"):
        thresholds_lib.check([0.2, 1.0], 2)


def test_metrics_and_reports_decide_with_the_thresholds():
    rng = np.random.default_rng(3)
    logits = rng.normal(size=(120, 3))
    labels = (rng.random(logits.shape) < 0.4).astype(np.float32)
    thresholds = (0.3, 0.5, 0.7)
    decided = 1 / (1 + np.exp(-logits)) > np.array(thresholds)

    scores = metrics_lib.compute_metrics(problem.MULTI_LABEL, logits, labels, thresholds=thresholds)
    report = class_metrics.report(problem.MULTI_LABEL, logits, labels, NAMES, thresholds)

    assert scores["micro_f1"] == pytest.approx(sklearn.metrics.f1_score(labels, decided, average="micro"))
    assert scores["macro_f1"] == pytest.approx(sklearn.metrics.f1_score(labels, decided, average="macro"))
    assert scores["accuracy"] == pytest.approx(sklearn.metrics.accuracy_score(labels, decided))
    for c, name in enumerate(NAMES):
        assert report["per_class"][name]["f1"] == pytest.approx(sklearn.metrics.f1_score(labels[:, c], decided[:, c]))
    np.testing.assert_array_equal(metrics_lib.predictions(problem.MULTI_LABEL, logits, thresholds), decided)


def _config(**kwargs) -> ClassifierConfig:
    hf = {"model_type": "bert", "vocab_size": 50, "hidden_size": 8, "num_hidden_layers": 1,
          "num_attention_heads": 2, "intermediate_size": 16}
    return ClassifierConfig.from_hf_config(hf, default_head="pooler", num_labels=3, id2label=list(NAMES), **kwargs)


def test_config_json_records_thresholds_by_label_name_and_reads_them_back():
    import dataclasses

    config = dataclasses.replace(_config(problem_type=problem.MULTI_LABEL), thresholds=(0.25, 0.5, 0.75))
    hf = config.to_hf_config("BertForSequenceClassification")
    assert hf["flaxheads"]["thresholds"] == {"politics": 0.25, "sports": 0.5, "tech": 0.75}

    back = ClassifierConfig.from_hf_config(hf, default_head="pooler")
    assert back.thresholds == (0.25, 0.5, 0.75)
    # Loaded with other labels, or as another problem type, the thresholds no longer apply.
    assert ClassifierConfig.from_hf_config(hf, default_head="pooler", id2label=["a", "b", "c"]).thresholds is None
    assert ClassifierConfig.from_hf_config(hf, default_head="pooler",
                                           problem_type=problem.SINGLE_LABEL).thresholds is None
    hf["flaxheads"]["thresholds"] = {"politics": 0.25, "tech": 0.75}
    with pytest.raises(ValueError, match="flaxheads.thresholds name the labels .* id2label has"):
        ClassifierConfig.from_hf_config(hf, default_head="pooler")


def test_thresholds_on_a_model_that_is_not_multi_label_are_refused():
    import dataclasses

    with pytest.raises(ValueError, match="decision thresholds are for multi_label_classification"):
        dataclasses.replace(_config(problem_type=problem.SINGLE_LABEL), thresholds=(0.5, 0.5, 0.5))
    with pytest.raises(ValueError, match="2 decision thresholds for 3 labels"):
        dataclasses.replace(_config(problem_type=problem.MULTI_LABEL), thresholds=(0.5, 0.5))


# ---------------------------------------------------------------------------------------------
# A run that tunes them


def _tagged(tmp_path):
    rows = [{"text": "goal match", "tags": ["sports"]}, {"text": "vote law", "tags": ["politics"]},
            {"text": "goal vote", "tags": ["politics", "sports"]}, {"text": "chip code", "tags": ["tech"]},
            {"text": "code law", "tags": ["politics", "tech"]}, {"text": "match chip", "tags": ["sports", "tech"]}] * 5
    for split in ("train", "validation"):
        (tmp_path / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return dict(train_file=str(tmp_path / "train.jsonl"), validation_file=str(tmp_path / "validation.jsonl"),
                text_column="text", label_column="tags")


@pytest.mark.slow  # two tiny training runs
def test_a_run_tunes_exports_and_applies_thresholds(tiny_bert, tmp_path, capsys):
    data = _tagged(tmp_path)
    settings = dict(model_name_or_path=str(tiny_bert), **data, max_seq_length=16, per_device_train_batch_size=8,
                    learning_rate=1e-3, max_steps=6, disable_tqdm=True, seed=0)
    plain = train(TrainConfig(**settings, output_dir=str(tmp_path / "plain")))
    result = train(TrainConfig(**settings, output_dir=str(tmp_path / "tuned"), tune_thresholds=True))
    run = tmp_path / "tuned"

    tuned = result["thresholds"]
    assert tuned["tuned_on"] == "validation" and set(tuned["per_label"]) == set(NAMES)
    thresholds = tuple(tuned["per_label"][n]["threshold"] for n in NAMES)
    for name in NAMES:
        row = tuned["per_label"][name]
        assert row["f1"] >= row["f1_at_default"]
    # The same weights as the plain run; the validation metrics now decide with the thresholds.
    assert result["validation"]["loss"] == pytest.approx(plain["validation"]["loss"], rel=1e-6)
    assert result["validation"]["macro_f1"] == pytest.approx(
        np.mean([tuned["per_label"][n]["f1"] for n in NAMES]), abs=1e-9)
    exported = json.loads((run / "config.json").read_text())
    assert exported["flaxheads"]["thresholds"] == dict(zip(NAMES, thresholds))
    assert json.loads((run / "results.json").read_text())["thresholds"] == tuned
    assert "thresholds" not in json.loads((tmp_path / "plain" / "config.json").read_text())["flaxheads"]

    # flaxheads evaluate scores with them, as the run did.
    capsys.readouterr()
    assert main(["evaluate", "--model_name_or_path", str(run), "--train_file", data["train_file"],
                 "--validation_file", data["validation_file"], "--split", "validation",
                 "--text_column", "text", "--label_column", "tags", "--max_seq_length", "16"]) == 0
    assert json.loads(capsys.readouterr().out)["macro_f1"] == pytest.approx(result["validation"]["macro_f1"])

    # predict, the pipeline and the library decide with them, and say so.
    texts = ["goal vote", "chip code", "law"]
    assert main(["predict", "--model_name_or_path", str(run), *texts]) == 0
    out = capsys.readouterr()
    rows = [json.loads(line) for line in out.out.splitlines()]
    assert "tuned on validation data" in out.err
    pipe = flaxheads.pipeline(model=str(run))
    assert pipe.thresholds == dict(zip(NAMES, thresholds)) and pipe.thresholds_tuned
    answers = pipe(texts, apply_thresholds=True)
    for row, answer in zip(rows, answers):
        expected = [n for n, t in zip(NAMES, thresholds) if row["probabilities"][n] > t]
        assert row["labels"] == expected
        assert sorted(a["label"] for a in answer) == sorted(expected)
        assert all(a["threshold"] == pipe.thresholds[a["label"]] for a in answer)
        assert [a["score"] for a in answer] == sorted((a["score"] for a in answer), reverse=True)
    assert pipe(texts[0], apply_thresholds=True) == answers[0]

    # Without tuned thresholds, predict says 0.5 is used.
    assert main(["predict", "--model_name_or_path", str(tmp_path / "plain"), *texts]) == 0
    assert "0.5 for every label (none were tuned" in capsys.readouterr().err
    assert not flaxheads.pipeline(model=str(tmp_path / "plain")).thresholds_tuned

    # Training the tuned model further drops its thresholds, saying why.
    again = train(TrainConfig(**{**settings, "model_name_or_path": str(run)}, output_dir=str(tmp_path / "again")))
    assert "thresholds" not in json.loads((tmp_path / "again" / "config.json").read_text())["flaxheads"]
    assert "decision thresholds are dropped" in capsys.readouterr().err
    assert "thresholds" not in again


def test_tune_thresholds_is_refused_where_it_cannot_apply(tiny_bert, snippets_csv, tmp_path):
    single = dict(model_name_or_path=str(tiny_bert), train_file=str(snippets_csv["train"]),
                  validation_file=str(snippets_csv["validation"]), text_column="sentence",
                  output_dir=str(tmp_path / "a"), max_steps=1, tune_thresholds=True)
    with pytest.raises(ValueError, match="tune_thresholds=True tunes the decision thresholds of multi_label"):
        train(TrainConfig(**single))
    data = _tagged(tmp_path)
    with pytest.raises(ValueError, match="tune_thresholds=True tunes on the labelled validation split"):
        train(TrainConfig(model_name_or_path=str(tiny_bert), **{**data, "validation_file": None},
                          output_dir=str(tmp_path / "b"), max_steps=1, tune_thresholds=True))
    import transformers

    model = flaxheads.from_pretrained(tiny_bert, num_labels=3, problem_type=problem.MULTI_LABEL)
    rows = [{"text": "goal", "label": ["sports"]}, {"text": "law", "label": ["politics"]},
            {"text": "chip", "label": ["tech"]}]
    with pytest.raises(ValueError, match="do_train=False trains none"):
        flaxheads.Trainer(model, TrainConfig(output_dir=None, do_train=False, tune_thresholds=True),
                          eval_dataset=rows, tokenizer=transformers.AutoTokenizer.from_pretrained(tiny_bert))


def test_the_pipeline_refuses_thresholds_of_a_single_label_model(tiny_bert):
    model = flaxheads.from_pretrained(tiny_bert, num_labels=2, problem_type=problem.SINGLE_LABEL)
    pipe = flaxheads.pipeline(model=model, tokenizer=str(tiny_bert))
    with pytest.raises(ValueError, match="decision thresholds belong to multi_label_classification models"):
        pipe(["a"], apply_thresholds=True)
