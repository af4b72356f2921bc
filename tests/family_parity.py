"""Helpers the backbone-family tests share: running a torch model and a flaxheads model on the same
inputs, comparisons that print the difference they measured, the command-line lifecycle and FSDP
on fake devices. The families themselves are in tests/families.py."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import jax.numpy as jnp
import numpy as np
import torch
from flax import nnx
from safetensors.torch import load_file

from runs import cpu_devices_env

ATOL = RTOL = 1e-5


def two_padded_rows(padding: str, *, seq_len: int = 11, seed: int = 0, pad_id: int = 0) -> dict[str, np.ndarray]:
    """Three rows of random ids; rows 1 and 2 (real lengths 7 and 4) padded on `padding`'s side
    ("none": no padding)."""
    rng = np.random.RandomState(seed)
    ids = rng.randint(3, 99, size=(3, seq_len)).astype(np.int64)
    mask = np.ones_like(ids)
    if padding != "none":
        for row, length in ((1, 7), (2, 4)):
            pads = slice(length, None) if padding == "right" else slice(0, seq_len - length)
            ids[row, pads], mask[row, pads] = pad_id, 0
    return {"input_ids": ids, "attention_mask": mask}


def torch_forward(model, batch, **kwargs):
    with torch.no_grad():
        return model(**{k: torch.as_tensor(v) for k, v in batch.items()}, **kwargs)


def torch_logits(model, batch) -> np.ndarray:
    return torch_forward(model, batch).logits.float().numpy()


def flax_inputs(batch) -> dict:
    return {k: jnp.asarray(v) for k, v in batch.items()}


def flax_logits(model, batch) -> np.ndarray:
    return np.asarray(model(**flax_inputs(batch)))


def assert_close(actual, expected, what: str, atol: float = ATOL, rtol: float = RTOL) -> None:
    actual, expected = np.asarray(actual, np.float32), np.asarray(expected, np.float32)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    print(f"{what}: max abs difference {np.max(np.abs(actual - expected)):.3g}")
    np.testing.assert_allclose(actual, expected, atol=atol, rtol=rtol, err_msg=what)


def state_dict(path) -> dict[str, torch.Tensor]:
    return load_file(path / "model.safetensors")


def assert_state_dicts_identical(actual: dict, expected: dict) -> None:
    assert sorted(actual) == sorted(expected)
    for name, tensor in expected.items():
        assert actual[name].dtype == tensor.dtype, name
        assert torch.equal(actual[name], tensor), name


def flat_params(model) -> dict:
    return {path: np.asarray(v[...]) for path, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}


def assert_same_params(a, b) -> None:
    pa, pb = flat_params(a), flat_params(b)
    assert pa.keys() == pb.keys() and all(np.array_equal(pa[k], pb[k]) for k in pa)


class CliResult(NamedTuple):
    source: Path
    """The checkpoint the run started from."""
    run: Path
    """The finished run's folder (its export)."""
    inspected: str
    """What `flaxheads inspect` printed about `source`."""
    train_err: str
    """What `flaxheads train` wrote to stderr."""
    texts: tuple[str, ...]
    """The texts `predict` was given."""


def check_cli_lifecycle(source, data: dict, tmp_path, capsys, *, model_type: str, head: str,
                        texts: tuple[str, ...] = ("a great film", "so dull, the worst plot"),
                        reference_options: dict | None = None) -> CliResult:
    """Runs `flaxheads inspect`, `train` (2 steps), `evaluate`, `predict` and `convert` (to a
    flaxheads checkpoint and back) on the family checkpoint `source`, which has its tokenizer next
    to it, with the `snippets_csv` files `data`. Asserts that the run exports `model_type`'s
    *ForSequenceClassification, evaluation reports accuracy, predicted probabilities equal
    transformers' on the exported run (loaded with `reference_options`; a tokenizer without a pad
    token pads with the exported pad_token_id, on the family's side), and the round trip is
    bit-identical with the tokenizer carried along."""
    import json

    import transformers

    from flaxheads.backbones import backbone_spec
    from flaxheads.cli import main

    assert main(["inspect", str(source), "--num_labels", "3"]) == 0
    inspected = capsys.readouterr().out
    assert f"model_type: {model_type}" in inspected and f"head shown: {head!r}" in inspected

    run = tmp_path / "run"
    common = ["--train_file", str(data["train"]), "--text_column", "sentence", "--max_seq_length", "32"]
    assert main(["train", "--model_name_or_path", str(source), *common, "--output_dir", str(run),
                 "--per_device_train_batch_size", "8", "--max_steps", "2", "--logging_steps", "1",
                 "--save_steps", "2", "--disable_tqdm"]) == 0
    train_err = capsys.readouterr().err
    exported = json.loads((run / "config.json").read_text())
    reference = transformers.AutoModelForSequenceClassification.from_pretrained(run, **(reference_options or {})).eval()
    assert exported["model_type"] == model_type and exported["architectures"] == [type(reference).__name__]

    assert main(["evaluate", "--model_name_or_path", str(run), *common, "--validation_file", str(data["validation"]),
                 "--split", "validation"]) == 0
    assert 0.0 <= json.loads(capsys.readouterr().out)["accuracy"] <= 1.0

    assert main(["predict", "--model_name_or_path", str(run), *texts]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["text"] for r in rows] == list(texts)
    tokenizer = transformers.AutoTokenizer.from_pretrained(run)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token_id = exported["pad_token_id"]
        tokenizer.padding_side = backbone_spec(model_type).padding_side
    enc = tokenizer(list(texts), padding=True, return_tensors="np")
    expected = torch.softmax(torch.as_tensor(torch_logits(reference, dict(enc))), -1).numpy()
    for row, p in zip(rows, expected):
        np.testing.assert_allclose(list(row["probabilities"].values()), p, atol=1e-5)

    assert main(["convert", str(run), str(tmp_path / "flax"), "--to", "flaxheads"]) == 0
    assert main(["convert", str(tmp_path / "flax"), str(tmp_path / "back"), "--to", "pytorch"]) == 0
    assert_state_dicts_identical(state_dict(tmp_path / "back"), state_dict(run))
    assert {p.name for p in run.glob("tokenizer*")} <= {p.name for p in (tmp_path / "back").iterdir()}
    capsys.readouterr()
    return CliResult(Path(source), run, inspected, train_err, tuple(texts))


def check_token_cli_lifecycle(source, conll: dict, tmp_path, capsys, *, architecture: str,
                              sentence: str = "Anna met the EU in Paris .", reference_options: dict | None = None
                              ) -> Path:
    """Runs `flaxheads train` (2 steps) on the `conll` files from the family checkpoint `source`,
    then `evaluate` and `predict` on the run without its train file (the tags come from the
    export). Asserts that the run exports `architecture`, evaluation repeats the run's own report,
    the logits of two padded sentences equal transformers' on the export (loaded with
    `reference_options`; a tokenizer without a pad token pads with the exported pad_token_id, on
    the family's side), and `predict` tags `sentence` as transformers' first subwords say.
    Returns the run's folder."""
    import json

    import transformers

    from flaxheads.backbones import backbone_spec
    from flaxheads.cli import main
    from flaxheads.tasks.token.model import TokenClassifier

    run = tmp_path / "token_run"
    assert main(["train", "--model_name_or_path", str(source), "--train_file", str(conll["train"]),
                 "--validation_file", str(conll["validation"]), "--output_dir", str(run), "--max_seq_length", "32",
                 "--per_device_train_batch_size", "8", "--max_steps", "2", "--logging_steps", "1", "--save_steps", "2",
                 "--report_to", "none", "--disable_tqdm"]) == 0
    results = json.loads((run / "results.json").read_text())
    exported = json.loads((run / "config.json").read_text())
    assert exported["architectures"] == [architecture]

    capsys.readouterr()
    assert main(["evaluate", "--model_name_or_path", str(run), "--validation_file", str(conll["validation"]),
                 "--split", "validation", "--max_seq_length", "32"]) == 0
    assert json.loads(capsys.readouterr().out)["report"] == results["reports"]["validation"]

    reference = transformers.AutoModelForTokenClassification.from_pretrained(run, **(reference_options or {})).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(run)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token_id = exported["pad_token_id"]
        tokenizer.padding_side = backbone_spec(exported["model_type"]).padding_side
    words = sentence.split()
    enc = tokenizer([words, words[:2]], is_split_into_words=True, padding=True, return_tensors="np")
    batch = {k: v for k, v in enc.items() if k in ("input_ids", "attention_mask", "token_type_ids")}
    expected = torch_logits(reference, batch)
    assert_close(flax_logits(TokenClassifier.from_pretrained(run), batch), expected, f"{architecture} export")

    capsys.readouterr()
    assert main(["predict", "--model_name_or_path", str(run), "--max_seq_length", "32", sentence]) == 0
    (row,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    first_subwords = {word: i for i, word in reversed(list(enumerate(enc.word_ids(0)))) if word is not None}
    names = [exported["id2label"][str(int(expected[0, first_subwords[w]].argmax()))] for w in range(len(words))]
    assert row["words"] == words and row["tags"] == names
    return run


_FSDP_FORWARD = """
import json, sys, traceback
import jax, jax.numpy as jnp, numpy as np
from flax import nnx
import flaxheads
from flaxheads.conversion.loading import flat_variables
from flaxheads.training.sharding import Layout

for job in json.loads(open(sys.argv[1]).read()):
    try:
        layout = Layout.create(job["layout"])
        # As the trainer loads a model: each parameter placed by the layout's rules.
        model = flaxheads.from_pretrained(job["path"], placement=layout.param_sharding, **job["options"])
        variables = {name: var[...] for name, (_, var) in flat_variables(model).items()}
        graphdef, state = nnx.split(model)
        batch = {k: jnp.asarray(v) for k, v in job["batch"].items()}
        logits = jax.jit(lambda s, b: nnx.merge(graphdef, s)(**b))(state, batch)
        # The train step's shardings: the same rules over the NNX state tree.
        tree = layout.tree_shardings(state)
        result = {
            "specs": {name: [str(a) for a in v.sharding.spec] for name, v in variables.items()
                      if not v.sharding.is_fully_replicated},
            "devices": len(jax.devices()),
            "tree": sorted(jax.tree_util.keystr(p, simple=True, separator=".").removesuffix(".value")
                           for p, s in jax.tree_util.tree_leaves_with_path(tree) if not s.is_fully_replicated),
            "logits": np.asarray(logits).tolist(),
        }
    except Exception:  # one family's failure is that family's test's, not every family's
        result = {"error": traceback.format_exc()}
    print(json.dumps(result), flush=True)
"""


class FsdpJob(NamedTuple):
    path: Path
    """A checkpoint folder."""
    batch: dict
    """numpy inputs to run through the sharded model."""
    layout: str = "fsdp=4"
    options: dict = {}
    """from_pretrained keyword arguments."""


def fsdp_on_fake_devices(jobs: list[FsdpJob], devices: int = 4) -> list[dict]:
    """Loads each job's checkpoint onto `devices` fake CPU devices with its layout's rules (in one
    subprocess: the device count is fixed when jax starts) and runs its batch through it under
    jit. Returns, per job, {"error": its traceback} if it failed, else {"specs": {parameter path:
    partition spec} of the split parameters, "split": their paths, "tree": the paths the train
    step's state shardings split, "logits": ...}."""
    import json
    import os
    import subprocess
    import sys
    import tempfile

    env = cpu_devices_env(devices)
    arguments = [{"path": str(job.path), "layout": job.layout, "options": job.options,
                  "batch": {k: np.asarray(v).tolist() for k, v in job.batch.items()}} for job in jobs]
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(arguments, f)
    try:
        proc = subprocess.run([sys.executable, "-c", _FSDP_FORWARD, f.name], env=env, capture_output=True, text=True,
                              timeout=600)
    finally:
        os.unlink(f.name)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(results) == len(jobs)
    for result in results:
        if "error" in result:
            continue
        assert result["devices"] == devices
        result["split"], result["tree"] = set(result["specs"]), set(result["tree"])
        result["logits"] = np.asarray(result["logits"], np.float32)
    return results
