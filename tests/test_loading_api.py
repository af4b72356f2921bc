"""The loading API as transformers users expect it: `SequenceClassifier.from_pretrained` with
`config=`, `id2label=`/`label2id=`, hub arguments and `trust_remote_code`, `save_pretrained`
with a tokenizer; and how loading is built: config.json read once, one call to the hub resolver.
(The import structure is checked in test_architecture.py.)"""

from __future__ import annotations

import inspect
import json
import pathlib
import re
import shutil

import numpy as np
import pytest
import transformers

import flaxheads
from flaxheads import convert as convert_module
from flaxheads.conversion import checkpoint_io, hub, loading
from flaxheads.tasks.classification.model import SequenceClassifier

from families import TINY_CONFIG

# ---------------------------------------------------------------------------------------------
# Structure


def test_from_pretrained_is_a_classmethod_that_builds_the_class_it_is_called_on(hf_checkpoint):
    class Subclass(SequenceClassifier):
        pass

    path = hf_checkpoint("BertForSequenceClassification", num_labels=2).path

    assert isinstance(inspect.getattr_static(SequenceClassifier, "from_pretrained"), classmethod)
    assert type(SequenceClassifier.from_pretrained(path)) is SequenceClassifier
    assert type(Subclass.from_pretrained(path)) is Subclass


def test_config_json_is_read_once_per_load_and_per_describe(hf_checkpoint, monkeypatch):
    path = hf_checkpoint("BertForSequenceClassification", num_labels=2).path
    reads = []
    read_config = checkpoint_io.read_config
    monkeypatch.setattr(checkpoint_io, "read_config", lambda folder: reads.append(folder) or read_config(folder))

    flaxheads.from_pretrained(path)
    loads = len(reads)
    convert_module.describe(path)

    assert (loads, len(reads) - loads) == (1, 1)


def test_hub_arguments_go_to_one_resolve_checkpoint_call(hf_checkpoint, monkeypatch):
    path = hf_checkpoint("BertForSequenceClassification", num_labels=2).path
    calls = []
    monkeypatch.setattr(hub, "resolve_checkpoint", lambda p, **kw: calls.append((p, kw)) or pathlib.Path(p))

    flaxheads.from_pretrained(path, revision="v1", cache_dir="/cache", token="secret", local_files_only=True)

    assert calls == [(path, dict(revision="v1", cache_dir="/cache", token="secret", local_files_only=True))]


def test_a_path_that_is_no_folder_is_refused_by_resolve_checkpoint(tmp_path):
    with pytest.raises(FileNotFoundError, match="no-such-model"):
        flaxheads.from_pretrained(tmp_path / "no-such-model", local_files_only=True)


# ---------------------------------------------------------------------------------------------
# Labels as transformers' PretrainedConfig has them


@pytest.fixture
def named_labels(hf_checkpoint, tmp_path):
    """A 3-label classifier whose config.json names its labels (transformers writes str ids)."""
    path = tmp_path / "named"
    shutil.copytree(hf_checkpoint("BertForSequenceClassification", num_labels=3).path, path)
    config = json.loads((path / "config.json").read_text())
    config.update(id2label={"0": "neg", "1": "neu", "2": "pos"}, label2id={"neg": 0, "neu": 1, "pos": 2})
    (path / "config.json").write_text(json.dumps(config))
    return path


@pytest.mark.parametrize("named", [True, False], ids=["named-labels", "default-labels"])
def test_id2label_label2id_and_num_labels_are_those_transformers_reads(named_labels, hf_checkpoint, named):
    path = named_labels if named else hf_checkpoint("BertForSequenceClassification", num_labels=3).path

    config = flaxheads.from_pretrained(path).config
    expected = transformers.AutoConfig.from_pretrained(path)

    assert config.id2label == expected.id2label and all(type(i) is int for i in config.id2label)
    assert config.label2id == expected.label2id
    assert config.num_labels == expected.num_labels == 3


@pytest.mark.parametrize("labels", [
    dict(id2label=["a", "b", "c"]),
    dict(id2label={0: "a", 1: "b", 2: "c"}),
    dict(id2label={"0": "a", "1": "b", "2": "c"}),
    dict(label2id={"a": 0, "b": 1, "c": 2}),
], ids=["id2label-list", "id2label-dict", "id2label-str-ids", "label2id"])
def test_labels_may_be_given_as_a_list_an_id2label_or_a_label2id_dict(named_labels, labels):
    config = flaxheads.from_pretrained(named_labels, **labels).config

    assert config.id2label == {0: "a", 1: "b", 2: "c"} and config.label2id == {"a": 0, "b": 1, "c": 2}
    assert config.label_names == ("a", "b", "c")


def test_id2label_with_ids_other_than_0_to_n_is_refused_naming_them(named_labels):
    with pytest.raises(ValueError, match=r"id2label has ids \[1, 2, 3\]; the ids must be 0\.\.2"):
        flaxheads.from_pretrained(named_labels, id2label={1: "a", 2: "b", 3: "c"})


# ---------------------------------------------------------------------------------------------
# config=


def test_config_from_transformers_sets_the_label_settings(hf_checkpoint):
    path = hf_checkpoint("BertModel").path
    given = transformers.AutoConfig.from_pretrained(
        path, id2label={0: "x", 1: "y", 2: "z"}, problem_type="multi_label_classification", classifier_dropout=0.3
    )

    config = flaxheads.from_pretrained(path, config=given).config

    assert config.id2label == given.id2label and config.num_labels == given.num_labels == 3
    # transformers leaves label2id as it was ({"LABEL_0": 0, ...}) when only id2label is given.
    assert config.label2id == {"x": 0, "y": 1, "z": 2}
    assert config.problem_type == "multi_label_classification"
    assert config.head_config().dropout_rate == 0.3


def test_config_given_as_a_dict_overrides_config_json_and_keyword_arguments_override_it(named_labels):
    config = flaxheads.from_pretrained(
        named_labels, config={"num_labels": 5, "problem_type": "regression", "pad_token_id": 3},
        ignore_mismatched_sizes=True, problem_type="multi_label_classification",
    ).config

    assert config.num_labels == 5 and config.label_names == tuple(f"LABEL_{i}" for i in range(5))
    assert config.backbone.pad_token_id == 3
    assert config.problem_type == "multi_label_classification"


@pytest.mark.slow
def test_config_of_the_same_checkpoint_loads_the_same_model(hf_checkpoint):
    path = hf_checkpoint("BertForSequenceClassification", num_labels=2).path
    ids = np.array([[2, 5, 7, 9, 3]])

    plain = flaxheads.from_pretrained(path)
    with_config = flaxheads.from_pretrained(path, config=transformers.AutoConfig.from_pretrained(path))

    np.testing.assert_array_equal(np.asarray(plain(ids)), np.asarray(with_config(ids)))


@pytest.mark.parametrize("field,value,has", [
    ("hidden_size", 64, "32"),
    ("num_hidden_layers", 3, "2"),
    ("vocab_size", 100, "99"),
    ("model_type", "gpt2", "'bert'"),
])
def test_config_contradicting_the_checkpoint_architecture_names_the_field_and_both_values(
        hf_checkpoint, field, value, has):
    path = hf_checkpoint("BertForSequenceClassification", num_labels=2).path

    with pytest.raises(ValueError, match=rf"config= sets {field}={value!r} but the checkpoint's config\.json has {has}"):
        flaxheads.from_pretrained(path, config={field: value})


def test_a_transformers_config_of_another_size_is_refused(hf_checkpoint):
    path = hf_checkpoint("BertForSequenceClassification", num_labels=2).path
    other = transformers.BertConfig(**{**TINY_CONFIG, "hidden_size": 64, "num_hidden_layers": 2})

    with pytest.raises(ValueError, match=r"hidden_size=64 .* has 32"):
        flaxheads.from_pretrained(path, config=other)


# ---------------------------------------------------------------------------------------------
# trust_remote_code


def test_trust_remote_code_true_is_refused_listing_the_architectures(hf_checkpoint):
    path = hf_checkpoint("BertForSequenceClassification", num_labels=2).path

    listed = re.escape(str(sorted(flaxheads.conversion.TABLES)))  # every family, as families are added
    with pytest.raises(ValueError, match=r"runs no code from checkpoints.*" + listed):
        flaxheads.from_pretrained(path, trust_remote_code=True)


def test_trust_remote_code_false_loads(hf_checkpoint):
    path = hf_checkpoint("BertForSequenceClassification", num_labels=2).path

    assert flaxheads.from_pretrained(path, trust_remote_code=False).config.num_labels == 2


# ---------------------------------------------------------------------------------------------
# save_pretrained(tokenizer=)


@pytest.mark.parametrize("save", ["method", "function"])
def test_save_pretrained_with_a_tokenizer_writes_one_folder_transformers_reads(tiny_bert, tmp_path, save):
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_bert)
    model = flaxheads.from_pretrained(tiny_bert, num_labels=2)
    out = tmp_path / "out"

    if save == "method":
        model.save_pretrained(out, tokenizer=tokenizer)
    else:
        flaxheads.save_pretrained(model, out, tokenizer=tokenizer)

    text = "Flax heads classify sentences."
    assert transformers.AutoTokenizer.from_pretrained(out)(text)["input_ids"] == tokenizer(text)["input_ids"]
    assert flaxheads.from_pretrained(out).config.num_labels == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no staging folder left behind


def test_a_tokenizer_that_fails_to_save_leaves_no_folder(hf_checkpoint, tmp_path):
    class Failing:
        def save_pretrained(self, folder):
            (pathlib.Path(folder) / "tokenizer.json").write_text("{")
            raise OSError("disk full")

    model = flaxheads.from_pretrained(hf_checkpoint("BertForSequenceClassification", num_labels=2).path)

    with pytest.raises(OSError, match="disk full"):
        model.save_pretrained(tmp_path / "new" / "out", tokenizer=Failing())

    assert list(tmp_path.iterdir()) == []


def test_id2label_and_label2id_that_disagree_are_refused(named_labels):
    with pytest.raises(ValueError, match=r"id2label .* and label2id .* disagree; pass one of them"):
        flaxheads.from_pretrained(named_labels, id2label=["a", "b", "c"], label2id={"a": 0, "b": 2, "c": 1})
