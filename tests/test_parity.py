"""Numerical parity with transformers (PyTorch, eval mode) on tiny random BERT and RoBERTa models.

Logits of the canonical heads are compared with `*ForSequenceClassification`, every hidden
state with `BertModel` / `RobertaModel`, and the heads transformers has no class for with a
reference computed in torch from transformers' hidden states and the head's exported weights.
"""

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

ATOL, RTOL = 1e-5, 1e-5
PAD_ID = {"bert": 0, "roberta": 1}
CLASSIFIER = {"bert": "BertForSequenceClassification", "roberta": "RobertaForSequenceClassification"}
BASE = {"bert": "BertModel", "roberta": "RobertaModel"}


def token_batch(family: str, padding: str, *, seq_len: int = 10, seed: int = 0) -> dict[str, np.ndarray]:
    """Three sequences of lengths (10, 7, 2) padded on `padding` ("right", "left", or "none":
    all full length), with the family's pad id; BERT gets segment B on the second half."""
    rng = np.random.default_rng(seed)
    lengths = np.array([seq_len] * 3 if padding == "none" else [seq_len, seq_len - 3, 2])
    positions = np.arange(seq_len)[None, :]
    if padding == "left":
        real = positions >= seq_len - lengths[:, None]
    else:
        real = positions < lengths[:, None]
    # ids from 3 up never collide with RoBERTa's <s>=0, <pad>=1, </s>=2 or BERT's [PAD]=0.
    input_ids = np.where(real, rng.integers(3, 99, real.shape), PAD_ID[family])
    batch = {"input_ids": input_ids, "attention_mask": real.astype(np.int64)}
    if family == "bert":
        batch["token_type_ids"] = (real & (positions >= seq_len // 2)).astype(np.int64)
    return batch


def torch_outputs(model: torch.nn.Module, batch: dict[str, np.ndarray], **kwargs):
    with torch.no_grad():
        return model(**{k: torch.from_numpy(v) for k, v in batch.items()}, **kwargs)


def flax_inputs(batch: dict[str, np.ndarray]) -> dict[str, jnp.ndarray]:
    return {k: jnp.asarray(v) for k, v in batch.items()}


def assert_close(actual, expected, what: str, atol: float = ATOL, rtol: float = RTOL) -> None:
    actual, expected = np.asarray(actual, np.float32), np.asarray(expected, np.float32)
    print(f"{what}: max abs difference {np.max(np.abs(actual - expected)):.3g}")
    np.testing.assert_allclose(actual, expected, atol=atol, rtol=rtol, err_msg=what)


# ---------------------------------------------------------------------------------------------
# Canonical heads: logits equal transformers' *ForSequenceClassification


@pytest.mark.parametrize("padding", ["right", "left", "none"])
@pytest.mark.parametrize("num_labels", [1, 2, 5])
@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_canonical_head_logits_match_transformers(hf_checkpoint, family, num_labels, padding):
    checkpoint = hf_checkpoint(CLASSIFIER[family], num_labels=num_labels)
    batch = token_batch(family, padding)
    model = flaxheads.from_pretrained(checkpoint.path)

    logits = model(**flax_inputs(batch))

    assert logits.shape == (3, num_labels) and logits.dtype == jnp.float32
    expected = torch_outputs(checkpoint.model, batch).logits
    assert_close(logits, expected, f"{family} num_labels={num_labels} padding={padding}")


def test_bert_token_type_ids_reach_the_logits_as_in_transformers(hf_checkpoint):
    checkpoint = hf_checkpoint(CLASSIFIER["bert"], num_labels=2)
    batch = token_batch("bert", "none")
    batch["token_type_ids"] = 1 - batch["token_type_ids"]
    model = flaxheads.from_pretrained(checkpoint.path)

    logits = model(**flax_inputs(batch))
    without_types = model(**flax_inputs({**batch, "token_type_ids": np.zeros_like(batch["input_ids"])}))

    assert_close(logits, torch_outputs(checkpoint.model, batch).logits, "bert, swapped segments")
    assert np.max(np.abs(np.asarray(logits - without_types))) > 1e-3


def test_roberta_explicit_position_ids_match_transformers(hf_checkpoint):
    checkpoint = hf_checkpoint(CLASSIFIER["roberta"], num_labels=2)
    batch = token_batch("roberta", "left")
    batch["position_ids"] = np.broadcast_to(np.arange(2, 12), batch["input_ids"].shape).copy()
    model = flaxheads.from_pretrained(checkpoint.path)

    assert_close(model(**flax_inputs(batch)), torch_outputs(checkpoint.model, batch).logits, "roberta position_ids")


@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_config_without_pad_token_id_uses_the_family_default_as_transformers_does(hf_checkpoint, tmp_path, family):
    checkpoint = hf_checkpoint(CLASSIFIER[family], num_labels=2)
    shutil.copytree(checkpoint.path, tmp_path, dirs_exist_ok=True)
    config = json.loads((tmp_path / "config.json").read_text())
    del config["pad_token_id"]  # third-party configs may leave family defaults out
    (tmp_path / "config.json").write_text(json.dumps(config))
    batch = token_batch(family, "right")
    reference = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path).eval()

    model = flaxheads.from_pretrained(tmp_path)

    assert model.config.backbone.pad_token_id == reference.config.pad_token_id == PAD_ID[family]
    assert_close(model(**flax_inputs(batch)), torch_outputs(reference, batch).logits, f"{family} without pad_token_id")


@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_multi_label_checkpoint_loads_its_problem_type_and_matches_logits(hf_checkpoint, family):
    checkpoint = hf_checkpoint(CLASSIFIER[family], num_labels=4, problem_type="multi_label_classification")
    batch = token_batch(family, "right")
    model = flaxheads.from_pretrained(checkpoint.path)

    assert model.config.problem_type == flaxheads.MULTI_LABEL
    assert model.config.num_labels == 4
    assert_close(model(**flax_inputs(batch)), torch_outputs(checkpoint.model, batch).logits, f"{family} multi-label")


def test_dropout_is_inactive_in_eval_mode_and_active_in_train_mode(hf_checkpoint):
    checkpoint = hf_checkpoint(CLASSIFIER["bert"], num_labels=2)
    batch = flax_inputs(token_batch("bert", "right"))
    model = flaxheads.from_pretrained(checkpoint.path)

    deterministic = [np.asarray(model(**batch)) for _ in range(2)]
    model.train()
    with_dropout = np.asarray(model(**batch, rngs=nnx.Rngs(dropout=1)))

    np.testing.assert_array_equal(deterministic[0], deterministic[1])
    assert np.max(np.abs(with_dropout - deterministic[0])) > 1e-4


# ---------------------------------------------------------------------------------------------
# Backbones: every hidden state equals transformers' base model's


@pytest.mark.parametrize("padding", ["right", "left"])
@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_every_hidden_state_and_pooler_match_base_model(hf_checkpoint, family, padding):
    checkpoint = hf_checkpoint(BASE[family], num_hidden_layers=3)
    batch = token_batch(family, padding)
    encoder, info = flaxheads.load_backbone(checkpoint.path)

    out = encoder(**flax_inputs(batch))

    expected = torch_outputs(checkpoint.model, batch, output_hidden_states=True)
    assert info.newly_initialized == [] and info.unused == []
    assert len(out.hidden_states) == len(expected.hidden_states) == 4
    for layer, (ours, theirs) in enumerate(zip(out.hidden_states, expected.hidden_states)):
        assert_close(ours, theirs, f"{family} hidden state {layer}")
    np.testing.assert_array_equal(np.asarray(out.last_hidden_state), np.asarray(out.hidden_states[-1]))
    assert_close(out.pooler_output, expected.pooler_output, f"{family} pooler_output")


@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_backbone_of_classifier_checkpoint_matches_its_base_model(hf_checkpoint, family):
    checkpoint = hf_checkpoint(CLASSIFIER[family], num_labels=2)
    batch = token_batch(family, "right")
    encoder, info = flaxheads.load_backbone(checkpoint.path)

    out = encoder(**flax_inputs(batch))

    base_model = getattr(checkpoint.model, family)
    expected = torch_outputs(base_model, batch, output_hidden_states=True)
    assert all(name.startswith("classifier") for name in info.unused)
    for layer, (ours, theirs) in enumerate(zip(out.hidden_states, expected.hidden_states, strict=True)):
        assert_close(ours, theirs, f"{family} classifier backbone hidden state {layer}")


# ---------------------------------------------------------------------------------------------
# Heads transformers has no class for: reference from transformers' hidden states + exported weights


def _linear(x: torch.Tensor, weights: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    return torch.nn.functional.linear(x, weights[f"{name}.weight"], weights[f"{name}.bias"])


def _masked_mean(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    mask = mask[..., None].to(hidden.dtype)
    return (hidden * mask).sum(1) / mask.sum(1)


# head -> f(hidden_states, attention_mask, exported tensors, base prefix) -> logits
REFERENCE_HEADS = {
    "cls": lambda hs, mask, w, base: _linear(hs[-1][:, 0], w, "head.classifier"),
    "mean": lambda hs, mask, w, base: _linear(_masked_mean(hs[-1], mask), w, "head.classifier"),
    "concat_last4": lambda hs, mask, w, base: _linear(
        torch.cat([hs[-k][:, 0] for k in (1, 2, 3, 4)], dim=-1), w, "head.classifier"
    ),
    "roberta": lambda hs, mask, w, base: _linear(
        torch.tanh(_linear(hs[-1][:, 0], w, "head.dense")), w, "head.out_proj"
    ),
    "pooler": lambda hs, mask, w, base: _linear(
        torch.tanh(_linear(hs[-1][:, 0], w, f"{base}.pooler.dense")), w, "head.classifier"
    ),
}
NON_CANONICAL = [
    *[("bert", head) for head in ("roberta", "cls", "mean", "concat_last4")],
    *[("roberta", head) for head in ("pooler", "cls", "mean", "concat_last4")],
]


@pytest.mark.parametrize("padding", ["right", "left"])
@pytest.mark.parametrize(("family", "head"), NON_CANONICAL)
def test_non_canonical_head_logits_match_torch_reference(hf_checkpoint, tmp_path, family, head, padding):
    checkpoint = hf_checkpoint(BASE[family], num_hidden_layers=4)
    batch = token_batch(family, padding)
    model = flaxheads.from_pretrained(checkpoint.path, head=head, num_labels=3, seed=1)
    model.save_pretrained(tmp_path)
    exported = load_file(tmp_path / "model.safetensors")

    logits = model(**flax_inputs(batch))

    hidden_states = torch_outputs(checkpoint.model, batch, output_hidden_states=True).hidden_states
    expected = REFERENCE_HEADS[head](hidden_states, torch.from_numpy(batch["attention_mask"]), exported, family)
    assert logits.shape == (3, 3)
    assert_close(logits, expected, f"{head} head on {family}, padding={padding}")


def test_pooler_head_on_roberta_uses_the_pretrained_pooler(hf_checkpoint, tmp_path):
    checkpoint = hf_checkpoint(BASE["roberta"], num_hidden_layers=4)
    model = flaxheads.from_pretrained(checkpoint.path, head="pooler", num_labels=3)
    model.save_pretrained(tmp_path)
    exported = load_file(tmp_path / "model.safetensors")

    for name in ("pooler.dense.weight", "pooler.dense.bias"):
        assert torch.equal(exported[f"roberta.{name}"], checkpoint.model.state_dict()[name])


def test_mean_head_ignores_padding_tokens(hf_checkpoint):
    checkpoint = hf_checkpoint(BASE["bert"], num_hidden_layers=2)
    batch = token_batch("bert", "right")
    model = flaxheads.from_pretrained(checkpoint.path, head="mean", num_labels=3)
    changed_padding = {**batch, "input_ids": np.where(batch["attention_mask"] == 1, batch["input_ids"], 7)}

    np.testing.assert_allclose(
        np.asarray(model(**flax_inputs(batch))), np.asarray(model(**flax_inputs(changed_padding))), atol=1e-6
    )



@pytest.mark.parametrize("head", flaxheads.HEAD_NAMES)
def test_all_padding_row_gives_finite_logits_with_and_without_dropout(hf_checkpoint, head):
    """Batches padded with dummy examples (example_mask 0) must not poison the loss with NaN."""
    checkpoint = hf_checkpoint(BASE["bert"], num_hidden_layers=4)
    batch = token_batch("bert", "right")
    batch["attention_mask"][2] = 0
    batch["input_ids"][2] = PAD_ID["bert"]
    model = flaxheads.from_pretrained(checkpoint.path, head=head, num_labels=3)

    logits = model(**flax_inputs(batch))
    model.train()
    with_dropout = model(**flax_inputs(batch), rngs=nnx.Rngs(dropout=0))

    assert np.isfinite(np.asarray(logits)).all() and np.isfinite(np.asarray(with_dropout)).all()

# ---------------------------------------------------------------------------------------------
# Mixed precision


@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_bfloat16_compute_stays_close_to_float32_and_keeps_float32_params(hf_checkpoint, family):
    checkpoint = hf_checkpoint(CLASSIFIER[family], num_labels=2)
    batch = flax_inputs(token_batch(family, "right"))
    full = flaxheads.from_pretrained(checkpoint.path)
    half = flaxheads.from_pretrained(checkpoint.path, dtype="bfloat16")

    logits = half(**batch)

    assert logits.dtype == jnp.float32
    param_dtypes = {leaf.dtype for leaf in jax.tree_util.tree_leaves(nnx.state(half, nnx.Param))}
    assert param_dtypes == {jnp.dtype("float32")}
    assert_close(logits, full(**batch), f"{family} bfloat16 vs float32 logits", atol=5e-2, rtol=5e-2)

