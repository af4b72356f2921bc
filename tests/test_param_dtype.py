"""Training with bfloat16 parameters (`param_dtype="bfloat16"`, `--param_dtype bfloat16`): the
parameters and their gradients are bf16, AdamW's state and update float32; runs train, resume
bit-identically, refuse a resume in the other dtype, and export bf16 checkpoints transformers loads.
Tiny random BERT and Llama models (tests/conftest.py), a few steps each."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch
import transformers
from flax import nnx
from safetensors import safe_open

import flaxheads
from flaxheads.training.checkpoints import CheckpointMismatch
from flaxheads.training.config import TrainConfig
from flaxheads.training.optim import make_optimizer
from flaxheads.training.parallel import JitParallel
from flaxheads.training.sharding import Layout
from flaxheads.training.trainable import split_trainable
from flaxheads.tasks.runs import Trainer, train
from runs import assert_weights_identical, cpu_devices_env, exported_weights, stopped_after_saving, two_epoch_config

BF16 = dict(param_dtype="bfloat16", max_steps=8, save_steps=4, logging_steps=2)
"""A short bf16-parameter run of test_training's tiny-BERT job: checkpoints at steps 4 and 8."""


def _dtypes(tree) -> set[str]:
    return {str(x.dtype) for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.floating)}


def _safetensors_dtypes(directory) -> set[str]:
    with safe_open(str(directory / "model.safetensors"), "np") as f:
        return {str(f.get_slice(name).get_dtype()) for name in f.keys()}


@pytest.fixture(scope="module")
def bf16_run(tiny_bert, snippets_csv, tmp_path_factory):
    out = tmp_path_factory.mktemp("bf16_run")
    train(two_epoch_config(tiny_bert, snippets_csv, out, **BF16))
    return out


def test_bfloat16_parameters_imply_bfloat16_compute():
    config = TrainConfig(param_dtype="bfloat16")
    assert config.dtype == "bfloat16"


@pytest.mark.slow  # a training run, a train step or a subprocess
def test_optimizer_state_and_update_are_float32_while_parameters_stay_bfloat16(tiny_bert):
    model = flaxheads.from_pretrained(tiny_bert, num_labels=2, dtype="bfloat16", param_dtype="bfloat16")
    graphdef, params = nnx.split(model)
    trainable, frozen = split_trainable(params)
    tx = make_optimizer(optax.constant_schedule(1e-3), weight_decay=0.01)
    runner = JitParallel(Layout.create(None), graphdef, tx, optax.constant_schedule(1e-3),
                         "single_label_classification", trainable, frozen)
    state = runner.init(trainable)
    assert _dtypes(state.opt_state) == {"float32"} and _dtypes(state.params) == {"bfloat16"}

    batch = {"input_ids": np.ones((1, 4, 8), np.int32), "attention_mask": np.ones((1, 4, 8), np.int32),
             "token_type_ids": np.zeros((1, 4, 8), np.int32), "labels": np.array([[0, 1, 0, 1]], np.int32),
             "example_mask": np.ones((1, 4), np.float32)}
    updated, _ = runner.step(state, batch, jax.random.key(0))
    assert _dtypes(updated.opt_state) == {"float32"} and _dtypes(updated.params) == {"bfloat16"}
    moved = [not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(updated.params), jax.tree.leaves(trainable))]
    assert any(moved)


def test_float32_update_is_added_to_bfloat16_parameters_and_rounded_to_bfloat16():
    params = {"w": jnp.full((4,), 1.0, jnp.bfloat16)}
    grads = {"w": jnp.full((4,), 1.0, jnp.bfloat16)}
    tx = make_optimizer(optax.constant_schedule(3e-3), max_grad_norm=None)
    updates, _ = tx.update(grads, tx.init(params), params)
    new = optax.apply_updates(params, updates)
    assert updates["w"].dtype == jnp.float32 and new["w"].dtype == jnp.bfloat16
    # 1 - 3e-3 in float32, rounded once: bf16's spacing below 1 is 2**-8, so 1 - 3e-3 -> 1 - 2**-8
    np.testing.assert_array_equal(np.asarray(new["w"], np.float32), np.float32(1 - 2**-8))


@pytest.mark.slow  # a training run, a train step or a subprocess
def test_training_with_bfloat16_parameters_decreases_the_loss(bf16_run):
    losses = [json.loads(line)["loss"] for line in open(bf16_run / "metrics.jsonl")
              if json.loads(line)["split"] == "train"]
    print("train losses, bf16 parameters", losses)
    assert losses[-1] < losses[0]


@pytest.mark.slow  # a training run, a train step or a subprocess
def test_bfloat16_run_exports_bfloat16_weights_that_transformers_loads_with_the_same_logits(bf16_run):
    assert _safetensors_dtypes(bf16_run) == {"BF16"}
    assert json.loads((bf16_run / "config.json").read_text())["dtype"] == "bfloat16"
    texts = ["a gorgeous, moving film", "tedious and far too long"]
    tokenizer = transformers.AutoTokenizer.from_pretrained(bf16_run)
    reference = transformers.AutoModelForSequenceClassification.from_pretrained(bf16_run).eval()
    assert reference.dtype == torch.bfloat16
    encoded = tokenizer(texts, return_tensors="np", padding=True)
    with torch.no_grad():
        expected = reference(**{k: torch.as_tensor(v) for k, v in encoded.items()}).logits.float().numpy()
    ours = flaxheads.from_pretrained(bf16_run, dtype="bfloat16", param_dtype="auto")
    logits = np.asarray(ours(**{k: jnp.asarray(v) for k, v in encoded.items()}))
    print("max logit difference, bf16 export vs transformers bf16", np.abs(logits - expected).max())
    np.testing.assert_allclose(logits, expected, atol=0.05)


@pytest.mark.slow  # a training run, a train step or a subprocess
def test_bfloat16_export_round_trips_bit_identically(bf16_run, tmp_path):
    flaxheads.from_pretrained(bf16_run, param_dtype="auto").save_pretrained(tmp_path)
    assert_weights_identical(exported_weights(bf16_run), exported_weights(tmp_path))


@pytest.mark.slow  # a training run, a train step or a subprocess
def test_bfloat16_run_resumed_after_a_stop_is_bit_identical(tiny_bert, snippets_csv, bf16_run, tmp_path, monkeypatch):
    with stopped_after_saving():  # right after the checkpoint of step 4
        train(two_epoch_config(tiny_bert, snippets_csv, tmp_path, **BF16))
    assert train(two_epoch_config(tiny_bert, snippets_csv, tmp_path, **BF16))["steps"] == 8
    assert_weights_identical(exported_weights(bf16_run), exported_weights(tmp_path))


@pytest.mark.slow  # a training run, a train step or a subprocess
@pytest.mark.parametrize("explicit", [False, True])
def test_resuming_with_another_param_dtype_is_refused_naming_it(tiny_bert, snippets_csv, bf16_run, explicit):
    settings = {**BF16, "param_dtype": "float32", "resume_from_checkpoint": "4" if explicit else None}
    with pytest.raises(CheckpointMismatch, match='param_dtype: "bfloat16" in the folder'):
        train(two_epoch_config(tiny_bert, snippets_csv, bf16_run, **settings))


def test_trainer_refuses_a_model_whose_parameters_are_not_in_param_dtype(tiny_bert):
    model = flaxheads.from_pretrained(tiny_bert, num_labels=2)
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_bert)
    with pytest.raises(ValueError, match=r"float32 but TrainConfig\(param_dtype='bfloat16'\).*param_dtype='bfloat16'"):
        Trainer(model, TrainConfig(output_dir=None, param_dtype="bfloat16"), tokenizer=tokenizer,
                train_dataset=(["good", "bad"], ["pos", "neg"]))


@pytest.mark.slow  # a training run, a train step or a subprocess
def test_bfloat16_parameters_train_with_pmap_accumulation_and_a_frozen_backbone(tiny_bert, snippets_csv, tmp_path):
    train(two_epoch_config(tiny_bert, snippets_csv, tmp_path, param_dtype="bfloat16", max_steps=2, parallel="pmap",
                  gradient_accumulation_steps=2, per_device_train_batch_size=4, freeze_backbone=True))
    assert _safetensors_dtypes(tmp_path) == {"BF16"}
    frozen = "encoder.layer.0.output.dense.weight"
    np.testing.assert_array_equal(exported_weights(tmp_path)[f"bert.{frozen}"], exported_weights(tiny_bert)[frozen].astype(jnp.bfloat16))


@pytest.mark.slow  # a training run, a train step or a subprocess
def test_llama_trains_with_bfloat16_parameters_and_float32_lora_adapters(tiny_llama, review_csv, tmp_path):
    config = TrainConfig(
        model_name_or_path=str(tiny_llama), train_file=str(review_csv / "train.csv"),
        validation_file=str(review_csv / "validation.csv"), text_column="sentence", output_dir=str(tmp_path),
        max_seq_length=16, per_device_train_batch_size=4, max_steps=3, logging_steps=1, save_steps=3,
        learning_rate=1e-2, disable_tqdm=True, param_dtype="bfloat16", lora_r=4,
        lora_target_modules=("q_proj", "v_proj"),
    )
    model = Trainer.from_config(config).train().model
    adapters = nnx.state(model, nnx.LoRAParam)
    base = nnx.state(model, nnx.All(nnx.Param, nnx.Not(nnx.LoRAParam)))
    assert _dtypes(adapters) == {"float32"} and _dtypes(base) == {"bfloat16"}
    assert any(np.abs(np.asarray(b)).max() > 0 for b in jax.tree.leaves(adapters))  # lora_b starts at zero
    assert _safetensors_dtypes(tmp_path) == {"BF16"}
    reference = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path).eval()
    assert reference.dtype == torch.bfloat16


_FSDP_STATE = textwrap.dedent(
    """
    import sys, jax, optax
    import flaxheads
    from flax import nnx
    from flaxheads.training.optim import make_optimizer
    from flaxheads.training.parallel import JitParallel
    from flaxheads.training.sharding import Layout
    from flaxheads.training.trainable import split_trainable
    layout = Layout.create("fsdp=2")
    model = flaxheads.from_pretrained(sys.argv[1], num_labels=2, dtype="bfloat16", param_dtype="bfloat16",
                                      placement=layout.param_sharding)
    graphdef, params = nnx.split(model)
    trainable, frozen = split_trainable(params)
    schedule = optax.constant_schedule(1e-3)
    state = JitParallel(layout, graphdef, make_optimizer(schedule), schedule, "single_label_classification",
                        trainable, frozen).init(trainable)
    def find(tree):
        return next(x for path, x in jax.tree_util.tree_leaves_with_path(tree)
                    if "layers.0.intermediate.kernel" in jax.tree_util.keystr(path, simple=True, separator="."))
    kernel, mu = find(state.params), find(state.opt_state[1][0].mu)
    print(kernel.dtype, kernel.sharding.spec, mu.dtype, mu.sharding.spec, sep="|")
    """
)


@pytest.mark.slow  # a training run, a train step or a subprocess
def test_fsdp_shards_bfloat16_parameters_and_their_float32_moments_alike_on_two_fake_devices(tiny_bert):
    env = cpu_devices_env(2)
    out = subprocess.run([sys.executable, "-c", _FSDP_STATE, str(tiny_bert)], env=env, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    kernel_dtype, kernel_spec, mu_dtype, mu_spec = out.stdout.strip().splitlines()[-1].split("|")
    print("intermediate kernel and its Adam mu:", out.stdout.strip().splitlines()[-1])
    assert (kernel_dtype, mu_dtype) == ("bfloat16", "float32")
    assert "fsdp" in kernel_spec and kernel_spec == mu_spec
