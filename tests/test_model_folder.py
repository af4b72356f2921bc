"""A command opens its model folder once (`conversion.model_folder.open_checkpoint`) and passes the
opened folder along: the folder is resolved once and its config.json parsed once, whatever the
command (train, evaluate, predict) or the pipeline asks of it (its task, labels, tokenizer,
weights). Counted by wrapping the two functions every read goes through."""

from __future__ import annotations

import collections
import os
import sys
from pathlib import Path

import pytest

import flaxheads
from flaxheads.cli import main
from flaxheads.conversion import checkpoint_io, hub
from flaxheads.conversion.model_folder import Checkpoint, open_checkpoint


def counting(monkeypatch) -> collections.Counter:
    """A Counter of ("resolve" | "read", folder): every resolve of a folder and parse of its
    config.json while `monkeypatch` holds (the functions are patched where they are looked up)."""
    counts: collections.Counter = collections.Counter()
    resolve, read = hub.resolve_checkpoint, checkpoint_io.read_config

    def counted_resolve(path, **options):
        folder = resolve(path, **options)
        counts["resolve", folder.resolve()] += 1
        return folder

    def counted_read(path):
        counts["read", Path(path).resolve()] += 1
        return read(path)

    monkeypatch.setattr(checkpoint_io, "read_config", counted_read)
    for module in [m for name, m in sys.modules.items() if name.startswith("flaxheads")]:
        if getattr(module, "resolve_checkpoint", None) is resolve:  # hub itself, and modules that imported it
            monkeypatch.setattr(module, "resolve_checkpoint", counted_resolve)
    return counts


def of(counts: collections.Counter, folder) -> dict[str, int]:
    folder = Path(folder).resolve()
    return {kind: counts[kind, folder] for kind in ("resolve", "read")}


def test_a_checkpoint_is_a_path_that_is_not_opened_again(tiny_bert, monkeypatch):
    counts = counting(monkeypatch)
    opened = open_checkpoint(tiny_bert)

    assert open_checkpoint(opened) is opened and os.fspath(opened) == str(tiny_bert) == str(opened)
    assert isinstance(opened, Checkpoint) and opened.task is None and opened.config["model_type"] == "bert"
    assert of(counts, tiny_bert) == {"resolve": 1, "read": 1}


def test_the_count_sees_every_open(tiny_bert, monkeypatch):
    """The checks below cannot pass vacuously: two opens count two of each."""
    counts = counting(monkeypatch)
    open_checkpoint(tiny_bert), open_checkpoint(str(tiny_bert))

    assert of(counts, tiny_bert) == {"resolve": 2, "read": 2}


@pytest.mark.slow
def test_train_evaluate_predict_and_the_pipeline_read_the_model_folder_once(tiny_bert, snippets_csv, tmp_path,
                                                                            monkeypatch, capsys):
    from flaxheads.tasks.runs import train
    from runs import four_step_config

    out = tmp_path / "run"
    with monkeypatch.context() as patched:
        counts = counting(patched)
        train(four_step_config(tiny_bert, snippets_csv, out, max_steps=2, save_steps=2))
    assert of(counts, tiny_bert) == {"resolve": 1, "read": 1}

    for command in (["evaluate", "--model_name_or_path", str(out), "--train_file", str(snippets_csv["train"]),
                     "--validation_file", str(snippets_csv["validation"]), "--text_column", "sentence",
                     "--split", "validation", "--max_seq_length", "32"],
                    ["predict", "--model_name_or_path", str(out), "a fine film", "dull"]):
        with monkeypatch.context() as patched:
            counts = counting(patched)
            assert main(command) == 0, capsys.readouterr().err
        assert of(counts, out) == {"resolve": 1, "read": 1}, command[0]

    with monkeypatch.context() as patched:
        counts = counting(patched)
        answer = flaxheads.pipeline("text-classification", model=str(out))("a fine film")
    assert of(counts, out) == {"resolve": 1, "read": 1}
    assert answer[0]["label"] in ("negative", "positive")


@pytest.mark.slow
def test_a_tagger_is_read_once_by_predict_and_evaluate(tiny_bert, conll, tmp_path, monkeypatch, capsys):
    out = tmp_path / "tagger"
    assert main(["train", "--model_name_or_path", str(tiny_bert), "--train_file", str(conll["train"]),
                 "--validation_file", str(conll["validation"]), "--output_dir", str(out), "--max_steps", "2",
                 "--max_seq_length", "32", "--per_device_train_batch_size", "4", "--report_to", "none",
                 "--disable_tqdm"]) == 0, capsys.readouterr().err

    for command in (["predict", "--model_name_or_path", str(out), "Peter lives in Berlin"],
                    ["evaluate", "--model_name_or_path", str(out), "--validation_file", str(conll["validation"]),
                     "--split", "validation", "--max_seq_length", "32"]):
        with monkeypatch.context() as patched:
            counts = counting(patched)
            assert main(command) == 0, capsys.readouterr().err
        assert of(counts, out) == {"resolve": 1, "read": 1}, command[0]
