"""LoRA adapters, trainable-parameter selection (LoRA, freeze_backbone) and gradient
checkpointing, on tiny random BERT and GPT-2 classifiers."""

from __future__ import annotations

import dataclasses
import json
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch
import transformers
from flax import nnx

import flaxheads
from flaxheads import lora
from flaxheads.conversion import peft as peft_format
from flaxheads.backbones import backbone_config_from_hf, stacking
from flaxheads.training.optim import make_optimizer
from flaxheads.training.parallel import JitParallel
from flaxheads.training.sharding import Layout
from flaxheads.training.trainable import split_trainable

ATOL = 1e-5
TARGETS = {"bert": ("query", "value"), "gpt2": ("c_attn",)}
PAD = 0


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """{"bert": path, "gpt2": path}: tiny random *ForSequenceClassification checkpoints (3 labels)."""
    torch.manual_seed(0)
    bert = transformers.BertForSequenceClassification(transformers.BertConfig(
        vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
        max_position_embeddings=64, num_labels=3, initializer_range=0.1))
    gpt2 = transformers.GPT2ForSequenceClassification(transformers.GPT2Config(
        vocab_size=99, n_embd=32, n_layer=2, n_head=4, n_positions=64, n_inner=37, num_labels=3,
        pad_token_id=PAD, bos_token_id=98, eos_token_id=98, initializer_range=0.1))
    paths = {}
    for name, model in (("bert", bert), ("gpt2", gpt2)):
        paths[name] = tmp_path_factory.mktemp(name)
        model.save_pretrained(paths[name])
    return paths


def _batch(seed: int = 0) -> dict[str, np.ndarray]:
    """Two rows, the second right-padded."""
    ids = np.random.RandomState(seed).randint(1, 98, (2, 9))
    mask = np.ones_like(ids)
    ids[1, 6:], mask[1, 6:] = PAD, 0
    return {"input_ids": ids, "attention_mask": mask}


def _lora_model(path, family: str, *, dropout: float = 0.0, seed: int = 0):
    base = flaxheads.from_pretrained(path)
    config = lora.LoRAConfig(r=4, alpha=8.0, dropout=dropout, target_modules=TARGETS[family])
    return base, base.with_lora(config, seed=seed)


def _with_trained_adapters(model) -> None:
    """Non-zero lora_b everywhere, as after training (a fresh adapter is a no-op)."""
    for i, adapter in enumerate(lora.adapters(model).values()):
        adapter.lora_b[...] = 0.3 * jax.random.normal(jax.random.key(i), adapter.lora_b.shape)


def _logits(model, batch) -> np.ndarray:
    return np.asarray(model(jnp.asarray(batch["input_ids"]), jnp.asarray(batch["attention_mask"])))


def _torch_logits(model, batch) -> np.ndarray:
    with torch.no_grad():
        out = model(input_ids=torch.tensor(batch["input_ids"]), attention_mask=torch.tensor(batch["attention_mask"]))
    return out.logits.numpy()


@pytest.mark.parametrize("family", ["bert", pytest.param("gpt2", marks=pytest.mark.slow)])
def test_fresh_lora_model_gives_the_base_models_logits(checkpoints, family):
    base, model = _lora_model(checkpoints[family], family)
    batch = _batch()

    diff = np.abs(_logits(model, batch) - _logits(base, batch)).max()
    print(f"{family}: max |lora - base| = {diff:.2e}")
    assert diff == 0.0
    assert len(lora.adapters(model)) == 2 * len(TARGETS[family])


def test_lora_targets_are_hugging_face_module_names_mapped_by_the_table(checkpoints):
    _, model = _lora_model(checkpoints["bert"], "bert")

    expected = [f"backbone.layers.{i}.attention.{n}" for i in (0, 1) for n in ("query", "value")]
    assert sorted(lora.adapters(model)) == expected
    assert [t.hf_module for t in peft_format.resolve_targets(model.config, ("layer.1.attention.self.query",))] == [
        "bert.encoder.layer.1.attention.self.query"]


def test_unknown_target_module_is_refused_naming_the_linear_layers(checkpoints):
    base = flaxheads.from_pretrained(checkpoints["bert"])

    with pytest.raises(ValueError, match=r"\['q_proj'\] match no Linear.*query.*value"):
        base.with_lora(lora.LoRAConfig(r=4, target_modules=("query", "q_proj")))


@pytest.mark.slow  # compiles train steps or gradients
def test_lora_dropout_acts_in_train_mode_only(checkpoints):
    batch = _batch()
    _, model = _lora_model(checkpoints["bert"], "bert", dropout=0.5)
    _with_trained_adapters(model)
    model.eval()
    eval_logits = _logits(model, batch)
    model.train()
    ids, mask = jnp.asarray(batch["input_ids"]), jnp.asarray(batch["attention_mask"])
    # The checkpoint's own dropout is on too in train mode: compare against the same model without LoRA dropout.
    plain = flaxheads.from_pretrained(checkpoints["bert"]).with_lora(dataclasses.replace(model.lora, dropout=0.0))
    nnx.update(plain, nnx.state(model))
    plain.train()
    train_key = jax.random.key(7)
    with_dropout = np.asarray(model(ids, mask, rngs=nnx.Rngs(dropout=train_key)))
    without = np.asarray(plain(ids, mask, rngs=nnx.Rngs(dropout=train_key)))

    assert not np.allclose(with_dropout, without, atol=1e-4)
    model.eval()
    np.testing.assert_array_equal(_logits(model, batch), eval_logits)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["bert", "gpt2"])
def test_merged_export_loads_in_transformers_with_equal_logits(checkpoints, family, tmp_path):
    _, model = _lora_model(checkpoints[family], family)
    _with_trained_adapters(model)
    batch = _batch()
    model.save_pretrained(tmp_path)

    torch_model, info = transformers.AutoModelForSequenceClassification.from_pretrained(
        tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    diff = np.abs(_torch_logits(torch_model.eval(), batch) - _logits(model, batch)).max()
    print(f"{family}: merged export, max |torch - flax LoRA| = {diff:.2e}")
    assert diff < ATOL


@pytest.mark.parametrize("family", ["bert", "gpt2"])
@pytest.mark.slow  # loads peft and runs both models
def test_adapter_export_loads_with_peft_with_equal_logits(checkpoints, family, tmp_path):
    peft = pytest.importorskip("peft")
    base, model = _lora_model(checkpoints[family], family)
    _with_trained_adapters(model)
    # The head is trained in full too: give it other values than the checkpoint's.
    for _, variable in nnx.to_flat_state(nnx.state(model.head)):
        variable[...] = variable[...] + 0.05
    batch = _batch()
    peft_format.save_adapter(model, tmp_path / "adapter", base_model_name_or_path=str(checkpoints[family]))

    torch_base = transformers.AutoModelForSequenceClassification.from_pretrained(checkpoints[family])
    peft_model = peft.PeftModel.from_pretrained(torch_base, tmp_path / "adapter").eval()
    diff = np.abs(_torch_logits(peft_model, batch) - _logits(model, batch)).max()
    print(f"{family}: peft adapter, max |peft - flax LoRA| = {diff:.2e}")
    assert diff < ATOL
    assert np.abs(_logits(base, batch) - _logits(model, batch)).max() > 1e-3  # the adapters and head mattered
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert config["fan_in_fan_out"] == (family == "gpt2")


# -- trainable-parameter selection ---------------------------------------------------------------


def _one_step_runner(model, *, freeze_backbone: bool):
    graphdef, params = nnx.split(model)
    trainable, frozen = split_trainable(params, freeze_backbone=freeze_backbone)
    schedule = optax.constant_schedule(1e-2)
    runner = JitParallel(Layout.create(), graphdef, make_optimizer(schedule), schedule, "single_label_classification",
                         trainable, frozen)
    return runner, runner.init(trainable), params


def _train_batch() -> dict[str, np.ndarray]:
    batch = _batch()
    return {**{k: v[None] for k, v in batch.items()}, "labels": np.array([[0, 2]]),
            "example_mask": np.ones((1, 2), np.float32)}


def _flat(state) -> dict[str, np.ndarray]:
    return {".".join(map(str, p)): np.asarray(v[...]) for p, v in nnx.to_flat_state(state)}


def _optimizer_state_paths(state) -> set[str]:
    """The parameter paths the optimizer keeps moments for."""
    paths = set()
    for path, _ in jax.tree_util.tree_flatten_with_path(state.opt_state)[0]:
        names = [str(k.key) for k in path if isinstance(k, jax.tree_util.DictKey)]  # not a Variable's .value
        if "backbone" in names or "head" in names:
            start = names.index("backbone") if "backbone" in names else names.index("head")
            paths.add(".".join(names[start:]))
    return paths


@pytest.mark.slow  # compiles train steps or gradients
@pytest.mark.parametrize("family", ["bert", "gpt2"])
def test_lora_steps_change_only_adapters_and_head_and_keep_no_state_for_frozen(checkpoints, family):
    _, model = _lora_model(checkpoints[family], family)
    runner, state, before = _one_step_runner(model, freeze_backbone=False)
    for _ in range(2):
        state, _ = runner.step(state, _train_batch(), jax.random.key(0))
    after, before = _flat(runner.params(state)), _flat(before)

    changed = {name for name in before if not np.array_equal(before[name], after[name])}
    trainable = {name for name in before if name.startswith("head.") or ".lora_" in name}
    assert changed == trainable
    assert _optimizer_state_paths(state) == trainable  # the base weights have no Adam moments at all


@pytest.mark.slow  # compiles train steps or gradients
def test_lora_step_with_gradient_checkpointing_gives_the_same_weights(checkpoints):
    results = []
    for checkpointing in (False, True):
        _, model = _lora_model(checkpoints["bert"], "bert")
        if checkpointing:
            stacking.set_gradient_checkpointing(model.backbone)
        runner, state, _ = _one_step_runner(model, freeze_backbone=False)
        state, _ = runner.step(state, _train_batch(), jax.random.key(0))
        results.append(_flat(state.params))

    diff = max(np.abs(results[0][name] - results[1][name]).max() for name in results[0])
    print(f"max |weights - weights with remat| after a LoRA step = {diff:.2e}")
    assert diff < 1e-6


@pytest.mark.slow  # compiles train steps or gradients
def test_freeze_backbone_steps_change_only_the_head_and_keep_no_state_for_the_backbone(checkpoints):
    model = flaxheads.from_pretrained(checkpoints["bert"])
    runner, state, before = _one_step_runner(model, freeze_backbone=True)
    state, _ = runner.step(state, _train_batch(), jax.random.key(0))
    after, before = _flat(runner.params(state)), _flat(before)

    changed = {name for name in before if not np.array_equal(before[name], after[name])}
    assert changed == {name for name in before if name.startswith("head.")}
    assert _optimizer_state_paths(state) == changed
    assert not any(name.startswith("backbone.") for name in _flat(state.params))


@pytest.mark.slow  # compiles train steps or gradients
def test_trainer_with_freeze_backbone_trains_only_the_head(tiny_bert, snippets_csv):
    import csv

    with open(snippets_csv["train"], encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    model = flaxheads.from_pretrained(tiny_bert, num_labels=2)
    args = flaxheads.TrainConfig(output_dir=None, dataset=None, text_column="sentence", max_seq_length=16,
                                 per_device_train_batch_size=8, max_steps=2, warmup_ratio=0.0, disable_tqdm=True,
                                 do_eval=False, learning_rate=1e-2, freeze_backbone=True)
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_bert)
    trained = flaxheads.Trainer(model, args, train_dataset=([r["sentence"] for r in rows], [r["label"] for r in rows]),
                                tokenizer=tokenizer).train().model
    before, after = _flat(nnx.state(model)), _flat(nnx.state(trained))

    changed = {name for name in before if not np.array_equal(before[name], after[name])}
    assert changed == {name for name in before if name.startswith("head.")}


@pytest.mark.slow  # compiles train steps or gradients
def test_cli_trains_lora_saves_merged_model_and_peft_adapter_and_resumes_exactly(tiny_bert, snippets_csv, tmp_path):
    from safetensors.numpy import load_file

    from flaxheads.cli import main

    run = tmp_path / "run"
    command = ["train", "--model_name_or_path", str(tiny_bert), "--train_file", str(snippets_csv["train"]),
               "--validation_file", str(snippets_csv["validation"]), "--text_column", "sentence",
               "--max_seq_length", "16", "--output_dir", str(run), "--max_steps", "4", "--save_steps", "2",
               "--per_device_train_batch_size", "8", "--disable_tqdm", "--lora_r", "4", "--lora_dropout", "0.1",
               "--lora_target_modules", "query", "value", "--lora_export", "both"]
    assert main(command) == 0
    merged, adapter = load_file(run / "model.safetensors"), load_file(run / "adapter" / "adapter_model.safetensors")

    torch_model, info = transformers.AutoModelForSequenceClassification.from_pretrained(run, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    adapter_config = json.loads((run / "adapter" / "adapter_config.json").read_text())
    assert adapter_config["target_modules"] == ["query", "value"] and adapter_config["r"] == 4
    # From the checkpoint of step 2 (adapters, head and their Adam moments; the base weights are
    # read again from the model) the same last two steps give the same weights, bit for bit.
    assert main([*command, "--resume_from_checkpoint", "2"]) == 0
    for before, after in ((merged, load_file(run / "model.safetensors")),
                          (adapter, load_file(run / "adapter" / "adapter_model.safetensors"))):
        assert before.keys() == after.keys()
        for name in before:
            np.testing.assert_array_equal(before[name], after[name], err_msg=name)


# -- gradient checkpointing ----------------------------------------------------------------------

# BERT keeps its dropout (the masks must be redrawn alike when a layer is recomputed); the others
# drop none, which keeps the compile short.
TINY_HF = {
    "bert": transformers.BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                    intermediate_size=37, max_position_embeddings=64),
    "gpt2": transformers.GPT2Config(vocab_size=99, n_embd=32, n_layer=2, n_head=4, n_positions=64, n_inner=37,
                                    pad_token_id=PAD, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0),
    "albert": transformers.AlbertConfig(vocab_size=99, embedding_size=16, hidden_size=32, num_hidden_layers=2,
                                        num_attention_heads=4, intermediate_size=37, max_position_embeddings=64,
                                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0),
    "xlnet": transformers.XLNetConfig(vocab_size=99, d_model=32, n_layer=2, n_head=4, d_inner=37, pad_token_id=PAD,
                                      dropout=0.0),
    "deberta-v2": transformers.DebertaV2Config(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                               intermediate_size=37, relative_attention=True, position_buckets=8,
                                               max_relative_positions=16, pos_att_type=["p2c", "c2p"],
                                               hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0),
    "modernbert": transformers.ModernBertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=3,
                                                num_attention_heads=4, intermediate_size=37, local_attention=4,
                                                global_attn_every_n_layers=2, pad_token_id=PAD),
    "llama": transformers.LlamaConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, intermediate_size=37, pad_token_id=PAD),
}


def _loss(graphdef, params):
    model = nnx.merge(graphdef, params)
    model.train()
    batch = _batch()
    logits = model(jnp.asarray(batch["input_ids"]), jnp.asarray(batch["attention_mask"]),
                   rngs=nnx.Rngs(dropout=jax.random.key(3)))
    return optax.softmax_cross_entropy_with_integer_labels(logits, jnp.array([0, 2])).mean()


def _grads_and_jaxpr(family: str, checkpointing: bool):
    backbone = backbone_config_from_hf(TINY_HF[family].to_dict())
    head = flaxheads.conversion.architecture_table(backbone.model_type).canonical_head
    model = flaxheads.SequenceClassifier(flaxheads.ClassifierConfig(backbone, head, num_labels=3), rngs=nnx.Rngs(0))
    if checkpointing:
        stacking.set_gradient_checkpointing(model.backbone)
    graphdef, params = nnx.split(model)
    grad_fn = jax.grad(lambda p: _loss(graphdef, p))
    return _flat(jax.jit(grad_fn)(params)), str(jax.make_jaxpr(grad_fn)(params))


@pytest.mark.slow  # compiles train steps or gradients
@pytest.mark.matrix()  # a third of the families a run (tests/conftest.py, MATRIX_PARTS)
@pytest.mark.parametrize("family", list(TINY_HF))
def test_gradient_checkpointing_gives_the_same_gradients_through_remat(family):
    plain, plain_jaxpr = _grads_and_jaxpr(family, checkpointing=False)
    remat, remat_jaxpr = _grads_and_jaxpr(family, checkpointing=True)

    diff = max(np.abs(plain[name] - remat[name]).max() for name in plain)
    print(f"{family}: max |grad - grad with remat| = {diff:.2e}")
    assert diff < 1e-6
    assert _remat_primitives(remat_jaxpr) and not _remat_primitives(plain_jaxpr)


def _remat_primitives(jaxpr: str) -> set[str]:
    """The rematerialisation primitives (jax.checkpoint's: `checkpoint`, `remat2` once differentiated) in a jaxpr."""
    return {name for name in re.findall(r"= ([a-z_0-9]+)\[", jaxpr) if "remat" in name or "checkpoint" in name}
