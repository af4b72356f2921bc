"""Which parameters a run trains: the one place that decides it.

The model's parameters are split once into (trainable, frozen). The train step differentiates
the loss with respect to the trainable ones only and the optimizer is built over them alone,
so frozen parameters get no gradient buffer, no weight-gradient matmuls (XLA drops what nothing
reads) and no Adam moments at all: not zeros, nothing. The frozen ones travel beside the train
state as a plain input of the step and are never checkpointed: a run reads them again from the
model it starts from. (optax.masked + set_to_zero would keep the moments away too, but still
compute and clip a full-size gradient of every frozen weight; a split costs nothing.)

Rules: the head always trains. The backbone trains unless `freeze_backbone` (a linear probe) or
the model carries LoRA adapters, whose base weights are frozen by definition; the adapters
(`nnx.LoRAParam`) always train.
"""

from __future__ import annotations

import jax
from flax import nnx


def is_trainable(freeze_backbone: bool, has_lora: bool):
    """An NNX filter `(path, variable) -> bool` for the parameters that train."""
    backbone_trains = not (freeze_backbone or has_lora)

    def trainable(path, variable) -> bool:
        return path[0] != "backbone" or backbone_trains or isinstance(variable, nnx.LoRAParam)

    return trainable


def has_lora(params: nnx.State) -> bool:
    """Whether the parameter tree holds LoRA adapters."""
    return any(isinstance(v, nnx.LoRAParam) for _, v in nnx.to_flat_state(params))


def split_trainable(params: nnx.State, *, freeze_backbone: bool = False) -> tuple[nnx.State, nnx.State]:
    """(trainable, frozen) parts of a model's full parameter State (`nnx.split(model)[1]`);
    `nnx.merge(graphdef, trainable, frozen)` rebuilds the model. Frozen is empty for full
    fine-tuning."""
    return nnx.split_state(params, is_trainable(freeze_backbone, has_lora(params)), ...)


def merge_trainable(trainable: nnx.State, frozen: nnx.State) -> nnx.State:
    """The full parameter State again (what evaluation and export read)."""
    if not jax.tree.leaves(frozen):
        return trainable
    return nnx.merge_state(trainable, frozen)


__all__ = ["has_lora", "is_trainable", "merge_trainable", "split_trainable"]
