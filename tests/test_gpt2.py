"""GPT-2 and the "last_token" head: what is particular to them. A pad id other than eos, explicit
positions and token types, causality, transformers' initialisation, which token the head reads
(pad id first, then the mask, then an error), the errors, old checkpoints' buffers, and the head on
BERT. Tiny random models: vocab 99 (eos = pad = 98), 32 wide, 2 layers, 64 positions. The
scenarios every family shares (row "gpt2" of tests/families.py) are in tests/test_family_*.py.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from safetensors.torch import load_file, save_file

import flaxheads
from families import EOS, GPT2, padded_batch
from family_parity import assert_close, assert_same_params, flax_inputs, torch_forward as torch_outputs
from flaxheads.heads.last_token import last_real_token_index

TINY_GPT2 = GPT2.config


def gpt2(hf_checkpoint, architecture: str, **overrides):
    """(path, torch model) of the GPT-2 row's checkpoint (tests/families.py: pad_token_id = eos)."""
    return hf_checkpoint(architecture, **overrides)


def token_batch(padding: str, *, pad_id: int = EOS, seq_len: int = 10, seed: int = 0) -> dict[str, np.ndarray]:
    """Three sequences of lengths (10, 7, 2) padded on `padding` ("right", "left" or "none")."""
    return padded_batch(padding, seq_len=seq_len, seed=seed, pad_id=pad_id, highest_id=90, token_types=False)


def copy_checkpoint(src: Path, dst: Path, **config_changes) -> Path:
    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text())
    config.update(config_changes)
    (dst / "config.json").write_text(json.dumps(config))
    return dst


# ---------------------------------------------------------------------------------------------
# Inputs


@pytest.mark.parametrize("padding", ["right", "left"])
@pytest.mark.slow  # runs the family beyond its canonical parity (the fast lane has that)
def test_pad_token_other_than_eos_matches_transformers(hf_checkpoint, padding):
    path, reference = gpt2(hf_checkpoint, "GPT2ForSequenceClassification", num_labels=3, pad_token_id=0)
    batch = token_batch(padding, pad_id=0)
    batch["input_ids"][0, 4] = EOS  # an eos inside a text is an ordinary token when pad != eos

    logits = flaxheads.from_pretrained(path)(**flax_inputs(batch))

    assert_close(logits, torch_outputs(reference, batch).logits, f"gpt2 pad_token_id=0, padding={padding}")


@pytest.mark.slow  # runs the family beyond its canonical parity (the fast lane has that)
def test_explicit_position_ids_and_token_type_ids_match_transformers(hf_checkpoint):
    path, reference = gpt2(hf_checkpoint, "GPT2ForSequenceClassification", num_labels=2)
    batch = token_batch("left")
    # Count positions from each row's first real token, as generation code does for left padding.
    batch["position_ids"] = np.maximum(np.cumsum(batch["attention_mask"], axis=1) - 1, 0)
    batch["token_type_ids"] = (np.arange(10)[None, :] >= 5).astype(np.int64) * np.array([[3], [5], [7]])
    model = flaxheads.from_pretrained(path)

    logits = model(**flax_inputs(batch))
    default_positions = model(**flax_inputs({k: v for k, v in batch.items() if k != "position_ids"}))

    assert_close(logits, torch_outputs(reference, batch).logits, "gpt2 explicit position_ids and token_type_ids")
    assert np.max(np.abs(np.asarray(logits - default_positions))) > 1e-3


@pytest.mark.slow  # runs the family beyond its canonical parity (the fast lane has that)
def test_changing_a_later_token_never_changes_an_earlier_hidden_state(hf_checkpoint):
    path, _ = gpt2(hf_checkpoint, "GPT2Model", n_layer=3)
    backbone, _ = flaxheads.load_backbone(path)
    batch = token_batch("none")
    changed = batch["input_ids"].copy()
    changed[:, 6] = (changed[:, 6] + 11) % 90 + 1

    before = backbone(jnp.asarray(batch["input_ids"])).hidden_states
    after = backbone(jnp.asarray(changed)).hidden_states

    for layer, (b, a) in enumerate(zip(before, after)):
        np.testing.assert_array_equal(np.asarray(b)[:, :6], np.asarray(a)[:, :6], err_msg=f"layer {layer}")
    assert np.max(np.abs(np.asarray(before[-1])[:, 6:] - np.asarray(after[-1])[:, 6:])) > 1e-3


@pytest.mark.slow  # initialises an 8-layer model
def test_fresh_model_initialises_like_transformers_with_scaled_residual_projections():
    config = flaxheads.GPT2Config(**{**TINY_GPT2, "n_embd": 64, "n_inner": None, "n_layer": 8, "initializer_range": 0.02})
    model = flaxheads.SequenceClassifier(
        flaxheads.ClassifierConfig(backbone=config, head="last_token", num_labels=3), rngs=nnx.Rngs(0)
    )
    block = model.backbone.layers[0]
    residual_std = 0.02 / np.sqrt(2 * 8)

    for kernel, std in [(block.attention.qkv.kernel, 0.02), (block.intermediate.kernel, 0.02),
                        (block.attention.output.kernel, residual_std), (block.output.kernel, residual_std),
                        (model.backbone.token_embeddings.embedding, 0.02), (model.head.score.kernel, 0.02)]:
        assert np.std(np.asarray(kernel[...])) == pytest.approx(std, rel=0.1)
    assert not np.asarray(block.attention.qkv.bias[...]).any() and not np.asarray(block.output.bias[...]).any()
    np.testing.assert_array_equal(np.asarray(model.backbone.final_norm.scale[...]), 1.0)
    assert model.head.score.bias is None


# ---------------------------------------------------------------------------------------------
# Which token the head reads: pad id first, then the mask, then an error


def test_last_real_token_index_handles_both_padding_sides_and_all_padding_rows():
    ids = jnp.array([[5, 6, 7, 0, 0], [0, 0, 5, 6, 7], [0, 0, 0, 0, 0], [5, 0, 0, 0, 0], [5, 6, 7, 8, 9]])

    np.testing.assert_array_equal(last_real_token_index(ids, None, pad_token_id=0), [2, 4, 0, 0, 4])
    np.testing.assert_array_equal(last_real_token_index(ids, (ids != 0).astype(jnp.int32), None), [2, 4, 0, 0, 4])


@pytest.mark.slow  # runs the family beyond its canonical parity (the fast lane has that)
def test_pad_id_equal_to_eos_reads_a_text_ending_in_eos_one_token_earlier_as_transformers(hf_checkpoint):
    path, reference = gpt2(hf_checkpoint, "GPT2ForSequenceClassification", num_labels=3)
    batch = token_batch("right")
    batch["input_ids"][1, 6] = EOS  # the text's own last token is eos; the mask says it is real
    model = flaxheads.from_pretrained(path)

    logits = model(**flax_inputs(batch))

    assert_close(logits, torch_outputs(reference, batch).logits, "gpt2 text ending in eos == pad")
    read_from_mask = model.head.score(model.backbone(**flax_inputs(batch)).last_hidden_state[1, 6])
    assert np.max(np.abs(np.asarray(logits[1] - read_from_mask))) > 1e-3


def test_without_pad_token_id_a_batch_without_mask_is_an_error_saying_what_to_set(hf_checkpoint):
    path, _ = gpt2(hf_checkpoint, "GPT2ForSequenceClassification", num_labels=2, pad_token_id=None)
    model = flaxheads.from_pretrained(path)
    assert model.config.backbone.pad_token_id is None

    with pytest.raises(ValueError, match=r"no pad_token_id and no attention_mask.*pad_token_id=tokenizer"):
        model(jnp.asarray(token_batch("none")["input_ids"]))


@pytest.mark.slow  # runs the family beyond its canonical parity (the fast lane has that)
def test_without_pad_token_id_a_single_sequence_reads_its_last_position_as_transformers(hf_checkpoint):
    path, reference = gpt2(hf_checkpoint, "GPT2ForSequenceClassification", num_labels=2, pad_token_id=None)
    batch = {"input_ids": token_batch("none")["input_ids"][:1]}

    logits = flaxheads.from_pretrained(path)(**flax_inputs(batch))

    assert_close(logits, torch_outputs(reference, batch).logits, "gpt2 no pad id, batch of one")


@pytest.mark.parametrize("padding", ["right", "left"])
@pytest.mark.slow  # runs the family beyond its canonical parity (the fast lane has that)
def test_without_pad_token_id_the_attention_mask_finds_the_last_real_token(hf_checkpoint, padding):
    path, _ = gpt2(hf_checkpoint, "GPT2ForSequenceClassification", num_labels=2, pad_token_id=None)
    batch = token_batch(padding, pad_id=EOS)
    model = flaxheads.from_pretrained(path)
    with_pad_id = flaxheads.from_pretrained(path, pad_token_id=EOS)

    np.testing.assert_array_equal(np.asarray(model(**flax_inputs(batch))), np.asarray(with_pad_id(**flax_inputs(batch))))


@pytest.mark.slow  # runs the family beyond its canonical parity (the fast lane has that)
def test_pad_token_id_override_matches_transformers_and_is_saved(hf_checkpoint, tmp_path):
    path, reference = gpt2(hf_checkpoint, "GPT2ForSequenceClassification", num_labels=2, pad_token_id=None)
    batch = token_batch("right")
    model = flaxheads.from_pretrained(path, pad_token_id=EOS)

    reference.config.pad_token_id = EOS  # transformers' documented fix; undone below (shared model)
    try:
        expected = torch_outputs(reference, batch).logits
    finally:
        reference.config.pad_token_id = None
    model.save_pretrained(tmp_path)

    assert_close(model(**flax_inputs(batch)), expected, "gpt2 pad_token_id given at load")
    assert json.loads((tmp_path / "config.json").read_text())["pad_token_id"] == EOS


# ---------------------------------------------------------------------------------------------
# Errors


def test_wrong_shape_tensor_names_key_and_both_shapes(hf_checkpoint, tmp_path):
    path, _ = gpt2(hf_checkpoint, "GPT2ForSequenceClassification", num_labels=2)
    damaged = copy_checkpoint(path, tmp_path / "damaged")
    tensors = load_file(damaged / "model.safetensors")
    # c_attn stored as an nn.Linear would be, (out, in): the Conv1D layout is (in, out).
    tensors["transformer.h.1.attn.c_attn.weight"] = tensors["transformer.h.1.attn.c_attn.weight"].T.contiguous()
    save_file(tensors, damaged / "model.safetensors", metadata={"format": "pt"})

    with pytest.raises(flaxheads.ShapeMismatch, match=r"transformer\.h\.1\.attn\.c_attn\.weight.*\(96, 32\).*\(32, 96\)"):
        flaxheads.from_pretrained(damaged)


def test_classifier_of_another_size_says_num_labels(hf_checkpoint):
    path, _ = gpt2(hf_checkpoint, "GPT2ForSequenceClassification", num_labels=2)

    with pytest.raises(flaxheads.ShapeMismatch, match=r"score\.weight.*num_labels"):
        flaxheads.from_pretrained(path, num_labels=3)


@pytest.mark.parametrize(
    ("inputs", "message"),
    [({"input_ids": np.ones((2, 65), np.int32)}, r"input_ids has 65 tokens per sequence, .* covers at most 64"),
     ({"input_ids": np.ones((8,), np.int32)}, r"input_ids must be integers of shape \(batch, seq\); got shape \(8,\)"),
     ({"input_ids": np.ones((2, 8), np.int32), "attention_mask": np.ones((2, 7), np.int32)},
      r"attention_mask has shape \(2, 7\) but input_ids has \(2, 8\)")],
)
def test_inputs_of_the_wrong_shape_are_refused(hf_checkpoint, inputs, message):
    path, _ = gpt2(hf_checkpoint, "GPT2ForSequenceClassification", num_labels=2)
    model = flaxheads.from_pretrained(path)

    with pytest.raises(ValueError, match=message):
        model(**flax_inputs(inputs))


def test_cross_attention_config_is_not_implemented(hf_checkpoint, tmp_path):
    path, _ = gpt2(hf_checkpoint, "GPT2Model")

    with pytest.raises(NotImplementedError, match="add_cross_attention"):
        flaxheads.from_pretrained(copy_checkpoint(path, tmp_path / "x", add_cross_attention=True))


# ---------------------------------------------------------------------------------------------
# Loading reports


def test_loading_info_says_when_the_last_token_head_has_no_pad_token_id(hf_checkpoint):
    path, _ = gpt2(hf_checkpoint, "GPT2Model", pad_token_id=None)

    _, without = flaxheads.from_pretrained(path, output_loading_info=True)
    _, with_pad = flaxheads.from_pretrained(path, pad_token_id=EOS, output_loading_info=True)

    assert any("pad_token_id=tokenizer.eos_token_id" in note for note in without.notes)
    assert "no pad_token_id" in str(without) and "no pad_token_id" not in str(with_pad)


def test_lm_head_checkpoint_loads_its_transformer_backbone_and_nothing_else(hf_checkpoint):
    path, _ = gpt2(hf_checkpoint, "GPT2LMHeadModel")

    _, info = flaxheads.from_pretrained(path, pad_token_id=EOS, output_loading_info=True)

    assert all(name.startswith("transformer.") for name in info.loaded)


def test_lm_head_weight_and_mask_buffers_of_old_checkpoints_are_reported_unused(hf_checkpoint, tmp_path):
    path, reference = gpt2(hf_checkpoint, "GPT2LMHeadModel")
    legacy = copy_checkpoint(path, tmp_path / "legacy")
    tensors = load_file(legacy / "model.safetensors")
    tensors["lm_head.weight"] = reference.lm_head.weight.detach().clone()
    for i in range(TINY_GPT2["n_layer"]):
        tensors[f"transformer.h.{i}.attn.bias"] = torch.tril(torch.ones(64, 64)).view(1, 1, 64, 64)
        tensors[f"transformer.h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
    save_file(tensors, legacy / "model.safetensors", metadata={"format": "pt"})

    _, info = flaxheads.from_pretrained(legacy, pad_token_id=EOS, output_loading_info=True)

    assert info.newly_initialized == ["score.weight"]
    assert info.unused == sorted(
        ["lm_head.weight", *[f"transformer.h.{i}.attn.{b}" for i in range(2) for b in ("bias", "masked_bias")]]
    )


# ---------------------------------------------------------------------------------------------
# The "last_token" head on another backbone


@pytest.mark.parametrize("padding", ["right", "left"])
@pytest.mark.slow  # runs the family beyond its canonical parity (the fast lane has that)
def test_last_token_head_on_bert_reads_the_last_real_token_and_round_trips(hf_checkpoint, tmp_path, padding):
    path, reference = hf_checkpoint("BertModel")
    batch = token_batch(padding, pad_id=0)
    model = flaxheads.from_pretrained(path, head="last_token", num_labels=3)

    model.save_pretrained(tmp_path)
    again = flaxheads.from_pretrained(tmp_path)

    exported = load_file(tmp_path / "model.safetensors")
    assert sorted(k for k in exported if not k.startswith("bert.")) == ["head.score.weight"]
    assert again.config.head == "last_token"
    assert_same_params(again, model)
    hidden = torch_outputs(reference, batch).last_hidden_state
    last = batch["attention_mask"].shape[1] - 1 - np.argmax(batch["attention_mask"][:, ::-1], axis=1)
    expected = hidden[torch.arange(3), torch.from_numpy(last)] @ exported["head.score.weight"].T
    assert_close(again(**flax_inputs(batch)), expected, f"last_token head on bert, {padding} padding")


