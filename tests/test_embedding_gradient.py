"""Embedding lookups (`layers.lookup`) whose gradient is not XLA's scatter-add into a table of zeros:
on GPUs and TPUs small tables take it as a one-hot matmul (GPU atomics serialise where many tokens
read one row), equal to the scatter-add's to float32 rounding; on CPUs large tables gather it from
per-id sums, the scatter-add's bits. The forward is `jnp.take` either way. Tested for every family's
tables, padded and packed; the tests make `lookup` choose as on a GPU (`layers._backend`) or take
the CPU's path for any table size (`GATHERED_GRADIENT_ROWS`), and compare in the same process."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import flaxheads
from families import FAMILIES
from family_parity import flax_inputs
from flaxheads.backbones import layers
from test_unread_positions import _packed


@pytest.fixture
def backend(monkeypatch):
    """`backend("gpu")` makes `layers.lookup` choose as it would on a GPU."""
    return lambda name: monkeypatch.setattr(layers, "_backend", lambda: name)


@pytest.fixture
def gathered(monkeypatch):
    """`gathered(True)`: every CPU table (of more than 0 rows) gathers its gradient; False: none."""
    return lambda on: monkeypatch.setattr(layers, "GATHERED_GRADIENT_ROWS", 0 if on else 2**62)


def _custom_gradient(table, ids) -> str | None:
    """Which custom gradient `lookup` takes ("_lookup_one_hot_gradient", ...), None for jnp.take's
    (a fresh function each call: jax caches traces by function)."""
    for eqn in jax.make_jaxpr(lambda t, i: layers.lookup(t, i))(table, ids).eqns:
        if eqn.primitive.name.startswith("custom_vjp"):
            return eqn.params["call_jaxpr"].jaxpr.debug_info.func_name
    return None


def _one_hot_gradient(table, ids) -> bool:
    return _custom_gradient(table, ids) == "_lookup_one_hot_gradient"


def _grad_of_lookup(table, ids, cotangent):
    return jax.jit(jax.value_and_grad(lambda t: jnp.sum(layers.lookup(t, ids).astype(jnp.float32) * cotangent)))(table)


IDS_KINDS = ["one row for every token", "positions of every row", "random, out of range too"]


@pytest.mark.parametrize("ids_kind", IDS_KINDS)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_one_hot_gradient_equals_the_scatter_add(backend, ids_kind, dtype):
    rng = np.random.default_rng(0)
    rows, batch, seq = 9, 6, 7
    ids = {
        "one row for every token": np.zeros((batch, seq), np.int32),
        "positions of every row": np.broadcast_to(np.arange(seq), (batch, seq)),
        "random, out of range too": rng.integers(-rows, rows + 3, (batch, seq)),
    }[ids_kind]
    ids = jnp.asarray(ids, jnp.int32)
    table = jnp.asarray(rng.normal(size=(rows, 5)), dtype)
    cotangent = jnp.asarray(rng.normal(size=(batch, seq, 5)), jnp.float32)
    in_range = np.asarray((ids >= -rows) & (ids < rows))
    cotangent = cotangent * jnp.asarray(in_range, jnp.float32)[..., None]  # NaN rows stay out of the sum
    backend("gpu")
    assert _one_hot_gradient(table, ids), "the one-hot gradient is not taken"
    got_forward = layers.lookup(table, ids)
    (_, got) = _grad_of_lookup(table, ids, cotangent)
    backend("cpu")
    assert not _one_hot_gradient(table, ids)
    (_, expected) = _grad_of_lookup(table, ids, cotangent)

    expected_forward = jnp.take(table, ids, axis=0)
    np.testing.assert_array_equal(np.asarray(got_forward, np.float32), np.asarray(expected_forward, np.float32))
    assert got.dtype == table.dtype
    # bf16: the scatter-add rounds every partial sum to bf16, the matmul only its float32 total
    tolerance = dict(atol=1e-5, rtol=1e-5) if dtype == jnp.float32 else dict(atol=0.1, rtol=0.05)
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(expected, np.float32), **tolerance)


def test_large_tables_keep_the_scatter_add(backend):
    backend("gpu")
    table = jnp.zeros((layers.ONE_HOT_GRADIENT_ROWS + 1, 2))
    assert not _one_hot_gradient(table, jnp.zeros((3,), jnp.int32))
    assert _one_hot_gradient(table[:-1], jnp.zeros((3,), jnp.int32))


def test_tpu_takes_the_one_hot_gradient_too(backend):
    backend("tpu")
    assert _one_hot_gradient(jnp.zeros((4, 2)), jnp.zeros((3,), jnp.int32))


@pytest.mark.parametrize("ids_kind", IDS_KINDS)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_gathered_gradient_is_the_scatter_add_bit_for_bit(backend, gathered, ids_kind, dtype):
    rng = np.random.default_rng(1)
    rows, batch, seq = 40, 6, 9
    ids = jnp.asarray({
        "one row for every token": np.zeros((batch, seq)),
        "positions of every row": np.broadcast_to(np.arange(seq), (batch, seq)),
        "random, out of range too": rng.integers(-rows - 4, rows + 4, (batch, seq)),
    }[ids_kind], jnp.int32)
    table = jnp.asarray(rng.normal(size=(rows, 5)), dtype)
    cotangent = jnp.asarray(rng.normal(size=(batch, seq, 5)), jnp.float32)  # out of range too: dropped
    backend("cpu")
    gathered(True)
    assert _custom_gradient(table, ids) == "_lookup_gathered_gradient"
    got_forward = layers.lookup(table, ids)
    loss, got = _grad_of_lookup(table, ids, cotangent)
    gathered(False)
    assert _custom_gradient(table, ids) is None
    expected_loss, expected = _grad_of_lookup(table, ids, cotangent)

    np.testing.assert_array_equal(np.asarray(got_forward, np.float32),
                                  np.asarray(jnp.take(table, ids, axis=0), np.float32))
    np.testing.assert_array_equal(loss, expected_loss)
    assert got.dtype == table.dtype
    np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(expected, np.float32))


def test_which_tables_take_which_gradient(backend):
    vocabulary = jnp.zeros((layers.GATHERED_GRADIENT_ROWS + 1, 2))
    small = jnp.zeros((layers.ONE_HOT_GRADIENT_ROWS, 2))
    ids = jnp.zeros((3,), jnp.int32)
    backend("cpu")
    assert (_custom_gradient(vocabulary, ids), _custom_gradient(small, ids)) == ("_lookup_gathered_gradient", None)
    assert _custom_gradient(vocabulary[:-1], ids) is None
    for accelerator in ("gpu", "tpu"):
        backend(accelerator)
        assert (_custom_gradient(vocabulary, ids), _custom_gradient(small, ids)) == (None, "_lookup_one_hot_gradient")


def _loss_and_grads(model, inputs: dict, extra: dict):
    """((loss, logits), gradients) of a training-mode forward pass, and how many scatter-adds of
    the gradient program write an array of an embedding table's shape."""
    graphdef, params = nnx.split(model)
    table_shapes = {"[{}]".format(",".join(map(str, m.embedding.shape)))
                    for _, m in nnx.iter_graph(model) if isinstance(m, layers.Embed)}

    def loss(params):
        logits = nnx.merge(graphdef, params)(**inputs, **extra, rngs=nnx.Rngs(dropout=3))
        return jnp.sum(jnp.sin(3.0 * logits)), logits

    step = jax.value_and_grad(loss, has_aux=True)
    scatter_adds = sum(1 for line in str(jax.make_jaxpr(step)(params)).splitlines()
                       if "= scatter-add[" in line and line.split("=")[0].strip().split("f32")[-1] in table_shapes)
    return jax.jit(step)(params), scatter_adds


# Every family (each row's tiny vocabulary is small enough that its word table takes the one-hot
# gradient too) in training mode (dropout on), on its padding side; BERT packed too (positions
# restart at every segment).
LAYOUTS = [(name, row.sample_padding) for name, row in FAMILIES.items()] + [("bert", "packed")]


@pytest.mark.slow
@pytest.mark.parametrize("path", ["one-hot (GPU)", "gathered (CPU)"])
@pytest.mark.parametrize(("name", "layout"), LAYOUTS, ids=[f"{name}-{layout}" for name, layout in LAYOUTS])
def test_every_family_trains_the_same_with_each_gradient(hf_checkpoint, backend, gathered, name, layout, path):
    row = FAMILIES[name]
    checkpoint = hf_checkpoint(row.base, family=row.name, **{row.layers_key: 1})
    model = flaxheads.from_pretrained(checkpoint.path, head=row.head, num_labels=3, seed=1, **dict(row.load_options))
    model.train()
    tables = [module for _, module in nnx.iter_graph(model) if isinstance(module, layers.Embed)]
    assert tables, f"{name}: no embedding table"
    assert all(module.num_embeddings <= layers.ONE_HOT_GRADIENT_ROWS for module in tables)
    if layout == "packed":
        inputs, extra = flax_inputs(_packed(row.batch("right"))), {"num_segments": 3}
    else:
        inputs, extra = flax_inputs(row.batch(layout)), {}

    if path == "one-hot (GPU)":
        backend("gpu")
    else:
        backend("cpu")
        gathered(True)
    ((_, logits), grads), scatter_adds = _loss_and_grads(model, inputs, extra)
    backend("cpu")
    gathered(False)
    ((_, expected_logits), expected_grads), expected_scatter_adds = _loss_and_grads(model, inputs, extra)

    # No table's gradient is a scatter-add any more (a table of one row never was: it broadcasts).
    assert (scatter_adds, expected_scatter_adds > 0) == (0, True), (name, scatter_adds, expected_scatter_adds)

    # The same rows are read; XLA may fuse their sum differently around the custom gradient (1 ulp).
    np.testing.assert_allclose(logits, expected_logits, atol=1e-6, rtol=1e-6, err_msg=f"{name}: logits")
    for (key, a), (_, b) in zip(jax.tree_util.tree_leaves_with_path(grads),
                                jax.tree_util.tree_leaves_with_path(expected_grads)):
        np.testing.assert_allclose(a, b, atol=1e-6 + 1e-6 * float(np.abs(b).max()), rtol=1e-5,
                                   err_msg=f"{name}: gradient of {jax.tree_util.keystr(key)}")
