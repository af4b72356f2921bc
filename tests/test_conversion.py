"""Conversion: PyTorch -> flaxheads -> PyTorch is exact, exports load in transformers, and every
weight-file layout transformers writes (single, sharded, pickle) and flaxheads' own are read."""

from __future__ import annotations

import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx
from safetensors.torch import load_file

import flaxheads
from flaxheads.convert import convert

CLASSIFIER = {"bert": "BertForSequenceClassification", "roberta": "RobertaForSequenceClassification"}
BASE = {"bert": "BertModel", "roberta": "RobertaModel"}
PAD_ID = {"bert": 0, "roberta": 1}


def padded_batch(family: str) -> dict[str, np.ndarray]:
    """Two sequences, the second right-padded, with the family's pad id."""
    attention_mask = np.array([[1] * 8, [1] * 5 + [0] * 3])
    input_ids = np.where(attention_mask == 1, np.random.default_rng(0).integers(3, 99, (2, 8)), PAD_ID[family])
    return {"input_ids": input_ids, "attention_mask": attention_mask}


def flax_logits(model, batch) -> np.ndarray:
    return np.asarray(model(**{k: jnp.asarray(v) for k, v in batch.items()}))


def torch_logits(model, batch) -> np.ndarray:
    with torch.no_grad():
        return model(**{k: torch.from_numpy(v) for k, v in batch.items()}).logits.float().numpy()


def assert_state_dicts_identical(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert sorted(actual) == sorted(expected)
    for name, tensor in expected.items():
        assert actual[name].dtype == tensor.dtype, name
        assert torch.equal(actual[name], tensor), name


def assert_same_params(a: nnx.Module, b: nnx.Module) -> None:
    flat_a, flat_b = (dict(nnx.to_flat_state(nnx.state(m, nnx.Param))) for m in (a, b))
    assert flat_a.keys() == flat_b.keys()
    for path in flat_a:
        assert flat_a[path][...].dtype == flat_b[path][...].dtype, path
        np.testing.assert_array_equal(np.asarray(flat_a[path][...]), np.asarray(flat_b[path][...]), err_msg=str(path))


# ---------------------------------------------------------------------------------------------
# Exact round trips


@pytest.mark.parametrize("torch_dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_pytorch_flaxheads_pytorch_round_trip_is_bit_identical(hf_checkpoint, tmp_path, family, torch_dtype):
    checkpoint = hf_checkpoint(CLASSIFIER[family], num_labels=3, torch_dtype=torch_dtype)
    model = flaxheads.from_pretrained(checkpoint.path, param_dtype="auto")

    model.save_pretrained(tmp_path)

    assert {leaf.dtype for leaf in jax.tree_util.tree_leaves(nnx.state(model, nnx.Param))} == {jnp.dtype(torch_dtype)}
    assert_state_dicts_identical(
        load_file(tmp_path / "model.safetensors"), load_file(checkpoint.path / "model.safetensors")
    )
    assert json.loads((tmp_path / "config.json").read_text())["dtype"] == torch_dtype


@pytest.mark.parametrize("torch_dtype", ["float32", "bfloat16"])
def test_convert_to_flax_and_back_is_bit_identical(hf_checkpoint, tmp_path, torch_dtype):
    checkpoint = hf_checkpoint(CLASSIFIER["bert"], num_labels=3, torch_dtype=torch_dtype)

    convert(checkpoint.path, tmp_path / "flax")
    convert(tmp_path / "flax", tmp_path / "pytorch")

    assert (tmp_path / "flax" / "flaxheads_model.safetensors").is_file()
    assert not (tmp_path / "flax" / "model.safetensors").exists()
    assert_state_dicts_identical(
        load_file(tmp_path / "pytorch" / "model.safetensors"), load_file(checkpoint.path / "model.safetensors")
    )


def test_default_float32_params_upcast_a_float16_checkpoint(hf_checkpoint):
    checkpoint = hf_checkpoint(CLASSIFIER["bert"], num_labels=3, torch_dtype="float16")

    model = flaxheads.from_pretrained(checkpoint.path)

    assert {leaf.dtype for leaf in jax.tree_util.tree_leaves(nnx.state(model, nnx.Param))} == {jnp.dtype("float32")}
    np.testing.assert_array_equal(
        np.asarray(model.head.classifier.kernel[...]),
        checkpoint.model.classifier.weight.detach().float().numpy().T,
    )


@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_export_loads_in_transformers_with_no_missing_or_unexpected_keys_and_same_logits(
    hf_checkpoint, tmp_path, family
):
    checkpoint = hf_checkpoint(CLASSIFIER[family], num_labels=3)
    batch = padded_batch(family)
    model = flaxheads.from_pretrained(checkpoint.path)
    model.save_pretrained(tmp_path)

    reloaded, info = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path, output_loading_info=True)

    assert type(reloaded).__name__ == CLASSIFIER[family]
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    expected = torch_logits(reloaded.eval(), batch)
    print(f"{family} export logits: max abs difference {np.max(np.abs(flax_logits(model, batch) - expected)):.3g}")
    np.testing.assert_allclose(flax_logits(model, batch), expected, atol=1e-5, rtol=1e-5)


def test_export_of_a_new_classifier_keeps_labels_and_problem_type(hf_checkpoint, tmp_path):
    checkpoint = hf_checkpoint("BertModel")
    model = flaxheads.from_pretrained(
        checkpoint.path, num_labels=3, id2label=["neg", "neu", "pos"], problem_type=flaxheads.SINGLE_LABEL
    )
    model.save_pretrained(tmp_path)

    config = transformers.AutoConfig.from_pretrained(tmp_path)
    again = flaxheads.from_pretrained(tmp_path)

    assert config.id2label == {0: "neg", 1: "neu", 2: "pos"}
    assert config.problem_type == flaxheads.SINGLE_LABEL
    assert again.config.label_names == ("neg", "neu", "pos")
    assert again.config.problem_type == flaxheads.SINGLE_LABEL



@pytest.mark.parametrize("override", [None, 0.2])
def test_export_keeps_the_classifier_dropout(hf_checkpoint, tmp_path, override):
    checkpoint = hf_checkpoint(CLASSIFIER["bert"], num_labels=2, classifier_dropout=0.3)
    expected = 0.3 if override is None else override
    model = flaxheads.from_pretrained(checkpoint.path, classifier_dropout=override)
    model.save_pretrained(tmp_path)

    again = flaxheads.from_pretrained(tmp_path)

    assert model.head.cfg.dropout_rate == expected
    assert json.loads((tmp_path / "config.json").read_text())["classifier_dropout"] == expected
    assert transformers.AutoConfig.from_pretrained(tmp_path).classifier_dropout == expected
    assert again.head.cfg.dropout_rate == expected

# ---------------------------------------------------------------------------------------------
# Weight-file layouts


def test_sharded_safetensors_checkpoint_reads_like_the_single_file(hf_checkpoint, tmp_path):
    checkpoint = hf_checkpoint(CLASSIFIER["bert"], num_labels=3)
    checkpoint.model.save_pretrained(tmp_path, max_shard_size="20KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    assert len(list(tmp_path.glob("model-*-of-*.safetensors"))) > 1
    batch = padded_batch("bert")

    model, info = flaxheads.from_pretrained(tmp_path, output_loading_info=True)

    assert info.fully_pretrained and info.unused == []
    assert_same_params(model, flaxheads.from_pretrained(checkpoint.path))
    np.testing.assert_allclose(flax_logits(model, batch), torch_logits(checkpoint.model, batch), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_pytorch_bin_checkpoint_reads_like_safetensors(hf_checkpoint, tmp_path, family):
    checkpoint = hf_checkpoint(CLASSIFIER[family], num_labels=3)
    # transformers 5 always writes safetensors; pytorch_model.bin is what older versions wrote.
    torch.save(checkpoint.model.state_dict(), tmp_path / "pytorch_model.bin")
    shutil.copy(checkpoint.path / "config.json", tmp_path)

    model, info = flaxheads.from_pretrained(tmp_path, output_loading_info=True)

    assert info.source.endswith("pytorch_model.bin")
    assert info.fully_pretrained
    assert_same_params(model, flaxheads.from_pretrained(checkpoint.path))


def test_sharded_pytorch_bin_checkpoint_reads_like_safetensors(hf_checkpoint, tmp_path):
    checkpoint = hf_checkpoint(CLASSIFIER["bert"], num_labels=3)
    state = checkpoint.model.state_dict()
    names = sorted(state)
    shards = {"pytorch_model-00001-of-00002.bin": names[::2], "pytorch_model-00002-of-00002.bin": names[1::2]}
    for shard, shard_names in shards.items():
        torch.save({name: state[name] for name in shard_names}, tmp_path / shard)
    weight_map = {name: shard for shard, shard_names in shards.items() for name in shard_names}
    (tmp_path / "pytorch_model.bin.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    shutil.copy(checkpoint.path / "config.json", tmp_path)

    model, info = flaxheads.from_pretrained(tmp_path, output_loading_info=True)

    assert info.fully_pretrained and info.unused == []
    assert_same_params(model, flaxheads.from_pretrained(checkpoint.path))


def test_bfloat16_pytorch_bin_keeps_its_bits(hf_checkpoint, tmp_path):
    checkpoint = hf_checkpoint(CLASSIFIER["bert"], num_labels=3, torch_dtype="bfloat16")
    torch.save(checkpoint.model.state_dict(), tmp_path / "pytorch_model.bin")
    shutil.copy(checkpoint.path / "config.json", tmp_path)

    model = flaxheads.from_pretrained(tmp_path, param_dtype="auto")
    model.save_pretrained(tmp_path / "export")

    assert_state_dicts_identical(
        load_file(tmp_path / "export" / "model.safetensors"), load_file(checkpoint.path / "model.safetensors")
    )


@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_flax_format_round_trip_is_exact(hf_checkpoint, tmp_path, family):
    checkpoint = hf_checkpoint(CLASSIFIER[family], num_labels=3)
    model = flaxheads.from_pretrained(checkpoint.path)
    batch = padded_batch(family)

    model.save_pretrained(tmp_path / "flax", format="flaxheads")
    again, info = flaxheads.from_pretrained(tmp_path / "flax", output_loading_info=True)
    again.save_pretrained(tmp_path / "pytorch")

    assert (tmp_path / "flax" / "flaxheads_model.safetensors").is_file()
    assert info.fully_pretrained and info.unused == []
    assert_same_params(again, model)
    np.testing.assert_array_equal(flax_logits(again, batch), flax_logits(model, batch))
    assert_state_dicts_identical(
        load_file(tmp_path / "pytorch" / "model.safetensors"), load_file(checkpoint.path / "model.safetensors")
    )



@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_load_backbone_reads_a_flaxheads_format_directory(hf_checkpoint, tmp_path, family):
    checkpoint = hf_checkpoint(BASE[family])
    inputs = {k: jnp.asarray(v) for k, v in padded_batch(family).items()}
    flaxheads.from_pretrained(checkpoint.path, head="pooler", num_labels=3).save_pretrained(tmp_path, format="flaxheads")

    from_flax, info = flaxheads.load_backbone(tmp_path)

    from_pytorch, _ = flaxheads.load_backbone(checkpoint.path)
    assert info.newly_initialized == []
    assert info.unused == ["head.classifier.bias", "head.classifier.kernel"]
    assert_same_params(from_flax, from_pytorch)
    expected = from_pytorch(**inputs)
    np.testing.assert_array_equal(np.asarray(from_flax(**inputs).pooler_output), np.asarray(expected.pooler_output))

# ---------------------------------------------------------------------------------------------
# Heads transformers has no class for


@pytest.mark.parametrize("head", ["cls", "mean", "concat_last4"])
@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_non_canonical_head_round_trips_through_flaxheads_layout(hf_checkpoint, tmp_path, family, head):
    checkpoint = hf_checkpoint(BASE[family], num_hidden_layers=4)
    batch = padded_batch(family)
    model = flaxheads.from_pretrained(checkpoint.path, head=head, num_labels=3)

    model.save_pretrained(tmp_path)
    again, info = flaxheads.from_pretrained(tmp_path, output_loading_info=True)

    exported = load_file(tmp_path / "model.safetensors")
    head_keys = sorted(k for k in exported if not k.startswith(f"{family}."))
    assert head_keys == ["head.classifier.bias", "head.classifier.weight"]
    np.testing.assert_array_equal(
        exported["head.classifier.weight"].numpy(), np.asarray(model.head.classifier.kernel[...]).T
    )
    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == [BASE[family]]
    assert again.config.head == head and info.fully_pretrained
    assert_same_params(again, model)
    np.testing.assert_array_equal(flax_logits(again, batch), flax_logits(model, batch))


@pytest.mark.parametrize("head", ["mean", "concat_last4"])
def test_non_canonical_head_round_trips_through_flax_format(hf_checkpoint, tmp_path, head):
    checkpoint = hf_checkpoint(BASE["roberta"], num_hidden_layers=4)
    model = flaxheads.from_pretrained(checkpoint.path, head=head, num_labels=3)

    model.save_pretrained(tmp_path, format="flaxheads")
    again, info = flaxheads.from_pretrained(tmp_path, output_loading_info=True)

    assert again.config.head == head and info.fully_pretrained
    assert_same_params(again, model)


@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_transformers_auto_model_loads_the_backbone_of_a_non_canonical_export(hf_checkpoint, tmp_path, family):
    checkpoint = hf_checkpoint(BASE[family], num_hidden_layers=4)
    batch = padded_batch(family)
    model = flaxheads.from_pretrained(checkpoint.path, head="mean", num_labels=3)
    model.save_pretrained(tmp_path)

    base, info = transformers.AutoModel.from_pretrained(tmp_path, output_loading_info=True)

    assert type(base).__name__ == BASE[family]
    # The mean head does not use the pooler, so the export has none for transformers to load.
    assert info["missing_keys"] <= {"pooler.dense.weight", "pooler.dense.bias"}
    assert info["unexpected_keys"] == {"head.classifier.weight", "head.classifier.bias"}
    with torch.no_grad():
        expected = base.eval()(**{k: torch.from_numpy(v) for k, v in batch.items()}).last_hidden_state.numpy()
    ours = model.backbone(**{k: jnp.asarray(v) for k, v in batch.items()}).last_hidden_state
    np.testing.assert_allclose(np.asarray(ours), expected, atol=1e-5, rtol=1e-5)


def test_roberta_head_on_bert_round_trips(hf_checkpoint, tmp_path):
    checkpoint = hf_checkpoint(BASE["bert"])
    model = flaxheads.from_pretrained(checkpoint.path, head="roberta", num_labels=3)

    model.save_pretrained(tmp_path)
    again = flaxheads.from_pretrained(tmp_path)

    exported = load_file(tmp_path / "model.safetensors")
    assert {"head.dense.weight", "head.out_proj.weight"} <= set(exported)
    assert again.config.head == "roberta"
    assert_same_params(again, model)
