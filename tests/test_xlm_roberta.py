"""XLM-RoBERTa: RoBERTa's encoder and conversion table under model_type "xlm-roberta". Parity with
transformers (PyTorch, eval mode) on tiny random configs, every head on it, conversion both ways,
the loading report, sharding on fake devices, and the command line on a tiny checkpoint with a
Unigram (sentencepiece-style) tokenizer built here."""

from __future__ import annotations

import json

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

import flaxheads
from family_parity import (
    assert_close, check_cli_lifecycle, flax_logits, fsdp_on_fake_devices, state_dict, torch_logits, two_padded_rows,
)
from flaxheads.backbones import backbone_config_from_hf
from flaxheads.heads import HEAD_NAMES, HeadInputs

BF16_ATOL = 0.02
"""bfloat16 compute vs float32 logits (measured at most 0.005 on these tiny models)."""
CLASSIFIER = "XLMRobertaForSequenceClassification"
PAD_ID = 1  # XLM-R's <pad>; position ids count from PAD_ID + 1












def token_batch(padding: str, *, seq_len: int = 11, seed: int = 0) -> dict:
    return two_padded_rows(padding, seq_len=seq_len, seed=seed, pad_id=PAD_ID)


# ---------------------------------------------------------------------------------------------
# Parity


@pytest.mark.parametrize("padding", ["right", "left"])
@pytest.mark.parametrize("num_labels", [1, 2, 5])
def test_roberta_head_logits_match_transformers(hf_checkpoint, padding, num_labels):
    checkpoint = hf_checkpoint(CLASSIFIER, num_labels=num_labels)
    batch = token_batch(padding)

    model = flaxheads.from_pretrained(checkpoint.path)

    assert model.config.head == "roberta" and model.config.backbone.model_type == "xlm-roberta"
    assert_close(flax_logits(model, batch), torch_logits(checkpoint.model, batch), f"{padding}, {num_labels} labels")


def test_token_type_ids_reach_the_logits_as_in_transformers(hf_checkpoint):
    checkpoint = hf_checkpoint(CLASSIFIER, num_labels=3, type_vocab_size=2, hidden_act="gelu_new")
    batch = token_batch("right")
    batch["token_type_ids"] = np.zeros_like(batch["input_ids"])
    batch["token_type_ids"][:, 5:] = 1
    model = flaxheads.from_pretrained(checkpoint.path)

    with_types = flax_logits(model, batch)

    assert_close(with_types, torch_logits(checkpoint.model, batch), "with token types")
    assert np.abs(with_types - flax_logits(model, {**batch, "token_type_ids": 0 * batch["token_type_ids"]})).max() > 1e-3


@pytest.mark.parametrize("head", [h for h in HEAD_NAMES if h != "roberta"])
def test_every_head_on_xlm_roberta_gives_that_head_of_transformers_hidden_states(hf_checkpoint, head):
    checkpoint = hf_checkpoint("XLMRobertaModel", num_hidden_layers=4)  # concat_last4 needs 4 layers
    batch = token_batch("right")
    with torch.no_grad():
        hidden = checkpoint.model(**{k: torch.as_tensor(v) for k, v in batch.items()}, output_hidden_states=True)

    model = flaxheads.from_pretrained(checkpoint.path, head=head, num_labels=3)
    reference = model.head(HeadInputs(tuple(jnp.asarray(h.numpy()) for h in hidden.hidden_states),
                                      jnp.asarray(batch["attention_mask"]), jnp.asarray(batch["input_ids"])))

    assert_close(flax_logits(model, batch), reference, head)


def test_pooler_head_on_xlm_roberta_matches_transformers_pooler(hf_checkpoint):
    checkpoint = hf_checkpoint("XLMRobertaModel")
    batch = token_batch("left")
    model = flaxheads.from_pretrained(checkpoint.path, head="pooler", num_labels=2)
    with torch.no_grad():
        pooled = checkpoint.model(**{k: torch.as_tensor(v) for k, v in batch.items()}).pooler_output.numpy()
    kernel, bias = (np.asarray(p[...]) for p in (model.head.classifier.kernel, model.head.classifier.bias))

    assert_close(flax_logits(model, batch), pooled @ kernel + bias, "pooler head")


def test_bfloat16_compute_stays_close_to_float32(hf_checkpoint):
    checkpoint = hf_checkpoint(CLASSIFIER, num_labels=3)
    batch = token_batch("right")

    bf16 = flaxheads.from_pretrained(checkpoint.path, dtype=jnp.bfloat16)

    assert bf16.backbone.embeddings.word_embeddings.embedding[...].dtype == jnp.float32
    assert_close(flax_logits(bf16, batch), torch_logits(checkpoint.model, batch), "bfloat16 compute", atol=BF16_ATOL)


def test_config_without_pad_token_id_means_xlm_robertas_pad_one():
    config = backbone_config_from_hf({"model_type": "xlm-roberta", "hidden_size": 32, "num_attention_heads": 4})

    assert config.pad_token_id == 1 and config.position_ids_from_padding and config.max_sequence_length == 510
    assert config.to_hf_config()["model_type"] == "xlm-roberta"


# ---------------------------------------------------------------------------------------------
# Conversion and the loading report


@pytest.mark.parametrize("torch_dtype", ["float32", "bfloat16"])
def test_pytorch_flaxheads_pytorch_round_trip_is_bit_identical(hf_checkpoint, tmp_path, torch_dtype):
    checkpoint = hf_checkpoint(CLASSIFIER, num_labels=3, torch_dtype=torch_dtype)
    original = state_dict(checkpoint.path)

    flaxheads.from_pretrained(checkpoint.path, param_dtype=getattr(jnp, torch_dtype)).save_pretrained(tmp_path)
    exported = state_dict(tmp_path)

    assert sorted(exported) == sorted(original)
    for name, tensor in original.items():
        assert exported[name].dtype == tensor.dtype and torch.equal(exported[name], tensor), name


def test_sharded_and_bin_checkpoints_load_the_same_weights(hf_checkpoint, tmp_path):
    checkpoint = hf_checkpoint(CLASSIFIER, num_labels=3)
    checkpoint.model.save_pretrained(tmp_path / "sharded", max_shard_size="20KB")
    (tmp_path / "bin").mkdir()
    checkpoint.model.config.save_pretrained(tmp_path / "bin")
    torch.save(checkpoint.model.state_dict(), tmp_path / "bin" / "pytorch_model.bin")
    assert len(list((tmp_path / "sharded").glob("*.safetensors"))) > 1
    batch = token_batch("right")
    expected = flax_logits(flaxheads.from_pretrained(checkpoint.path), batch)

    for kind in ("sharded", "bin"):
        np.testing.assert_array_equal(flax_logits(flaxheads.from_pretrained(tmp_path / kind), batch), expected, kind)


def test_export_of_a_new_head_loads_in_transformers_with_no_missing_or_unexpected_keys(hf_checkpoint, tmp_path):
    flaxheads.from_pretrained(hf_checkpoint("XLMRobertaModel").path, num_labels=4, seed=2).save_pretrained(tmp_path)
    batch = token_batch("left")

    reference, info = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path, output_loading_info=True)

    assert type(reference).__name__ == CLASSIFIER
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "xlm-roberta"
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    assert_close(flax_logits(flaxheads.from_pretrained(tmp_path), batch), torch_logits(reference.eval(), batch),
                 "export in transformers")


def test_xlm_roberta_model_checkpoint_creates_only_the_roberta_head_and_leaves_its_pooler(hf_checkpoint):
    _, info = flaxheads.from_pretrained(hf_checkpoint("XLMRobertaModel").path, output_loading_info=True)

    assert info.newly_initialized == ["classifier.dense.bias", "classifier.dense.weight",
                                      "classifier.out_proj.bias", "classifier.out_proj.weight"]
    assert info.unused == ["pooler.dense.bias", "pooler.dense.weight"]


def test_masked_lm_checkpoint_reports_its_lm_head_unused(hf_checkpoint):
    _, info = flaxheads.from_pretrained(hf_checkpoint("XLMRobertaForMaskedLM").path, output_loading_info=True)

    assert info.unused and all(name.startswith("lm_head.") for name in info.unused)
    assert {"lm_head.dense.weight", "lm_head.layer_norm.weight", "lm_head.bias"} <= set(info.unused)
    assert all(name.startswith("roberta.") for name in info.loaded)


# ---------------------------------------------------------------------------------------------
# Sharding on fake devices

def test_fsdp_rules_split_xlm_roberta_kernels_and_embeddings_and_keep_the_logits(hf_checkpoint):
    checkpoint = hf_checkpoint(CLASSIFIER, num_labels=3)
    batch = two_padded_rows("right", seq_len=9, pad_id=1)

    result = fsdp_on_fake_devices(checkpoint.path, batch)

    split = result["split"]
    assert result["tree"] == split  # the train step's state shardings follow the same rules
    assert {"backbone.embeddings.position_embeddings.embedding", "backbone.layers.1.attention.value.kernel",
            "backbone.layers.0.intermediate.kernel", "head.dense.kernel", "head.out_proj.kernel"} <= split
    # 99 vocabulary rows and 37 feed-forward inputs do not divide by 4: those stay whole.
    assert not {"backbone.embeddings.word_embeddings.embedding", "backbone.layers.0.output.kernel"} & split
    assert not any(name.endswith(("bias", "scale")) for name in split)
    assert_close(result["logits"], torch_logits(checkpoint.model, batch), "fsdp=4 on fake devices")


# ---------------------------------------------------------------------------------------------
# The command line on a tiny checkpoint with a Unigram tokenizer

WORDS = "a the film movie great good bad dull boring moving story plot worst best so and is was very".split()


@pytest.fixture(scope="module")
def tiny_xlm_roberta(tmp_path_factory):
    """A 2-layer XLMRobertaModel (dropout off) and an XLM-R tokenizer over a small Unigram vocab
    (<s>=0, <pad>=1, </s>=2, <unk>=3, as XLM-R's sentencepiece model)."""
    path = tmp_path_factory.mktemp("tiny_xlm_roberta")
    specials = [("<s>", 0.0), ("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("<mask>", 0.0)]
    pieces = [(f"\u2581{w}", -2.0) for w in WORDS] + [(c, -5.0) for c in "\u2581abcdefghijklmnopqrstuvwxyz,.!"]
    tokenizer = transformers.XLMRobertaTokenizer(vocab=specials + pieces)
    config = transformers.XLMRobertaConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2,
                                           num_attention_heads=4, intermediate_size=37, max_position_embeddings=40,
                                           type_vocab_size=1, pad_token_id=1, bos_token_id=0, eos_token_id=2,
                                           hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    transformers.XLMRobertaModel(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def test_inspect_train_evaluate_predict_and_convert_commands_work_on_xlm_roberta(
    tiny_xlm_roberta, snippets_csv, tmp_path, capsys
):
    inspected = check_cli_lifecycle(tiny_xlm_roberta, snippets_csv, tmp_path, capsys,
                                    model_type="xlm-roberta", head="roberta")
    assert "classifier.out_proj.weight" in inspected
