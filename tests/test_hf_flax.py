"""Hugging Face Flax checkpoints (`flax_model.msgpack`, sharded too) as transformers 4.57 saved them.

The fixtures in tests/fixtures/hf_flax/ were written by transformers 4.57's Flax classes with
random, non-trivial parameters (scripts/make_hf_flax_fixtures.py); each holds the inputs and that
Flax model's float32 outputs in expected.npz. No transformers 4.x is needed here, and no torch
except to check a conversion to PyTorch, and for the token-classification and multiple-choice
layouts, written here from a PyTorch model by the module names transformers 4.x's Flax classes
used (`transformers_flax_tree`).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from flax import serialization

import flaxheads
from flaxheads.cli import main
from flaxheads.conversion import hf_flax
from flaxheads.conversion.checkpoint_io import CheckpointError
from flaxheads.conversion.table import CONV1D, LINEAR, Rule
from flaxheads.convert import convert

FIXTURES = Path(__file__).parent / "fixtures" / "hf_flax"
ATOL = 1e-5


def expected(name: str) -> dict[str, np.ndarray]:
    with np.load(FIXTURES / name / "expected.npz") as npz:
        return dict(npz)


def model_inputs(values: dict[str, np.ndarray], to=jnp.asarray) -> dict:
    return {k: to(values[k]) for k in ("input_ids", "attention_mask", "token_type_ids") if k in values}


def copy_fixture(name: str, tmp_path: Path) -> Path:
    return Path(shutil.copytree(FIXTURES / name, tmp_path / name))


def assert_close(ours, theirs, what: str) -> None:
    diff = float(np.max(np.abs(np.asarray(ours, np.float32) - theirs)))
    print(f"{what}: max abs diff {diff:.2e}")
    np.testing.assert_allclose(np.asarray(ours, np.float32), theirs, atol=ATOL, rtol=0, err_msg=what)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["bert_seq_cls", "roberta_seq_cls"])
def test_classifier_logits_match_transformers_flax(name):
    values = expected(name)
    model, info = flaxheads.from_pretrained(FIXTURES / name, output_loading_info=True)

    assert_close(model(**model_inputs(values)), values["logits"], f"{name} logits")
    assert info.fully_pretrained and info.unused == []
    assert info.source == str(FIXTURES / name / hf_flax.MSGPACK_NAME)


def test_loading_info_names_tensors_by_their_hf_flax_names():
    _, info = flaxheads.from_pretrained(FIXTURES / "roberta_seq_cls", output_loading_info=True)

    assert "roberta/encoder/layer/1/attention/self/query/kernel" in info.loaded
    assert "roberta/embeddings/LayerNorm/scale" in info.loaded
    assert {"classifier/dense/kernel", "classifier/out_proj/bias"} <= set(info.loaded)
    assert all("." not in name for name in info.loaded)


@pytest.mark.parametrize("name", ["bert_model", "gpt2_model", "gpt2_lm_sharded"])
def test_bare_model_hidden_states_match_transformers_flax(name):
    values = expected(name)
    backbone, info = flaxheads.load_backbone(FIXTURES / name)

    out = backbone(**model_inputs(values))

    # Padded positions too: both implementations attend from them to the row's real tokens.
    assert_close(out.last_hidden_state, values["last_hidden_state"], f"{name} last_hidden_state")
    assert info.newly_initialized == [] and info.unused == []


def test_bare_bert_model_gives_a_new_classifier_reported_as_new():
    model, info = flaxheads.from_pretrained(FIXTURES / "bert_model", num_labels=2, output_loading_info=True)

    assert info.newly_initialized == ["classifier/bias", "classifier/kernel"]
    assert {"pooler/dense/kernel", "encoder/layer/0/output/LayerNorm/bias"} <= set(info.loaded)
    assert "NEW" in str(info) and "classifier/kernel" in str(info)
    assert model.config.num_labels == 2


def test_gpt2_lm_head_model_gives_a_last_token_classifier_on_its_hidden_states():
    values = expected("gpt2_lm_sharded")
    model, info = flaxheads.from_pretrained(
        FIXTURES / "gpt2_lm_sharded", num_labels=2, pad_token_id=0, output_loading_info=True
    )

    logits = model(**model_inputs(values))

    assert info.newly_initialized == ["score/kernel"]
    last_real = values["attention_mask"].sum(axis=1) - 1
    final_hidden = values["last_hidden_state"][np.arange(3), last_real]
    assert_close(logits, final_hidden @ np.asarray(model.head.score.kernel[...]), "gpt2 last-token logits")


def pretraining_checkpoint(tmp_path: Path) -> tuple[Path, dict[str, np.ndarray]]:
    """bert_model's weights in FlaxBertForPreTraining's layout: under "bert", beside an NSP head."""
    path = copy_fixture("bert_model", tmp_path)
    rng = np.random.default_rng(0)
    nsp = {"kernel": rng.standard_normal((32, 2)).astype(np.float32), "bias": rng.standard_normal(2).astype(np.float32)}
    bare = serialization.msgpack_restore((path / hf_flax.MSGPACK_NAME).read_bytes())
    tree = {"bert": bare, "cls": {"seq_relationship": nsp}}
    (path / hf_flax.MSGPACK_NAME).write_bytes(serialization.msgpack_serialize(tree))
    return path, nsp


def transformers_flax_tree(torch_model) -> dict:
    """The parameter tree transformers 4.x's Flax class of `torch_model` saved: the same module
    names, a Linear's weight as its Dense kernel (in, out), a LayerNorm's weight as its scale, an
    Embedding's weight as its embedding (FlaxBertForTokenClassificationModule: `bert` without its
    pooler and `classifier`; FlaxBertForMultipleChoiceModule: `bert` and a one-output `classifier`)."""
    import torch

    tree: dict = {}
    for name, module in torch_model.named_modules():
        if isinstance(module, torch.nn.Linear):
            leaves = {"kernel": module.weight.T, "bias": module.bias}
        elif isinstance(module, torch.nn.LayerNorm):
            leaves = {"scale": module.weight, "bias": module.bias}
        elif isinstance(module, torch.nn.Embedding):
            leaves = {"embedding": module.weight}
        else:
            continue
        node = tree
        for key in name.split("."):
            node = node.setdefault(key, {})
        node.update({leaf: value.detach().numpy().copy() for leaf, value in leaves.items() if value is not None})
    return tree


@pytest.mark.slow
@pytest.mark.parametrize("architecture", ["BertForTokenClassification", "BertForMultipleChoice"])
def test_token_classifier_and_multiple_choice_read_their_transformers_flax_layout(architecture, hf_checkpoint, tmp_path):
    import torch

    checkpoint = hf_checkpoint(architecture, num_labels=3)
    shutil.copy(checkpoint.path / "config.json", tmp_path / "config.json")  # Flax classes wrote the same names
    (tmp_path / hf_flax.MSGPACK_NAME).write_bytes(serialization.msgpack_serialize(transformers_flax_tree(checkpoint.model)))
    choice = architecture.endswith("MultipleChoice")
    ids = np.random.default_rng(0).integers(3, 99, size=(2, 3, 7) if choice else (2, 7))  # (batch, [choices,] seq)
    inputs = {"input_ids": ids, "attention_mask": np.ones_like(ids)}

    model, info = flaxheads.from_pretrained(tmp_path, task="multiple-choice" if choice else "token-classification",
                                            output_loading_info=True)
    with torch.no_grad():
        expected_logits = checkpoint.model(**{k: torch.from_numpy(v) for k, v in inputs.items()}).logits.numpy()

    assert info.fully_pretrained and info.unused == [] and "classifier/kernel" in info.loaded
    assert_close(model(**model_inputs(inputs)), expected_logits, f"{architecture} from its Flax layout")


@pytest.mark.parametrize("name, new, unused", [
    ("bert_model", ["classifier/bias", "classifier/kernel"], ["pooler/dense/bias", "pooler/dense/kernel"]),
    ("gpt2_lm_sharded", ["classifier/bias", "classifier/kernel"], []),  # its LM head is the tied embedding
])
def test_a_token_head_is_new_on_a_transformers_flax_base_or_lm_checkpoint(name, new, unused):
    _, info = flaxheads.TokenClassifier.from_pretrained(FIXTURES / name, num_labels=3, pad_token_id=0,
                                                        output_loading_info=True)

    assert info.newly_initialized == new and info.unused == unused


def test_the_pretraining_heads_are_unused_by_a_token_classifier_from_the_flax_layout(tmp_path):
    path, _ = pretraining_checkpoint(tmp_path)

    _, info = flaxheads.TokenClassifier.from_pretrained(path, num_labels=3, output_loading_info=True)

    assert info.newly_initialized == ["classifier/bias", "classifier/kernel"]
    assert info.unused == ["bert/pooler/dense/bias", "bert/pooler/dense/kernel", "cls/seq_relationship/bias",
                           "cls/seq_relationship/kernel"]


def test_pretraining_heads_are_reported_unused_by_their_hf_flax_names(tmp_path):
    path, _ = pretraining_checkpoint(tmp_path)

    _, info = flaxheads.from_pretrained(path, num_labels=3, output_loading_info=True)

    assert info.unused == ["cls/seq_relationship/bias", "cls/seq_relationship/kernel"]
    assert "bert/pooler/dense/kernel" in info.loaded


def test_init_classifier_from_nsp_takes_the_flax_nsp_kernel_as_is(tmp_path):
    path, nsp = pretraining_checkpoint(tmp_path)

    model, info = flaxheads.from_pretrained(path, num_labels=2, init_classifier_from_nsp=True, output_loading_info=True)

    assert info.newly_initialized == [] and "cls/seq_relationship/kernel" in info.loaded
    np.testing.assert_array_equal(np.asarray(model.head.classifier.kernel[...]), nsp["kernel"])


def test_sharded_fixture_spans_several_shards():
    index = json.loads((FIXTURES / "gpt2_lm_sharded" / hf_flax.MSGPACK_INDEX_NAME).read_text())

    assert len(set(index["weight_map"].values())) >= 2
    assert not (FIXTURES / "gpt2_lm_sharded" / hf_flax.MSGPACK_NAME).exists()


def test_bfloat16_checkpoint_loads_in_bfloat16_with_param_dtype_auto():
    path = FIXTURES / "bert_seq_cls_bf16"
    stored = hf_flax.open_hf_flax(path).read("bert/encoder/layer/0/attention/self/query/kernel")

    model = flaxheads.from_pretrained(path, param_dtype="auto")

    kernel = np.asarray(model.backbone.layers[0].attention.query.kernel[...])
    assert kernel.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(kernel.view(np.uint16), stored.view(np.uint16))


def test_bfloat16_checkpoint_upcast_to_float32_matches_transformers_flax():
    values = expected("bert_seq_cls_bf16")
    model = flaxheads.from_pretrained(FIXTURES / "bert_seq_cls_bf16")

    assert_close(model(**model_inputs(values)), values["logits"], "bfloat16 checkpoint, float32 logits")


@pytest.mark.parametrize("name", ["bert_seq_cls", "roberta_seq_cls"])
def test_converted_to_pytorch_transformers_gives_the_same_logits(name, tmp_path):
    import torch
    import transformers

    values = expected(name)
    convert(FIXTURES / name, tmp_path / "pt", to="pytorch")
    reference = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "pt").eval()

    with torch.no_grad():
        logits = reference(**model_inputs(values, lambda v: torch.from_numpy(v).long())).logits

    assert_close(logits.numpy(), values["logits"], f"{name} via PyTorch export")


def test_inspect_names_the_msgpack_and_the_new_classifier(capsys):
    assert main(["inspect", str(FIXTURES / "bert_model"), "--num_labels", "4"]) == 0

    out = capsys.readouterr().out
    assert "flax_model.msgpack" in out and "classifier/kernel" in out and "model_type: bert" in out


def test_pytorch_weights_are_read_before_flax_ones(tmp_path):
    path = copy_fixture("bert_seq_cls", tmp_path)
    convert(FIXTURES / "bert_seq_cls", tmp_path / "pt", to="pytorch")
    shutil.copy(tmp_path / "pt" / "model.safetensors", path / "model.safetensors")

    _, info = flaxheads.from_pretrained(path, output_loading_info=True)

    assert info.source.endswith("model.safetensors")


def test_more_layers_than_config_json_is_refused(tmp_path):
    path = copy_fixture("bert_seq_cls", tmp_path)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 1}))

    with pytest.raises(CheckpointError, match=r"holds 2 layers \(e\.g\. bert/encoder/layer/1/.*num_hidden_layers=1"):
        flaxheads.from_pretrained(path)


def test_truncated_msgpack_is_refused_naming_the_file(tmp_path):
    path = copy_fixture("bert_seq_cls", tmp_path)
    file = path / hf_flax.MSGPACK_NAME
    file.write_bytes(file.read_bytes()[: file.stat().st_size // 2])

    with pytest.raises(CheckpointError, match=rf"cannot read {file}: .*truncated.*re-download it"):
        flaxheads.from_pretrained(path)


@pytest.mark.parametrize("content", [b"", b"not msgpack at all \xff\x00", b"\x93\x01\x02\x03"])
def test_non_msgpack_bytes_are_refused(tmp_path, content):
    path = copy_fixture("bert_seq_cls", tmp_path)
    (path / hf_flax.MSGPACK_NAME).write_bytes(content)

    with pytest.raises(CheckpointError, match="not a flax msgpack checkpoint"):
        flaxheads.from_pretrained(path)


def test_git_lfs_pointer_is_named_as_such(tmp_path):
    path = copy_fixture("bert_seq_cls", tmp_path)
    (path / hf_flax.MSGPACK_NAME).write_text("version https://git-lfs.github.com/spec/v1\noid sha256:00\nsize 1\n")

    with pytest.raises(CheckpointError, match="Git LFS pointer.*git lfs pull"):
        flaxheads.from_pretrained(path)


def test_non_array_leaf_is_refused_naming_it(tmp_path):
    path = copy_fixture("bert_seq_cls", tmp_path)
    tree = serialization.msgpack_restore((path / hf_flax.MSGPACK_NAME).read_bytes())
    tree["bert"]["pooler"]["dense"]["bias"] = "zeros"
    (path / hf_flax.MSGPACK_NAME).write_bytes(serialization.msgpack_serialize(tree))

    with pytest.raises(CheckpointError, match="bert/pooler/dense/bias is a str .*not an array of numbers"):
        flaxheads.from_pretrained(path)


def test_missing_shard_is_refused_naming_it(tmp_path):
    path = copy_fixture("gpt2_lm_sharded", tmp_path)
    (path / "flax_model-00002-of-00003.msgpack").unlink()

    with pytest.raises(CheckpointError, match="lists shard flax_model-00002-of-00003.msgpack, which is missing"):
        flaxheads.load_backbone(path)


def test_damaged_shard_is_refused_naming_it(tmp_path):
    path = copy_fixture("gpt2_lm_sharded", tmp_path)
    shard = path / "flax_model-00003-of-00003.msgpack"
    shard.write_bytes(shard.read_bytes()[:100])

    with pytest.raises(CheckpointError, match=f"cannot read {shard}"):
        flaxheads.load_backbone(path)


def test_xlnet_config_with_flax_weights_says_transformers_has_no_flax_xlnet(tmp_path):
    path = copy_fixture("bert_model", tmp_path)
    (path / "config.json").write_text(json.dumps({"model_type": "xlnet", "d_model": 32, "n_layer": 2, "n_head": 4,
                                                  "d_inner": 37, "vocab_size": 99}))

    with pytest.raises(CheckpointError, match="never had a Flax XLNet.*model.safetensors"):
        flaxheads.from_pretrained(path, num_labels=2)


def test_rules_keep_linear_kernels_and_transpose_conv1d_ones():
    linear, conv1d = hf_flax.hf_flax_rules([
        Rule("bert.encoder.layer.0.intermediate.dense.weight", "backbone.layers.0.intermediate.kernel", LINEAR),
        Rule("transformer.h.0.mlp.c_fc.weight", "backbone.layers.0.intermediate.kernel", CONV1D),
    ])
    kernel = np.arange(6.0).reshape(2, 3)

    assert linear.hf == "bert/encoder/layer/0/intermediate/dense/kernel"
    assert conv1d.hf == "transformer/h/0/mlp/c_fc/kernel"
    np.testing.assert_array_equal(linear.transform.to_flax(kernel), kernel)
    np.testing.assert_array_equal(conv1d.transform.to_flax(kernel), kernel.T)
    assert conv1d.transform.hf_shape((2, 3)) == (3, 2)


def test_rules_refuse_a_parameter_with_no_flax_module_leaf():
    with pytest.raises(ValueError, match="no Hugging Face Flax name"):
        hf_flax.hf_flax_rules([Rule("transformer.mask_emb", "backbone.mask_emb")])


def test_head_of_another_size_is_named_in_the_flax_layout_and_can_be_replaced():
    with pytest.raises(ValueError, match=r"classifier/kernel: checkpoint has shape \(32, 3\).*expects \(32, 5\)"):
        flaxheads.from_pretrained(FIXTURES / "bert_seq_cls", num_labels=5)

    _, info = flaxheads.from_pretrained(
        FIXTURES / "bert_seq_cls", num_labels=5, ignore_mismatched_sizes=True, output_loading_info=True
    )
    assert {name for name, _, _ in info.mismatched} == {"classifier/bias", "classifier/kernel"}


def test_a_flax_models_model_safetensors_reads_like_its_msgpack(tmp_path):
    """transformers 4.x Flax models saved with safe_serialization=True wrote model.safetensors with
    "."-joined Flax names and metadata format "flax": read as Hugging Face Flax, not refused as an
    incomplete PyTorch checkpoint."""
    from flax.traverse_util import flatten_dict
    from safetensors.numpy import save_file

    name = "bert_seq_cls"
    tree = serialization.msgpack_restore((FIXTURES / name / hf_flax.MSGPACK_NAME).read_bytes())
    folder = tmp_path / name
    folder.mkdir()
    shutil.copy(FIXTURES / name / "config.json", folder / "config.json")
    save_file({".".join(k): np.asarray(v) for k, v in flatten_dict(tree).items()}, folder / "model.safetensors",
              metadata={"format": "flax"})
    values = expected(name)

    model, info = flaxheads.from_pretrained(folder, output_loading_info=True)

    assert info.fully_pretrained and info.unused == [] and "bert/encoder/layer/0/output/dense/kernel" in info.loaded
    assert_close(model(**model_inputs(values)), values["logits"], "Flax model.safetensors")
