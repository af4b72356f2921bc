"""Every way a load or save can go wrong ends in an error that names the key, file or setting."""

from __future__ import annotations

import json
import re
import shutil
import sys

import jax.numpy as jnp
import pytest
import torch
from safetensors.torch import load_file, save_file

import flaxheads

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


@pytest.mark.parametrize(("first", "second"), [("pytorch", "flax"), ("flax", "pytorch")])
def test_saving_into_a_directory_of_the_other_format_is_refused(bert_copy, tmp_path, first, second):
    model = flaxheads.from_pretrained(bert_copy)
    model.save_pretrained(tmp_path / "out", format=first)

    with pytest.raises(FileExistsError, match=re.escape(str(tmp_path / "out"))):
        model.save_pretrained(tmp_path / "out", format=second)
