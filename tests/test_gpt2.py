"""GPT-2: the backbone and the "last_token" head against transformers (PyTorch, eval mode), the
conversion table, loading reports, the pad-token rules, and fine-tuning with a pad-less tokenizer.

Tiny random models: vocab 99 (eos = 98), 32 wide, 2-3 layers, 64 positions.
"""

from __future__ import annotations

import csv
import json
import shutil
import zlib
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx
from safetensors.torch import load_file, save_file

import flaxheads
from flaxheads.heads.last_token import last_real_token_index

EOS = 98
TINY_GPT2 = dict(
    vocab_size=99, n_embd=32, n_layer=2, n_head=4, n_positions=64, n_inner=37,
    bos_token_id=EOS, eos_token_id=EOS, initializer_range=0.1,
)
ATOL, RTOL = 1e-5, 1e-5


def _randomize_(model: torch.nn.Module, seed: int) -> None:
    """Every parameter drawn afresh (LayerNorm scales around 1, biases non-zero), so a swapped
    scale/bias or a dropped bias cannot go unnoticed."""
    generator = torch.Generator().manual_seed(seed)
    std = model.config.initializer_range
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = std * torch.randn(param.shape, generator=generator)
            is_norm_scale = name.split(".")[-2].startswith("ln_") and name.endswith("weight")
            param.copy_(1.0 + noise if is_norm_scale else noise)


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    """`gpt2("GPT2ForSequenceClassification", num_labels=3, pad_token_id=EOS)` -> (path, torch model),
    cached; treat both as read-only. `torch_dtype` casts the model before saving."""
    cache = {}

    def build(architecture: str, *, torch_dtype: str = "float32", **overrides):
        key = (architecture, torch_dtype, tuple(sorted(overrides.items())))
        if key not in cache:
            config = transformers.GPT2Config(**{**TINY_GPT2, **overrides})
            torch.manual_seed(0)
            model = getattr(transformers, architecture)(config).eval()
            _randomize_(model, zlib.crc32(repr(key).encode()))
            model = model.to(getattr(torch, torch_dtype))
            path = tmp_path_factory.mktemp(architecture)
            model.save_pretrained(path)
            cache[key] = (path, model)
        return cache[key]

    return build


def token_batch(padding: str, *, pad_id: int = EOS, seq_len: int = 10, seed: int = 0) -> dict[str, np.ndarray]:
    """Three sequences of lengths (10, 7, 2) padded on `padding` ("right", "left" or "none")."""
    rng = np.random.default_rng(seed)
    lengths = np.array([seq_len] * 3 if padding == "none" else [seq_len, seq_len - 3, 2])
    positions = np.arange(seq_len)[None, :]
    real = positions >= seq_len - lengths[:, None] if padding == "left" else positions < lengths[:, None]
    input_ids = np.where(real, rng.integers(1, 90, real.shape), pad_id)  # never 0, 98: pad ids used below
    return {"input_ids": input_ids, "attention_mask": real.astype(np.int64)}


def torch_outputs(model, batch, **kwargs):
    with torch.no_grad():
        return model(**{k: torch.from_numpy(v) for k, v in batch.items()}, **kwargs)


def flax_inputs(batch) -> dict[str, jnp.ndarray]:
    return {k: jnp.asarray(v) for k, v in batch.items()}


def assert_close(actual, expected, what: str, atol: float = ATOL, rtol: float = RTOL) -> None:
    actual, expected = np.asarray(actual, np.float32), np.asarray(expected, np.float32)
    print(f"{what}: max abs difference {np.max(np.abs(actual - expected)):.3g}")
    np.testing.assert_allclose(actual, expected, atol=atol, rtol=rtol, err_msg=what)


def assert_same_params(a: nnx.Module, b: nnx.Module) -> None:
    flat_a, flat_b = (dict(nnx.to_flat_state(nnx.state(m, nnx.Param))) for m in (a, b))
    assert flat_a.keys() == flat_b.keys()
    for path in flat_a:
        np.testing.assert_array_equal(np.asarray(flat_a[path][...]), np.asarray(flat_b[path][...]), err_msg=str(path))


def copy_checkpoint(src: Path, dst: Path, **config_changes) -> Path:
    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text())
    config.update(config_changes)
    (dst / "config.json").write_text(json.dumps(config))
    return dst


# ---------------------------------------------------------------------------------------------
# Parity: logits equal GPT2ForSequenceClassification's, hidden states GPT2Model's


@pytest.mark.parametrize("padding", ["right", "left", "none"])
@pytest.mark.parametrize("num_labels", [1, 2, 5])
def test_last_token_logits_match_transformers(gpt2, num_labels, padding):
    path, reference = gpt2("GPT2ForSequenceClassification", num_labels=num_labels, pad_token_id=EOS)
    batch = token_batch(padding)
    model = flaxheads.from_pretrained(path)

    logits = model(**flax_inputs(batch))

    assert model.config.head == "last_token"
    assert logits.shape == (3, num_labels) and logits.dtype == jnp.float32
    assert_close(logits, torch_outputs(reference, batch).logits, f"gpt2 num_labels={num_labels} padding={padding}")


@pytest.mark.parametrize("padding", ["right", "left"])
def test_pad_token_other_than_eos_matches_transformers(gpt2, padding):
    path, reference = gpt2("GPT2ForSequenceClassification", num_labels=3, pad_token_id=0)
    batch = token_batch(padding, pad_id=0)
    batch["input_ids"][0, 4] = EOS  # an eos inside a text is an ordinary token when pad != eos

    logits = flaxheads.from_pretrained(path)(**flax_inputs(batch))

    assert_close(logits, torch_outputs(reference, batch).logits, f"gpt2 pad_token_id=0, padding={padding}")


@pytest.mark.parametrize(
    ("problem_type", "labels"),
    [("regression", np.array([[0.5, -1.0], [2.0, 0.0], [0.1, 0.3]], np.float32)),
     ("multi_label_classification", np.array([[1, 0], [0, 0], [1, 1]], np.float32))],
)
def test_regression_and_multi_label_logits_and_loss_match_transformers(gpt2, problem_type, labels):
    path, reference = gpt2("GPT2ForSequenceClassification", num_labels=2, pad_token_id=EOS, problem_type=problem_type)
    batch = token_batch("left")
    model = flaxheads.from_pretrained(path)

    logits = model(**flax_inputs(batch))
    loss = model.loss(logits, jnp.asarray(labels))

    expected = torch_outputs(reference, batch, labels=torch.from_numpy(labels))
    assert model.config.problem_type == problem_type
    assert_close(logits, expected.logits, f"gpt2 {problem_type} logits")
    assert_close(loss, expected.loss, f"gpt2 {problem_type} loss")


@pytest.mark.parametrize("padding", ["right", "left"])
def test_every_hidden_state_matches_gpt2_model(gpt2, padding):
    path, reference = gpt2("GPT2Model", n_layer=3)
    batch = token_batch(padding)
    backbone, info = flaxheads.load_backbone(path)

    out = backbone(**flax_inputs(batch))

    expected = torch_outputs(reference, batch, output_hidden_states=True)
    assert info.newly_initialized == [] and info.unused == []
    assert out.pooler_output is None
    assert len(out.hidden_states) == len(expected.hidden_states) == 4
    # Padded positions too: a left-padding query that sees no key gets a zero context, as in torch's sdpa.
    for layer, (ours, theirs) in enumerate(zip(out.hidden_states, expected.hidden_states)):
        assert_close(ours, theirs, f"gpt2 hidden state {layer}, {padding} padding")
    np.testing.assert_array_equal(np.asarray(out.last_hidden_state), np.asarray(out.hidden_states[-1]))


def test_explicit_position_ids_and_token_type_ids_match_transformers(gpt2):
    path, reference = gpt2("GPT2ForSequenceClassification", num_labels=2, pad_token_id=EOS)
    batch = token_batch("left")
    # Count positions from each row's first real token, as generation code does for left padding.
    batch["position_ids"] = np.maximum(np.cumsum(batch["attention_mask"], axis=1) - 1, 0)
    batch["token_type_ids"] = (np.arange(10)[None, :] >= 5).astype(np.int64) * np.array([[3], [5], [7]])
    model = flaxheads.from_pretrained(path)

    logits = model(**flax_inputs(batch))
    default_positions = model(**flax_inputs({k: v for k, v in batch.items() if k != "position_ids"}))

    assert_close(logits, torch_outputs(reference, batch).logits, "gpt2 explicit position_ids and token_type_ids")
    assert np.max(np.abs(np.asarray(logits - default_positions))) > 1e-3


def test_changing_a_later_token_never_changes_an_earlier_hidden_state(gpt2):
    path, _ = gpt2("GPT2Model", n_layer=3)
    backbone, _ = flaxheads.load_backbone(path)
    batch = token_batch("none")
    changed = batch["input_ids"].copy()
    changed[:, 6] = (changed[:, 6] + 11) % 90 + 1

    before = backbone(jnp.asarray(batch["input_ids"])).hidden_states
    after = backbone(jnp.asarray(changed)).hidden_states

    for layer, (b, a) in enumerate(zip(before, after)):
        np.testing.assert_array_equal(np.asarray(b)[:, :6], np.asarray(a)[:, :6], err_msg=f"layer {layer}")
    assert np.max(np.abs(np.asarray(before[-1])[:, 6:] - np.asarray(after[-1])[:, 6:])) > 1e-3


def test_bfloat16_compute_stays_close_to_float32_and_keeps_float32_params(gpt2):
    path, _ = gpt2("GPT2ForSequenceClassification", num_labels=2, pad_token_id=EOS)
    batch = flax_inputs(token_batch("left"))
    full = flaxheads.from_pretrained(path)
    half = flaxheads.from_pretrained(path, dtype="bfloat16")

    logits = half(**batch)

    assert logits.dtype == jnp.float32
    assert {leaf.dtype for leaf in jax_leaves(half)} == {jnp.dtype("float32")}
    assert_close(logits, full(**batch), "gpt2 bfloat16 vs float32 logits", atol=5e-2, rtol=5e-2)


def jax_leaves(model):
    import jax

    return jax.tree_util.tree_leaves(nnx.state(model, nnx.Param))


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


def test_dropout_is_active_only_in_train_mode(gpt2):
    path, _ = gpt2("GPT2ForSequenceClassification", num_labels=2, pad_token_id=EOS)
    batch = flax_inputs(token_batch("right"))
    model = flaxheads.from_pretrained(path)

    deterministic = [np.asarray(model(**batch)) for _ in range(2)]
    model.train()
    with_dropout = np.asarray(model(**batch, rngs=nnx.Rngs(dropout=0)))

    np.testing.assert_array_equal(deterministic[0], deterministic[1])
    assert np.max(np.abs(with_dropout - deterministic[0])) > 1e-4


# ---------------------------------------------------------------------------------------------
# Which token the head reads: pad id first, then the mask, then an error


def test_last_real_token_index_handles_both_padding_sides_and_all_padding_rows():
    ids = jnp.array([[5, 6, 7, 0, 0], [0, 0, 5, 6, 7], [0, 0, 0, 0, 0], [5, 0, 0, 0, 0], [5, 6, 7, 8, 9]])

    np.testing.assert_array_equal(last_real_token_index(ids, None, pad_token_id=0), [2, 4, 0, 0, 4])
    np.testing.assert_array_equal(last_real_token_index(ids, (ids != 0).astype(jnp.int32), None), [2, 4, 0, 0, 4])


def test_pad_id_equal_to_eos_reads_a_text_ending_in_eos_one_token_earlier_as_transformers(gpt2):
    path, reference = gpt2("GPT2ForSequenceClassification", num_labels=3, pad_token_id=EOS)
    batch = token_batch("right")
    batch["input_ids"][1, 6] = EOS  # the text's own last token is eos; the mask says it is real
    model = flaxheads.from_pretrained(path)

    logits = model(**flax_inputs(batch))

    assert_close(logits, torch_outputs(reference, batch).logits, "gpt2 text ending in eos == pad")
    read_from_mask = model.head.score(model.backbone(**flax_inputs(batch)).last_hidden_state[1, 6])
    assert np.max(np.abs(np.asarray(logits[1] - read_from_mask))) > 1e-3


def test_without_pad_token_id_a_batch_without_mask_is_an_error_saying_what_to_set(gpt2):
    path, _ = gpt2("GPT2ForSequenceClassification", num_labels=2)
    model = flaxheads.from_pretrained(path)
    assert model.config.backbone.pad_token_id is None

    with pytest.raises(ValueError, match=r"no pad_token_id and no attention_mask.*pad_token_id=tokenizer"):
        model(jnp.asarray(token_batch("none")["input_ids"]))


def test_without_pad_token_id_a_single_sequence_reads_its_last_position_as_transformers(gpt2):
    path, reference = gpt2("GPT2ForSequenceClassification", num_labels=2)
    batch = {"input_ids": token_batch("none")["input_ids"][:1]}

    logits = flaxheads.from_pretrained(path)(**flax_inputs(batch))

    assert_close(logits, torch_outputs(reference, batch).logits, "gpt2 no pad id, batch of one")


@pytest.mark.parametrize("padding", ["right", "left"])
def test_without_pad_token_id_the_attention_mask_finds_the_last_real_token(gpt2, padding):
    path, _ = gpt2("GPT2ForSequenceClassification", num_labels=2)
    batch = token_batch(padding, pad_id=EOS)
    model = flaxheads.from_pretrained(path)
    with_pad_id = flaxheads.from_pretrained(path, pad_token_id=EOS)

    np.testing.assert_array_equal(np.asarray(model(**flax_inputs(batch))), np.asarray(with_pad_id(**flax_inputs(batch))))


def test_pad_token_id_override_matches_transformers_and_is_saved(gpt2, tmp_path):
    path, reference = gpt2("GPT2ForSequenceClassification", num_labels=2)
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
# Conversion


@pytest.mark.parametrize("torch_dtype", ["float32", "bfloat16"])
def test_pytorch_flaxheads_pytorch_round_trip_is_bit_identical(gpt2, tmp_path, torch_dtype):
    path, _ = gpt2("GPT2ForSequenceClassification", num_labels=3, pad_token_id=EOS, torch_dtype=torch_dtype)
    model = flaxheads.from_pretrained(path, param_dtype="auto")

    model.save_pretrained(tmp_path)

    ours, theirs = load_file(tmp_path / "model.safetensors"), load_file(path / "model.safetensors")
    assert sorted(ours) == sorted(theirs)
    for name, tensor in theirs.items():
        assert ours[name].dtype == tensor.dtype and torch.equal(ours[name], tensor), name


def test_flax_format_round_trip_is_exact(gpt2, tmp_path):
    path, _ = gpt2("GPT2ForSequenceClassification", num_labels=3, pad_token_id=EOS)
    model = flaxheads.from_pretrained(path)

    model.save_pretrained(tmp_path, format="flaxheads")
    again, info = flaxheads.from_pretrained(tmp_path, output_loading_info=True)

    assert info.fully_pretrained and again.config == model.config
    assert_same_params(again, model)


def test_export_of_a_new_classifier_loads_in_transformers_with_no_missing_or_unexpected_keys(gpt2, tmp_path):
    path, _ = gpt2("GPT2Model")
    batch = token_batch("left")
    model = flaxheads.from_pretrained(path, num_labels=4, pad_token_id=EOS, seed=3)
    model.save_pretrained(tmp_path)

    loaded, info = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path, output_loading_info=True)

    assert type(loaded).__name__ == "GPT2ForSequenceClassification"
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    assert loaded.config.pad_token_id == EOS and loaded.config.num_labels == 4
    assert_close(model(**flax_inputs(batch)), torch_outputs(loaded.eval(), batch).logits, "gpt2 export in transformers")


def test_wrong_shape_tensor_names_key_and_both_shapes(gpt2, tmp_path):
    path, _ = gpt2("GPT2ForSequenceClassification", num_labels=2, pad_token_id=EOS)
    damaged = copy_checkpoint(path, tmp_path / "damaged")
    tensors = load_file(damaged / "model.safetensors")
    # c_attn stored as an nn.Linear would be, (out, in): the Conv1D layout is (in, out).
    tensors["transformer.h.1.attn.c_attn.weight"] = tensors["transformer.h.1.attn.c_attn.weight"].T.contiguous()
    save_file(tensors, damaged / "model.safetensors", metadata={"format": "pt"})

    with pytest.raises(flaxheads.ShapeMismatch, match=r"transformer\.h\.1\.attn\.c_attn\.weight.*\(96, 32\).*\(32, 96\)"):
        flaxheads.from_pretrained(damaged)


def test_classifier_of_another_size_says_num_labels(gpt2):
    path, _ = gpt2("GPT2ForSequenceClassification", num_labels=2, pad_token_id=EOS)

    with pytest.raises(flaxheads.ShapeMismatch, match=r"score\.weight.*num_labels"):
        flaxheads.from_pretrained(path, num_labels=3)


@pytest.mark.parametrize(
    ("inputs", "message"),
    [({"input_ids": np.ones((2, 65), np.int32)}, r"sequence length 65 exceeds n_positions=64"),
     ({"input_ids": np.ones((8,), np.int32)}, r"input_ids must be \(batch, seq\), got shape \(8,\)"),
     ({"input_ids": np.ones((2, 8), np.int32), "attention_mask": np.ones((2, 7), np.int32)},
      r"attention_mask has shape \(2, 7\) but input_ids has \(2, 8\)")],
)
def test_inputs_of_the_wrong_shape_are_refused(gpt2, inputs, message):
    path, _ = gpt2("GPT2ForSequenceClassification", num_labels=2, pad_token_id=EOS)
    model = flaxheads.from_pretrained(path)

    with pytest.raises(ValueError, match=message):
        model(**flax_inputs(inputs))


def test_cross_attention_config_is_not_implemented(gpt2, tmp_path):
    path, _ = gpt2("GPT2Model")

    with pytest.raises(NotImplementedError, match="add_cross_attention"):
        flaxheads.from_pretrained(copy_checkpoint(path, tmp_path / "x", add_cross_attention=True))


# ---------------------------------------------------------------------------------------------
# Loading reports


def test_gpt2_model_loads_the_backbone_and_creates_only_the_score(gpt2):
    path, _ = gpt2("GPT2Model")

    _, info = flaxheads.from_pretrained(path, pad_token_id=EOS, output_loading_info=True)

    assert info.newly_initialized == ["score.weight"] and info.unused == [] and info.mismatched == []


def test_loading_info_says_when_the_last_token_head_has_no_pad_token_id(gpt2):
    path, _ = gpt2("GPT2Model")

    _, without = flaxheads.from_pretrained(path, output_loading_info=True)
    _, with_pad = flaxheads.from_pretrained(path, pad_token_id=EOS, output_loading_info=True)

    assert any("pad_token_id=tokenizer.eos_token_id" in note for note in without.notes)
    assert "no pad_token_id" in str(without) and "no pad_token_id" not in str(with_pad)


def test_lm_head_checkpoint_has_nothing_missing_and_its_tied_head_is_not_needed(gpt2):
    path, _ = gpt2("GPT2LMHeadModel")

    _, info = flaxheads.from_pretrained(path, pad_token_id=EOS, output_loading_info=True)

    assert info.newly_initialized == ["score.weight"]
    assert all(name.startswith("transformer.") for name in info.loaded)
    assert info.unused == []  # transformers does not write the tied lm_head.weight


def test_lm_head_weight_and_mask_buffers_of_old_checkpoints_are_reported_unused(gpt2, tmp_path):
    path, reference = gpt2("GPT2LMHeadModel")
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
# Any head on any backbone


def _masked_mean(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    mask = mask[..., None].to(hidden.dtype)
    return (hidden * mask).sum(1) / mask.sum(1)


@pytest.mark.parametrize("padding", ["right", "left"])
@pytest.mark.parametrize("head", ["cls", "mean"])
def test_encoder_heads_on_gpt2_match_torch_reference_and_round_trip_through_flaxheads_layout(
    gpt2, tmp_path, head, padding
):
    path, reference = gpt2("GPT2Model")
    batch = token_batch(padding)
    model = flaxheads.from_pretrained(path, head=head, num_labels=3, seed=1)

    model.save_pretrained(tmp_path)
    again, info = flaxheads.from_pretrained(tmp_path, output_loading_info=True)

    exported = load_file(tmp_path / "model.safetensors")
    assert sorted(k for k in exported if not k.startswith("transformer.")) == ["head.classifier.bias", "head.classifier.weight"]
    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == ["GPT2Model"]
    assert again.config.head == head and info.fully_pretrained
    assert_same_params(again, model)
    hidden = torch_outputs(reference, batch).last_hidden_state
    pooled = hidden[:, 0] if head == "cls" else _masked_mean(hidden, torch.from_numpy(batch["attention_mask"]))
    expected = torch.nn.functional.linear(pooled, exported["head.classifier.weight"], exported["head.classifier.bias"])
    assert_close(again(**flax_inputs(batch)), expected, f"{head} head on gpt2, {padding} padding")


def test_transformers_gpt2_model_loads_the_backbone_of_a_non_canonical_export(gpt2, tmp_path):
    path, _ = gpt2("GPT2Model")
    flaxheads.from_pretrained(path, head="mean", num_labels=3).save_pretrained(tmp_path)

    base, info = transformers.AutoModel.from_pretrained(tmp_path, output_loading_info=True)

    assert type(base).__name__ == "GPT2Model"
    assert not info["missing_keys"]
    assert info["unexpected_keys"] == {"head.classifier.weight", "head.classifier.bias"}


@pytest.mark.parametrize("padding", ["right", "left"])
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


# ---------------------------------------------------------------------------------------------
# Fine-tuning: the tokenizer has no pad token, the checkpoint no pad_token_id


@pytest.fixture(scope="module")
def gpt2_with_tokenizer(tmp_path_factory) -> Path:
    """A tiny GPT2Model and a byte-level BPE tokenizer trained here (no pad token, eos only)."""
    from tokenizers import ByteLevelBPETokenizer

    texts = ["a gorgeous, moving film", "tedious and dull", "what a great story", "the worst plot ever"] * 20
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(texts, vocab_size=300, special_tokens=["<|endoftext|>"], show_progress=False)
    tokenizer = transformers.GPT2TokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>",
                                               bos_token="<|endoftext|>", unk_token="<|endoftext|>")
    eos = tokenizer.eos_token_id
    path = tmp_path_factory.mktemp("gpt2_tok")
    config = transformers.GPT2Config(**{**TINY_GPT2, "vocab_size": len(tokenizer), "bos_token_id": eos,
                                        "eos_token_id": eos, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0})
    torch.manual_seed(0)
    transformers.GPT2Model(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    assert tokenizer.pad_token is None
    return path


def test_training_without_a_pad_token_pads_with_eos_and_exports_a_model_transformers_reads_alike(
    gpt2_with_tokenizer, tmp_path, capsys
):
    from flaxheads.training.config import TrainConfig
    from flaxheads.inference import predict
    from flaxheads.training.trainer import train

    data = tmp_path / "train.csv"
    with open(data, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["sentence", "label"])
        for i in range(16):
            writer.writerow(["a gorgeous, moving film" if i % 2 else "the worst plot ever, so " + "dull " * (i % 5),
                             "positive" if i % 2 else "negative"])
    config = TrainConfig(model_name_or_path=str(gpt2_with_tokenizer), train_file=str(data), text_column="sentence",
                         output_dir=str(tmp_path / "run"), max_seq_length=32, per_device_train_batch_size=8,
                         max_steps=2, logging_steps=1, save_steps=2, disable_tqdm=True)

    train(config)

    out = Path(config.output_dir)
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    eos = tokenizer.eos_token_id
    assert "sets no pad_token_id" in capsys.readouterr().err
    assert json.loads((out / "config.json").read_text())["pad_token_id"] == eos == tokenizer.pad_token_id
    texts = ["tedious and dull", "what a great story, a gorgeous and moving film"]
    enc = tokenizer(texts, padding="longest", return_tensors="np")
    reference = transformers.AutoModelForSequenceClassification.from_pretrained(out).eval()
    ours = flaxheads.from_pretrained(out)(jnp.asarray(enc["input_ids"]), jnp.asarray(enc["attention_mask"]))
    assert_close(ours, torch_outputs(reference, dict(enc)).logits, "trained gpt2 export in transformers")
    rows = predict(out, texts)
    expected = torch.softmax(torch_outputs(reference, dict(enc)).logits, -1).numpy()
    for row, p in zip(rows, expected):
        np.testing.assert_allclose(list(row["probabilities"].values()), p, atol=1e-5)
