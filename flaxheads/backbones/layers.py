"""Building blocks shared by every backbone: dense/LayerNorm factories, activations, attention.

Train/eval mode the NNX way: every module that applies dropout carries a ``deterministic``
attribute, which ``model.train()`` sets to False and ``model.eval()`` to True (``nnx.Module``
does this for every submodule that has the attribute). A freshly constructed model is in train
mode, as in NNX; ``from_pretrained`` returns one in eval mode. In train mode the dropout bits
come from the ``rngs`` the caller passes (an ``nnx.Rngs`` with a ``dropout`` stream), so the call
stays pure; forgetting them is a ValueError, never silently deterministic training.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
from flax import nnx

# Hugging Face `hidden_act` names -> functions with the same numerics as transformers.activations.
ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),
    "gelu_python": lambda x: jax.nn.gelu(x, approximate=False),
    "gelu_new": lambda x: jax.nn.gelu(x, approximate=True),
    "gelu_pytorch_tanh": lambda x: jax.nn.gelu(x, approximate=True),
    "gelu_fast": lambda x: jax.nn.gelu(x, approximate=True),
    "quick_gelu": lambda x: x * jax.nn.sigmoid(1.702 * x),
    "relu": jax.nn.relu,
    "silu": jax.nn.silu,
    "swish": jax.nn.silu,
    "tanh": jnp.tanh,
    "linear": lambda x: x,
}


def activation(name: str) -> Callable[[jax.Array], jax.Array]:
    """The activation Hugging Face calls `name`; ValueError listing the supported ones otherwise."""
    try:
        return ACTIVATIONS[name]
    except KeyError:
        raise ValueError(
            f"unsupported activation {name!r}; flaxheads supports {sorted(ACTIVATIONS)}"
        ) from None


def dense(
    in_features: int,
    out_features: int,
    *,
    init_std: float,
    dtype,
    param_dtype,
    rngs: nnx.Rngs,
    use_bias: bool = True,
) -> nnx.Linear:
    """A Linear layer initialised like Hugging Face's: kernel ~ normal(init_std), bias zeros."""
    return nnx.Linear(
        in_features,
        out_features,
        use_bias=use_bias,
        dtype=dtype,
        param_dtype=param_dtype,
        kernel_init=nnx.initializers.normal(init_std),
        bias_init=nnx.initializers.zeros,
        rngs=rngs,
    )


def layer_norm(
    features: int, *, eps: float, dtype, param_dtype, rngs: nnx.Rngs, use_bias: bool = True
) -> nnx.LayerNorm:
    """LayerNorm with torch's numerics: variance as mean((x - mean)^2), not E[x^2] - E[x]^2."""
    return nnx.LayerNorm(
        features,
        epsilon=eps,
        use_bias=use_bias,
        dtype=dtype,
        param_dtype=param_dtype,
        use_fast_variance=False,
        rngs=rngs,
    )


def embed(num_embeddings: int, features: int, *, init_std: float, dtype, param_dtype, rngs) -> nnx.Embed:
    return nnx.Embed(
        num_embeddings,
        features,
        dtype=dtype,
        param_dtype=param_dtype,
        embedding_init=nnx.initializers.normal(init_std),
        rngs=rngs,
    )


DROPOUT_BITS = 16
"""Random bits per element behind a dropout decision: the rate is applied in steps of 2**-16
(0.1 becomes 6554/65536 = 0.100006), and the kept values are scaled by the exact inverse of the
keep probability, so the expectation is unchanged."""


def dropout_active(rate: float, *, deterministic: bool, rngs: nnx.Rngs | None) -> bool:
    """Whether dropout at `rate` applies: in train mode (`deterministic` False) at a non-zero rate.

    Raises ValueError in train mode at a non-zero rate without `rngs`: the model would otherwise
    have to choose between training without dropout and inventing a key.
    """
    if deterministic or rate == 0.0:
        return False
    if rngs is None:
        raise ValueError(
            f"the model is in train mode (dropout rate {rate}) but no rngs were passed: pass "
            "rngs=nnx.Rngs(dropout=key), or call model.eval() for inference"
        )
    return True


def dropout(x: jax.Array, rate: float, rngs: nnx.Rngs | None, *, deterministic: bool = False) -> jax.Array:
    """Inverted dropout in train mode (`deterministic` False); `x` itself in eval mode or at rate 0.
    ValueError in train mode at a non-zero rate without `rngs` (see `dropout_active`)."""
    if not dropout_active(rate, deterministic=deterministic, rngs=rngs):
        return x
    keep, keep_prob = keep_mask(rngs.dropout(), rate, x.shape)
    return jnp.where(keep, x * jnp.asarray(1.0 / keep_prob, x.dtype), jnp.zeros_like(x))


def keep_mask(key: jax.Array, rate: float, shape: tuple[int, ...]) -> tuple[jax.Array, float]:
    """(mask of kept elements, keep probability) with 16 random bits per element.

    Each 32-bit random word decides two elements (its low and high halves), which halves the
    random-number work of `jax.random.bernoulli` (one word per element). The halves sit side by
    side on the last axis, so the bits of an element depend on its index alone and a sharded
    batch draws the same mask as an unsharded one.
    """
    if not 0.0 <= rate < 1.0:
        raise ValueError(f"dropout rate {rate}: it must be in [0, 1)")
    levels = 1 << DROPOUT_BITS
    threshold = round(rate * levels)
    if not shape or shape[-1] < 2:
        bits = random_bits(key, shape) >> (32 - DROPOUT_BITS)
    else:
        last, half = shape[-1], (shape[-1] + 1) // 2
        words = random_bits(key, (*shape[:-1], half))
        # (..., 2, half) by broadcasting, then a free reshape: XLA fuses this into the consumer,
        # where a concatenate of the two halves was a separate pass over memory.
        shifts = jnp.array([[0], [DROPOUT_BITS]], jnp.uint32)
        pairs = (words[..., None, :] >> shifts) & jnp.uint32(levels - 1)
        bits = pairs.reshape(*shape[:-1], 2 * half)[..., :last]
    return bits >= threshold, (levels - threshold) / levels


_THREEFRY_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))


def random_bits(key: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """`jax.random.bits(key, shape, jnp.uint32)`, bit for bit, for threefry keys.

    The same Threefry-2x32 over the same counters (the element's flat index), written as plain
    uint32 arithmetic that XLA fuses into one loop. jax lowers its threefry on CPU as a rolled
    `while` loop that keeps four arrays in memory between rounds: on CPU this form runs 3x faster
    and compiles 10x faster (measured on 16x12x128x64 words: 2.1 vs 6.6 ms, 0.07 vs 0.8 s).
    Other key implementations (rbg) go to `jax.random.bits`.
    """
    if jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
        if str(jax.random.key_impl(key)) != "threefry2x32":
            return jax.random.bits(key, shape, jnp.uint32)
        key = jax.random.key_data(key)
    if math.prod(shape) >= 2**32:  # jax's counters then need a high word too
        return jax.random.bits(jax.random.wrap_key_data(key), shape, jnp.uint32)
    strides = [math.prod(shape[d + 1:]) for d in range(len(shape))]
    counter = jnp.zeros(shape, jnp.uint32)
    for d, stride in enumerate(strides):
        counter = counter + jax.lax.broadcasted_iota(jnp.uint32, shape, d) * jnp.uint32(stride)
    high, low = _threefry2x32(key[0], key[1], jnp.zeros_like(counter), counter)
    return high ^ low


def _threefry2x32(k0: jax.Array, k1: jax.Array, x0: jax.Array, x1: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Threefry-2x32 with 20 rounds (Salmon et al. 2011), as jax.random implements it."""
    keys = (k0, k1, k0 ^ k1 ^ jnp.uint32(0x1BD11BDA))
    x0, x1 = x0 + k0, x1 + k1
    for i in range(5):
        for r in _THREEFRY_ROTATIONS[i % 2]:
            x0 = x0 + x1
            x1 = ((x1 << jnp.uint32(r)) | (x1 >> jnp.uint32(32 - r))) ^ x0
        x0 = x0 + keys[(i + 1) % 3]
        x1 = x1 + keys[(i + 2) % 3] + jnp.uint32(i + 1)
    return x0, x1


def _fused_implementation(query: jax.Array) -> str | None:
    """cuDNN's fused attention on GPUs for the half-precision dtypes it supports; XLA elsewhere
    (`None` lets jax choose, which today means XLA's own fusion)."""
    if jax.default_backend() == "gpu" and query.dtype in (jnp.bfloat16, jnp.float16):
        return "cudnn"
    return None


def attend(
    query_BTNH: jax.Array,
    key_BSNH: jax.Array,
    value_BSNH: jax.Array,
    mask_BS: jax.Array | None,
    *,
    bias_BNTS: jax.Array | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    local_window_size: int | None = None,
    dropout_rate: float = 0.0,
    deterministic: bool = False,
    rngs: nnx.Rngs | None = None,
) -> jax.Array:
    """Scaled dot-product attention over a (batch, key) padding mask; returns BTNH.

    `scale` multiplies the query-key logits; None means 1/sqrt(head_dim). A query whose every
    key is masked (with `is_causal`, a left-padding position) gets an average of all values from
    XLA's kernel; kernels differ there, so a backbone that needs a defined value sets it itself
    (GPT-2 zeroes those rows, as torch does). Real queries never see such rows: they are padding.

    `mask_BS` may also be (batch, 1, query, key): a mask per query and key (DeBERTa masks padded
    queries too; such a row gets the average of all values, as torch's masked softmax gives).
    `bias_BNTS`, broadcastable to (batch, heads, query, key), is added to the scaled logits before
    masking (DeBERTa's relative-position scores); XLA then runs the attention, not cuDNN.
    `local_window_size` w lets query t see only keys s with |t - s| <= w (ModernBERT's
    bidirectional sliding window), on top of the padding mask.

    Eval mode (`deterministic`) and dropout-free training go through
    `jax.nn.dot_product_attention`, which GPUs run as a fused kernel. Attention-probability
    dropout (as BERT trains with) has no fused form there, so in train mode at a non-zero rate
    the probabilities are materialised; that needs `rngs` (ValueError without, as `dropout`).
    """
    if mask_BS is None:
        mask_B11S = None
    else:
        mask_B11S = (mask_BS if mask_BS.ndim == 4 else mask_BS[:, None, None, :]).astype(bool)
    if not dropout_active(dropout_rate, deterministic=deterministic, rngs=rngs):
        return jax.nn.dot_product_attention(
            query_BTNH, key_BSNH, value_BSNH, bias=bias_BNTS, mask=mask_B11S, is_causal=is_causal, scale=scale,
            local_window_size=local_window_size,
            # cuDNN's fused kernel takes neither a bias nor a two-sided window: those go to XLA's.
            implementation=_fused_implementation(query_BTNH) if bias_BNTS is None and local_window_size is None else None,
        )
    scale = 1.0 / math.sqrt(query_BTNH.shape[-1]) if scale is None else scale
    logits_BNTS = jnp.einsum("BTNH,BSNH->BNTS", query_BTNH, key_BSNH) * scale
    if bias_BNTS is not None:
        logits_BNTS = logits_BNTS + bias_BNTS
    if is_causal:
        t, s = logits_BNTS.shape[-2:]
        causal_TS = jnp.tril(jnp.ones((t, s), bool))
        mask_B11S = causal_TS if mask_B11S is None else mask_B11S & causal_TS
    if local_window_size is not None:
        t, s = logits_BNTS.shape[-2:]
        band_TS = jnp.abs(jnp.arange(t)[:, None] - jnp.arange(s)[None, :]) <= local_window_size
        mask_B11S = band_TS if mask_B11S is None else mask_B11S & band_TS
    if mask_B11S is not None:
        logits_BNTS = jnp.where(mask_B11S, logits_BNTS, jnp.finfo(logits_BNTS.dtype).min)
    probs_BNTS = jax.nn.softmax(logits_BNTS.astype(jnp.float32), axis=-1).astype(value_BSNH.dtype)
    probs_BNTS = dropout(probs_BNTS, dropout_rate, rngs, deterministic=False)
    return jnp.einsum("BNTS,BSNH->BTNH", probs_BNTS, value_BSNH)


class Pooler(nnx.Module):
    """BERT's pooler: tanh(dense(hidden state of the first token))."""

    def __init__(self, hidden_size: int, *, init_std: float, dtype, param_dtype, rngs: nnx.Rngs):
        self.dense = dense(
            hidden_size, hidden_size, init_std=init_std, dtype=dtype, param_dtype=param_dtype, rngs=rngs
        )

    def __call__(self, hidden_BTD: jax.Array) -> jax.Array:
        return self.project(hidden_BTD[:, 0])

    def project(self, first_token_BD: jax.Array) -> jax.Array:
        """tanh(dense(x)) of first-token states already picked, (..., hidden) (packed rows: (B, S, D))."""
        return jnp.tanh(self.dense(first_token_BD))


GRADIENT_CHECKPOINTING = "gradient_checkpointing"
"""The backbone attribute `set_gradient_checkpointing` sets and `run_layer` reads."""


def set_gradient_checkpointing(backbone: nnx.Module, enabled: bool = True) -> None:
    """Rematerialise each of `backbone`'s layers in the backward pass (transformers'
    `gradient_checkpointing_enable`): activation memory of one layer instead of all of them, for
    about one more forward pass of compute. Only backbones whose layer loop calls `run_layer` obey."""
    setattr(backbone, GRADIENT_CHECKPOINTING, enabled)


def run_layer(backbone: nnx.Module, layer: nnx.Module, *args, **kwargs):
    """`layer(*args, **kwargs)`, under `nnx.remat` when `backbone` has gradient checkpointing on:
    the backward pass then recomputes the layer's activations from its inputs instead of keeping
    them. Same values and gradients either way. Every backbone's layer loop calls this."""
    if not getattr(backbone, GRADIENT_CHECKPOINTING, False):
        return layer(*args, **kwargs)
    return nnx.remat(_call)(layer, args, kwargs)


def _call(layer: nnx.Module, args: tuple, kwargs: dict):
    return layer(*args, **kwargs)


SCAN_LAYERS = "scan_layers"
"""The backbone attribute `set_scan_layers` sets and `run_layers` reads (absent: off)."""


def set_scan_layers(backbone: nnx.Module, enabled: bool = True) -> None:
    """Run `backbone`'s repeating layers as one `jax.lax.scan` instead of a Python loop (off by
    default). Same values either way (tested per family). The scan traces and compiles one layer
    instead of all of them: a 24-layer MiniLM-wide train step compiles in 15.7 s instead of 26.9 s
    on the 2-core CPU. But XLA:CPU runs the scanned step 14-23% slower (its stacked residual and
    gradient buffers are written by dynamic-update-slice copies), so on a CPU it pays only for deep
    models and short runs; see docs/benchmarks.md."""
    setattr(backbone, SCAN_LAYERS, enabled)


def run_layers(backbone: nnx.Module, stack: Sequence[nnx.Module], x: jax.Array, *args, rngs, **kwargs) -> list[jax.Array]:
    """Applies `stack`'s layers in turn, `layer(x, *args, rngs, **kwargs)`, and returns the hidden
    states: `x`, then every layer's output. Every backbone's layer loop calls this.

    With `set_scan_layers` on: parameters stay one module per layer (the names conversion tables,
    sharding rules, LoRA and checkpoints use); inside the traced call, layers that repeat with a
    period p (same structure: p = 1 for BERT, 2 for Gemma2's alternating windows) are stacked and
    run by one `jax.lax.scan` over groups of p layers, so jax traces and XLA compiles p layers
    instead of all of them. Layers before the repetition starts and after its last whole group
    run as a loop. The dropout stream is carried through the scan, so the masks equal the loop's.
    A layer object listed several times (ALBERT's shared layers) is passed once, not stacked.
    LoRA adapters differ per layer (their dropout index), so a model with them runs as a loop.
    With gradient checkpointing each scanned group is rematerialised in the backward pass (the
    scan body under `jax.checkpoint`), each layer outside the scan by `run_layer`."""
    stack = list(stack)
    hidden = [x]
    graphdefs = [nnx.graphdef(layer) for layer in stack] if getattr(backbone, SCAN_LAYERS, False) else []
    start, period = _scan_plan(graphdefs)
    end = start + (len(stack) - start) // period * period if period else 0
    for layer in stack[:start]:
        hidden.append(run_layer(backbone, layer, hidden[-1], *args, rngs, **kwargs))
    if period:
        hidden += _scan(backbone, stack[start:end], graphdefs[start:start + period], hidden[-1], args, rngs, kwargs)
    for layer in stack[end:]:
        hidden.append(run_layer(backbone, layer, hidden[-1], *args, rngs, **kwargs))
    return hidden


def _scan_plan(graphdefs: list[nnx.GraphDef]) -> tuple[int, int | None]:
    """(start, p) for the layers of structures `graphdefs`: from layer `start` on, layer i has the
    structure of layer start + (i - start) % p, over two groups of p at least; the smallest start,
    then the smallest p. (0, None) when nothing repeats (or no layers: scanning is off).
    ModernBERT's first layer has no attention norm: start 1."""
    for start in range(len(graphdefs)):
        for period in range(1, (len(graphdefs) - start) // 2 + 1):
            whole = (len(graphdefs) - start) // period * period
            if all(graphdefs[start + i] == graphdefs[start + i % period] for i in range(whole)):
                return start, period
    return 0, None


def _scan(backbone, stack, graphdefs, x, args, rngs, kwargs) -> list[jax.Array]:
    """The hidden states of `stack` (whole groups of p = len(graphdefs) layers, the structures of
    one group) run by one `jax.lax.scan`."""
    period = len(graphdefs)
    if all(layer is stack[i % period] for i, layer in enumerate(stack)):
        # One set of parameters serves every group: a constant of the scan, not stacked.
        group_states = None
        constant = [nnx.state(layer) for layer in stack[:period]]
    else:
        states = [nnx.state(layer) for layer in stack]
        groups = [states[start:start + period] for start in range(0, len(stack), period)]
        group_states = jax.tree.map(lambda *leaves: jnp.stack(leaves), *groups)
        constant = None
    rng_graphdef, rng_state = nnx.split(rngs) if rngs is not None else (None, None)

    def body(carry, group_state):
        x, rng_state = carry
        layer_rngs = None if rngs is None else nnx.merge(rng_graphdef, rng_state)
        outputs = []
        for graphdef, state in zip(graphdefs, constant if group_state is None else group_state):
            x = nnx.merge(graphdef, state)(x, *args, layer_rngs, **kwargs)
            outputs.append(x)
        return (x, None if rngs is None else nnx.state(layer_rngs)), outputs

    if getattr(backbone, GRADIENT_CHECKPOINTING, False):
        body = jax.checkpoint(body, prevent_cse=False)
    (_, rng_state), outputs = jax.lax.scan(body, (x, rng_state), group_states, length=len(stack) // period)
    if rngs is not None:
        nnx.update(rngs, rng_state)
    return [outputs[i % period][i // period] for i in range(len(stack))]
