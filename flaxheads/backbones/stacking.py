"""Running a backbone's stack of layers: per-layer rematerialisation (gradient checkpointing)
and scan over layers. Every backbone's layer loop goes through `run_layers` (or `run_layer`), so
both switches work on every family."""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from flaxheads.backbones import dropout

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
    names = tuple(kwargs)
    carried, follow = dropout.as_nnx_rngs((*args, *kwargs.values()))
    out = nnx.remat(_call)(layer, carried[:len(args)], dict(zip(names, carried[len(args):])))
    follow()
    return out


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
    (rngs,), follow = dropout.as_nnx_rngs((rngs,))
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
    follow()
    return [outputs[i % period][i // period] for i in range(len(stack))]
