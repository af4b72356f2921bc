"""benchmarks/train_memory.py: XLA's planned memory of a train step, on a tiny config."""

from __future__ import annotations

import pytest

from flaxheads.benchmarks import train_memory

TINY_LLAMA = dict(model_type="llama", vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, intermediate_size=128, max_position_embeddings=64)


@pytest.mark.parametrize("model_type, expected", [("llama", ("q_proj", "v_proj")), ("bert", ("query", "value"))])
def test_lora_query_value_targets_take_each_familys_names(model_type, expected):
    assert train_memory.lora_targets(model_type, train_memory.QUERY_VALUE) == expected
    assert train_memory.lora_targets(model_type, ("o_proj",)) == ("o_proj",)


@pytest.mark.slow  # a training step compiled
def test_lora_on_a_llama_shape_keeps_optimizer_state_for_adapters_and_head_only():
    full, lora = (train_memory.step_memory(TINY_LLAMA, train_memory.SETUPS[i], batch=2, seq=8) for i in (0, 2))
    assert full["trainable_params"] == full["all_params"]
    assert lora["trainable_params"] < full["trainable_params"] / 4
    assert lora["optimizer_state_bytes"] < full["optimizer_state_bytes"] / 4
    assert lora["peak_bytes"] > 0
