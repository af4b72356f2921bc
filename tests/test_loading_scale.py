"""Loading at scale: tensors go to their devices (their FSDP shards) one at a time as they are
read, in the parameter dtype asked for, and the host never holds the model's state."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import weakref

import numpy as np
import pytest

import flaxheads
from flaxheads.conversion import loading
from flaxheads.conversion.checkpoint_io import TensorReader
from runs import cpu_devices_env

_SHARDED_BF16 = textwrap.dedent("""
    import json, sys
    import jax, jax.numpy as jnp, numpy as np
    import flaxheads
    from flaxheads.conversion.loading import flat_variables
    from flaxheads.training.sharding import Layout

    layout = Layout.create("fsdp=4")
    ids = jnp.asarray(np.random.RandomState(0).randint(1, 99, (4, 12)), jnp.int32)
    plain = flaxheads.from_pretrained(sys.argv[1], param_dtype=jnp.bfloat16)
    sharded = flaxheads.from_pretrained(sys.argv[1], param_dtype=jnp.bfloat16, placement=layout.param_sharding)
    variables = {k: v[...] for k, (_, v) in flat_variables(sharded).items()}
    print(json.dumps({
        "plain": np.asarray(plain(ids)).tolist(), "sharded": np.asarray(sharded(ids)).tolist(),
        "dtypes": sorted({str(a.dtype) for a in variables.values()}),
        "specs": {k: str(a.sharding.spec) for k, a in variables.items()},
        "expected": {k: str(layout.param_sharding(k, a.shape).spec) for k, a in variables.items()},
    }))
""")


@pytest.mark.slow  # a subprocess on 4 fake devices
def test_sharded_bfloat16_load_places_each_tensor_on_its_fsdp_shards_with_plain_logits(hf_checkpoint):
    checkpoint = hf_checkpoint("BertForSequenceClassification", num_labels=3, torch_dtype="bfloat16")
    env = cpu_devices_env(4)
    result = subprocess.run([sys.executable, "-c", _SHARDED_BF16, str(checkpoint.path)], capture_output=True,
                            text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    out = json.loads(result.stdout.splitlines()[-1])
    assert out["dtypes"] == ["bfloat16"]
    assert out["specs"] == out["expected"]
    assert out["specs"]["backbone.layers.0.attention.query.kernel"] == "P('fsdp', None)"
    difference = float(np.abs(np.array(out["plain"]) - np.array(out["sharded"])).max())
    print("sharded vs plain bf16 load, max logit difference:", difference)
    assert difference < 1e-5


class _AliveCounter:
    """Wraps a reader: at every read, counts the tensors it returned earlier that are still alive."""

    def __init__(self, reader: TensorReader):
        self.reader, self.earlier, self.most_alive, self.reads = reader, [], 0, 0

    def read(self, name: str) -> np.ndarray:
        self.most_alive = max(self.most_alive, sum(ref() is not None for ref in self.earlier))
        array = self.reader.read(name)
        self.earlier.append(weakref.ref(array))
        self.reads += 1
        return array

    def as_reader(self) -> TensorReader:
        return TensorReader(self.reader.names, self.read, self.reader.source, self.reader.dtype_of)


def test_loading_holds_one_checkpoint_tensor_at_a_time_not_the_state(hf_checkpoint):
    # bf16 on disk, float32 parameters: every read tensor is copied into its parameter, so a loader
    # that kept the read tensors (the model's whole state, on the host) would show them alive.
    checkpoint = loading.open_checkpoint(hf_checkpoint("BertForSequenceClassification", num_labels=3,
                                                       torch_dtype="bfloat16").path)
    counter = _AliveCounter(checkpoint.reader)
    checkpoint.__dict__["reader"] = counter.as_reader()  # the cached_property's slot

    model = flaxheads.from_pretrained(checkpoint, param_dtype="float32")

    assert counter.reads > 20 and model.config.num_labels == 3
    assert counter.most_alive <= 1, f"{counter.most_alive} of {counter.reads} read tensors were alive at once"


def test_benchmark_checkpoint_is_sharded_and_loads_every_tensor(tmp_path):
    from flaxheads.benchmarks.loading import write_random_checkpoint

    shape = {"model_type": "bert", "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
             "intermediate_size": 37, "vocab_size": 99, "max_position_embeddings": 64}
    folder = write_random_checkpoint(tmp_path / "ckpt", shape, shard_bytes=20_000)
    model, info = flaxheads.from_pretrained(folder, param_dtype="bfloat16", output_loading_info=True)
    assert len(list(folder.glob("model-*-of-*.safetensors"))) > 2
    assert info.newly_initialized == [] and info.unused == [] and model.config.num_labels == 1
