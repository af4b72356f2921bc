"""Every way a load or save can go wrong ends in an error that names the key, file or setting."""

from __future__ import annotations

import json
import os
import re
import shutil
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx
from safetensors.torch import load_file, save_file

import flaxheads
from flaxheads.conversion import checkpoint_io

CLASSIFIER = {"bert": "BertForSequenceClassification", "roberta": "RobertaForSequenceClassification"}


@pytest.fixture
def bert_copy(hf_checkpoint, tmp_path):
    """A private copy of a 2-label BertForSequenceClassification directory, free to damage."""
    path = tmp_path / "bert"
    shutil.copytree(hf_checkpoint(CLASSIFIER["bert"], num_labels=2).path, path)
    return path


def edit_config(path, **changes) -> None:
    config = json.loads((path / "config.json").read_text())
    config.update(changes)
    (path / "config.json").write_text(json.dumps(config))


def edit_weights(path, edit) -> None:
    tensors = load_file(path / "model.safetensors")
    edit(tensors)
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})


# ---------------------------------------------------------------------------------------------
# Configuration


def test_unknown_model_type_lists_the_supported_ones(bert_copy):
    edit_config(bert_copy, model_type="gpt_neox")

    with pytest.raises(ValueError, match=r"model_type 'gpt_neox'.*bert.*roberta"):
        flaxheads.from_pretrained(bert_copy)


def test_relative_position_embeddings_are_not_implemented(bert_copy):
    edit_config(bert_copy, position_embedding_type="relative_key")

    with pytest.raises(NotImplementedError, match="position_embedding_type='relative_key'"):
        flaxheads.from_pretrained(bert_copy)


def test_decoder_config_is_not_implemented(bert_copy):
    edit_config(bert_copy, is_decoder=True)

    with pytest.raises(NotImplementedError, match="is_decoder"):
        flaxheads.from_pretrained(bert_copy)


def test_missing_config_json_names_the_file(bert_copy):
    (bert_copy / "config.json").unlink()

    with pytest.raises(flaxheads.CheckpointError, match=re.escape(f"{bert_copy} has no config.json")):
        flaxheads.from_pretrained(bert_copy)


def test_invalid_config_json_names_the_file(bert_copy):
    (bert_copy / "config.json").write_text("{not json")

    with pytest.raises(flaxheads.CheckpointError, match=r"config\.json is not valid JSON"):
        flaxheads.from_pretrained(bert_copy)


def test_path_that_does_not_exist_is_file_not_found(tmp_path):
    missing = tmp_path / "no-such-model"

    with pytest.raises(FileNotFoundError, match=re.escape(str(missing))):
        flaxheads.from_pretrained(missing)


def test_directory_without_weights_lists_the_expected_files(bert_copy):
    (bert_copy / "model.safetensors").unlink()

    with pytest.raises(flaxheads.CheckpointError, match=r"has no weights.*model\.safetensors.*pytorch_model\.bin"):
        flaxheads.from_pretrained(bert_copy)


# ---------------------------------------------------------------------------------------------
# Weights that do not fit the config


def test_missing_backbone_tensor_is_named(bert_copy):
    edit_weights(bert_copy, lambda t: t.pop("bert.encoder.layer.1.attention.self.value.bias"))

    with pytest.raises(flaxheads.CheckpointError, match=r"bert\.encoder\.layer\.1\.attention\.self\.value\.bias"):
        flaxheads.from_pretrained(bert_copy)


def test_missing_backbone_tensor_is_an_error_even_for_load_backbone(bert_copy):
    edit_weights(bert_copy, lambda t: t.pop("bert.embeddings.LayerNorm.weight"))

    with pytest.raises(flaxheads.CheckpointError, match=r"bert\.embeddings\.LayerNorm\.weight"):
        flaxheads.load_backbone(bert_copy)


def test_config_that_disagrees_with_weights_names_key_and_both_shapes(bert_copy):
    edit_config(bert_copy, intermediate_size=40)

    with pytest.raises(flaxheads.ShapeMismatch) as err:
        flaxheads.from_pretrained(bert_copy)

    message = str(err.value)
    assert "bert.encoder.layer.0.intermediate.dense.weight" in message
    assert "(37, 32)" in message and "(40, 32)" in message


def test_wrong_shape_backbone_tensor_names_key_and_both_shapes(bert_copy):
    name = "bert.embeddings.position_embeddings.weight"

    def shrink(tensors):
        tensors[name] = tensors[name][:50]

    edit_weights(bert_copy, shrink)

    with pytest.raises(flaxheads.ShapeMismatch, match=r"position_embeddings\.weight.*\(50, 32\).*\(64, 32\)"):
        flaxheads.from_pretrained(bert_copy)


def test_wrong_shape_backbone_tensor_is_not_ignored_by_ignore_mismatched_sizes(bert_copy):
    edit_config(bert_copy, intermediate_size=40)

    with pytest.raises(flaxheads.ShapeMismatch, match="intermediate"):
        flaxheads.from_pretrained(bert_copy, ignore_mismatched_sizes=True)


@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_classifier_of_another_size_says_num_labels_and_ignore_mismatched_sizes(hf_checkpoint, family):
    checkpoint = hf_checkpoint(CLASSIFIER[family], num_labels=2)

    with pytest.raises(flaxheads.ShapeMismatch) as err:
        flaxheads.from_pretrained(checkpoint.path, num_labels=5)

    message = str(err.value)
    assert "num_labels" in message and "ignore_mismatched_sizes=True" in message
    assert re.search(r"(classifier\.weight|out_proj\.weight)", message)
    assert "(2, 32)" in message and "(5, 32)" in message


@pytest.mark.slow
@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_ignore_mismatched_sizes_starts_a_new_classifier_and_reports_it(hf_checkpoint, family):
    checkpoint = hf_checkpoint(CLASSIFIER[family], num_labels=2)
    out_proj = {"bert": "classifier", "roberta": "classifier.out_proj"}[family]

    model, info = flaxheads.from_pretrained(
        checkpoint.path, num_labels=5, ignore_mismatched_sizes=True, output_loading_info=True
    )

    assert model.config.num_labels == 5
    assert model(jnp.full((2, 6), 5)).shape == (2, 5)
    assert sorted(info.mismatched) == [
        (f"{out_proj}.bias", (2,), (5,)),
        (f"{out_proj}.weight", (2, 32), (5, 32)),
    ]
    assert f"{out_proj}.weight" not in info.loaded
    assert not info.fully_pretrained
    assert "must be trained" in str(info) and "(2, 32)" in str(info)
    # Everything else still comes from the checkpoint, the pooler / dense layer included.
    pooler = {"bert": "bert.pooler.dense.weight", "roberta": "classifier.dense.weight"}[family]
    assert pooler in info.loaded


# ---------------------------------------------------------------------------------------------
# Damaged or unreadable weight files


@pytest.mark.parametrize("keep", ["half", "all but the last 100 bytes"])
def test_truncated_safetensors_is_a_checkpoint_error_naming_the_file(bert_copy, keep):
    weights = bert_copy / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2] if keep == "half" else data[:-100])

    with pytest.raises(flaxheads.CheckpointError, match=re.escape(str(weights))):
        flaxheads.from_pretrained(bert_copy)


def test_garbage_safetensors_is_a_checkpoint_error_naming_the_file(bert_copy):
    weights = bert_copy / "model.safetensors"
    weights.write_bytes(b"\x00\xff" * 5000)

    with pytest.raises(flaxheads.CheckpointError, match=re.escape(str(weights))):
        flaxheads.from_pretrained(bert_copy)


def test_missing_shard_is_named(hf_checkpoint, tmp_path):
    hf_checkpoint(CLASSIFIER["bert"], num_labels=2).model.save_pretrained(tmp_path, max_shard_size="20KB")
    shard = sorted(tmp_path.glob("model-*-of-*.safetensors"))[1]
    shard.unlink()

    with pytest.raises(flaxheads.CheckpointError, match=re.escape(shard.name)):
        flaxheads.from_pretrained(tmp_path)


def test_pytorch_bin_without_torch_names_the_extra(hf_checkpoint, tmp_path, monkeypatch):
    checkpoint = hf_checkpoint(CLASSIFIER["bert"], num_labels=2)
    torch.save(checkpoint.model.state_dict(), tmp_path / "pytorch_model.bin")
    shutil.copy(checkpoint.path / "config.json", tmp_path)
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` now raises ImportError

    with pytest.raises(flaxheads.CheckpointError, match=re.escape("flaxheads[torch]")) as err:
        flaxheads.from_pretrained(tmp_path)

    assert "pytorch_model.bin" in str(err.value)


def test_corrupt_pytorch_bin_is_a_checkpoint_error_naming_the_file(bert_copy):
    (bert_copy / "model.safetensors").unlink()
    (bert_copy / "pytorch_model.bin").write_bytes(b"not a pickle at all")

    with pytest.raises(flaxheads.CheckpointError, match=r"pytorch_model\.bin"):
        flaxheads.from_pretrained(bert_copy)


# ---------------------------------------------------------------------------------------------
# Heads and settings


def test_unknown_head_lists_the_known_heads(bert_copy):
    with pytest.raises(ValueError, match=r"unknown head 'attention_pool'.*concat_last4"):
        flaxheads.from_pretrained(bert_copy, head="attention_pool")


def test_concat_last4_on_two_layers_says_it_needs_four(bert_copy):
    with pytest.raises(ValueError, match=r"concat_last4.*at least 4 layers.*has 2"):
        flaxheads.from_pretrained(bert_copy, head="concat_last4")


def test_unknown_problem_type_is_named(bert_copy):
    with pytest.raises(ValueError, match=r"problem_type='ordinal'"):
        flaxheads.from_pretrained(bert_copy, problem_type="ordinal")


def test_id2label_of_the_wrong_length_names_num_labels(bert_copy):
    with pytest.raises(ValueError, match=r"id2label has 3 names but num_labels=2"):
        flaxheads.from_pretrained(bert_copy, num_labels=2, id2label=["a", "b", "c"])


def test_unknown_save_format_is_refused(bert_copy, tmp_path):
    model = flaxheads.from_pretrained(bert_copy)

    with pytest.raises(ValueError, match=r"format='onnx'"):
        model.save_pretrained(tmp_path / "out", format="onnx")


@pytest.mark.parametrize(("first", "second"), [("pytorch", "flaxheads"), ("flaxheads", "pytorch")])
def test_saving_into_a_directory_of_the_other_format_is_refused(bert_copy, tmp_path, first, second):
    model = flaxheads.from_pretrained(bert_copy)
    model.save_pretrained(tmp_path / "out", format=first)

    with pytest.raises(FileExistsError, match=re.escape(str(tmp_path / "out"))):
        model.save_pretrained(tmp_path / "out", format=second)


# ---------------------------------------------------------------------------------------------
# config.json, shard indexes and legacy PyTorch files


@pytest.mark.parametrize("content", ["[1, 2]", '"x"', "null", "3"])
def test_config_json_that_is_not_an_object_is_named_and_must_be_an_object(bert_copy, content):
    (bert_copy / "config.json").write_text(content)

    with pytest.raises(flaxheads.CheckpointError, match=r"config\.json holds .*must be a JSON object") as err:
        flaxheads.from_pretrained(bert_copy)

    assert str(bert_copy / "config.json") in str(err.value)


@pytest.fixture
def sharded_bert(hf_checkpoint, tmp_path):
    """A BERT classifier saved in 20 KB safetensors shards with model.safetensors.index.json."""
    hf_checkpoint(CLASSIFIER["bert"], num_labels=2).model.save_pretrained(tmp_path, max_shard_size="20KB")
    return tmp_path


def edit_index(path, edit) -> None:
    index_file = path / "model.safetensors.index.json"
    index = json.loads(index_file.read_text())
    index_file.write_text(json.dumps(edit(index)))


@pytest.mark.parametrize(
    "edit",
    [
        lambda index: [index],
        lambda index: {"metadata": index["metadata"]},
        lambda index: {**index, "weight_map": list(index["weight_map"])},
        lambda index: {**index, "weight_map": {**index["weight_map"], "bert.pooler.dense.bias": 3}},
    ],
    ids=["index is a list", "no weight_map", "weight_map is a list", "shard name is a number"],
)
def test_shard_index_without_a_weight_map_of_names_to_files_is_refused(sharded_bert, edit):
    edit_index(sharded_bert, edit)

    with pytest.raises(flaxheads.CheckpointError, match=r"index\.json is not a valid shard index: it needs a \"weight_map\""):
        flaxheads.from_pretrained(sharded_bert)


def test_index_naming_a_tensor_its_shard_lacks_names_tensor_shard_and_index(sharded_bert):
    index = json.loads((sharded_bert / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    name = next(n for n, shard in index["weight_map"].items() if shard == shards[0])
    edit_index(sharded_bert, lambda index: {**index, "weight_map": {**index["weight_map"], name: shards[1]}})

    with pytest.raises(flaxheads.CheckpointError) as err:
        flaxheads.from_pretrained(sharded_bert)

    message = str(err.value)
    assert repr(name) in message and str(sharded_bert / shards[1]) in message
    assert "model.safetensors.index.json" in message and "re-export" in message


def test_legacy_pytorch_bin_loads_with_identical_tensors(hf_checkpoint, tmp_path):
    state = hf_checkpoint(CLASSIFIER["bert"], num_labels=2).model.state_dict()
    torch.save(state, tmp_path / "pytorch_model.bin", _use_new_zipfile_serialization=False)

    reader = checkpoint_io.open_weights(tmp_path, "pytorch_model.bin")

    assert sorted(reader.names) == sorted(state)
    for name, tensor in state.items():
        assert np.array_equal(reader.read(name), tensor.numpy()), name


class _RunsAShellCommand:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_legacy_pytorch_bin_with_a_malicious_pickle_is_refused_without_running_it(hf_checkpoint, tmp_path):
    checkpoint = hf_checkpoint(CLASSIFIER["bert"], num_labels=2)
    marker = tmp_path / "payload-ran"
    state = {**checkpoint.model.state_dict(), "evil": _RunsAShellCommand(marker)}
    torch.save(state, tmp_path / "pytorch_model.bin", _use_new_zipfile_serialization=False)
    shutil.copy(checkpoint.path / "config.json", tmp_path)

    with pytest.raises(flaxheads.CheckpointError, match=r"(?s)weights_only=True.*holds objects other than tensors"):
        flaxheads.from_pretrained(tmp_path)

    assert not marker.exists()


# ---------------------------------------------------------------------------------------------
# Weights deeper than config.json


def _deep_checkpoint(family: str, path) -> tuple[str, str]:
    """A 4-layer random checkpoint of `family` whose config.json then says 2 layers; returns the
    config key and the name prefix of layer 3's tensors."""
    torch.manual_seed(0)
    if family == "gpt2":
        config = transformers.GPT2Config(vocab_size=99, n_embd=32, n_layer=4, n_head=4, n_positions=64, n_inner=37)
        model, key, deepest = transformers.GPT2ForSequenceClassification(config), "n_layer", "transformer.h.3."
    elif family == "xlnet":
        config = transformers.XLNetConfig(vocab_size=99, d_model=32, n_head=4, d_inner=37, n_layer=4)
        model, key, deepest = transformers.XLNetForSequenceClassification(config), "n_layer", "transformer.layer.3."
    else:
        classes = {"bert": transformers.BertForSequenceClassification, "roberta": transformers.RobertaForSequenceClassification}
        config = classes[family].config_class(
            vocab_size=99, hidden_size=32, num_attention_heads=4, intermediate_size=37, max_position_embeddings=64,
            num_hidden_layers=4, pad_token_id=1,
        )
        model, key, deepest = classes[family](config), "num_hidden_layers", f"{family}.encoder.layer.3."
    model.save_pretrained(path)
    edit_config(path, **{key: 2})
    return key, deepest


@pytest.mark.parametrize("family", ["bert", "roberta", "gpt2", "xlnet"])
@pytest.mark.parametrize("load", [flaxheads.from_pretrained, flaxheads.load_backbone], ids=["from_pretrained", "load_backbone"])
def test_weights_with_more_layers_than_config_json_are_refused(tmp_path, family, load):
    key, deepest = _deep_checkpoint(family, tmp_path)

    with pytest.raises(flaxheads.CheckpointError) as err:
        load(tmp_path)

    message = str(err.value)
    assert f"holds 4 layers (e.g. {deepest}" in message and f"{key}=2" in message, message
    assert f'"{key}": 4' in message and "re-export" in message


@pytest.mark.parametrize("load", [flaxheads.from_pretrained, flaxheads.load_backbone], ids=["from_pretrained", "load_backbone"])
def test_flaxheads_format_with_more_layers_than_config_json_is_refused(tmp_path, load):
    _deep_checkpoint("bert", tmp_path / "hf")
    edit_config(tmp_path / "hf", num_hidden_layers=4)
    flaxheads.from_pretrained(tmp_path / "hf").save_pretrained(tmp_path / "native", format="flaxheads")
    edit_config(tmp_path / "native", num_hidden_layers=2)

    with pytest.raises(flaxheads.CheckpointError, match=r"holds 4 layers \(e\.g\. backbone\.layers\.3\..*num_hidden_layers=2"):
        load(tmp_path / "native")


# ---------------------------------------------------------------------------------------------
# Inputs and weights that would load as something else


@pytest.mark.parametrize("where", ["../outside.safetensors", "/abs/model-00001.safetensors", "sub/dir.safetensors"])
def test_a_shard_index_naming_a_path_outside_the_folder_is_refused(sharded_bert, tmp_path, where):
    index = json.loads((sharded_bert / "model.safetensors.index.json").read_text())
    name = next(iter(index["weight_map"]))
    edit_index(sharded_bert, lambda index: {**index, "weight_map": {**index["weight_map"], name: where}})

    with pytest.raises(flaxheads.CheckpointError, match=rf"names shard '{re.escape(where)}', a path"):
        flaxheads.from_pretrained(sharded_bert)


def test_a_float_weight_relabelled_as_integers_is_refused_naming_the_tensor(bert_copy):
    file = bert_copy / "model.safetensors"
    raw = bytearray(file.read_bytes())
    header_len = int.from_bytes(raw[:8], "little")
    header = raw[8:8 + header_len].decode()
    name = "bert.embeddings.word_embeddings.weight"
    at = header.index('"F32"', header.index(f'"{name}"'))
    header = header[:at] + '"I32"' + header[at + 5:]  # the same 4 bytes per value, read as integers near 1e9
    file.write_bytes(raw[:8] + header.encode() + raw[8 + header_len:])

    with pytest.raises(flaxheads.CheckpointError, match=rf"{re.escape(name)} is stored as int32.*float32"):
        flaxheads.from_pretrained(bert_copy)


@pytest.mark.parametrize("bad_id", [-1, 99])
def test_ids_outside_the_vocabulary_are_refused_as_pytorch_refuses_them(bert_copy, bad_id):
    model = flaxheads.from_pretrained(bert_copy)  # vocab_size 99
    ids = np.array([[2, 5, bad_id, 7]])

    with pytest.raises(ValueError, match=rf"input_ids holds {bad_id} at \(0, 2\), outside the model's vocabulary \[0, 99\)"):
        model(jnp.asarray(ids))
    with pytest.raises(IndexError):  # what transformers does with the same ids
        transformers.AutoModelForSequenceClassification.from_pretrained(bert_copy)(torch.as_tensor(ids))


@pytest.mark.parametrize("model_class", [flaxheads.SequenceClassifier, flaxheads.TokenClassifier,
                                         flaxheads.MultipleChoice], ids=lambda c: c.__name__)
def test_every_model_class_refuses_a_mask_of_another_batch_and_a_token_type_outside_the_table(hf_checkpoint,
                                                                                              model_class):
    model = model_class.from_pretrained(hf_checkpoint("BertModel").path)  # type_vocab_size 2
    shape = (2, 3, 6) if model_class is flaxheads.MultipleChoice else (2, 6)
    ids = jnp.full(shape, 7)

    with pytest.raises(ValueError, match=re.escape(f"attention_mask has shape {(1, *shape[1:])} but input_ids has "
                                                   f"{shape}")):
        model(ids, jnp.ones((1, *shape[1:]), jnp.int32))  # jax would broadcast it over every row
    with pytest.raises(ValueError, match=r"token_type_ids holds 2 at \(0, 0.*outside the model's token types \[0, 2\)"):
        model(ids, token_type_ids=jnp.full(shape, 2))  # jax's lookup gives NaN


def test_under_jit_a_sequence_past_the_position_table_is_refused_from_its_shape(bert_copy):
    model = flaxheads.from_pretrained(bert_copy)  # max_position_embeddings 64
    graphdef, params = nnx.split(model)
    forward = jax.jit(lambda params, ids: nnx.merge(graphdef, params)(ids))

    with pytest.raises(ValueError, match="input_ids has 65 tokens per sequence.*truncate the text to at most 64 tokens"):
        forward(params, jnp.ones((1, 65), jnp.int32))
    assert forward(params, jnp.ones((1, 64), jnp.int32)).shape == (1, 2)


@pytest.mark.parametrize(("argument", "value", "expected"), [
    ("num_labels", "3", "an int of at least 1"),
    ("num_labels", 2.5, "an int of at least 1"),  # jax: "Shapes must be 1D sequences of ... integer type"
    ("classifier_dropout", float("nan"), r"a rate in \[0, 1\)"),  # loaded, and trained to NaN
    ("classifier_dropout", 1.5, r"a rate in \[0, 1\)"),
    ("seed", None, "an int"),  # AttributeError: 'NoneType' object has no attribute 'dtype'
    ("dtype", "float17", "a float dtype"),
    ("pad_token_id", -3, "a token id"),
    ("id2label", "ab", "a list of label names"),  # two labels, 'a' and 'b'
    ("head_options", "x", "a dict of the head's options"),
])
def test_a_from_pretrained_argument_of_the_wrong_kind_or_range_is_refused_naming_it(hf_checkpoint, argument, value,
                                                                                     expected):
    path = hf_checkpoint(CLASSIFIER["bert"], num_labels=2).path

    with pytest.raises(ValueError, match=rf"^{argument}={re.escape(repr(value))}: it must be {expected}"):
        flaxheads.from_pretrained(path, **{argument: value})


# ---------------------------------------------------------------------------------------------
# Settings: every number a run or a pipeline takes is checked where it is given


@pytest.mark.parametrize(("settings", "named"), [
    (dict(learning_rate=float("nan")), r"learning_rate=nan: it must be a finite number"),
    (dict(learning_rate=float("inf")), r"learning_rate=inf: it must be a finite number"),
    (dict(learning_rate=-1e-4), r"learning_rate=-0\.0001: it must be positive"),
    (dict(weight_decay=-0.01), r"weight_decay=-0\.01: it must be 0 or positive"),
    (dict(adam_beta1=1.0), r"adam_beta1=1\.0: it must be in \[0, 1\)"),
    (dict(adam_beta2=float("nan")), r"adam_beta2=nan: it must be a finite number"),
    (dict(adam_epsilon=0.0), r"adam_epsilon=0\.0: it must be positive"),
    (dict(max_grad_norm=float("nan")), r"max_grad_norm=nan: it must be a finite number"),
    (dict(max_grad_norm=-1.0), r"max_grad_norm=-1\.0: it must be 0 \(no clipping\) or positive"),
    (dict(label_smoothing_factor=float("nan")), r"label_smoothing_factor=nan: it must be a finite number"),
    (dict(warmup_steps=float("nan")), r"warmup_steps=nan: it must be a finite number"),
    (dict(classifier_dropout=1.0), r"classifier_dropout=1\.0: it must be a rate in \[0, 1\)"),
    (dict(seed=-1), r"seed=-1: it must be 0 or positive"),
])
def test_a_training_number_outside_its_range_or_not_finite_is_refused_naming_the_field(settings, named):
    with pytest.raises(ValueError, match=named):
        flaxheads.TrainConfig(**settings)


@pytest.mark.parametrize(("settings", "named"), [
    (dict(max_seq_length="128"), r"max_seq_length='128': it must be an int, not a str"),
    (dict(per_device_train_batch_size=None), r"per_device_train_batch_size=None: it must be an int, not a NoneType"),
    (dict(learning_rate="1e-4"), r"learning_rate='1e-4': it must be a number, not a str"),
    (dict(num_labels=2.0), r"num_labels=2\.0: it must be an int or None, not a float"),
    (dict(do_train="yes"), r"do_train='yes': it must be True or False, not a str"),
])
def test_a_training_setting_of_the_wrong_kind_is_refused_naming_the_field_and_the_kind(settings, named):
    with pytest.raises(ValueError, match=named):
        flaxheads.TrainConfig(**settings)


def test_a_run_of_no_step_is_refused_with_the_fix_as_it_would_export_an_untrained_head(tmp_path, capsys):
    from flaxheads.cli import main

    with pytest.raises(ValueError, match=r"num_train_epochs=0 with max_steps=-1: the run would take no step and export "
                                         r"the untrained model.*do_train=False to score the model as it is"):
        flaxheads.TrainConfig(num_train_epochs=0)
    assert flaxheads.TrainConfig(num_train_epochs=0, max_steps=3).max_steps == 3
    assert flaxheads.TrainConfig(num_train_epochs=0, do_train=False).do_train is False

    assert main(["train", "--num_train_epochs", "0", "--output_dir", str(tmp_path / "run")]) == 2
    assert "--num_train_epochs 0.0 with --max_steps -1" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


@pytest.fixture(scope="module")
def small_pipeline(hf_checkpoint, tmp_path_factory):
    """A text-classification pipeline over a random 3-label BERT and a tokenizer of its 99 ids."""
    folder = tmp_path_factory.mktemp("tokenizer")
    (folder / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "film"]) + "\n")
    tokenizer = transformers.BertTokenizerFast.from_pretrained(folder)
    model = flaxheads.from_pretrained(hf_checkpoint("BertForSequenceClassification", num_labels=3).path)
    return flaxheads.pipeline("text-classification", model=model, tokenizer=tokenizer), model, tokenizer


@pytest.mark.parametrize("top_k", [-1, 0, 1.5, "2"])
def test_a_top_k_that_is_not_a_count_of_labels_is_refused_naming_it(small_pipeline, top_k):
    classify, _, _ = small_pipeline

    with pytest.raises(ValueError, match=rf"top_k={re.escape(repr(top_k))}: give the number of best labels"):
        classify("a film", top_k=top_k)  # -1 sliced off the last label, 0 answered nothing
    assert len(classify("a film", top_k=2)) == 2 and len(classify("a film", top_k=None)) == 3


@pytest.mark.parametrize(("option", "value"), [("batch_size", 0), ("batch_size", 2.5), ("batch_size", None),
                                               ("max_seq_length", 0), ("max_seq_length", "32")])
def test_a_pipeline_size_that_is_not_a_positive_int_is_refused_naming_it(small_pipeline, option, value):
    _, model, tokenizer = small_pipeline

    with pytest.raises(ValueError, match=rf"{option}={re.escape(repr(value))}: it must be an int of at least 1"):
        flaxheads.pipeline("text-classification", model=model, tokenizer=tokenizer, **{option: value})
