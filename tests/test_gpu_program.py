"""The GPU programs, checked on this CPU: jax lowers a function for CUDA without the device
(`jax.export.export(..., platforms=["cuda"])`), so the train step a GPU would run can be read as
StableHLO here. Every choice made by backend is made as on a GPU (`layers._backend`,
`compile_cache._backend`, `attention._backend`); attention runs XLA's kernel in cuDNN's place
(cuDNN's lowering needs the device). Tiny configs of the benchmark's shapes (`StepBench`)."""

from __future__ import annotations

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from flaxheads import compile_cache
from flaxheads.backbones import attention, backbone_config_from_hf, build_backbone, fused_attention, layers
from flaxheads.benchmarks.step_shapes import StepBench
from flaxheads.tasks.classification.model import ClassifierConfig, SequenceClassifier
from flaxheads.training.optim import make_optimizer
from flaxheads.training.step import TrainState, make_train_step

TINY = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
"""Sizes that keep the families' real vocabularies (30,522 and 32,000 rows: tables past every
row limit of `layers.lookup`) and shrink everything else."""
BATCH, SEQ = 4, 16


@pytest.fixture
def as_on_a_gpu(monkeypatch):
    """Programs traced now choose as on a GPU; cuDNN's adapter runs XLA's kernel."""
    for module in (layers, compile_cache, attention):
        monkeypatch.setattr(module, "_backend", lambda: "gpu")
    monkeypatch.setattr(fused_attention, "cudnn", functools.partial(fused_attention.cudnn, implementation="xla"))


def _hf_config(arch: str) -> dict:
    hf = StepBench(arch=arch).hf_config()
    return {**hf, **TINY} if arch != "gpt2" else hf


def _train_step_and_inputs(arch: str, padding_side: str):
    """(jitted train step, its arguments) of `arch`'s canonical classifier in bfloat16, for a
    batch padded on `padding_side` (rows of 16, 12, 8 and 4 real tokens)."""
    hf = _hf_config(arch)
    config = ClassifierConfig(backbone=backbone_config_from_hf(hf), head=_canonical_head(hf), num_labels=2)
    model = SequenceClassifier(config, dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(model)
    schedule = optax.constant_schedule(2e-5)
    tx = make_optimizer(schedule, weight_decay=0.01, max_grad_norm=1.0)
    state = TrainState(jnp.zeros((), jnp.int32), params, tx.init(params))
    mask = np.arange(SEQ)[None, :] < np.array([16, 12, 8, 4])[:, None]
    mask = mask if padding_side == "right" else mask[:, ::-1]
    batch = {"input_ids": np.where(mask, 1000, 0), "attention_mask": mask, "labels": np.zeros(BATCH),
             "example_mask": np.ones(BATCH)}
    if arch == "bert":
        batch["token_type_ids"] = np.zeros_like(mask)
    dtypes = {"example_mask": jnp.float32}
    batch = {k: jnp.asarray(v, dtypes.get(k, jnp.int32))[None] for k, v in batch.items()}  # accumulation axis
    step = compile_cache.precise(make_train_step(graphdef, tx, schedule, "single_label_classification"))
    return jax.jit(step), (state, batch, jax.random.key(0)), model


def _canonical_head(hf: dict) -> str:
    from flaxheads import conversion

    return conversion.architecture_table(hf["model_type"]).canonical_head


def _scatters(stablehlo: str) -> list[dict]:
    """Every stablehlo.scatter of a module's text: its result type, whether its indices are
    declared unique, and whether its update adds (a scatter-add) or replaces."""
    lines = stablehlo.splitlines()
    found = []
    for i, line in enumerate(lines):
        if '"stablehlo.scatter"' not in line:
            continue
        end = next(j for j in range(i, len(lines)) if re.search(r"^\s*\}\) : \(", lines[j]))
        body = "\n".join(lines[i + 1:end])
        found.append({"result": re.search(r"-> (tensor<[^>]*>)", lines[end]).group(1),
                      "unique": "unique_indices = true" in line, "adds": "stablehlo.add" in body})
    return found


def _census(stablehlo: str) -> dict[str, int]:
    """How many loops, conditionals and host callbacks a module's text holds."""
    return {"while": stablehlo.count('"stablehlo.while"') + stablehlo.count("stablehlo.while("),
            "conditional": len(re.findall(r"stablehlo\.(case|if)\b", stablehlo)),
            "host callback": len(re.findall(r"custom_call @\w*callback", stablehlo))}


@pytest.mark.slow  # ~4 s a family on this machine: tracing and lowering a train step
@pytest.mark.parametrize(("arch", "padding_side"), [("bert", "right"), ("llama", "left")])
def test_the_cuda_train_step_writes_no_table_by_scatter_add_and_holds_no_loop_or_host_call(
        as_on_a_gpu, arch, padding_side):
    step, args, model = _train_step_and_inputs(arch, padding_side)
    tables = {f"tensor<{'x'.join(map(str, m.embedding.shape))}x" for _, m in nnx.iter_graph(model)
              if isinstance(m, layers.Embed)}
    assert any(m.num_embeddings > layers.SORTED_GRADIENT_ROWS for _, m in nnx.iter_graph(model)
               if isinstance(m, layers.Embed)), "no vocabulary-sized table: the test would prove nothing"

    stablehlo = jax.export.export(step, platforms=["cuda"])(*args).mlir_module()

    into_tables = [s for s in _scatters(stablehlo) if any(s["result"].startswith(t) for t in tables)]
    # The vocabulary's gradient: one write per id (unique indices, no atomics); small tables: none.
    assert into_tables and all(s["unique"] and not s["adds"] for s in into_tables), into_tables
    assert _census(stablehlo) == {"while": 0, "conditional": 0, "host callback": 0}


def _decoder_forward(padding_side: str | None):
    """(jitted forward of a tiny bfloat16 Llama backbone built as `build_backbone` builds it,
    then told `padding_side`; its arguments: a left-padded batch)."""
    cfg = backbone_config_from_hf(_hf_config("llama"))
    backbone = build_backbone(cfg, dtype=jnp.bfloat16, param_dtype=jnp.float32, rngs=nnx.Rngs(0))
    backbone.eval()
    if padding_side != "left":
        backbone.set_attributes(padding_side=padding_side)
    graphdef, params = nnx.split(backbone)
    mask_BS = jnp.asarray((np.arange(SEQ)[None, :] < np.array([16, 12, 8, 4])[:, None])[:, ::-1], jnp.int32)
    ids_BS = jnp.where(mask_BS == 1, 1000, 0)
    forward = jax.jit(lambda params, ids, mask: nnx.merge(graphdef, params)(ids, attention_mask=mask).last_hidden_state)
    return forward, (params, ids_BS, mask_BS)


def test_the_family_padding_side_reaches_the_decoder_attention():
    cfg = backbone_config_from_hf(_hf_config("llama"))
    backbone = build_backbone(cfg, dtype=jnp.bfloat16, param_dtype=jnp.float32, rngs=nnx.Rngs(0))
    qwen = backbone_config_from_hf({**_hf_config("llama"), "model_type": "qwen2"})
    qwen_backbone = build_backbone(qwen, dtype=jnp.bfloat16, param_dtype=jnp.float32, rngs=nnx.Rngs(0))

    sides = lambda module: {m.padding_side for _, m in nnx.iter_graph(module) if hasattr(m, "padding_side")}
    assert (sides(backbone), sides(qwen_backbone)) == ({"left"}, {"right"})


@pytest.mark.slow  # three tiny decoder forward passes traced and run: ~3 s
def test_a_left_padded_decoder_chooses_xla_attention_while_tracing(as_on_a_gpu, monkeypatch):
    left, args = _decoder_forward("left")
    unknown, _ = _decoder_forward(None)

    assert _census(left.lower(*args).as_text())["conditional"] == 0
    # Without the side the cuDNN adapter still checks for right padding at run time.
    assert _census(unknown.lower(*args).as_text())["conditional"] > 0
    got = left(*args)
    monkeypatch.setattr(attention, "_backend", lambda: "cpu")
    expected = _decoder_forward("left")[0](*args)  # the CPU's program: XLA's attention, the eager path
    np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(expected, np.float32))
