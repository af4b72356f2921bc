"""Memory of one train step as XLA plans it: full fine-tuning vs LoRA vs a frozen backbone, with
and without gradient checkpointing, float32 or bfloat16 parameters, for any backbone config,
without allocating the model.

    python -m flaxheads.benchmarks.train_memory            # a 1.3B BERT-shaped model, batch 8 x 512
    python -m flaxheads.benchmarks.train_memory --shape llama --setups 0 2 4   # a 1.0B Llama shape

The model is built abstractly (`nnx.eval_shape`), the train step of `flaxheads.training.step`
lowered for it and compiled, and XLA's `memory_analysis()` read: arguments (parameters, optimizer
state, frozen weights, batch), temporaries (activations kept for the backward pass, gradients,
workspace) and the peak = arguments + temporaries + outputs not aliased to donated arguments.
Compiled memory, not RSS: what the step needs on the device it is compiled for. XLA:CPU's
buffer assignment barely profits from rematerialisation (a plain jax.checkpoint'ed MLP chain shows
the same), so measure gradient checkpointing's saving on a GPU/TPU. Likewise for bf16 parameters:
XLA:CPU computes bf16 matmuls in float32, so its temporaries hold float32 copies of the weights
(measured: LoRA's temporaries grew by about the weights' float32 size); read the arguments
(parameters, optimizer state) there, and the temporaries on a GPU/TPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from flaxheads import compile_cache, lora
from flaxheads.backbones import backbone_config_from_hf, stacking
from flaxheads.conversion import architecture_table
from flaxheads.tasks.classification.model import ClassifierConfig, SequenceClassifier
from flaxheads.training.optim import make_optimizer
from flaxheads.training.step import TrainState, make_train_step
from flaxheads.training.trainable import split_trainable

BERT_1B = dict(model_type="bert", vocab_size=30522, hidden_size=2048, num_hidden_layers=24, num_attention_heads=16,
               intermediate_size=8192, max_position_embeddings=512)
"""BERT-shaped, 1.27B parameters (BERT-large widened to 2048)."""
LLAMA_1B = dict(model_type="llama", vocab_size=32000, hidden_size=2048, num_hidden_layers=22, num_attention_heads=32,
                num_key_value_heads=4, intermediate_size=5632, max_position_embeddings=2048)
"""Llama-shaped (TinyLlama's shape), 1.03B parameters without the LM head."""
SHAPES = {"bert": BERT_1B, "llama": LLAMA_1B}

QUERY_VALUE = ("query", "value")
"""LoRA's targets in the setups: attention's query and value projections, by BERT's names;
`lora_targets` renames them for other families (peft's usual choice for each)."""
_QUERY_VALUE_BY_FAMILY = {"llama": ("q_proj", "v_proj")}


def lora_targets(model_type: str, targets: tuple[str, ...]) -> tuple[str, ...]:
    """`targets` in `model_type`'s module names (the query/value default becomes q_proj/v_proj on Llama)."""
    return _QUERY_VALUE_BY_FAMILY.get(model_type, targets) if targets == QUERY_VALUE else targets


@dataclasses.dataclass(frozen=True)
class Setup:
    name: str
    lora: lora.LoRAConfig | None = None
    freeze_backbone: bool = False
    gradient_checkpointing: bool = False
    param_dtype: str = "float32"
    """"bfloat16": parameters and gradients in bf16 (compute too), AdamW state float32 (--param_dtype)."""


@dataclasses.dataclass(frozen=True)
class BuiltStep:
    """What `build_step` returns: the backbone config, the jitted step (state donated) and its
    arguments; `state` and `frozen` hold arrays, or their shapes where built abstractly."""
    backbone: Any
    step: Any
    state: Any
    frozen: Any
    all_params: int
    trainable_params: int
    lora_params: int
    multiplying_params: int
    """Parameters that multiply a token: all but the embedding tables (a lookup multiplies nothing)."""


def build_step(hf_config: dict[str, Any], setup: Setup, problem_type: str, *, num_labels: int,
               abstract: bool) -> BuiltStep:
    """`setup`'s model (the family's canonical head) and its jitted train step (AdamW, constant
    rate 1e-4, weight decay 0.01), built as training builds them: concretely (random weights,
    seed 0) or, with `abstract`, as shapes only (`nnx.eval_shape`), allocating nothing."""
    backbone = backbone_config_from_hf(hf_config)
    config = ClassifierConfig(backbone, architecture_table(backbone.model_type).canonical_head, num_labels=num_labels)
    dtype = jnp.dtype(setup.param_dtype)  # bf16 parameters compute in bf16, as TrainConfig implies
    build = lambda: SequenceClassifier(config, dtype=dtype, param_dtype=dtype, rngs=nnx.Rngs(0))  # noqa: E731
    model = nnx.eval_shape(build) if abstract else build()
    if setup.lora is not None:
        targets = lora_targets(backbone.model_type, tuple(setup.lora.target_modules))
        model = model.with_lora(dataclasses.replace(setup.lora, target_modules=targets))
    if setup.gradient_checkpointing:
        stacking.set_gradient_checkpointing(model.backbone)
    graphdef, params = nnx.split(model)
    trainable, frozen = split_trainable(params, freeze_backbone=setup.freeze_backbone)
    schedule = optax.constant_schedule(1e-4)
    tx = make_optimizer(schedule, weight_decay=0.01)
    init = lambda p: TrainState(jnp.zeros((), jnp.int32), p, tx.init(p))  # noqa: E731
    state = jax.eval_shape(init, _abstract(trainable)) if abstract else init(trainable)
    step = compile_cache.train_jit(make_train_step(graphdef, tx, schedule, problem_type), donate_argnums=0,
                                   graphdef=graphdef)
    sizes = [(path, variable.get_value().size, isinstance(variable, nnx.LoRAParam))
             for path, variable in nnx.to_flat_state(params)]
    return BuiltStep(
        backbone, step, state, _abstract(frozen) if abstract else frozen,
        all_params=sum(size for _, size, _ in sizes),
        trainable_params=_count(trainable),
        lora_params=sum(size for _, size, is_lora in sizes if is_lora),
        multiplying_params=sum(size for path, size, _ in sizes if "embed" not in "/".join(map(str, path))),
    )


def step_memory(hf_config: dict[str, Any], setup: Setup, *, batch: int, seq: int) -> dict[str, Any]:
    """Parameter counts and XLA's compiled memory (bytes) of one train step of `setup`."""
    built = build_step(hf_config, setup, "single_label_classification", num_labels=2, abstract=True)
    ids = jax.ShapeDtypeStruct((1, batch, seq), jnp.int32)
    batch_spec = {"input_ids": ids, "attention_mask": ids,
                  "labels": jax.ShapeDtypeStruct((1, batch), jnp.int32),
                  "example_mask": jax.ShapeDtypeStruct((1, batch), jnp.float32)}
    if getattr(built.backbone, "type_vocab_size", 0):  # decoders refuse token types
        batch_spec["token_type_ids"] = ids
    compiled = built.step.lower(built.state, batch_spec, jax.random.key(0), built.frozen).compile()
    memory = compiled.memory_analysis()
    trainable, frozen = built.state.params, built.frozen
    return {
        "setup": setup.name,
        "trainable_params": built.trainable_params,
        "all_params": built.all_params,
        "param_bytes": sum(x.size * x.dtype.itemsize for x in jax.tree.leaves((trainable, frozen))),
        "optimizer_state_bytes": sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(built.state.opt_state)),
        "argument_bytes": memory.argument_size_in_bytes,
        "temp_bytes": memory.temp_size_in_bytes,
        "output_bytes": memory.output_size_in_bytes,
        "alias_bytes": memory.alias_size_in_bytes,
        "peak_bytes": memory.argument_size_in_bytes + memory.temp_size_in_bytes + memory.output_size_in_bytes
        - memory.alias_size_in_bytes,
    }


def _count(tree) -> int:
    return sum(x.size for x in jax.tree.leaves(tree))


def _abstract(tree):
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)


SETUPS = (
    Setup("full fine-tuning"),
    Setup("full, gradient checkpointing", gradient_checkpointing=True),
    Setup("LoRA r=16 query,value", lora=lora.LoRAConfig(r=16, alpha=32, target_modules=QUERY_VALUE)),
    Setup("LoRA r=16 query,value, gradient checkpointing",
          lora=lora.LoRAConfig(r=16, alpha=32, target_modules=QUERY_VALUE), gradient_checkpointing=True),
    Setup("frozen backbone (linear probe)", freeze_backbone=True),
    Setup("full, bf16 parameters and compute, float32 AdamW state", param_dtype="bfloat16"),
    Setup("LoRA r=16 query,value, bf16 parameters and compute",
          lora=lora.LoRAConfig(r=16, alpha=32, target_modules=QUERY_VALUE), param_dtype="bfloat16"),
)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--setups", nargs="*", type=int, help="indices into SETUPS; default: all")
    parser.add_argument("--shape", default="bert",
                        help=f"the model: {' or '.join(SHAPES)} (about 1B parameters each), or a config.json as JSON")
    args = parser.parse_args(argv)
    shape = SHAPES[args.shape] if args.shape in SHAPES else json.loads(args.shape)
    for index in args.setups if args.setups is not None else range(len(SETUPS)):
        print(json.dumps(step_memory(shape, SETUPS[index], batch=args.batch, seq=args.seq)), flush=True)


if __name__ == "__main__":
    main()
