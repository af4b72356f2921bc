"""The study's cells that train no network: the majority-class baseline, and the converged linear
probe (logistic regression, L-BFGS, on a head's frozen features; ridge regression for a
regression data set). Also the checkpoint copy whose pooler is left out, so that the "pooler"
head starts from a fresh dense layer (the `pooler_reinit` arm).

A head's features are what its output layer reads: the head with that Linear replaced by the
identity, in eval mode, on the pretrained backbone (fresh layers before it, e.g. the attention
head's query, at their seeded initialisation). The probe's regularisation strength is chosen on
the validation split only.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
from flax import nnx

from flaxheads.data.task import LABEL, TaskData, column_array

PROBE_STRENGTHS = (0.01, 0.1, 1.0, 10.0, 100.0)
"""Candidate inverse regularisation strengths C of the logistic probe (ridge: alpha = 1 / C)."""
PROBE_MAX_ITERATIONS = 2000


class _Identity(nnx.Module):
    def __call__(self, x):
        return x


def head_features(model, tokenizer, task: TaskData, *, max_seq_length: int, batch_size: int = 64) -> dict[str, np.ndarray]:
    """{split: (examples, features)} the model's head hands its output layer, for every split."""
    from flaxheads.tasks.classification.inference import TextScorer

    setattr(model.head, type(model.head).OUTPUT_LAYER, _Identity())
    scorer = TextScorer(model, tokenizer, max_seq_length=max_seq_length, batch_size=batch_size,
                        source="the study's probe")
    features = {}
    for name, split in task.splits.items():
        pairs = split["text_pair"] if "text_pair" in split.column_names else None
        features[name] = scorer.logits(split["text"], pairs)
    return features


def majority_predictions(task: TaskData) -> dict[str, np.ndarray]:
    """{split: predictions} of the majority-class baseline: the train split's most frequent class
    (regression: the train mean) for every example."""
    labels = column_array(task.splits["train"], LABEL)
    if task.problem_type == "regression":
        constant = float(labels.mean())
    else:
        constant = int(np.bincount(labels.astype(int), minlength=task.num_labels).argmax())
    return {name: np.full(len(split), constant) for name, split in task.splits.items()}


def linear_probe_predictions(features: dict[str, np.ndarray], task: TaskData) -> tuple[dict[str, np.ndarray], float]:
    """({split: predictions}, chosen C) of a linear model fitted on the standardised train
    features; C from PROBE_STRENGTHS by validation metric (ties: the stronger regularisation)."""
    from sklearn.linear_model import LogisticRegression, Ridge
    from sklearn.preprocessing import StandardScaler

    scaler = StandardScaler().fit(features["train"])
    scaled = {name: scaler.transform(values) for name, values in features.items()}
    train_labels = column_array(task.splits["train"], LABEL)
    regression = task.problem_type == "regression"
    best = None
    for strength in PROBE_STRENGTHS:
        if regression:
            model = Ridge(alpha=1.0 / strength)
        else:
            model = LogisticRegression(C=strength, solver="lbfgs", max_iter=PROBE_MAX_ITERATIONS)
        model.fit(scaled["train"], train_labels)
        predictions = {name: model.predict(values) for name, values in scaled.items()}
        score = primary_score(predictions["validation"], column_array(task.splits["validation"], LABEL), regression)
        if best is None or score > best[0]:
            best = (score, predictions, strength)
    return best[1], best[2]


def primary_score(predictions: np.ndarray, labels: np.ndarray, regression: bool) -> float:
    """Accuracy, or Pearson's r for regression (nan for constant predictions)."""
    if regression:
        if np.std(predictions) == 0 or np.std(labels) == 0:
            return float("nan")
        return float(np.corrcoef(predictions, labels)[0, 1])
    return float(np.mean(predictions == labels))


def split_metrics(predictions: dict[str, np.ndarray], task: TaskData) -> dict[str, dict[str, Any]]:
    """{split: {metric: value}} in the names the Trainer's records use (accuracy / pearson)."""
    regression = task.problem_type == "regression"
    name = "pearson" if regression else "accuracy"
    return {split: {name: primary_score(values, column_array(task.splits[split], LABEL), regression)}
            for split, values in predictions.items() if split in ("validation", "test")}


def checkpoint_without_pooler(source: Path, target: Path) -> Path:
    """A copy of the checkpoint folder `source` in `target` whose weights lack the pooler's
    tensors (the conversion table's pooler rows), so that the "pooler" head loads a fresh dense
    layer there; made once, reused after. ValueError for a checkpoint without a pooler or with
    other weight files than one model.safetensors."""
    import json

    from safetensors.numpy import load_file, save_file

    from flaxheads.conversion import architecture_table
    from flaxheads.conversion.table import expand

    if (target / "model.safetensors").is_file():
        return target
    weights = source / "model.safetensors"
    if not weights.is_file():
        raise ValueError(f"{source}: the pooler_reinit arm reads a checkpoint of one model.safetensors file")
    table = architecture_table(json.loads((source / "config.json").read_text())["model_type"])
    pooler = {rule.hf for base in ("", f"{table.base_prefix}.") for rule in expand(table.pooler, base=base)}
    tensors = load_file(weights)
    kept = {name: value for name, value in tensors.items() if name not in pooler}
    if len(kept) == len(tensors):
        raise ValueError(f"{source}: no pooler tensors ({sorted(pooler)}) to leave out")
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    shutil.copytree(source, partial, ignore=shutil.ignore_patterns("model.safetensors", "*.bin", "*.h5", "*.msgpack"))
    save_file(kept, partial / "model.safetensors", metadata={"format": "pt"})
    partial.rename(target)
    return target
