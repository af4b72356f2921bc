"""Embedding lookups (`layers.lookup`) whose gradient is not XLA's scatter-add into a table of zeros:
on GPUs and TPUs small tables take it as a one-hot matmul (GPU atomics serialise where many tokens
read one row), on GPUs large tables (a vocabulary) sum it per id after sorting the ids, both equal to
the scatter-add's to float32 rounding; on CPUs large tables gather it from per-id sums, the
scatter-add's bits. The forward is `jnp.take` either way. Tested for every family's tables, padded
and packed. The tests make `lookup` take each path on this CPU (`taking`: the backend it believes it
runs on, `layers._backend`, and the row limits) and trace every path into ONE jitted function, so
that each case compiles once (the forward passes, identical, are computed once) and compares the
paths with the scatter-add in the same program."""

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

REFERENCE = "scatter-add"
PATHS = {
    # path -> (the backend `lookup` believes it runs on, {row limit: value}): every table of these
    # tests (all of at most ONE_HOT_GRADIENT_ROWS rows) then takes that path.
    REFERENCE: ("cpu", {"GATHERED_GRADIENT_ROWS": 2**62}),
    "one-hot (GPU)": ("gpu", {}),
    "sorted (GPU)": ("gpu", {"ONE_HOT_GRADIENT_ROWS": 0, "SORTED_GRADIENT_ROWS": 0}),
    "gathered (CPU)": ("cpu", {"GATHERED_GRADIENT_ROWS": 0}),
}
CUSTOM_GRADIENT = {REFERENCE: None, "one-hot (GPU)": "_lookup_one_hot_gradient",
                   "sorted (GPU)": "_lookup_sorted_gradient", "gathered (CPU)": "_lookup_gathered_gradient"}


def taking(path: str, paths: dict = PATHS):
    """`lookup` traced inside takes `path` (of `paths`), as it would on that backend."""
    backend, limits = paths[path]
    return layers.gradient_paths(backend=backend, **limits)


@pytest.fixture
def backend(monkeypatch):
    """`backend("gpu")` makes `layers.lookup` choose as it would on a GPU."""
    return lambda name: monkeypatch.setattr(layers, "_backend", lambda: name)


def _custom_gradient(table, ids) -> str | None:
    """Which custom gradient `lookup` takes ("_lookup_one_hot_gradient", ...), None for jnp.take's
    (a fresh function each call: jax caches traces by function)."""
    for eqn in jax.make_jaxpr(lambda t, i: layers.lookup(t, i))(table, ids).eqns:
        if eqn.primitive.name.startswith("custom_vjp"):
            return eqn.params["call_jaxpr"].jaxpr.debug_info.func_name
    return None


def _every_path(fn, paths: dict = PATHS):
    """A function of fn's arguments returning {path: fn(...) traced taking that path}."""
    def every_path(*args):
        results = {}
        for path in paths:
            with taking(path, paths):
                results[path] = fn(*args)
        return results
    return every_path


IDS_KINDS = ["one row for every token", "positions of every row", "random, out of range too"]


@pytest.mark.parametrize("ids_kind", IDS_KINDS)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_every_gradient_equals_the_scatter_add(ids_kind, dtype):
    rng = np.random.default_rng(1)
    rows, batch, seq = 40, 6, 9
    ids = jnp.asarray({
        "one row for every token": np.zeros((batch, seq)),
        "positions of every row": np.broadcast_to(np.arange(seq), (batch, seq)),
        "random, out of range too": rng.integers(-rows - 4, rows + 4, (batch, seq)),
    }[ids_kind], jnp.int32)
    table = jnp.asarray(rng.normal(size=(rows, 5)), dtype)
    cotangent = jnp.asarray(rng.normal(size=(batch, seq, 5)), jnp.float32)  # out of range too: dropped
    for path in PATHS:
        with taking(path):
            assert _custom_gradient(table, ids) == CUSTOM_GRADIENT[path], path

    def forward_loss_and_gradient(table):
        loss = lambda t: jnp.sum(layers.lookup(t, ids).astype(jnp.float32) * cotangent)
        return layers.lookup(table, ids), *jax.value_and_grad(loss)(table)

    results = jax.jit(_every_path(forward_loss_and_gradient))(table)
    expected_forward, expected_loss, expected = results.pop(REFERENCE)
    np.testing.assert_array_equal(np.asarray(expected_forward, np.float32),
                                  np.asarray(jnp.take(table, ids, axis=0), np.float32))
    for path, (forward, loss, got) in results.items():
        np.testing.assert_array_equal(np.asarray(forward, np.float32), np.asarray(expected_forward, np.float32))
        np.testing.assert_array_equal(loss, expected_loss)
        assert got.dtype == table.dtype, path
        if path == "gathered (CPU)":  # the scatter-add's sums in its order
            np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(expected, np.float32), err_msg=path)
            continue
        # bf16: the scatter-add rounds every partial sum to bf16, these paths only their float32 total
        tolerance = dict(atol=1e-5, rtol=1e-5) if dtype == jnp.float32 else dict(atol=0.1, rtol=0.05)
        np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(expected, np.float32), **tolerance,
                                   err_msg=path)


def test_which_tables_take_which_gradient(backend):
    vocabulary = jnp.zeros((layers.GATHERED_GRADIENT_ROWS + 1, 2))
    largest_one_hot = jnp.zeros((layers.ONE_HOT_GRADIENT_ROWS, 2))
    smallest_sorted = jnp.zeros((layers.SORTED_GRADIENT_ROWS + 1, 2))
    ids = jnp.zeros((3,), jnp.int32)
    taken = lambda *tables: tuple(_custom_gradient(table, ids) for table in tables)
    backend("cpu")
    assert taken(vocabulary, vocabulary[:-1], largest_one_hot) == ("_lookup_gathered_gradient", None, None)
    backend("gpu")
    assert taken(vocabulary, smallest_sorted, largest_one_hot) == (
        "_lookup_sorted_gradient", "_lookup_sorted_gradient", "_lookup_one_hot_gradient")
    backend("tpu")
    assert taken(vocabulary, largest_one_hot) == (None, "_lookup_one_hot_gradient")


def test_gradient_paths_chooses_inside_its_block_restores_after_and_names_an_unknown_limit():
    table, ids = jnp.zeros((layers.SORTED_GRADIENT_ROWS + 1, 2)), jnp.zeros((3,), jnp.int32)
    before = _custom_gradient(table, ids)
    with pytest.raises(RuntimeError), layers.gradient_paths(backend="gpu", SORTED_GRADIENT_ROWS=2**62):
        assert _custom_gradient(table, ids) is None  # the vocabulary's scatter-add on a GPU
        raise RuntimeError  # the block fails: the settings are restored all the same
    assert _custom_gradient(table, ids) == before and layers.SORTED_GRADIENT_ROWS == 2048
    with pytest.raises(ValueError, match="not SORTED_ROWS"):
        layers.gradient_paths(SORTED_ROWS=1).__enter__()


def _table_scatter_adds(jaxpr, table_shapes: set[str]) -> int:
    """How many scatter-adds of a jaxpr write an array of one of these shapes ("[rows,features]")."""
    return sum(1 for line in str(jaxpr).splitlines()
               if "= scatter-add[" in line and line.split("=")[0].strip().split("f32")[-1] in table_shapes)


# Every family in training mode (dropout on), on its padding side; BERT packed too (positions
# restart at every segment). As on a GPU with the row limits scaled to the tiny tables: the largest
# (the vocabulary) sorted, the others one-hot; and as on a CPU with every table gathered.
LAYOUTS = [(name, row.sample_padding) for name, row in FAMILIES.items()] + [("bert", "packed")]


@pytest.mark.slow
@pytest.mark.matrix()  # a third of the families a run (tests/conftest.py, MATRIX_PARTS); the rule: test_which_tables_take_which_gradient
@pytest.mark.parametrize(("name", "layout"), LAYOUTS, ids=[f"{name}-{layout}" for name, layout in LAYOUTS])
def test_every_family_trains_the_same_with_each_gradient(hf_checkpoint, name, layout):
    row = FAMILIES[name]
    checkpoint = hf_checkpoint(row.base, family=row.name, **{row.layers_key: 1})
    model = flaxheads.from_pretrained(checkpoint.path, head=row.head, num_labels=3, seed=1, **dict(row.load_options))
    model.train()
    tables = [module for _, module in nnx.iter_graph(model) if isinstance(module, layers.Embed)]
    assert tables, f"{name}: no embedding table"
    assert all(module.num_embeddings <= layers.ONE_HOT_GRADIENT_ROWS for module in tables)
    table_shapes = {"[{}]".format(",".join(map(str, m.embedding.shape))) for m in tables}
    below_largest = max(module.num_embeddings for module in tables) - 1
    paths = {REFERENCE: PATHS[REFERENCE], "gathered (CPU)": PATHS["gathered (CPU)"],
             "GPU": ("gpu", {"ONE_HOT_GRADIENT_ROWS": below_largest, "SORTED_GRADIENT_ROWS": below_largest})}
    if layout == "packed":
        inputs, extra = flax_inputs(_packed(row.batch("right"))), {"num_segments": 3}
    else:
        inputs, extra = flax_inputs(row.batch(layout)), {}
    graphdef, params = nnx.split(model)

    def loss(params):
        logits = nnx.merge(graphdef, params)(**inputs, **extra, rngs=nnx.Rngs(dropout=3))
        return jnp.sum(jnp.sin(3.0 * logits)), logits

    step = jax.value_and_grad(loss, has_aux=True)
    with taking(REFERENCE):
        expected_scatter_adds = _table_scatter_adds(jax.make_jaxpr(step)(params), table_shapes)
    traced = jax.jit(_every_path(step, paths)).trace(params)
    # No table's gradient is a scatter-add on the other paths (a table of one row never was: it broadcasts).
    assert expected_scatter_adds > 0, name
    assert _table_scatter_adds(traced.jaxpr, table_shapes) == expected_scatter_adds, name
    with taking("GPU", paths):  # the forward's jaxpr names the custom gradients
        forward = str(jax.make_jaxpr(loss)(params))
    assert "name=_lookup_sorted_gradient" in forward, name
    results = traced.lower().compile()(params)

    ((_, expected_logits), expected_grads) = results.pop(REFERENCE)
    for path, ((_, logits), grads) in results.items():
        # The same rows are read; XLA may fuse their sum differently around the custom gradient (1 ulp).
        np.testing.assert_allclose(logits, expected_logits, atol=1e-6, rtol=1e-6, err_msg=f"{name}, {path}: logits")
        for (key, a), (_, b) in zip(jax.tree_util.tree_leaves_with_path(grads),
                                    jax.tree_util.tree_leaves_with_path(expected_grads)):
            np.testing.assert_allclose(a, b, atol=1e-6 + 1e-6 * float(np.abs(b).max()), rtol=1e-5,
                                       err_msg=f"{name}, {path}: gradient of {jax.tree_util.keystr(key)}")
