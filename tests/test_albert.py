"""ALBERT: parity with transformers (PyTorch, eval mode) on factorised embeddings and shared
layers, every head on ALBERT, conversion both ways (safetensors, sharded, .bin), the loading
report of each ALBERT checkpoint type, sharding on fake devices, and the command line with an
ALBERT tokenizer (a tiny Unigram vocabulary, no sentencepiece model needed)."""

from __future__ import annotations

import json
import os
import zlib

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx
from safetensors.torch import load_file

import flaxheads
from family_parity import (
    assert_close, assert_state_dicts_identical, check_cli_lifecycle, flat_params, flax_inputs, fsdp_on_fake_devices,
    padded_batch, torch_forward,
)
from conftest import _randomize_
from flaxheads.backbones import backbone_spec
from flaxheads.convert import convert
from flaxheads.heads import HeadInputs

BF16_ATOL = 2e-2
"""bfloat16 compute (float32 parameters) against transformers in float32: 8 bits of mantissa
through 3 layers (2 x 2 shared) give differences of a few 1e-3 on logits of order 1 (measured 4.6e-3)."""
TINY_ALBERT = dict(
    vocab_size=99,
    embedding_size=24,  # != hidden_size: the factorised embedding projection is exercised
    hidden_size=36,  # 4 heads of 9: an odd head width
    num_attention_heads=4,
    intermediate_size=37,
    num_hidden_layers=3,
    max_position_embeddings=64,
    initializer_range=0.1,
)


# ---------------------------------------------------------------------------------------------
# Fixtures and helpers


@pytest.fixture(scope="session")
def albert(tmp_path_factory):
    """`albert("AlbertForSequenceClassification", num_labels=3, num_hidden_groups=2)` -> (directory
    written by transformers, the torch model in eval mode). Cached: treat both as read-only."""
    cache = {}

    def build(architecture: str, *, torch_dtype: str = "float32", **overrides):
        key = (architecture, torch_dtype, tuple(sorted(overrides.items())))
        if key not in cache:
            torch.manual_seed(0)
            config = transformers.AlbertConfig(**{**TINY_ALBERT, **overrides})
            model = getattr(transformers, architecture)(config).eval()
            _randomize_(model, seed=zlib.crc32(repr(key).encode()))
            model = model.to(getattr(torch, torch_dtype))
            path = tmp_path_factory.mktemp(architecture)
            model.save_pretrained(path)
            cache[key] = (path, model)
        return cache[key]

    return build














def albert_batch(padding: str = "right", *, seq_len: int = 9, seed: int = 0, token_types: bool = True):
    """Three sequences of lengths (9, 6, 2) padded with <pad> = 0, the second half of each in segment 1."""
    return padded_batch(padding, seq_len=seq_len, seed=seed, lowest_id=5, token_types=token_types)


# ---------------------------------------------------------------------------------------------
# Parity


# (num_hidden_groups, inner_group_num): one group as released ALBERTs, uneven groups (3 layers over
# 2 groups: layers 0 and 1 use group 0), two layers per group, both at once.
@pytest.mark.parametrize(("groups", "inner", "num_labels"), [(1, 1, 2), (2, 1, 3), (1, 2, 1), (2, 2, 5)])
@pytest.mark.parametrize("padding", ["right", "left"])
def test_pooler_head_logits_match_transformers_for_every_sharing_layout(albert, groups, inner, num_labels, padding):
    path, reference = albert(
        "AlbertForSequenceClassification", num_labels=num_labels, num_hidden_groups=groups, inner_group_num=inner
    )
    batch = albert_batch(padding)
    model = flaxheads.from_pretrained(path)

    logits = model(**flax_inputs(batch))

    assert model.config.head == "pooler" and logits.shape == (3, num_labels) and logits.dtype == jnp.float32
    assert_close(logits, torch_forward(reference, batch).logits, f"groups={groups} inner={inner} {padding}")


def test_shared_layers_exist_once_in_the_model(albert):
    path, reference = albert("AlbertForSequenceClassification", num_hidden_groups=2, inner_group_num=2)
    model = flaxheads.from_pretrained(path)

    ours = sum(p.size for p in flat_params(model).values())

    assert ours == sum(p.numel() for p in reference.parameters())
    assert len(model.backbone.groups) == 2 and all(len(group.layers) == 2 for group in model.backbone.groups)


def test_token_types_position_ids_and_missing_inputs_match_transformers(albert):
    path, reference = albert("AlbertForSequenceClassification", num_labels=3)
    batch = albert_batch("right")
    model = flaxheads.from_pretrained(path)
    no_types = {k: v for k, v in batch.items() if k != "token_type_ids"}
    shifted = {**batch, "position_ids": np.broadcast_to(np.arange(2, 11), (3, 9)).copy()}

    with_types = model(**flax_inputs(batch))

    assert_close(model(**flax_inputs(no_types)), torch_forward(reference, no_types).logits, "no token types")
    assert_close(model(**flax_inputs(shifted)), torch_forward(reference, shifted).logits, "explicit position ids")
    assert np.max(np.abs(np.asarray(with_types) - np.asarray(model(**flax_inputs(no_types))))) > 1e-3


@pytest.mark.parametrize(("groups", "inner"), [(1, 1), (1, 2), (2, 2)])
def test_every_hidden_state_and_the_pooler_match_albert_model(albert, groups, inner):
    """transformers 5 records every inner layer's output; flaxheads returns one state per layer
    (after its whole group), the interface's num_hidden_layers + 1: every inner_group_num-th of theirs."""
    path, reference = albert("AlbertModel", num_hidden_groups=groups, inner_group_num=inner)
    batch = albert_batch("right")
    backbone, info = flaxheads.load_backbone(path)

    out = backbone(**flax_inputs(batch))

    expected = torch_forward(reference, batch, output_hidden_states=True)
    assert info.newly_initialized == [] and info.unused == []
    assert len(out.hidden_states) == 4 and len(expected.hidden_states) == 3 * inner + 1
    for layer, (ours, theirs) in enumerate(zip(out.hidden_states, expected.hidden_states[::inner])):
        assert_close(ours, theirs, f"AlbertModel hidden state {layer} (groups={groups} inner={inner})")
    assert_close(out.pooler_output, expected.pooler_output, "AlbertModel pooler output")


@pytest.mark.parametrize(
    ("problem_type", "num_labels", "labels"),
    [
        ("regression", 1, np.array([0.5, -1.0, 2.0], np.float32)),
        ("multi_label_classification", 4, np.array([[1, 0, 1, 0], [0, 0, 0, 1], [1, 1, 0, 0]], np.float32)),
    ],
)
def test_loss_matches_transformers(albert, problem_type, num_labels, labels):
    path, reference = albert("AlbertForSequenceClassification", num_labels=num_labels, problem_type=problem_type)
    batch = albert_batch("right")
    model = flaxheads.from_pretrained(path)

    logits = model(**flax_inputs(batch))

    expected = torch_forward(reference, {**batch, "labels": labels})
    assert_close(model.loss(logits, jnp.asarray(labels)), expected.loss, f"{problem_type} loss")


def test_bfloat16_compute_stays_within_the_stated_tolerance_of_transformers_float32(albert):
    path, reference = albert("AlbertForSequenceClassification", num_labels=3, num_hidden_groups=2, inner_group_num=2)
    batch = albert_batch("right")
    half = flaxheads.from_pretrained(path, dtype="bfloat16")

    logits = half(**flax_inputs(batch))

    assert logits.dtype == jnp.float32
    assert {v.dtype for v in flat_params(half).values()} == {np.dtype("float32")}
    assert_close(logits, torch_forward(reference, batch).logits, "bfloat16 vs transformers float32", BF16_ATOL, BF16_ATOL)


def test_dropout_is_active_only_in_train_mode_and_every_shared_layer_gets_gradients(albert):
    path, _ = albert("AlbertForSequenceClassification", num_labels=3, num_hidden_groups=2, hidden_dropout_prob=0.2)
    batch = flax_inputs(albert_batch("right"))
    model = flaxheads.from_pretrained(path)

    def loss_and_logits(m):
        logits = m(**batch, rngs=nnx.Rngs(dropout=1))
        return m.loss(logits, jnp.array([0, 1, 2])), logits

    deterministic = np.asarray(model(**batch))
    model.train()
    (_, with_dropout), grads = nnx.jit(nnx.value_and_grad(loss_and_logits, has_aux=True))(model)

    assert np.max(np.abs(np.asarray(with_dropout) - deterministic)) > 1e-4
    for group in range(2):
        assert np.any(np.asarray(grads.backbone.groups[group].layers[0].attention.query.kernel[...]) != 0)
    assert np.any(np.asarray(grads.backbone.embedding_projection.kernel[...]) != 0)


def test_data_pipeline_pads_albert_on_the_right():
    assert backbone_spec("albert").padding_side == "right"


# ---------------------------------------------------------------------------------------------
# Every head on ALBERT


@pytest.mark.parametrize("head", ["cls", "mean", "concat_last4", "roberta", "last_token", "summary"])
def test_every_head_on_albert_reads_transformers_hidden_states_and_round_trips(albert, tmp_path, head):
    path, reference = albert("AlbertModel", num_hidden_layers=4, num_hidden_groups=2)
    batch = albert_batch("right")
    model = flaxheads.from_pretrained(path, head=head, num_labels=3, seed=1)
    model.save_pretrained(tmp_path)

    logits = model(**flax_inputs(batch))

    hidden = torch_forward(reference, batch, output_hidden_states=True).hidden_states
    inputs = HeadInputs(tuple(jnp.asarray(h.numpy()) for h in hidden), jnp.asarray(batch["attention_mask"]),
                        jnp.asarray(batch["input_ids"]), None)
    assert_close(logits, model.head(inputs), f"{head} on ALBERT vs the head on transformers' hidden states")
    again = flaxheads.from_pretrained(tmp_path)
    assert again.config.head == head
    assert_close(again(**flax_inputs(batch)), logits, f"{head} reloaded", atol=0, rtol=0)
    base, info = transformers.AutoModel.from_pretrained(tmp_path, output_loading_info=True)
    # Only the "pooler" head holds a pooler, as for BERT: transformers' AlbertModel starts its own.
    assert info["missing_keys"] <= {"pooler.weight", "pooler.bias"}
    assert_close(torch_forward(base.eval(), batch).last_hidden_state, hidden[-1], f"{head}: transformers reads the backbone")


# ---------------------------------------------------------------------------------------------
# Conversion


@pytest.mark.parametrize("torch_dtype", ["float32", "bfloat16"])
def test_pytorch_flaxheads_pytorch_round_trip_is_bit_identical(albert, tmp_path, torch_dtype):
    path, _ = albert("AlbertForSequenceClassification", num_labels=3, num_hidden_groups=2, inner_group_num=2,
                     torch_dtype=torch_dtype)
    model = flaxheads.from_pretrained(path, param_dtype="auto")

    model.save_pretrained(tmp_path)

    assert_state_dicts_identical(load_file(tmp_path / "model.safetensors"), load_file(path / "model.safetensors"))
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == ["AlbertForSequenceClassification"] and config["dtype"] == torch_dtype
    assert (config["num_hidden_groups"], config["inner_group_num"], config["embedding_size"]) == (2, 2, 24)


def test_convert_to_flax_and_back_is_bit_identical(albert, tmp_path):
    path, _ = albert("AlbertForSequenceClassification", num_labels=3, num_hidden_groups=2)

    convert(path, tmp_path / "flax")
    convert(tmp_path / "flax", tmp_path / "pytorch")

    assert_state_dicts_identical(load_file(tmp_path / "pytorch" / "model.safetensors"), load_file(path / "model.safetensors"))


@pytest.mark.parametrize("layout", ["sharded_safetensors", "bin"])
def test_sharded_and_bin_checkpoints_load_like_safetensors(albert, tmp_path, layout):
    path, reference = albert("AlbertForSequenceClassification", num_labels=3, num_hidden_groups=2)
    if layout == "bin":
        torch.save(reference.state_dict(), tmp_path / "pytorch_model.bin")
        (tmp_path / "config.json").write_text((path / "config.json").read_text())
    else:
        reference.save_pretrained(tmp_path, max_shard_size="20KB")
        assert (tmp_path / "model.safetensors.index.json").is_file()
    batch = albert_batch("left")

    model, info = flaxheads.from_pretrained(tmp_path, output_loading_info=True)

    assert info.fully_pretrained and info.unused == []
    assert_close(model(**flax_inputs(batch)), torch_forward(reference, batch).logits, layout)


def test_albert_model_export_with_a_new_classifier_loads_in_transformers_with_the_same_logits(albert, tmp_path):
    path, _ = albert("AlbertModel", num_hidden_groups=2, inner_group_num=2)
    batch = albert_batch("right")
    model = flaxheads.from_pretrained(path, num_labels=4, classifier_dropout=0.3, seed=2)
    model.save_pretrained(tmp_path)

    reloaded, info = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path, output_loading_info=True)

    assert type(reloaded).__name__ == "AlbertForSequenceClassification"
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    assert reloaded.config.classifier_dropout_prob == 0.3  # where AlbertForSequenceClassification reads it
    assert flaxheads.from_pretrained(tmp_path).head.cfg.dropout_rate == 0.3
    assert_close(model(**flax_inputs(batch)), torch_forward(reloaded.eval(), batch).logits, "export in transformers")


# ---------------------------------------------------------------------------------------------
# Loading report


def test_pretraining_checkpoint_keeps_its_pooler_and_reports_mlm_and_sop_heads_unused(albert):
    path, _ = albert("AlbertForPreTraining")

    model, info = flaxheads.from_pretrained(path, num_labels=3, output_loading_info=True)

    assert info.head == "pooler"
    assert info.newly_initialized == ["classifier.bias", "classifier.weight"]
    assert {"albert.pooler.weight", "albert.pooler.bias"} <= set(info.loaded)
    assert info.unused and all(n.startswith(("predictions.", "sop_classifier.")) for n in info.unused)
    assert {"sop_classifier.classifier.weight", "predictions.dense.weight"} <= set(info.unused)


def test_albert_model_checkpoint_creates_only_the_classifier(albert):
    path, _ = albert("AlbertModel")

    _, info = flaxheads.from_pretrained(path, output_loading_info=True)

    assert info.newly_initialized == ["classifier.bias", "classifier.weight"] and info.unused == []


def test_masked_lm_checkpoint_has_no_pooler_so_the_pooler_head_starts_new(albert):
    # AlbertForMaskedLM builds AlbertModel(add_pooling_layer=False): no pretrained pooler exists.
    path, _ = albert("AlbertForMaskedLM")

    _, info = flaxheads.from_pretrained(path, output_loading_info=True)

    assert info.newly_initialized == ["albert.pooler.bias", "albert.pooler.weight", "classifier.bias", "classifier.weight"]
    assert info.unused and all(n.startswith("predictions.") for n in info.unused)
    assert "albert.pooler.weight" in str(info)


def test_masked_lm_file_carrying_a_pooler_loads_it_as_the_hub_albert_v2_files_do(albert, tmp_path):
    # The hub's albert-*-v2 files (AlbertForMaskedLM, converted from TensorFlow) hold albert.pooler.*,
    # which transformers' AlbertForMaskedLM ignores and AlbertForSequenceClassification loads.
    from safetensors.numpy import load_file as load_numpy, save_file as save_numpy

    path, _ = albert("AlbertForPreTraining")
    tensors = {k: v for k, v in load_numpy(path / "model.safetensors").items() if not k.startswith("sop_classifier.")}
    save_numpy(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    config = {**json.loads((path / "config.json").read_text()), "architectures": ["AlbertForMaskedLM"]}
    (tmp_path / "config.json").write_text(json.dumps(config))

    _, info = flaxheads.from_pretrained(tmp_path, output_loading_info=True)

    assert info.newly_initialized == ["classifier.bias", "classifier.weight"]
    assert "albert.pooler.weight" in info.loaded and all(n.startswith("predictions.") for n in info.unused)


# ---------------------------------------------------------------------------------------------
# Errors


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"num_hidden_groups": 5}, r"num_hidden_groups=5.*num_hidden_layers=3"),
        ({"position_embedding_type": "relative_key"}, "relative_key"),
        ({"hidden_size": 34}, r"hidden_size=34 is not a multiple of num_attention_heads=4"),
    ],
)
def test_unsupported_albert_configs_say_what_is_wrong(albert, tmp_path, change, message):
    path, _ = albert("AlbertModel")
    (tmp_path / "config.json").write_text(json.dumps({**json.loads((path / "config.json").read_text()), **change}))
    (tmp_path / "model.safetensors").write_bytes((path / "model.safetensors").read_bytes())

    with pytest.raises((ValueError, NotImplementedError), match=message):
        flaxheads.from_pretrained(tmp_path)


def test_weights_of_more_groups_than_config_json_says_are_refused_naming_num_hidden_groups(albert, tmp_path):
    path, _ = albert("AlbertForSequenceClassification", num_labels=2, num_hidden_groups=2)
    config = {**json.loads((path / "config.json").read_text()), "num_hidden_groups": 1}
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "model.safetensors").write_bytes((path / "model.safetensors").read_bytes())

    with pytest.raises(flaxheads.CheckpointError, match=r"albert_layer_groups\.1\..*num_hidden_groups=1"):
        flaxheads.from_pretrained(tmp_path)


def test_wrong_shape_shared_layer_tensor_names_key_and_both_shapes(albert, tmp_path):
    from safetensors.numpy import load_file as load_numpy, save_file as save_numpy

    path, _ = albert("AlbertForSequenceClassification", num_labels=2, num_hidden_groups=2)
    tensors = load_numpy(path / "model.safetensors")
    name = "albert.encoder.albert_layer_groups.1.albert_layers.0.ffn.weight"
    tensors[name] = np.zeros((36, 36), np.float32)
    save_numpy(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    (tmp_path / "config.json").write_text((path / "config.json").read_text())

    with pytest.raises(flaxheads.ShapeMismatch, match=r"albert_layer_groups\.1\.albert_layers\.0\.ffn\.weight.*\(36, 36\).*\(37, 36\)"):
        flaxheads.from_pretrained(tmp_path)


# ---------------------------------------------------------------------------------------------
# Sharding on fake devices

def test_fsdp_rules_split_the_shared_albert_parameters_on_four_fake_devices(albert):
    path, reference = albert("AlbertForSequenceClassification", num_labels=3, num_hidden_groups=2, inner_group_num=2)
    batch = albert_batch("right")

    out = fsdp_on_fake_devices(path, batch)

    assert_close(out["logits"], torch_forward(reference, batch).logits, "fsdp=4 on fake devices")
    assert out["tree"] == out["split"]
    # Embeddings split by rows, kernels by input features, wherever 4 divides the dimension.
    assert "backbone.embeddings.word_embeddings.embedding" not in out["split"]  # 99 rows: whole
    for name in ("backbone.embeddings.position_embeddings.embedding", "backbone.embedding_projection.kernel",
                 "backbone.groups.1.layers.1.attention.query.kernel", "backbone.groups.0.layers.0.intermediate.kernel",
                 "head.pooler.dense.kernel"):
        assert name in out["split"], name
    assert "backbone.groups.0.layers.0.output.kernel" not in out["split"]  # 37 input features: whole


# ---------------------------------------------------------------------------------------------
# The command line, with an ALBERT tokenizer saved next to the checkpoint

_PIECES = ["<pad>", "<unk>", "[CLS]", "[SEP]", "[MASK]", "▁"] + list("abcdefghijklmnopqrstuvwxyz.,'!-")
_WORDS = ["the", "a", "and", "of", "to", "is", "it", "film", "movie", "good", "bad", "great", "dull", "story"]


@pytest.fixture(scope="module")
def albert_with_tokenizer(tmp_path_factory):
    """A tiny random AlbertModel and an `AlbertTokenizer` over a Unigram vocabulary of letters and
    a few words (what a spiece.model holds, built in memory), saved as tokenizer.json."""
    vocab = [(piece, 0.0 if i < 5 else -float(i)) for i, piece in enumerate(_PIECES)]
    vocab += [(f"▁{word}", -1.0) for word in _WORDS]
    tokenizer = transformers.AlbertTokenizer(vocab=vocab)
    path = tmp_path_factory.mktemp("albert_tok")
    config = transformers.AlbertConfig(**{**TINY_ALBERT, "vocab_size": len(tokenizer), "classifier_dropout_prob": 0.0})
    torch.manual_seed(0)
    transformers.AlbertModel(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    assert tokenizer.pad_token_id == 0 and tokenizer("a good film")["input_ids"][0] == 2
    return path


def test_inspect_train_evaluate_predict_and_convert_commands_work_on_albert(
    albert_with_tokenizer, snippets_csv, tmp_path, capsys
):
    check_cli_lifecycle(albert_with_tokenizer, snippets_csv, tmp_path, capsys, model_type="albert", head="pooler")
    pretrained = load_file(albert_with_tokenizer / "model.safetensors")
    exported = load_file(tmp_path / "run" / "model.safetensors")
    assert {f"albert.{k}" for k in pretrained} | {"classifier.weight", "classifier.bias"} == set(exported)


# ---------------------------------------------------------------------------------------------
# Hugging Face Flax (transformers 4.x FlaxAlbert) checkpoints

HF_FLAX_ALBERT = os.path.join(os.path.dirname(__file__), "fixtures", "hf_flax", "albert_seq_cls")
"""Saved by transformers 4.57's FlaxAlbertForSequenceClassification (scripts/make_hf_flax_fixtures.py):
embedding_size 24, hidden 32, 2 groups of 2 layers; expected.npz holds its inputs and logits."""


def test_hf_flax_albert_classifier_matches_transformers_flax_and_converts_to_pytorch(tmp_path):
    with np.load(os.path.join(HF_FLAX_ALBERT, "expected.npz")) as npz:
        values = dict(npz)
    batch = {k: values[k] for k in ("input_ids", "attention_mask", "token_type_ids")}
    model, info = flaxheads.from_pretrained(HF_FLAX_ALBERT, output_loading_info=True)

    logits = model(**flax_inputs(batch))
    model.save_pretrained(tmp_path)

    assert info.fully_pretrained and info.unused == []
    assert "albert/encoder/albert_layer_groups/1/albert_layers/1/ffn/kernel" in info.loaded
    assert_close(logits, values["logits"], "HF Flax ALBERT vs transformers 4.57 Flax")
    reloaded = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path).eval()
    batch64 = {k: v.astype(np.int64) for k, v in batch.items()}
    assert_close(torch_forward(reloaded, batch64).logits, values["logits"], "converted to PyTorch, in transformers 5")
