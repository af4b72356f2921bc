"""DistilBERT and the "distilbert" head: parity with transformers (PyTorch, eval mode) on tiny random
non-default configs, every head on DistilBERT and the new head on BERT, conversion both ways,
the loading report, sharding on fake devices, and the command line on a tiny checkpoint with a
WordPiece (vocab.txt) tokenizer."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

import flaxheads
from family_parity import (
    assert_close, check_cli_lifecycle, flax_logits, fsdp_on_fake_devices, state_dict, torch_logits,
)
from family_parity import two_padded_rows as token_batch
from flaxheads.backbones import DistilBertConfig, backbone_config_from_hf
from flaxheads.backbones.encoder import sinusoidal_table
from flaxheads.heads import HEAD_NAMES, HeadInputs

BF16_ATOL = 0.02
"""bfloat16 compute vs float32 logits (measured at most 0.005 on these tiny models)."""
CLASSIFIER = "DistilBertForSequenceClassification"












# ---------------------------------------------------------------------------------------------
# Parity


@pytest.mark.parametrize("padding", ["right", "left"])
@pytest.mark.parametrize("num_labels", [1, 2, 5])
def test_distilbert_head_logits_match_transformers(hf_checkpoint, padding, num_labels):
    checkpoint = hf_checkpoint(CLASSIFIER, num_labels=num_labels)
    batch = token_batch(padding)

    model = flaxheads.from_pretrained(checkpoint.path)

    assert model.config.head == "distilbert"
    assert_close(flax_logits(model, batch), torch_logits(checkpoint.model, batch), f"{padding}, {num_labels} labels")


@pytest.mark.parametrize(
    "options",
    [dict(sinusoidal_pos_embds=True, activation="relu"), dict(num_hidden_layers=3, activation="gelu_new", max_position_embeddings=20)],
)
def test_backbone_variants_match_transformers(hf_checkpoint, options):
    checkpoint = hf_checkpoint(CLASSIFIER, num_labels=3, **options)
    batch = token_batch("right")

    assert_close(flax_logits(flaxheads.from_pretrained(checkpoint.path), batch), torch_logits(checkpoint.model, batch),
                 str(options))


def test_every_hidden_state_matches_distilbert_model(hf_checkpoint):
    checkpoint = hf_checkpoint("DistilBertModel")
    batch = token_batch("right")
    with torch.no_grad():
        expected = checkpoint.model(**{k: torch.as_tensor(v) for k, v in batch.items()}, output_hidden_states=True)

    backbone, _ = flaxheads.load_backbone(checkpoint.path)
    backbone.eval()
    ours = backbone(jnp.asarray(batch["input_ids"]), jnp.asarray(batch["attention_mask"]))

    assert len(ours.hidden_states) == len(expected.hidden_states) == 3
    for i, (a, b) in enumerate(zip(ours.hidden_states, expected.hidden_states)):
        assert_close(a, b.numpy(), f"hidden state {i}")


def test_token_type_ids_are_ignored_as_distilbert_has_no_token_types(hf_checkpoint):
    model = flaxheads.from_pretrained(hf_checkpoint(CLASSIFIER).path)
    batch = token_batch("right")
    token_types = np.zeros_like(batch["input_ids"])
    token_types[:, 5:] = 1

    with_types = flax_logits(model, {**batch, "token_type_ids": token_types})

    np.testing.assert_array_equal(with_types, flax_logits(model, batch))
    assert model.backbone.embeddings.token_type_embeddings is None


@pytest.mark.parametrize("head", [h for h in HEAD_NAMES if h != "distilbert"])
def test_every_head_on_distilbert_gives_that_head_of_transformers_hidden_states(hf_checkpoint, head):
    checkpoint = hf_checkpoint("DistilBertModel", num_hidden_layers=4)  # concat_last4 needs 4 layers
    batch = token_batch("right")
    with torch.no_grad():
        hidden = checkpoint.model(**{k: torch.as_tensor(v) for k, v in batch.items()}, output_hidden_states=True)

    model = flaxheads.from_pretrained(checkpoint.path, head=head, num_labels=3)
    reference = model.head(HeadInputs(tuple(jnp.asarray(h.numpy()) for h in hidden.hidden_states),
                                      jnp.asarray(batch["attention_mask"]), jnp.asarray(batch["input_ids"])))

    assert_close(flax_logits(model, batch), reference, head)


@pytest.mark.parametrize("padding", ["right", "left"])
def test_distilbert_head_on_bert_matches_a_torch_reference_and_round_trips(hf_checkpoint, tmp_path, padding):
    checkpoint = hf_checkpoint("BertModel")
    batch = {**token_batch(padding), "token_type_ids": np.zeros((3, 11), np.int64)}
    model = flaxheads.from_pretrained(checkpoint.path, head="distilbert", num_labels=4)
    model.save_pretrained(tmp_path)
    weights = state_dict(tmp_path)
    with torch.no_grad():
        first = checkpoint.model(**{k: torch.as_tensor(v) for k, v in batch.items()}).last_hidden_state[:, 0]
        pre = torch.relu(first @ weights["head.pre_classifier.weight"].T + weights["head.pre_classifier.bias"])
        expected = pre @ weights["head.classifier.weight"].T + weights["head.classifier.bias"]

    assert_close(flax_logits(model, batch), expected.numpy(), f"distilbert head on bert, {padding} padding")
    assert_close(flax_logits(flaxheads.from_pretrained(tmp_path), batch), expected.numpy(), "reloaded")


def test_head_dropout_is_seq_classif_dropout_on_distilbert_and_the_classifier_dropout_elsewhere(hf_checkpoint):
    on_distilbert = flaxheads.from_pretrained(hf_checkpoint(CLASSIFIER, seq_classif_dropout=0.3).path)
    on_bert = flaxheads.from_pretrained(hf_checkpoint("BertModel").path, head="distilbert")
    overridden = flaxheads.from_pretrained(hf_checkpoint(CLASSIFIER).path, classifier_dropout=0.05)

    assert on_distilbert.config.head_config().dropout_rate == 0.3
    assert on_bert.config.head_config().dropout_rate == 0.1  # BERT's hidden_dropout_prob
    assert overridden.config.head_config().dropout_rate == 0.05


def test_bfloat16_compute_stays_close_to_float32_and_keeps_float32_params(hf_checkpoint):
    checkpoint = hf_checkpoint(CLASSIFIER, num_labels=3)
    batch = token_batch("right")

    bf16 = flaxheads.from_pretrained(checkpoint.path, dtype=jnp.bfloat16)

    params = jax.tree_util.tree_leaves(bf16)
    assert all(p.dtype == jnp.float32 for p in params if hasattr(p, "dtype") and jnp.issubdtype(p.dtype, jnp.floating))
    assert_close(flax_logits(bf16, batch), torch_logits(checkpoint.model, batch), "bfloat16 compute", atol=BF16_ATOL)


def test_fresh_sinusoidal_model_starts_from_transformers_position_table():
    config = DistilBertConfig(vocab_size=99, dim=32, n_heads=4, hidden_dim=37, n_layers=1, max_position_embeddings=24,
                              sinusoidal_pos_embds=True)
    model = flaxheads.SequenceClassifier(flaxheads.ClassifierConfig(config, head="distilbert"),
                                         rngs=flaxheads_rngs())
    torch_model = transformers.DistilBertModel(transformers.DistilBertConfig(**config.to_hf_config()))

    table = np.asarray(model.backbone.embeddings.position_embeddings.embedding[...])

    np.testing.assert_array_equal(table, sinusoidal_table(24, 32))
    np.testing.assert_array_equal(table, torch_model.embeddings.position_embeddings.weight.detach().numpy())


def flaxheads_rngs():
    from flax import nnx

    return nnx.Rngs(0)


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


def test_flax_format_round_trip_is_exact(hf_checkpoint, tmp_path):
    model = flaxheads.from_pretrained(hf_checkpoint(CLASSIFIER, num_labels=2).path)
    model.save_pretrained(tmp_path, format="flaxheads")
    batch = token_batch("left")

    np.testing.assert_array_equal(flax_logits(flaxheads.from_pretrained(tmp_path), batch), flax_logits(model, batch))


def test_export_of_a_new_head_loads_in_transformers_with_no_missing_or_unexpected_keys(hf_checkpoint, tmp_path):
    flaxheads.from_pretrained(hf_checkpoint("DistilBertModel").path, num_labels=5, seed=3).save_pretrained(tmp_path)
    batch = token_batch("right")

    reference, info = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path, output_loading_info=True)

    assert type(reference).__name__ == CLASSIFIER
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    assert_close(flax_logits(flaxheads.from_pretrained(tmp_path), batch), torch_logits(reference.eval(), batch),
                 "export in transformers")


def test_export_keeps_every_distilbert_config_field(hf_checkpoint, tmp_path):
    checkpoint = hf_checkpoint(CLASSIFIER, num_labels=2, sinusoidal_pos_embds=True, activation="relu")
    flaxheads.from_pretrained(checkpoint.path).save_pretrained(tmp_path)
    source, exported = (json.loads((p / "config.json").read_text()) for p in (checkpoint.path, tmp_path))

    for name in ("dim", "n_layers", "n_heads", "hidden_dim", "activation", "sinusoidal_pos_embds", "dropout",
                 "attention_dropout", "seq_classif_dropout", "qa_dropout", "max_position_embeddings", "model_type"):
        assert exported[name] == source[name], name
    assert backbone_config_from_hf(exported) == backbone_config_from_hf(source)


def test_distilbert_model_checkpoint_creates_only_the_distilbert_head(hf_checkpoint):
    _, info = flaxheads.from_pretrained(hf_checkpoint("DistilBertModel").path, output_loading_info=True)

    assert info.newly_initialized == ["classifier.bias", "classifier.weight", "pre_classifier.bias",
                                      "pre_classifier.weight"]
    assert info.unused == [] and info.mismatched == []


def test_masked_lm_checkpoint_reports_its_vocab_head_unused(hf_checkpoint):
    checkpoint = hf_checkpoint("DistilBertForMaskedLM")

    _, info = flaxheads.from_pretrained(checkpoint.path, output_loading_info=True)

    unused = set(info.unused)
    for part in ("vocab_transform", "vocab_layer_norm"):
        assert {f"{part}.weight", f"{part}.bias"} <= unused, part
    assert "vocab_projector.bias" in unused
    assert all(name.startswith("distilbert.") for name in info.loaded)
    assert sorted(info.newly_initialized) == ["classifier.bias", "classifier.weight", "pre_classifier.bias",
                                              "pre_classifier.weight"]


def test_another_head_on_distilbert_round_trips_through_the_flaxheads_layout(hf_checkpoint, tmp_path):
    model = flaxheads.from_pretrained(hf_checkpoint("DistilBertModel").path, head="roberta", num_labels=3, seed=1)
    model.save_pretrained(tmp_path)
    batch = token_batch("right")

    backbone_only, info = transformers.DistilBertModel.from_pretrained(tmp_path, output_loading_info=True)

    assert not info["missing_keys"]
    assert {"head.dense.weight", "head.out_proj.weight"} <= set(state_dict(tmp_path))
    np.testing.assert_array_equal(flax_logits(flaxheads.from_pretrained(tmp_path), batch), flax_logits(model, batch))


# ---------------------------------------------------------------------------------------------
# Sharding on fake devices

def test_fsdp_rules_split_distilbert_kernels_and_embeddings_and_keep_the_logits(hf_checkpoint):
    checkpoint = hf_checkpoint(CLASSIFIER, num_labels=3)
    batch = token_batch("right", seq_len=9)

    result = fsdp_on_fake_devices(checkpoint.path, batch)

    assert result["tree"] == result["split"]  # the train step's state shardings follow the same rules
    assert {"backbone.embeddings.position_embeddings.embedding", "backbone.layers.0.attention.query.kernel",
            "backbone.layers.1.intermediate.kernel", "head.pre_classifier.kernel", "head.classifier.kernel"} <= result["split"]
    assert not any(name.endswith(("bias", "scale")) for name in result["split"])
    assert_close(result["logits"], torch_logits(checkpoint.model, batch), "fsdp=4 on fake devices")


# ---------------------------------------------------------------------------------------------
# The command line on a tiny checkpoint with a WordPiece tokenizer

WORDS = "a the film movie great good bad dull boring moving story plot worst best so and is was very".split()


@pytest.fixture(scope="module")
def tiny_distilbert(tmp_path_factory):
    """A 2-layer DistilBertModel (dropout off) and a DistilBERT tokenizer over a small vocab.txt."""
    path = tmp_path_factory.mktemp("tiny_distilbert")
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS, ",", ".", "!"]
    (path / "vocab.txt").write_text("\n".join(vocab) + "\n")
    tokenizer = transformers.DistilBertTokenizer(vocab_file=str(path / "vocab.txt"))
    config = transformers.DistilBertConfig(vocab_size=len(vocab), dim=32, n_heads=4, hidden_dim=37, n_layers=2,
                                           max_position_embeddings=64, dropout=0.0, attention_dropout=0.0,
                                           seq_classif_dropout=0.0)
    torch.manual_seed(0)
    transformers.DistilBertModel(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def test_inspect_train_evaluate_predict_and_convert_commands_work_on_distilbert(
    tiny_distilbert, snippets_csv, tmp_path, capsys
):
    inspected = check_cli_lifecycle(tiny_distilbert, snippets_csv, tmp_path, capsys,
                                    model_type="distilbert", head="distilbert")
    assert "pre_classifier.weight" in inspected
