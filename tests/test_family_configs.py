"""Every family of tests/families.py refuses a config.json that cannot describe its weights, naming
the field, the value and the fix: a size that is not an int of at least 1 (jax failed later with
a TypeError or ZeroDivisionError, or built a model of no width), and a layer count the weights do
not have, refused before the model is built (building 100000 layers took minutes)."""

from __future__ import annotations

import inspect
import json
import re
import shutil

import pytest
from flax import nnx

import flaxheads
from families import FAMILIES, case
from flaxheads.backbones import backbone_config_from_hf

SIZES = ("vocab_size", "hidden_size", "n_embd", "d_model", "dim", "num_hidden_layers", "n_layer", "n_layers",
         "num_attention_heads", "n_head", "n_heads", "intermediate_size", "hidden_dim", "d_inner", "n_inner",
         "embedding_size", "num_key_value_heads", "head_dim", "max_position_embeddings", "n_positions")
"""The sizes of a backbone as transformers' config classes name them; each row checks those its class has."""
ROWS = [case(row, id=row.name, fast=True) for row in FAMILIES.values()]


def _sizes(row) -> list[str]:
    own = inspect.signature(row.config_class.__init__).parameters
    hf = row.hf_config()
    return [name for name in SIZES if name in own and hf.get(name) is not None]


@pytest.mark.parametrize("row", ROWS)
def test_a_size_that_is_not_a_positive_int_is_refused_naming_the_field_and_the_value(row):
    hf = row.hf_config()
    assert _sizes(row)
    for name in _sizes(row):
        for bad in (-hf[name], 0, float(hf[name]), str(hf[name])):
            with pytest.raises(ValueError, match=rf"^{name}={re.escape(repr(bad))}: .* int\) of at least 1.*"
                                                 rf"correct \"{name}\" in config\.json"):
                backbone_config_from_hf({**hf, name: bad})
    if "type_vocab_size" in hf:  # 0 is a size there: no token types
        with pytest.raises(ValueError, match=r"^type_vocab_size=-1: .* of at least 0"):
            backbone_config_from_hf({**hf, "type_vocab_size": -1})


@pytest.mark.parametrize("row", ROWS)
def test_a_layer_count_the_weights_do_not_have_is_refused_before_the_model_is_built(hf_checkpoint, row, tmp_path,
                                                                                   monkeypatch):
    shutil.copytree(hf_checkpoint(row.base, family=row.name).path, tmp_path, dirs_exist_ok=True)
    key = row.weights_layers_key or row.config_class.attribute_map.get(row.layers_key, row.layers_key)
    config = json.loads((tmp_path / "config.json").read_text())
    held = config[key]
    config.pop("layer_types", None)  # one per layer: the family's default pattern for the new count
    (tmp_path / "config.json").write_text(json.dumps({**config, key: held + 1}))

    def built(*args, **kwargs):
        raise AssertionError("the model was built before its layer count was checked")

    monkeypatch.setattr(nnx, "eval_shape", built)
    with pytest.raises(flaxheads.CheckpointError,
                       match=rf"holds {held} layers \(e\.g\. .*\) but config\.json says {key}={held + 1}; .*Set "
                             rf"\"{key}\": {held} in config\.json if the weights are right, or re-export"):
        flaxheads.from_pretrained(tmp_path, **dict(row.load_options))
