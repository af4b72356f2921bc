"""Fused attention kernels (`backbones/attention.py` chooses, `backbones/fused_attention.py` runs):
which kernel each backend and dtype gets, the setting that forces XLA's, and each fused kernel
against XLA's path on this CPU, the Pallas kernels in interpret mode, forward and gradients, to
float32 tolerance: right and left padding, packed rows, causal, sliding windows (one- and
two-sided), grouped-query heads. cuDNN itself needs a GPU (docs/benchmarks.md, "Fused
attention"); its adapter's choice between key lengths and XLA runs here with XLA in its place.

Tiny shapes: 2 rows of 20 tokens, 4 query heads of 8 (2 key/value heads where grouped). Splash
pads rows to its 128-token tile; the Pallas GPU kernel tiles by 16.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from flaxheads.backbones import attention, fused_attention, segments
from flaxheads.backbones.albert import Albert, AlbertConfig
from flaxheads.backbones.decoder import Decoder
from flaxheads.backbones.decoder_config import DecoderConfig
from flaxheads.backbones.encoder import Encoder, EncoderConfig

BATCH, SEQ, HEADS, HEAD_DIM = 2, 20, 4, 8
TOLERANCE = dict(atol=2e-5, rtol=2e-5)
"""float32 kernels against XLA's: the same sums in another order (measured ~1e-6)."""

LENGTHS = np.array([13, SEQ])
RIGHT_PADDED = np.arange(SEQ)[None, :] < LENGTHS[:, None]
LEFT_PADDED = RIGHT_PADDED[:, ::-1]
PACKED = np.array([[1] * 6 + [2] * 9 + [0] * 5, [1] * 4 + [2] * 4 + [3] * 12])
"""Segment ids of two packed rows (0: the padding after the examples)."""


@pytest.fixture
def backend(monkeypatch):
    """`backend("tpu")` makes `attend` choose as it would on a TPU (the kernels then interpret)."""
    return lambda name: monkeypatch.setattr(attention, "_backend", lambda: name)


@pytest.fixture
def splash_calls(monkeypatch):
    """The list of calls `attend` makes to the splash kernel from now on."""
    calls = []

    def counted(*args, **kwargs):
        calls.append(kwargs)
        return run(*args, **kwargs)

    run = fused_attention.splash
    monkeypatch.setattr(fused_attention, "splash", counted)
    return calls


def _qkv(kv_heads: int = HEADS, dtype=jnp.float32, seed: int = 0):
    keys = jax.random.split(jax.random.key(seed), 3)
    query = jax.random.normal(keys[0], (BATCH, SEQ, HEADS, HEAD_DIM), dtype)
    key, value = (jax.random.normal(k, (BATCH, SEQ, kv_heads, HEAD_DIM), dtype) for k in keys[1:])
    return query, key, value


def _sees_a_key(mask_BS, segment_ids_BT, is_causal: bool, window: int | None) -> np.ndarray:
    """(batch, T) bool: the query sees at least one key. Elsewhere kernels differ by design
    (attend's docstring); those positions are padding."""
    if segment_ids_BT is not None:
        allowed = np.asarray(segments.attention_mask(jnp.asarray(segment_ids_BT)))[:, 0]
    elif mask_BS is not None:
        allowed = np.broadcast_to(np.asarray(mask_BS, bool)[:, None, :], (BATCH, SEQ, SEQ))
    else:
        allowed = np.ones((BATCH, SEQ, SEQ), bool)
    t, s = np.arange(SEQ)[:, None], np.arange(SEQ)[None, :]
    if is_causal:
        allowed = allowed & (s <= t)
    if window is not None:
        allowed = allowed & (np.abs(t - s) <= window)
    return allowed.any(axis=-1)


def _value_and_grads(fn, query, key, value, weights_BT):
    """fn's output and the gradients of sum(output * random cotangent) over the weighted queries."""
    cotangent = jax.random.normal(jax.random.key(7), query.shape, query.dtype) * weights_BT[:, :, None, None]

    def loss(q, k, v):
        out = fn(q, k, v)
        return jnp.sum(out * cotangent), out

    (_, out), grads = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(query, key, value)
    return out, grads


def _assert_matches_xla(fused, inputs, *, mask_BS, segment_ids_BT, is_causal, window):
    sees_BT = _sees_a_key(mask_BS, segment_ids_BT, is_causal, window)
    weights_BT = jnp.asarray(sees_BT, jnp.float32)
    with attention.implementation("xla"):
        expected, expected_grads = _value_and_grads(
            lambda q, k, v: attention.attend(q, k, v, mask_BS, segment_ids_BT=segment_ids_BT, is_causal=is_causal,
                                             local_window_size=window), *inputs, weights_BT)
    got, grads = _value_and_grads(fused, *inputs, weights_BT)
    assert np.isfinite(np.asarray(got)).all()
    difference = float(np.abs(np.asarray(got - expected))[sees_BT].max())
    print(f"max |fused - xla| {difference:.2e}")
    np.testing.assert_allclose(np.asarray(got)[sees_BT], np.asarray(expected)[sees_BT], **TOLERANCE)
    for name, g, e in zip("qkv", grads, expected_grads):
        np.testing.assert_allclose(np.asarray(g), np.asarray(e), **TOLERANCE, err_msg=f"d{name}")


# ---------------------------------------------------------------------------------------------
# Which kernel


@pytest.mark.parametrize("backend_name, dtype, inputs, expected", [
    ("cpu", jnp.bfloat16, {}, attention.XLA),
    ("cpu", jnp.float32, {"segment_ids_BT": PACKED}, attention.XLA),
    ("gpu", jnp.float32, {}, attention.XLA),
    ("gpu", jnp.bfloat16, {}, attention.CUDNN),
    ("gpu", jnp.float16, {"mask_BS": RIGHT_PADDED}, attention.CUDNN),
    ("gpu", jnp.bfloat16, {"mask_BS": RIGHT_PADDED, "is_causal": True, "local_window_size": 3}, attention.CUDNN),
    ("gpu", jnp.bfloat16, {"mask_BS": RIGHT_PADDED, "local_window_size": 3}, attention.XLA),
    ("gpu", jnp.bfloat16, {"segment_ids_BT": PACKED, "is_causal": True}, attention.PALLAS_GPU),
    ("gpu", jnp.bfloat16, {"segment_ids_BT": PACKED, "is_causal": True, "local_window_size": 3}, attention.XLA),
    ("gpu", jnp.bfloat16, {"mask_BS": PACKED[:, None, :, None] == PACKED[:, None, None, :]}, attention.XLA),
    ("gpu", jnp.bfloat16, {"has_bias": True}, attention.XLA),
    ("gpu", jnp.bfloat16, {"dropout_active": True}, attention.XLA),
    ("gpu", jnp.bfloat16, {"query_rows": True}, attention.XLA),
    # The tokenizer's side, known while tracing: left padding goes to XLA without cuDNN's run-time check.
    ("gpu", jnp.bfloat16, {"mask_BS": LEFT_PADDED, "is_causal": True, "padding_side": "left"}, attention.XLA),
    ("gpu", jnp.bfloat16, {"mask_BS": RIGHT_PADDED, "is_causal": True, "padding_side": "right"}, attention.CUDNN),
    ("gpu", jnp.bfloat16, {"is_causal": True, "padding_side": "left"}, attention.CUDNN),
    ("tpu", jnp.bfloat16, {"mask_BS": LEFT_PADDED, "padding_side": "left"}, attention.SPLASH),
    ("tpu", jnp.float32, {}, attention.SPLASH),
    ("tpu", jnp.bfloat16, {"mask_BS": LEFT_PADDED, "is_causal": True}, attention.SPLASH),
    ("tpu", jnp.float32, {"segment_ids_BT": PACKED, "local_window_size": 3}, attention.SPLASH),
    ("tpu", jnp.float32, {"has_bias": True}, attention.XLA),
    ("tpu", jnp.float32, {"dropout_active": True}, attention.XLA),
])
def test_kernel_is_chosen_by_backend_dtype_and_inputs(backend_name, dtype, inputs, expected):
    query, key, _ = _qkv(dtype=dtype)

    assert attention.kernel(query, key, backend=backend_name, **inputs) == expected


def test_default_backend_on_this_cpu_is_xla():
    query, key, _ = _qkv(dtype=jnp.bfloat16)

    assert attention.kernel(query, key, RIGHT_PADDED) == attention.XLA


def test_setting_xla_forces_xla_on_every_backend(monkeypatch):
    query, key, _ = _qkv(dtype=jnp.bfloat16)
    monkeypatch.setenv(attention.ENVIRONMENT_VARIABLE, "xla")
    assert attention.kernel(query, key, backend="gpu") == attention.XLA

    monkeypatch.setenv(attention.ENVIRONMENT_VARIABLE, "auto")
    with attention.implementation("xla"):
        assert attention.kernel(query, key, backend="tpu") == attention.XLA
    assert attention.kernel(query, key, backend="tpu") == attention.SPLASH

    attention.set_implementation("xla")
    try:
        assert attention.configured_implementation() == "xla"
    finally:
        attention.set_implementation(None)
    assert attention.configured_implementation() == "auto"


def test_unknown_setting_is_refused_naming_the_choices(monkeypatch):
    with pytest.raises(ValueError, match="'auto', 'xla'"):
        attention.set_implementation("flash")
    monkeypatch.setenv(attention.ENVIRONMENT_VARIABLE, "cudnn")
    with pytest.raises(ValueError, match="FLAXHEADS_ATTENTION"):
        attention.configured_implementation()


# ---------------------------------------------------------------------------------------------
# Splash attention (TPU) in interpret mode against XLA's path

SPLASH_CASES = {
    "right-padded": dict(mask_BS=RIGHT_PADDED, segment_ids_BT=None, is_causal=False, window=None, kv_heads=HEADS),
    "left-padded causal": dict(mask_BS=LEFT_PADDED, segment_ids_BT=None, is_causal=True, window=None, kv_heads=HEADS),
    "packed": dict(mask_BS=None, segment_ids_BT=PACKED, is_causal=False, window=None, kv_heads=HEADS),
    "packed causal grouped": dict(mask_BS=None, segment_ids_BT=PACKED, is_causal=True, window=None, kv_heads=2),
    "sliding window causal grouped": dict(mask_BS=RIGHT_PADDED, segment_ids_BT=None, is_causal=True, window=3,
                                          kv_heads=2),
    "two-sided window padded": dict(mask_BS=RIGHT_PADDED, segment_ids_BT=None, is_causal=False, window=3,
                                    kv_heads=HEADS),
    "two-sided window packed": dict(mask_BS=None, segment_ids_BT=PACKED, is_causal=False, window=3, kv_heads=HEADS),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(SPLASH_CASES))
def test_splash_attention_equals_xla_forward_and_gradients(backend, case):
    options = dict(SPLASH_CASES[case])
    inputs = _qkv(options.pop("kv_heads"))
    backend("tpu")
    mask_BS, segment_ids_BT = options["mask_BS"], options["segment_ids_BT"]
    assert attention.kernel(inputs[0], inputs[1], mask_BS, segment_ids_BT=segment_ids_BT) == attention.SPLASH

    _assert_matches_xla(
        lambda q, k, v: attention.attend(q, k, v, mask_BS, segment_ids_BT=segment_ids_BT,
                                         is_causal=options["is_causal"], local_window_size=options["window"]),
        inputs, **options)


def test_splash_attention_without_a_mask_equals_xla(backend):
    inputs = _qkv()
    backend("tpu")

    _assert_matches_xla(lambda q, k, v: attention.attend(q, k, v, None, is_causal=True), inputs,
                        mask_BS=None, segment_ids_BT=None, is_causal=True, window=None)


# ---------------------------------------------------------------------------------------------
# The Pallas GPU kernel (packed rows) in interpret mode, float32, against XLA's path


@pytest.mark.parametrize("is_causal, kv_heads", [(False, HEADS), (True, 2)], ids=["packed", "packed causal grouped"])
def test_pallas_gpu_attention_over_packed_rows_equals_xla(is_causal, kv_heads):
    inputs = _qkv(kv_heads)

    _assert_matches_xla(
        lambda q, k, v: fused_attention.pallas_gpu(q, k, v, jnp.asarray(PACKED), is_causal=is_causal,
                                                   scale=HEAD_DIM ** -0.5, interpret=True),
        inputs, mask_BS=None, segment_ids_BT=PACKED, is_causal=is_causal, window=None)


# ---------------------------------------------------------------------------------------------
# The cuDNN adapter's choice (key lengths for right padding, else XLA), with XLA in cuDNN's place


@pytest.mark.parametrize("mask_name, is_causal, window", [
    ("right", False, None), ("left", False, None), ("right", True, 3), ("left", True, None),
])
def test_cudnn_adapter_equals_xla_for_either_padding_side(mask_name, is_causal, window):
    mask_BS = {"right": RIGHT_PADDED, "left": LEFT_PADDED}[mask_name]
    inputs = _qkv(kv_heads=2)

    _assert_matches_xla(
        lambda q, k, v: fused_attention.cudnn(q, k, v, jnp.asarray(mask_BS), is_causal=is_causal, scale=None,
                                              local_window_size=window, implementation="xla"),
        inputs, mask_BS=mask_BS, segment_ids_BT=None, is_causal=is_causal, window=window)


# ---------------------------------------------------------------------------------------------
# Backbones hand their padding and segment ids to the fused kernel


def _tiny_decoder(model_type: str, **extra) -> Decoder:
    cfg = DecoderConfig.from_hf_config(dict(
        model_type=model_type, vocab_size=99, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=37, num_hidden_layers=2, max_position_embeddings=64, **extra))
    model = Decoder(cfg, rngs=nnx.Rngs(0))
    model.eval()
    return model


@pytest.mark.slow
@pytest.mark.parametrize("inputs", ["left-padded", "packed"])
def test_mistral_sliding_window_layers_on_splash_equal_the_eager_path(backend, splash_calls, inputs):
    model = _tiny_decoder("mistral", sliding_window=4)
    ids = jnp.asarray(np.random.default_rng(0).integers(3, 99, (BATCH, SEQ)))
    kwargs = {"attention_mask": jnp.asarray(LEFT_PADDED, jnp.int32)} if inputs == "left-padded" else {
        "segment_ids": jnp.asarray(PACKED)}
    expected = model(ids, **kwargs).last_hidden_state
    backend("tpu")

    got = model(ids, **kwargs).last_hidden_state

    assert [call["local_window_size"] for call in splash_calls] == [3, 3]  # keys < 4 positions back
    real_BT = LEFT_PADDED if inputs == "left-padded" else np.ones((BATCH, SEQ), bool)
    np.testing.assert_allclose(np.asarray(got)[real_BT], np.asarray(expected)[real_BT], atol=1e-4, rtol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["bert", "albert"])
def test_packed_encoder_on_splash_equals_xla(backend, splash_calls, family):
    common = dict(vocab_size=99, hidden_size=32, num_attention_heads=4, intermediate_size=37, num_hidden_layers=2,
                  max_position_embeddings=64)
    if family == "albert":  # one shared layer applied twice: two kernel calls
        model = Albert(AlbertConfig(**common, embedding_size=16), rngs=nnx.Rngs(0))
    else:
        model = Encoder(EncoderConfig(**common), add_pooling_layer=False, rngs=nnx.Rngs(0))
    model.eval()
    ids = jnp.asarray(np.random.default_rng(0).integers(3, 99, (BATCH, SEQ)))
    expected = model(ids, segment_ids=jnp.asarray(PACKED)).last_hidden_state
    backend("tpu")

    got = model(ids, segment_ids=jnp.asarray(PACKED)).last_hidden_state

    assert len(splash_calls) == 2
    np.testing.assert_allclose(np.asarray(got), np.asarray(expected), atol=1e-4, rtol=1e-4)


# ---------------------------------------------------------------------------------------------
# The device check (`benchmarks.fused_check`), run here as on a GPU with XLA in cuDNN's place


@pytest.fixture
def as_on_a_gpu(backend, monkeypatch):
    """`attend` chooses as on a GPU; cuDNN's adapter runs XLA's kernel, Pallas interprets."""
    backend("gpu")
    monkeypatch.setattr(fused_attention, "cudnn", functools.partial(fused_attention.cudnn, implementation="xla"))


@pytest.mark.slow
def test_the_device_check_passes_the_kernels_and_names_them(as_on_a_gpu):
    from flaxheads.benchmarks import fused_check

    rows = fused_check.run_all(batch=2, seq=32, heads=4, head_dim=8, repeats=1)

    assert [row["case"] for row in rows] == [case.name for case in fused_check.CASES]
    assert all(row["passes"] for row in rows), [row for row in rows if not row["passes"]]
    chosen = {row["case"]: row["chosen"] for row in rows}
    assert chosen["encoder, packed rows"] == chosen["decoder GQA, packed rows"] == attention.PALLAS_GPU
    assert {chosen[name] for name in chosen if "packed" not in name} == {attention.CUDNN}


@pytest.mark.slow
def test_the_device_check_fails_a_kernel_that_is_off(as_on_a_gpu, monkeypatch):
    from flaxheads.benchmarks import fused_check

    kernel = fused_attention.pallas_gpu
    monkeypatch.setattr(fused_attention, "pallas_gpu", lambda *args, **kwargs: kernel(*args, **kwargs) * 1.05)
    rows = fused_check.run_all(batch=2, seq=32, heads=4, head_dim=8, repeats=1)

    assert {row["case"] for row in rows if not row["passes"]} == {"encoder, packed rows", "decoder GQA, packed rows"}
