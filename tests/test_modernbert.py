"""ModernBERT and the "modernbert" head: parity with transformers (PyTorch, eager attention, eval
mode) on small non-default configs (odd MLP width, global layers every 2 or 3 of 3-4 layers, a
sliding window of 4 or 6 on 13-token sequences, distinct global/local RoPE theta, biases on and
off, both poolings, both padding sides); every head on ModernBERT and the "modernbert" head on
BERT; conversion both ways (safetensors, sharded, .bin); the loading report of ModernBertModel /
ModernBertForMaskedLM; sharding on fake devices; the command line on a tiny checkpoint with a
BERT-style tokenizer."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import zlib

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from conftest import TOKENIZER_FILES, _randomize_
from flax import nnx
from safetensors.torch import load_file

import flaxheads
from family_parity import (
    assert_close, assert_same_params, assert_state_dicts_identical, flat_params, flax_inputs, padded_batch,
    torch_forward,
)
from flaxheads.backbones import ModernBertConfig, attention, backbone_spec
from flaxheads.cli import main
from flaxheads.convert import convert
from flaxheads.conversion.loading import flat_variables
from flaxheads.heads import HEAD_NAMES, HeadInputs

BF16_ATOL = BF16_RTOL = 5e-2
"""bfloat16 compute against transformers' float32 logits (measured max difference: see the test's output)."""
# 44 wide in 2 heads (head_dim 22: RoPE needs it even), a 37-wide GeGLU; 4 layers, global at 0 and 3,
# a window of 4 (2 keys each side) on 13-token inputs; RoPE thetas far from the defaults.
TINY_MODERNBERT = dict(
    vocab_size=99, hidden_size=44, num_attention_heads=2, intermediate_size=37, num_hidden_layers=4,
    max_position_embeddings=64, global_attn_every_n_layers=3, local_attention=4, global_rope_theta=500.0,
    local_rope_theta=77.0, initializer_range=0.1, pad_token_id=0, bos_token_id=1, cls_token_id=1,
    eos_token_id=2, sep_token_id=2,
)
BIASES = dict(attention_bias=True, mlp_bias=True, norm_bias=True, classifier_bias=True)
SEQ_LEN = 13
PAD_ID = 0


def randomize_(model: torch.nn.Module, seed: int) -> None:
    """conftest's `_randomize_`, then LayerNorm scales around 1 (ModernBERT names them `*norm.weight`)."""
    _randomize_(model, seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.add_(1.0)


@pytest.fixture(scope="session")
def modernbert(tmp_path_factory):
    """`modernbert("ModernBertForSequenceClassification", num_labels=3)` -> (directory written by
    transformers, the torch model in eval mode, eager attention). Cached: treat both as read-only."""
    cache = {}

    def build(architecture: str, *, torch_dtype: str = "float32", **overrides):
        key = (architecture, torch_dtype, tuple(sorted(overrides.items())))
        if key not in cache:
            torch.manual_seed(0)
            config = transformers.ModernBertConfig(**{**TINY_MODERNBERT, **overrides}, attn_implementation="eager")
            model = getattr(transformers, architecture)(config).eval()
            randomize_(model, seed=zlib.crc32(repr(key).encode()))
            model = model.to(getattr(torch, torch_dtype))
            path = tmp_path_factory.mktemp(architecture)
            model.save_pretrained(path)
            cache[key] = (path, model)
        return cache[key]

    return build


def token_batch(padding: str = "right", *, seed: int = 0):
    """Three sequences of lengths (13, 10, 2) padded on `padding`: longer than the sliding window."""
    return padded_batch(padding, seq_len=SEQ_LEN, seed=seed, pad_id=PAD_ID, lowest_id=3, token_types=False)


# ---------------------------------------------------------------------------------------------
# Config


def test_config_reads_transformers_5_and_4_layouts_and_writes_both():
    hf5 = transformers.ModernBertConfig(**TINY_MODERNBERT).to_dict()
    legacy = {k: v for k, v in hf5.items() if k not in ("layer_types", "rope_parameters")}
    legacy.update(global_rope_theta=500.0, local_rope_theta=77.0)

    config = ModernBertConfig.from_hf_config(hf5)

    assert config == ModernBertConfig.from_hf_config(legacy)
    assert config.layer_types == ("full_attention", "sliding_attention", "sliding_attention", "full_attention")
    assert (config.global_rope_theta, config.local_rope_theta, config.sliding_window) == (500.0, 77.0, 2)
    written = config.to_hf_config()
    assert written["rope_parameters"]["sliding_attention"]["rope_theta"] == 77.0
    assert written["global_attn_every_n_layers"] == 3 and ModernBertConfig.from_hf_config(written) == config
    assert transformers.ModernBertConfig(**written).layer_types == list(config.layer_types)
    with pytest.raises(ValueError, match="head_dim=11 .* is odd"):
        ModernBertConfig(hidden_size=44, num_attention_heads=4)
    with pytest.raises(NotImplementedError, match="rope_type='yarn'"):
        ModernBertConfig.from_hf_config({**hf5, "rope_parameters": {"full_attention": {"rope_type": "yarn"}}})


# ---------------------------------------------------------------------------------------------
# Parity: ModernBertForSequenceClassification logits

CONFIGS = {
    "no_bias-cls-every3": ({}, 3),
    "biases-mean-every2-silu": ({**BIASES, "global_attn_every_n_layers": 2, "classifier_pooling": "mean",
                                 "classifier_activation": "silu"}, 1),
    "3_layers-window6-cls-every2": ({"num_hidden_layers": 3, "global_attn_every_n_layers": 2, "local_attention": 6,
                                     "norm_bias": True}, 5),
}


@pytest.mark.parametrize("padding", ["right", "left"])
@pytest.mark.parametrize("name", CONFIGS)
def test_modernbert_head_logits_match_transformers(modernbert, name, padding):
    overrides, num_labels = CONFIGS[name]
    path, reference = modernbert("ModernBertForSequenceClassification", num_labels=num_labels, **overrides)
    batch = token_batch(padding)
    model = flaxheads.from_pretrained(path)

    logits = model(**flax_inputs(batch))

    assert model.config.head == "modernbert" and logits.shape == (3, num_labels) and logits.dtype == jnp.float32
    assert_close(logits, torch_forward(reference, batch).logits, f"modernbert {name} {padding}")


@pytest.mark.parametrize("padding", ["right", "left"])
def test_every_hidden_state_matches_modernbert_model_the_last_after_the_final_norm(modernbert, padding):
    path, reference = modernbert("ModernBertModel", **BIASES)
    batch = token_batch(padding)
    backbone, info = flaxheads.load_backbone(path)

    out = backbone(**flax_inputs(batch))

    expected = torch_forward(reference, batch, output_hidden_states=True)
    assert info.newly_initialized == [] and info.unused == []
    assert len(out.hidden_states) == len(expected.hidden_states) == 5 and out.pooler_output is None
    for layer, (ours, theirs) in enumerate(zip(out.hidden_states, expected.hidden_states)):
        assert_close(ours, theirs, f"ModernBertModel hidden state {layer} {padding}")
    assert_close(out.last_hidden_state, expected.last_hidden_state, "last_hidden_state")


def test_a_window_shorter_than_the_sequence_changes_the_output(modernbert, tmp_path):
    path, _ = modernbert("ModernBertModel")
    batch = token_batch("right")
    config = json.loads((path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "local_attention": 2 * SEQ_LEN}))
    shutil.copy(path / "model.safetensors", tmp_path)
    windowed, _ = flaxheads.load_backbone(path)
    unwindowed, _ = flaxheads.load_backbone(tmp_path)

    difference = np.abs(np.asarray(windowed(**flax_inputs(batch)).last_hidden_state
                                   - unwindowed(**flax_inputs(batch)).last_hidden_state))

    # Row 0 (13 real tokens) sees farther than 2 positions without the window; row 2 (2 tokens) never does.
    assert difference[0].max() > 1e-3 and difference[2, :2].max() < 1e-5


def test_attention_dropout_in_training_keeps_the_sliding_window():
    rng = np.random.default_rng(0)
    query, key, value = (jnp.asarray(rng.normal(size=(1, 9, 2, 4)), jnp.float32) for _ in range(3))
    far_changed = value.at[:, 8].set(100.0)

    outputs = [attention.attend(query, key, v, None, local_window_size=2, dropout_rate=0.5, deterministic=False,
                             rngs=nnx.Rngs(dropout=0)) for v in (value, far_changed)]

    # Queries 0..5 are more than 2 positions from key 8: the materialised (dropout) path masks it too.
    np.testing.assert_array_equal(np.asarray(outputs[0][:, :6]), np.asarray(outputs[1][:, :6]))
    assert np.max(np.abs(np.asarray(outputs[0][:, 6:] - outputs[1][:, 6:]))) > 1.0


def test_bfloat16_compute_stays_within_tolerance_of_transformers_float32(modernbert):
    path, reference = modernbert("ModernBertForSequenceClassification", num_labels=3, **BIASES)
    batch = token_batch("right")
    half = flaxheads.from_pretrained(path, dtype="bfloat16")

    logits = half(**flax_inputs(batch))

    assert logits.dtype == jnp.float32
    assert {v.dtype for v in flat_params(half).values()} == {np.dtype("float32")}
    assert_close(logits, torch_forward(reference, batch).logits, "bfloat16 vs transformers float32", BF16_ATOL, BF16_RTOL)


# ---------------------------------------------------------------------------------------------
# Every head on ModernBERT, the "modernbert" head on BERT


@pytest.mark.parametrize("head", [h for h in HEAD_NAMES if h != "modernbert"])
def test_every_head_on_modernbert_reads_transformers_hidden_states(modernbert, head):
    path, reference = modernbert("ModernBertForMaskedLM")
    batch = token_batch("right")
    model, info = flaxheads.from_pretrained(path, head=head, num_labels=3, seed=1, output_loading_info=True)

    hidden = torch_forward(reference.model, batch, output_hidden_states=True).hidden_states
    inputs = HeadInputs(tuple(jnp.asarray(h.numpy()) for h in hidden), jnp.asarray(batch["attention_mask"]),
                        jnp.asarray(batch["input_ids"]))
    assert_close(model(**flax_inputs(batch)), model.head(inputs), f"{head} head on ModernBERT")
    # The masked-LM prediction head (head.dense, head.norm) never fills another head's parameters.
    assert info.newly_initialized and all(name.startswith("flaxheads_head.") for name in info.newly_initialized)
    assert {"head.dense.weight", "head.norm.weight", "decoder.bias"} <= set(info.unused)


@pytest.mark.parametrize("head", ["roberta", "concat_last4"])
def test_another_head_on_modernbert_round_trips_and_transformers_reads_the_backbone(modernbert, tmp_path, head):
    path, reference = modernbert("ModernBertForMaskedLM")
    batch = token_batch("right")
    model = flaxheads.from_pretrained(path, head=head, num_labels=3, seed=1)

    model.save_pretrained(tmp_path)
    again = flaxheads.from_pretrained(tmp_path)
    base, hf_info = transformers.AutoModel.from_pretrained(tmp_path, output_loading_info=True, attn_implementation="eager")

    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == ["ModernBertModel"]
    assert again.config.head == head
    assert_same_params(again, model)
    assert not hf_info["missing_keys"] and all(k.startswith("flaxheads_head.") for k in hf_info["unexpected_keys"])
    expected = torch_forward(reference.model, batch).last_hidden_state
    assert_close(torch_forward(base.eval(), batch).last_hidden_state, expected, f"{head}: transformers reads the backbone")


def test_modernbert_head_on_bert_matches_modernbert_prediction_head(hf_checkpoint, tmp_path):
    pooling, padding = "mean", "left"
    checkpoint = hf_checkpoint("BertModel")
    batch = padded_batch(padding, seq_len=10, pad_id=0)
    model = flaxheads.from_pretrained(checkpoint.path, head="modernbert", num_labels=4, seed=3,
                                      head_options={"classifier_pooling": pooling, "classifier_bias": True})
    model.save_pretrained(tmp_path)
    exported = load_file(tmp_path / "model.safetensors")

    config = transformers.ModernBertConfig(hidden_size=32, num_attention_heads=4, classifier_bias=True)
    head = transformers.models.modernbert.modeling_modernbert.ModernBertPredictionHead(config).eval()
    classifier = torch.nn.Linear(32, 4)
    head.load_state_dict({k[len("head."):]: v for k, v in exported.items() if k.startswith("head.") and "classifier" not in k})
    classifier.load_state_dict({k[len("head.classifier."):]: v for k, v in exported.items() if k.startswith("head.classifier.")})
    last = torch_forward(checkpoint.model, batch).last_hidden_state
    mask = torch.as_tensor(batch["attention_mask"])[..., None].float()
    pooled = last[:, 0] if pooling == "cls" else (last * mask).sum(1) / mask.sum(1)
    with torch.no_grad():
        expected = classifier(head(pooled))
    assert sorted(k for k in exported if k.startswith("head.")) == [
        "head.classifier.bias", "head.classifier.weight", "head.dense.bias", "head.dense.weight", "head.norm.weight"
    ]
    assert_close(model(**flax_inputs(batch)), expected, f"modernbert head ({pooling}) on BERT, {padding} padding")
    again = flaxheads.from_pretrained(tmp_path)
    assert again.config.head == "modernbert" and dict(again.config.head_options)["classifier_pooling"] == pooling
    assert_same_params(again, model)


def test_head_option_overrides_config_json_and_is_written_back_for_transformers(modernbert, tmp_path):
    path, _ = modernbert("ModernBertForSequenceClassification", num_labels=3)
    batch = token_batch("left")
    model = flaxheads.from_pretrained(path, head_options={"classifier_pooling": "mean"})
    model.save_pretrained(tmp_path)

    reloaded = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path, attn_implementation="eager")

    assert json.loads((tmp_path / "config.json").read_text())["classifier_pooling"] == "mean"
    assert reloaded.config.classifier_pooling == "mean"
    assert_close(model(**flax_inputs(batch)), torch_forward(reloaded.eval(), batch).logits, "mean pooling, written back")


def test_a_head_norm_option_other_than_the_backbones_is_refused_on_modernbert(modernbert):
    path, _ = modernbert("ModernBertForSequenceClassification", num_labels=3)

    with pytest.raises(ValueError, match="norm_eps.*leave norm_eps out of head_options"):
        flaxheads.from_pretrained(path, head_options={"norm_eps": 1e-3})


# ---------------------------------------------------------------------------------------------
# Conversion


@pytest.mark.parametrize(("overrides", "torch_dtype"), [({}, "bfloat16"), (BIASES, "float32")],
                         ids=["no_bias-bfloat16", "biases-float32"])
def test_pytorch_flaxheads_pytorch_round_trip_is_bit_identical(modernbert, tmp_path, overrides, torch_dtype):
    path, _ = modernbert("ModernBertForSequenceClassification", num_labels=3, torch_dtype=torch_dtype, **overrides)
    model = flaxheads.from_pretrained(path, param_dtype="auto")

    model.save_pretrained(tmp_path)

    assert_state_dicts_identical(load_file(tmp_path / "model.safetensors"), load_file(path / "model.safetensors"))
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == ["ModernBertForSequenceClassification"] and config["dtype"] == torch_dtype


def test_convert_to_flax_and_back_is_bit_identical(modernbert, tmp_path):
    path, _ = modernbert("ModernBertForSequenceClassification", num_labels=3, **BIASES)

    convert(path, tmp_path / "flax")
    convert(tmp_path / "flax", tmp_path / "pytorch")

    assert_state_dicts_identical(load_file(tmp_path / "pytorch" / "model.safetensors"), load_file(path / "model.safetensors"))


@pytest.mark.parametrize("layout", ["sharded_safetensors", "bin"])
def test_sharded_and_bin_checkpoints_read_like_the_single_safetensors_file(modernbert, tmp_path, layout):
    path, reference = modernbert("ModernBertForSequenceClassification", num_labels=3)
    if layout == "bin":
        torch.save(reference.state_dict(), tmp_path / "pytorch_model.bin")
        shutil.copy(path / "config.json", tmp_path)
    else:
        reference.save_pretrained(tmp_path, max_shard_size="20KB")
        assert len(list(tmp_path.glob("model-*-of-*.safetensors"))) > 1

    model, info = flaxheads.from_pretrained(tmp_path, output_loading_info=True)

    assert info.fully_pretrained and info.unused == []
    assert_same_params(model, flaxheads.from_pretrained(path))


def test_export_loads_in_transformers_with_no_missing_or_unexpected_keys_and_same_logits(modernbert, tmp_path):
    path, _ = modernbert("ModernBertForMaskedLM", **BIASES)
    batch = token_batch("right")
    model = flaxheads.from_pretrained(path, num_labels=5, seed=4)
    model.save_pretrained(tmp_path)

    reloaded, info = transformers.AutoModelForSequenceClassification.from_pretrained(
        tmp_path, output_loading_info=True, attn_implementation="eager"
    )

    assert type(reloaded).__name__ == "ModernBertForSequenceClassification"
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    assert_close(model(**flax_inputs(batch)), torch_forward(reloaded.eval(), batch).logits, "export in transformers")


# ---------------------------------------------------------------------------------------------
# Loading report

_CLASSIFIER = ["classifier.bias", "classifier.weight"]


@pytest.mark.parametrize(
    ("architecture", "unused", "new"),
    [
        ("ModernBertModel", [], ["classifier.bias", "classifier.weight", "head.dense.weight", "head.norm.weight"]),
        # The masked-LM head's head.dense/head.norm are the classification head's, as in transformers;
        # decoder.weight is tied to the token embeddings and not saved.
        ("ModernBertForMaskedLM", ["decoder.bias"], _CLASSIFIER),
        ("ModernBertForSequenceClassification", [], []),
    ],
)
def test_loading_report_lists_the_decoder_as_unused_and_the_classifier_as_new(modernbert, architecture, unused, new):
    path, _ = modernbert(architecture)

    model, info = flaxheads.from_pretrained(path, num_labels=2, output_loading_info=True)

    assert info.head == "modernbert" and model.config.head == "modernbert"
    assert info.unused == unused and info.newly_initialized == new
    assert {"layers.3.attn.Wqkv.weight", "final_norm.weight"} <= {name.removeprefix("model.") for name in info.loaded}
    assert info.fully_pretrained == (not new)


def test_loading_report_matches_what_transformers_reports_for_a_masked_lm_checkpoint(modernbert):
    path, _ = modernbert("ModernBertForMaskedLM")

    _, info = flaxheads.from_pretrained(path, num_labels=2, output_loading_info=True)
    _, hf_info = transformers.ModernBertForSequenceClassification.from_pretrained(path, output_loading_info=True)

    assert set(info.newly_initialized) == hf_info["missing_keys"] and set(info.unused) == hf_info["unexpected_keys"]


# ---------------------------------------------------------------------------------------------
# Sharding on fake devices

_SHARDED = textwrap.dedent("""
    import json, sys
    import jax, numpy as np
    import flaxheads
    from flaxheads.conversion.loading import flat_variables
    from flaxheads.training.sharding import Layout

    layout = Layout.create("fsdp=4")
    batch = {k: jax.numpy.asarray(v) for k, v in json.loads(sys.argv[2]).items()}
    model = flaxheads.from_pretrained(sys.argv[1], placement=layout.param_sharding)
    split = sorted(k for k, (_, v) in flat_variables(model).items() if not v[...].sharding.is_fully_replicated)
    print(json.dumps({"logits": np.asarray(model(**batch)).tolist(), "split": split}))
""")


def test_fsdp_rules_split_every_modernbert_kernel_on_four_fake_devices(modernbert):
    path, reference = modernbert("ModernBertForSequenceClassification", num_labels=3, **BIASES)
    batch = token_batch("left")
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4", "JAX_PLATFORMS": "cpu"}
    arguments = json.dumps({k: v.tolist() for k, v in batch.items()})

    result = subprocess.run([sys.executable, "-c", _SHARDED, str(path), arguments],
                            capture_output=True, text=True, env=env, timeout=300)

    assert result.returncode == 0, result.stderr[-2000:]
    out = json.loads(result.stdout.splitlines()[-1])
    assert_close(np.array(out["logits"]), torch_forward(reference, batch).logits, "fsdp=4 on fake devices")
    # Kernels split by input features (44 and 37 rows: 4 divides 44 only), the 99-row vocabulary whole.
    kernels = [k for k in flat_variables(flaxheads.from_pretrained(path)) if k.endswith("kernel")]
    assert len(kernels) == 4 * 4 + 2 and set(out["split"]) == {k for k in kernels if not k.endswith("mlp.Wo.kernel")}


# ---------------------------------------------------------------------------------------------
# Command line


@pytest.fixture(scope="module")
def modernbert_with_tokenizer(tmp_path_factory):
    """A tiny ModernBertForMaskedLM with MiniLM's BERT vocab.txt tokenizer ([PAD] = 0, [CLS] = 101)."""
    from flaxheads.shipped_model import minilm_path

    path = tmp_path_factory.mktemp("modernbert_tok")
    torch.manual_seed(0)
    config = transformers.ModernBertConfig(**{**TINY_MODERNBERT, "vocab_size": 30522, "cls_token_id": 101,
                                              "bos_token_id": 101, "sep_token_id": 102, "eos_token_id": 102})
    transformers.ModernBertForMaskedLM(config).save_pretrained(path)
    for name in TOKENIZER_FILES:
        shutil.copy(minilm_path() / name, path / name)
    return path


def test_padding_side_is_right():
    assert backbone_spec("modernbert").padding_side == "right"


def test_cli_inspect_convert_train_evaluate_predict_on_modernbert(modernbert_with_tokenizer, snippets_csv, tmp_path, capsys):
    source, data = modernbert_with_tokenizer, snippets_csv

    assert main(["inspect", str(source), "--num_labels", "2"]) == 0
    out = capsys.readouterr().out
    assert "model_type: modernbert" in out and "head shown: 'modernbert'" in out
    assert "classifier.weight" in out and "decoder.bias" in out

    assert main(["convert", str(source), str(tmp_path / "flax")]) == 0
    assert main(["convert", str(tmp_path / "flax"), str(tmp_path / "pytorch"), "--to", "pytorch"]) == 0
    capsys.readouterr()
    assert (tmp_path / "pytorch" / "vocab.txt").is_file()
    exported = load_file(tmp_path / "pytorch" / "model.safetensors")
    assert "model.layers.1.attn_norm.weight" in exported and "head.norm.weight" in exported

    run = tmp_path / "run"
    common = ["--train_file", str(data["train"]), "--text_column", "sentence", "--max_seq_length", "32"]
    assert main(["train", "--model_name_or_path", str(source), *common, "--output_dir", str(run),
                 "--per_device_train_batch_size", "8", "--max_steps", "2", "--logging_steps", "1",
                 "--save_steps", "2", "--disable_tqdm"]) == 0
    capsys.readouterr()
    config = json.loads((run / "config.json").read_text())
    assert config["model_type"] == "modernbert" and config["architectures"] == ["ModernBertForSequenceClassification"]

    assert main(["evaluate", "--model_name_or_path", str(run), *common, "--validation_file", str(data["validation"]),
                 "--split", "validation"]) == 0
    assert "accuracy" in json.loads(capsys.readouterr().out)

    assert main(["predict", "--model_name_or_path", str(run), "a fine film", "dull"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["text"] for r in rows] == ["a fine film", "dull"]
    assert all(r["label"] in ("negative", "positive") for r in rows)
