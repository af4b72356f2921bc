"""Conversion on every family: PyTorch -> flaxheads -> PyTorch is bit-identical in every dtype,
the flaxheads format round trip too, exports load in transformers with no missing or unexpected
keys and the same logits, sharded and pytorch_model.bin files read like the single safetensors
file, and each checkpoint type gives the loading report the row states."""

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

import flaxheads
from families import FAMILIES, case, rows
from family_parity import (
    assert_close, assert_same_params, assert_state_dicts_identical, flat_params, flax_logits, state_dict,
    torch_logits,
)
from flaxheads.convert import convert, describe

ROUND_TRIPS = [
    *(case(row, overrides, "float32", id=f"{row.name}-{name}-float32", fast=name == "default")
      for row in FAMILIES.values() for name, overrides in row.configs()),
    *(case(row, (), dtype, id=f"{row.name}-default-{dtype}", fast=False)
      for row in FAMILIES.values() for dtype in ("float16", "bfloat16")),
]


@pytest.mark.matrix("row", "torch_dtype")
@pytest.mark.parametrize(("row", "overrides", "torch_dtype"), ROUND_TRIPS)
def test_pytorch_flaxheads_pytorch_round_trip_is_bit_identical(hf_checkpoint, tmp_path, row, overrides, torch_dtype):
    checkpoint = hf_checkpoint(row.classifier, family=row.name, num_labels=3, torch_dtype=torch_dtype,
                               **dict(overrides))
    model = flaxheads.from_pretrained(checkpoint.path, param_dtype="auto")

    model.save_pretrained(tmp_path)

    assert {leaf.dtype for leaf in jax.tree_util.tree_leaves(nnx.state(model, nnx.Param))} == {jnp.dtype(torch_dtype)}
    assert_state_dicts_identical(state_dict(tmp_path), state_dict(checkpoint.path))
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == [row.classifier] and config["dtype"] == torch_dtype
    exported = transformers.AutoConfig.from_pretrained(tmp_path)
    for name, _ in overrides:  # the variant's own settings, as transformers reads them
        assert getattr(exported, name) == getattr(checkpoint.model.config, name), name


@pytest.mark.matrix("row", "torch_dtype")
@pytest.mark.parametrize("torch_dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("row", rows(fast=False))
def test_flaxheads_format_round_trip_is_exact_and_converts_back_bit_identically(hf_checkpoint, tmp_path, row,
                                                                                 torch_dtype):
    checkpoint = hf_checkpoint(row.classifier, family=row.name, num_labels=3, torch_dtype=torch_dtype)
    batch = row.batch(row.sample_padding)
    options = {**dict(row.load_options), "param_dtype": "auto"}

    convert(checkpoint.path, tmp_path / "flax")
    model, info = flaxheads.from_pretrained(tmp_path / "flax", output_loading_info=True, **options)
    convert(tmp_path / "flax", tmp_path / "pytorch")

    assert (tmp_path / "flax" / "flaxheads_model.safetensors").is_file()
    assert not (tmp_path / "flax" / "model.safetensors").exists()
    assert info.fully_pretrained and info.unused == []
    original = flaxheads.from_pretrained(checkpoint.path, **options)
    assert model.config == original.config
    assert_same_params(model, original)
    np.testing.assert_array_equal(flax_logits(model, batch), flax_logits(original, batch))
    assert_state_dicts_identical(state_dict(tmp_path / "pytorch"), state_dict(checkpoint.path))


TASK_CHECKPOINTS = [
    case(row, task, id=f"{row.name}-{task}", fast=row.name == "bert")
    for row in FAMILIES.values() for task in ("token_classifier", "multiple_choice") if getattr(row, task)
]


@pytest.mark.matrix("row", "task")
@pytest.mark.parametrize(("row", "task"), TASK_CHECKPOINTS)
def test_token_and_choice_checkpoints_convert_both_ways_bit_identically(hf_checkpoint, tmp_path, row, task):
    checkpoint = hf_checkpoint(getattr(row, task), family=row.name, num_labels=3)

    convert(checkpoint.path, tmp_path / "flax")
    convert(tmp_path / "flax", tmp_path / "pytorch")

    assert (tmp_path / "flax" / "flaxheads_model.safetensors").is_file()
    for folder in ("flax", "pytorch"):
        assert json.loads((tmp_path / folder / "config.json").read_text())["architectures"] == [getattr(row, task)]
    assert_state_dicts_identical(state_dict(tmp_path / "pytorch"), state_dict(checkpoint.path))


@pytest.mark.parametrize("task, named", [("token_classifier", "task: token-classification"),
                                         ("multiple_choice", "task: multiple-choice")])
def test_inspect_describes_token_and_choice_checkpoints_with_their_task(hf_checkpoint, task, named):
    report = describe(hf_checkpoint(getattr(FAMILIES["bert"], task), num_labels=3).path)

    assert named in report and "every parameter came from the checkpoint" in report


@pytest.mark.matrix("row", "source")
@pytest.mark.parametrize("source", ["classifier", "pretrained", "base"])
@pytest.mark.parametrize("row", rows(fast=False))
def test_export_loads_in_transformers_with_no_missing_or_unexpected_keys_and_same_logits(
    hf_checkpoint, tmp_path, row, source
):
    """From a *ForSequenceClassification checkpoint, a new one-label head (a reward model) on a
    pretraining checkpoint, and a new two-label head on the bare backbone (*Model: what it has and
    the classifier lacks, XLM-R's pooler say, is left out of the export)."""
    if source == "classifier":
        checkpoint, num_labels = hf_checkpoint(row.classifier, family=row.name, num_labels=3), 3
    elif source == "pretrained":
        checkpoint, num_labels = hf_checkpoint(row.pretrained, family=row.name), 1
    else:
        checkpoint, num_labels = hf_checkpoint(row.base, family=row.name), 2
    batch = row.batch(row.sample_padding)
    model = flaxheads.from_pretrained(checkpoint.path, num_labels=num_labels, seed=4, **dict(row.load_options))
    model.save_pretrained(tmp_path)

    options = {"attn_implementation": "eager"} if row.eager else {}
    reloaded, info = transformers.AutoModelForSequenceClassification.from_pretrained(
        tmp_path, output_loading_info=True, **options)

    assert type(reloaded).__name__ == row.classifier and reloaded.config.num_labels == num_labels
    assert reloaded.config.pad_token_id == model.config.backbone.pad_token_id
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    assert_close(flax_logits(model, batch), torch_logits(reloaded.eval(), batch), f"{row.name} {source} export")


def _sharded_bin(checkpoint, folder) -> None:
    state = checkpoint.model.state_dict()
    names = sorted(state)
    shards = {"pytorch_model-00001-of-00002.bin": names[::2], "pytorch_model-00002-of-00002.bin": names[1::2]}
    for shard, shard_names in shards.items():
        torch.save({name: state[name] for name in shard_names}, folder / shard)
    weight_map = {name: shard for shard, shard_names in shards.items() for name in shard_names}
    (folder / "pytorch_model.bin.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


@pytest.mark.matrix("row", "layout")
@pytest.mark.parametrize("layout", ["sharded_safetensors", "bin", "sharded_bin"])
@pytest.mark.parametrize("row", rows(fast=False))
def test_sharded_and_bin_checkpoints_read_like_the_single_safetensors_file(hf_checkpoint, tmp_path, row, layout):
    checkpoint = hf_checkpoint(row.classifier, family=row.name, num_labels=3)
    if layout == "sharded_safetensors":
        checkpoint.model.save_pretrained(tmp_path, max_shard_size="20KB")
        assert (tmp_path / "model.safetensors.index.json").is_file()
        assert len(list(tmp_path.glob("model-*-of-*.safetensors"))) > 1
    else:
        # transformers 5 always writes safetensors; pytorch_model.bin is what older versions wrote.
        if layout == "bin":
            torch.save(checkpoint.model.state_dict(), tmp_path / "pytorch_model.bin")
        else:
            _sharded_bin(checkpoint, tmp_path)
        shutil.copy(checkpoint.path / "config.json", tmp_path)

    model, info = flaxheads.from_pretrained(tmp_path, output_loading_info=True, **dict(row.load_options))

    assert info.fully_pretrained and info.unused == []
    assert (".bin" in info.source) == layout.endswith("bin")
    assert_same_params(model, flaxheads.from_pretrained(checkpoint.path, **dict(row.load_options)))


REPORTS = [
    *(case(row, row.classifier, (), [], [], id=f"{row.name}-{row.classifier}", fast=True) for row in FAMILIES.values()),
    # Slow: each builds a new head, compiled (flaxheads initialises new parameters under jit).
    *(case(row, architecture, overrides, unused, new, fast=False,
           id="-".join([row.name, architecture, *(f"{k}={v}" for k, v in overrides)]))
      for row in FAMILIES.values() for architecture, overrides, unused, new in row.reports),
]


@pytest.mark.matrix("row")
@pytest.mark.parametrize(("row", "architecture", "overrides", "unused", "new"), REPORTS)
def test_loading_report_lists_pretraining_heads_as_unused_and_the_head_as_new(
    hf_checkpoint, row, architecture, overrides, unused, new
):
    checkpoint = hf_checkpoint(architecture, family=row.name, **dict(overrides))

    model, info = flaxheads.from_pretrained(checkpoint.path, num_labels=2, output_loading_info=True,
                                            **dict(row.load_options))

    assert info.head == row.head and model.config.head == row.head
    assert info.unused == unused and info.newly_initialized == new
    assert info.fully_pretrained == (not new)
    assert info.mismatched == []


@pytest.mark.parametrize("row", rows())
def test_loading_builds_models_with_the_keys_nnx_rngs_gives(row):
    """Loading builds models with `SeedKeys(seed)` (Python-counted keys, cheap to trace): every
    parameter, new heads' included, equals a build with `nnx.Rngs(seed)`, bit for bit."""
    from flaxheads.backbones import backbone_config_from_hf
    from flaxheads.conversion.loading import SeedKeys

    hf_config = getattr(transformers, row.classifier).config_class(**row.config).to_dict()
    config = flaxheads.ClassifierConfig(backbone_config_from_hf(hf_config), row.head, num_labels=3)
    with_rngs = flaxheads.SequenceClassifier(config, rngs=nnx.Rngs(5))
    with_keys = flaxheads.SequenceClassifier(config, rngs=SeedKeys(5))
    assert_same_params(with_keys, with_rngs)
    mine, other = flat_params(with_keys), flat_params(flaxheads.SequenceClassifier(config, rngs=SeedKeys(6)))
    assert any(not np.array_equal(mine[k], other[k]) for k in mine)  # the seed matters
