"""Training features crossed pairwise, for each task that accepts them: every pair of feature values
a task accepts trains, exports and reloads (the reloaded model's logits are the trained model's),
and every setting a task refuses is refused before training, naming the setting.

One run per pair would be hundreds of runs. The runs are a covering array of strength 2 instead
(`covering_array`): each run combines several features, and every pair of feature values a task
accepts is in at least one run. `test_the_runs_cover_every_pair_a_task_accepts` checks that, and
prints the runs (`pytest -s`). The features a task refuses, alone or as a pair, are the table
`REFUSED`; the array leaves those pairs out (`FORBIDDEN`), and each refusal is its own test.
A CI run trains a part of the runs (`@pytest.mark.matrix`, tests/conftest.py MATRIX_PARTS: about
half) that holds every value of every feature of every task; the parts together, every pair.

A run on several devices (2 fake CPU devices, under the `jit` or the `pmap` runner) needs its own
process (XLA_FLAGS are read when jax starts): those runs go, one after the other, in one
subprocess that starts with the file's first run and trains beside the one-device runs; each
writes what it trained, and the test of each checks it here.
"""

from __future__ import annotations

import contextlib
import csv
import io
import itertools
import json
import random
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from runs import cpu_devices_env, stopped_after_saving

pytestmark = pytest.mark.slow

TEXT, TOKEN, CHOICE = "text-classification", "token-classification", "multiple-choice"
SHORT = {TEXT: "text", TOKEN: "token", CHOICE: "choice"}

FEATURES: dict[str, list] = {
    "problem": ["single", "multi"],  # text classification's data: single-label or multi-label
    "class_weights": [False, True],
    "label_smoothing": [False, True],
    "best": [False, True],  # load_best_model_at_end with early stopping
    "calibrate": [False, True],
    "thresholds": [False, True],
    "lora": [False, True],
    "packing": [False, True],
    "accumulation": [1, 2],
    "dtype": ["float32", "bfloat16"],
    "devices": [1, 2],  # fake CPU devices
    "parallel": ["jit", "pmap"],  # the runner (training.parallel); pmap runs on one device too
    "resume": [False, True],  # stopped right after its first checkpoint, then run again
}
"""Each feature's values; the first is the feature left out."""

FIELDS: dict[str, Any] = {
    "class_weights": lambda on: {"class_weights": "balanced"} if on else {},
    "label_smoothing": lambda on: {"label_smoothing_factor": 0.1} if on else {},
    "best": lambda on: {"load_best_model_at_end": True, "early_stopping_patience": 1} if on else {},
    "calibrate": lambda on: {"calibrate": on},
    "thresholds": lambda on: {"tune_thresholds": on},
    "lora": lambda on: {"lora_r": 2, "lora_target_modules": ("query", "value")} if on else {},
    "packing": lambda on: {"packing": on},  # left out, a text classifier packs
    "accumulation": lambda steps: {"gradient_accumulation_steps": steps},
    "dtype": lambda dtype: {"dtype": dtype},
    "parallel": lambda runner: {"parallel": runner},
}
"""The TrainConfig fields that set each feature to a value. The problem, the devices and resume
are how a run is set up, not fields."""

ACCEPTED: dict[str, tuple[str, ...]] = {
    TEXT: tuple(FEATURES),
    TOKEN: ("best", "lora", "accumulation", "dtype", "devices", "parallel", "resume"),
    CHOICE: ("best", "lora", "accumulation", "dtype", "devices", "parallel", "resume"),
}
"""The features each task trains with (the others are refused: `REFUSED`)."""


def settings(features: dict[str, Any]) -> dict[str, Any]:
    """The TrainConfig fields of `features` (feature -> value)."""
    return {name: value for feature, on in features.items() if feature in FIELDS
            for name, value in FIELDS[feature](on).items()}


@dataclass(frozen=True)
class Refusal:
    task: str
    problem: str | None
    """Text classification's data ("single", "multi"); None for another task."""
    features: tuple[str, ...]
    error: str
    """What the error says (a regular expression): it names the setting."""


REFUSED: list[Refusal] = [
    Refusal(TEXT, "single", ("thresholds",), r"tune_thresholds=True tunes the decision thresholds of "
            r"multi_label_classification.*leave tune_thresholds out"),
    Refusal(TEXT, "multi", ("label_smoothing",), r"label_smoothing_factor=0.1 smooths single-label targets.*leave "
            r"it out"),
    *(Refusal(task, problem, ("best", "lora"), r"load_best_model_at_end=True with lora_r")
      for task, problem in ((TEXT, "single"), (TOKEN, None), (CHOICE, None))),
    *(Refusal(task, None, (feature,), error) for task in (TOKEN, CHOICE) for feature, error in (
        ("class_weights", r"class_weights='balanced' apply to text classification.*leave it out"),
        ("label_smoothing", r"label_smoothing_factor=0.1 apply to text classification.*leave it out"),
        ("calibrate", r"calibrate=True apply to text classification.*leave it out"),
        ("thresholds", r"tune_thresholds=True apply to text classification.*leave it out"),
        ("packing", r"packing=True.*does not apply to .*Train without packing"))),
]
"""What a task refuses before training: a feature alone, or a pair of features."""

FORBIDDEN: dict[str, list[tuple[tuple[str, Any], tuple[str, Any]]]] = {
    TEXT: [(("problem", "single"), ("thresholds", True)), (("problem", "multi"), ("label_smoothing", True)),
           (("best", True), ("lora", True))],
    TOKEN: [(("best", True), ("lora", True))],
    CHOICE: [(("best", True), ("lora", True))],
}
"""The pairs of feature values the covering arrays leave out: `REFUSED`'s pairs, and the data
each refused single feature needs."""

IMPLIED: dict[str, set] = {TEXT: {frozenset({("label_smoothing", True), ("thresholds", True)})}}
"""Pairs no data takes, implied by `FORBIDDEN` (label smoothing is single-label, thresholds
multi-label)."""

KNOWN_FAILURES: dict[str, str] = {}
"""Runs (by id) that should work and do not yet: the reason, shown as the test's xfail."""


# ---------------------------------------------------------------------------------------------
# The covering array


def covering_array(factors: dict[str, list], forbidden=(), *, tries: int = 40, seed: int = 3
                   ) -> tuple[list[dict[str, Any]], set]:
    """Rows (one value per factor) such that every pair of values of two factors is in a row,
    except the `forbidden` pairs ((factor, value), (factor, value)), which no row holds; and the
    pairs no row can hold without a forbidden pair, returned apart. Greedy (AETG's): each row is
    the best of `tries` candidates grown from an uncovered pair; the same seed, the same rows."""
    names = list(factors)
    forbidden = {frozenset(pair) for pair in forbidden}
    rng = random.Random(seed)

    def pairs(row: dict) -> set:
        return {frozenset(pair) for pair in itertools.combinations(row.items(), 2)}

    def allowed(row: dict) -> bool:
        return not pairs(row) & forbidden

    uncovered = {frozenset({(a, x), (b, y)}) for a, b in itertools.combinations(names, 2)
                 for x in factors[a] for y in factors[b]} - forbidden

    def grown(row: dict, order: list[str]) -> dict | None:  # depth first, so a constraint never strands it
        todo = [name for name in order if name not in row]
        if not todo:
            return row
        name, values = todo[0], list(factors[todo[0]])
        rng.shuffle(values)
        values.sort(key=lambda v: -sum(frozenset({(name, v), item}) in uncovered for item in row.items()))
        for value in values:
            if allowed({**row, name: value}) and (done := grown({**row, name: value}, order)) is not None:
                return done
        return None

    rows, impossible = [], set()
    while uncovered:
        best = None
        ordered = sorted(uncovered, key=lambda pair: sorted((names.index(f), str(v)) for f, v in pair))
        for _ in range(tries):
            start = rng.choice(ordered)
            order = names[:]
            rng.shuffle(order)
            row = grown(dict(start), order)
            if row is None:
                impossible.add(start)
                uncovered.discard(start)
                break
            if best is None or len(pairs(row) & uncovered) > len(pairs(best) & uncovered):
                best = row
        else:
            rows.append({name: best[name] for name in names})
            uncovered -= pairs(best)
    return rows, impossible


@dataclass(frozen=True)
class Run:
    id: str
    task: str
    features: dict[str, Any] = field(hash=False)

    @property
    def devices(self) -> int:
        return self.features["devices"]

    @property
    def problem(self) -> str | None:
        return self.features.get("problem")

    @property
    def axes(self) -> dict[str, Any]:
        """Each feature's value, by task and feature: the axes of the `matrix` marker (every run
        of CI trains every value of every feature of every task)."""
        return {f"{SHORT[self.task]}.{name}": value for name, value in self.features.items()}

    def __str__(self) -> str:
        on = [f if v is True else f"{f}={v}" for f, v in self.features.items()
              if v != FEATURES[f][0] or f in ("problem", "devices", "parallel")]
        return f"{self.id}: {', '.join(on)}"


def task_array(task: str) -> tuple[list[dict[str, Any]], set]:
    return covering_array({name: FEATURES[name] for name in ACCEPTED[task]}, FORBIDDEN[task])


RUNS: list[Run] = sorted(
    (Run(f"{SHORT[task]}-{i}", task, row) for task in ACCEPTED for i, row in enumerate(task_array(task)[0])),
    key=lambda run: run.devices)  # the one-device runs first: the others train meanwhile in their subprocess


# ---------------------------------------------------------------------------------------------
# Data and runs


SENTENCES = [("a gorgeous, moving film", ["positive"]), ("the worst plot ever, so dull", ["negative"]),
             ("what a great story", ["positive"]), ("tedious and dull", ["negative"])]
TAGGED = [("goal match", ["sports"]), ("vote law", ["politics"]), ("goal vote", ["politics", "sports"]),
          ("chip code", ["tech"]), ("code law", ["politics", "tech"]), ("match chip", ["sports", "tech"])]
ENDINGS = ["and walks inside.", "and throws it far.", "and starts to play.", "and drives away."]
ACTS = ["opens the door", "picks up a ball", "sits at the piano", "walks to the car"]


def write_data(folder: Path, conll: dict[str, Path]) -> dict[str, dict[str, str]]:
    """Each kind of data a run trains on, as TrainConfig fields: train and validation files."""
    folder.mkdir(parents=True, exist_ok=True)
    for split in ("train", "validation"):  # calibrate fits on 30 validation examples at least
        with open(folder / f"single_{split}.csv", "w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f)
            writer.writerow(["sentence", "label"])
            writer.writerows([text, labels[0]] for text, labels in SENTENCES * 8)
        (folder / f"multi_{split}.jsonl").write_text(
            "".join(json.dumps({"text": text, "tags": tags}) + "\n" for text, tags in TAGGED * 5))
        with open(folder / f"choice_{split}.csv", "w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f)
            writer.writerow(["sent1", "sent2", *(f"ending{k}" for k in range(4)), "label"])
            for i in range(16):
                act, label = i % 4, (i * 7) % 4
                endings = [e for k, e in enumerate(ENDINGS) if k != act]
                endings.insert(label, ENDINGS[act])
                writer.writerow([f"Someone {ACTS[act]}.", "Then the person", *endings, label])
    return {
        "single": {"train_file": str(folder / "single_train.csv"),
                   "validation_file": str(folder / "single_validation.csv"), "text_column": "sentence"},
        "multi": {"train_file": str(folder / "multi_train.jsonl"),
                  "validation_file": str(folder / "multi_validation.jsonl"), "label_column": "tags"},
        TOKEN: {"train_file": str(conll["train"]), "validation_file": str(conll["validation"])},
        CHOICE: {"train_file": str(folder / "choice_train.csv"), "validation_file": str(folder / "choice_validation.csv")},
    }


def config(model: Path, data: dict[str, dict[str, str]], task: str, problem: str | None, output_dir: Path,
           **overrides):
    """A TrainConfig of 4 steps of 8 examples a device (a checkpoint and an evaluation every 2)."""
    from flaxheads.training.config import TrainConfig

    return TrainConfig(**{
        **data[problem if task == TEXT else task], "model_name_or_path": str(model), "output_dir": str(output_dir),
        "max_seq_length": 32, "per_device_train_batch_size": 4, "per_device_eval_batch_size": 16,
        "learning_rate": 1e-3, "max_steps": 4, "logging_steps": 1, "save_steps": 2, "eval_steps": 2,
        "warmup_ratio": 0.0, "pad_to_multiple_of": 32, "disable_tqdm": True, "report_to": "none", "seed": 3, **overrides})


def probe(model_dir: Path, task: str) -> dict[str, np.ndarray]:
    """Inputs the trained and the reloaded model are compared on."""
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    if task == CHOICE:
        enc = tokenizer(["Someone opens the door."] * 2, ["Then the person and walks inside.",
                                                          "Then the person and drives away."],
                        padding=True, return_tensors="np")
        return {name: values[None] for name, values in enc.items()}  # one example of 2 choices
    return dict(tokenizer(["a gorgeous, moving film", "Anna met the EU in Paris ."], padding=True, return_tensors="np"))


def logits_of(model, inputs: dict[str, np.ndarray]) -> np.ndarray:
    """The model's logits on `inputs`, jitted (op by op, a forward compiles each op: seconds)."""
    from flax import nnx

    model.eval()
    forward = nnx.jit(lambda m, ids, mask, types: m(ids, mask, types))
    return np.asarray(forward(model, inputs["input_ids"], inputs["attention_mask"], inputs["token_type_ids"]),
                      np.float32)


def train_run(run: Run, model: Path, data: dict, output_dir: Path) -> dict[str, Any]:
    """Trains `run` into output_dir (stopped after its first checkpoint and run again with
    resume): {"results", "logits": the trained model's on `probe`, "printed"}."""
    from flaxheads.tasks.runs import Trainer

    cfg = config(model, data, run.task, run.problem, output_dir, **settings(run.features))
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        if run.features["resume"]:
            with stopped_after_saving(2):
                Trainer.from_config(cfg).train()
        trained = Trainer.from_config(cfg).train()
    return {"results": trained.metrics, "logits": logits_of(trained.model, probe(output_dir, run.task)).tolist(),
            "printed": printed.getvalue()}


def _train_in_subprocess(spec_file: str) -> None:
    """The runs of `spec_file` one after the other, each writing trained.json (or its error) in its
    output folder: the subprocess's work."""
    spec = json.loads(Path(spec_file).read_text())
    for entry in spec["runs"]:
        run, out = Run(entry["id"], entry["task"], entry["features"]), Path(entry["output_dir"])
        try:
            done = train_run(run, Path(spec["model"]), spec["data"], out)
        except BaseException as error:  # noqa: BLE001 (reported to the test of the run)
            done = {"error": f"{type(error).__name__}: {error}", "traceback": traceback.format_exc()}
        out.mkdir(parents=True, exist_ok=True)
        (out.parent / f"{out.name}.trained.tmp").write_text(json.dumps(done))
        (out.parent / f"{out.name}.trained.tmp").rename(out.parent / f"{out.name}.trained.json")


class DeviceJob:
    """The subprocess training the runs on 2 devices, one after the other, beside the one-device
    runs here (about as many: the two keep both cores busy); `trained(run)` waits for one."""

    def __init__(self, runs: list[Run], model: Path, data: dict, folder: Path):
        self.folder = folder
        spec = {"model": str(model), "data": data,
                "runs": [{"id": r.id, "task": r.task, "features": r.features, "output_dir": str(folder / r.id)}
                         for r in runs]}
        (folder / "spec.json").write_text(json.dumps(spec))
        code = (f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import test_feature_pairs as t; "
                f"t._train_in_subprocess({str(folder / 'spec.json')!r})")
        self.log = folder / "subprocess.log"
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen([sys.executable, "-c", code], env=cpu_devices_env(2), stdout=log,
                                         stderr=subprocess.STDOUT)

    def trained(self, run: Run, timeout: float = 600) -> dict[str, Any]:
        done = self.folder / f"{run.id}.trained.json"
        deadline = time.monotonic() + timeout
        while not done.exists():
            if self.proc.poll() is not None and not done.exists():
                pytest.fail(f"the 2-device subprocess ended ({self.proc.returncode}) before {run.id}:\n"
                            f"{self.log.read_text()[-4000:]}")
            if time.monotonic() > deadline:
                pytest.fail(f"{run.id} not trained after {timeout:.0f} s")
            time.sleep(0.5)
        return json.loads(done.read_text())

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


@pytest.fixture(scope="module")
def data(tmp_path_factory, conll) -> dict:
    return write_data(tmp_path_factory.mktemp("pairs_data"), conll)


@pytest.fixture(scope="module")
def device_job(request, tiny_bert, data, tmp_path_factory):
    """The subprocesses of the selected runs on 2 devices, started with the first run of the file."""
    selected = {item.callspec.params["run"].id for item in request.session.items
                if hasattr(item, "callspec") and isinstance(item.callspec.params.get("run"), Run)}
    job = DeviceJob([run for run in RUNS if run.devices > 1 and run.id in selected], tiny_bert, data,
                    tmp_path_factory.mktemp("two_devices"))
    yield job
    job.close()


# ---------------------------------------------------------------------------------------------
# The tests


def test_the_runs_cover_every_pair_a_task_accepts():
    for task, features in ACCEPTED.items():
        rows, impossible = task_array(task)
        allowed = {frozenset({(a, x), (b, y)}) for a, b in itertools.combinations(features, 2)
                   for x in FEATURES[a] for y in FEATURES[b]} - {frozenset(p) for p in FORBIDDEN[task]}
        covered = {frozenset(p) for row in rows for p in itertools.combinations(row.items(), 2)}
        assert allowed - impossible <= covered, task
        assert impossible == IMPLIED.get(task, set()), task
        assert not covered & {frozenset(p) for p in FORBIDDEN[task]}, task
        print(f"\n{task}: {len(rows)} runs cover {len(allowed - impossible)} pairs of feature values "
              f"({len(FORBIDDEN[task])} refused, {len(impossible)} that no data takes)")
        for run in RUNS:
            if run.task == task:
                print(f"  {run}")


# A part of the runs a CI run (tests/conftest.py, MATRIX_PARTS): every value of every feature of
# every task in each, every pair of them every MATRIX_PARTS runs (the whole covering array).
@pytest.mark.matrix("run.axes")
@pytest.mark.parametrize("run", RUNS, ids=lambda run: run.id)
def test_a_run_of_several_features_trains_exports_and_reloads_as_trained(run, tiny_bert, data, device_job,
                                                                        tmp_path):
    import flaxheads

    if run.id in KNOWN_FAILURES:
        pytest.xfail(KNOWN_FAILURES[run.id])
    print(run)
    if run.devices == 1:
        out = tmp_path / run.id
        trained = train_run(run, tiny_bert, data, out)
    else:
        out = device_job.folder / run.id
        trained = device_job.trained(run)
        assert "error" not in trained, f"{run}\n{trained.get('traceback')}"
    results = trained["results"]

    assert results["steps"] == 4 and json.loads((out / "results.json").read_text())["steps"] == 4
    assert json.loads((out / "run.json").read_text())["complete"]
    assert ("resuming from step 2" in trained["printed"]) == bool(run.features["resume"])
    assert "report/training_curves.png" in results["report"] and (out / "report" / "training_curves.png").is_file()
    assert ("exported_step" in results) == bool(run.features["best"])
    assert ("calibration" in results) == bool(run.features.get("calibrate"))
    assert ("thresholds" in results) == bool(run.features.get("thresholds"))

    reloaded = flaxheads.from_pretrained(out, task=run.task, dtype=run.features["dtype"])
    ours, theirs = logits_of(reloaded, probe(out, run.task)), np.asarray(trained["logits"], np.float32)
    print("max difference", np.abs(ours - theirs).max())
    tolerance = 5e-2 if run.features["dtype"] == "bfloat16" else 1e-5
    np.testing.assert_allclose(ours, theirs, atol=tolerance, rtol=tolerance)
    if run.features.get("thresholds"):
        assert reloaded.config.thresholds is not None and reloaded.config.thresholds == tuple(
            results["thresholds"]["per_label"][name]["threshold"] for name in reloaded.config.label_names)


@pytest.mark.parametrize("refusal", REFUSED, ids=lambda r: "-".join(
    [SHORT[r.task], *([r.problem] if r.problem else []), "+".join(r.features)]))
def test_a_refused_feature_is_refused_before_training_naming_the_setting(refusal, tiny_bert, data, tmp_path,
                                                                          monkeypatch):
    from flaxheads.tasks.runs import train
    from flaxheads.training import loop

    def no_step(*args, **kwargs):
        raise AssertionError("a training loop started")

    monkeypatch.setattr(loop.TrainLoop, "__init__", no_step)
    out = tmp_path / "run"
    on = settings({feature: FEATURES[feature][-1] for feature in refusal.features})

    with pytest.raises(ValueError, match=refusal.error):
        train(config(tiny_bert, data, refusal.task, refusal.problem, out, **on))
    assert not out.exists() or not any(out.iterdir())
