"""jax's persistent compilation cache as the CLI turns it on (flaxheads.compile_cache)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from flaxheads import compile_cache
from flaxheads.cli import build_parser


def test_the_cache_folder_is_the_setting_the_xdg_default_or_none_when_off(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv(compile_cache.ENV_VAR, raising=False)
    assert compile_cache.cache_directory() == tmp_path / "xdg" / "flaxheads" / "jax"
    monkeypatch.setenv(compile_cache.ENV_VAR, str(tmp_path / "mine"))
    assert compile_cache.cache_directory() == tmp_path / "mine"
    assert compile_cache.cache_directory("off") is None and compile_cache.cache_directory("0") is None
    assert compile_cache.cache_directory(str(tmp_path / "flag")) == tmp_path / "flag"


def test_the_size_limit_is_four_gib_unless_the_variable_sets_one_or_none(monkeypatch):
    monkeypatch.delenv(compile_cache.MAX_BYTES_ENV_VAR, raising=False)
    assert compile_cache.max_bytes() == compile_cache.MAX_BYTES == 4 * 1024**3
    monkeypatch.setenv(compile_cache.MAX_BYTES_ENV_VAR, "-1")
    assert compile_cache.max_bytes() == -1
    monkeypatch.setenv(compile_cache.MAX_BYTES_ENV_VAR, "1000000")
    assert compile_cache.max_bytes() == 1_000_000
    for bad in ("4G", "-2"):
        monkeypatch.setenv(compile_cache.MAX_BYTES_ENV_VAR, bad)
        with pytest.raises(ValueError, match="size in bytes, or -1"):
            compile_cache.max_bytes()


def test_the_cli_takes_a_compilation_cache_flag_before_the_command():
    assert build_parser().parse_args(["--compilation_cache", "off", "bench", "e2e"]).compilation_cache == "off"
    assert build_parser().parse_args(["bench"]).compilation_cache is None


_COMPILE_ONCE = textwrap.dedent("""
    import json, sys
    import jax, jax.numpy as jnp
    from flaxheads import compile_cache
    compile_cache.enable(sys.argv[1])
    timer = compile_cache.CompileTimer().start()
    jax.jit(lambda x: jnp.tanh(x @ x.T).sum())(jnp.ones((8, 8))).block_until_ready()
    print(json.dumps(timer.as_dict()))
""")


@pytest.mark.slow  # two subprocesses
def test_a_second_process_loads_every_compilation_from_the_cache_instead_of_compiling(tmp_path):
    def run():
        env = {**os.environ, "JAX_PLATFORMS": "cpu"}
        out = subprocess.run([sys.executable, "-c", _COMPILE_ONCE, str(tmp_path / "cache")], env=env,
                             capture_output=True, text=True, timeout=300, check=True).stdout
        return json.loads(out.strip().splitlines()[-1])

    first, second = run(), run()
    assert first["compilations"] >= 1 and first["cache_hits"] == 0
    assert second["cache_hits"] == second["compilations"] == first["compilations"]


def test_forward_programs_compile_without_ynnpack_fusions_and_give_the_same_logits():
    """On CPU, evaluation and prediction compile with `CPU_OPTIONS["forward"]` (XLA's own fusions,
    faster for a forward pass than jax 0.10's YNNPACK subgraphs), train steps with YNNPACK's
    reductions only; the values stay the same."""
    import jax
    import numpy as np

    if compile_cache.compiler_options("forward") is None:
        pytest.skip("this jax's XLA:CPU has no YNNPACK fusions to turn off")
    w1, w2 = jax.random.normal(jax.random.key(0), (2, 64, 256))
    x = jax.random.normal(jax.random.key(1), (128, 64))

    def layer(x, w1, w2):  # a matmul, its element-wise neighbours, another matmul and a reduction
        h = jax.nn.gelu(x @ w1, approximate=False) @ w2.T
        return (h - h.mean(-1, keepdims=True)) * jax.lax.rsqrt(h.var(-1, keepdims=True) + 1e-12)

    default = jax.jit(layer).lower(x, w1, w2).compile()
    if "__ynn_fusion" not in default.as_text():
        pytest.skip("this jax's XLA:CPU does not fuse this layer with YNNPACK by default")
    expected = np.asarray(default(x, w1, w2))
    forward = compile_cache.forward_jit(layer).lower(x, w1, w2).compile()
    assert "__ynn_fusion" not in forward.as_text()
    np.testing.assert_allclose(np.asarray(forward(x, w1, w2)), expected, atol=1e-5)
    train = compile_cache.train_jit(layer).lower(x, w1, w2).compile()
    assert train.as_text().count("__ynn_fusion") < default.as_text().count("__ynn_fusion")  # no YNNPACK matmuls
    np.testing.assert_allclose(np.asarray(train(x, w1, w2)), expected, atol=1e-5)


def test_the_scorer_evaluates_with_the_forward_options(monkeypatch, hf_checkpoint):
    """`Evaluator` (and so `flaxheads train`'s validation and test scores) jits through
    `forward_jit`, the jit training path its train step through `train_jit`."""
    import optax
    from flax import nnx

    import flaxheads
    from flaxheads.training import parallel, scoring
    from flaxheads.training.optim import make_optimizer
    from flaxheads.training.sharding import Layout

    seen = []
    for kind in ("forward", "train"):
        monkeypatch.setattr(compile_cache, f"{kind}_jit", lambda fun, kind=kind, **kwargs: seen.append(kind) or fun)
    scoring.Evaluator(None, "single_label_classification", Layout.create(), batch_format=None, eval_batch_size=8)
    assert seen == ["forward"]
    graphdef, params = nnx.split(flaxheads.from_pretrained(hf_checkpoint("BertForSequenceClassification").path))
    schedule = optax.constant_schedule(1e-3)
    parallel.JitParallel(Layout.create(), graphdef, make_optimizer(schedule), schedule, "single_label_classification",
                         params)
    assert seen == ["forward", "train"]


def _dot_precisions(lowered_text: str) -> list[str]:
    """The precision of every dot_general in a lowered program's text (StableHLO)."""
    import re

    return re.findall(r"dot_general.*?precision = \[(\w+), \w+\]", lowered_text)


@pytest.mark.slow
@pytest.mark.parametrize(("backend", "setting", "expected"), [
    ("gpu", None, "HIGHEST"), ("tpu", None, "HIGHEST"), ("gpu", "tensorfloat32", "HIGH"), ("gpu", "default", "DEFAULT"),
    ("cpu", None, "DEFAULT"),
])
def test_train_and_eval_programs_multiply_float32_in_float32_on_accelerators(monkeypatch, hf_checkpoint, backend,
                                                                            setting, expected):
    """Every matrix product of a train step (forward and gradients) and of an eval program is
    traced at `FLAXHEADS_MATMUL_PRECISION`'s precision, "highest" unless set, on GPUs and TPUs
    (XLA's default there is TF32 / one bfloat16 pass); on CPUs the programs are left as they are."""
    import jax
    import jax.numpy as jnp
    import optax
    from flax import nnx

    import flaxheads
    from flaxheads.training import parallel
    from flaxheads.training.optim import make_optimizer
    from flaxheads.training.sharding import Layout
    from flaxheads.training.step import make_eval_step

    monkeypatch.setattr(compile_cache, "_backend", lambda: backend)
    if setting is None:
        monkeypatch.delenv(compile_cache.PRECISION_ENV_VAR, raising=False)
    else:
        monkeypatch.setenv(compile_cache.PRECISION_ENV_VAR, setting)
    model = flaxheads.from_pretrained(hf_checkpoint("BertForSequenceClassification").path)
    graphdef, params = nnx.split(model)
    schedule = optax.constant_schedule(1e-3)
    tx = make_optimizer(schedule)
    batch = {"input_ids": jnp.ones((1, 2, 5), jnp.int32), "attention_mask": jnp.ones((1, 2, 5), jnp.int32),
             "token_type_ids": jnp.zeros((1, 2, 5), jnp.int32), "labels": jnp.zeros((1, 2), jnp.int32),
             "example_mask": jnp.ones((1, 2), jnp.float32)}
    state = jax.eval_shape(lambda p: parallel.TrainState(jnp.zeros((), jnp.int32), p, tx.init(p)), params)
    replicated = jax.tree.map(lambda x: jax.ShapeDtypeStruct((1, *x.shape), x.dtype), state)  # pmap: 1 device
    for wrapper, step_state, step_batch in (
        (parallel.JitParallel, state, batch),
        (parallel.PmapParallel, replicated, {k: v[None] for k, v in batch.items()}),
    ):
        steps = wrapper(Layout.create(), graphdef, tx, schedule, "single_label_classification", params)
        lowered = steps._step.lower(step_state, step_batch, jax.random.key(0), nnx.State({}), steps.schedule_values)
        precisions = _dot_precisions(lowered.as_text())
        # forward and backward products of 2 layers, the pooler and the classifier
        assert len(precisions) > 20 and set(precisions) == {expected}, (wrapper.name, precisions)
    forward = compile_cache.forward_jit(make_eval_step(graphdef, "single_label_classification"))
    eval_batch = {k: v[0] for k, v in batch.items()}
    assert set(_dot_precisions(forward.lower(params, eval_batch).as_text())) == {expected}


def test_an_unknown_matmul_precision_is_refused_naming_the_choices(monkeypatch):
    monkeypatch.setattr(compile_cache, "_backend", lambda: "gpu")
    monkeypatch.setenv(compile_cache.PRECISION_ENV_VAR, "tf32")
    with pytest.raises(ValueError, match="FLAXHEADS_MATMUL_PRECISION='tf32' is not one of .*tensorfloat32"):
        compile_cache.precise(lambda x: x)


def _lowered_train_step(schedule, parallel: str = "jit") -> str:
    """The lowered text of a tiny classifier's train step under a runner made with `schedule`."""
    import jax
    import numpy as np
    from flax import nnx

    from flaxheads.backbones import EncoderConfig
    from flaxheads.tasks.classification.model import ClassifierConfig, SequenceClassifier
    from flaxheads.training.optim import make_optimizer
    from flaxheads.training.parallel import PARALLEL
    from flaxheads.training.sharding import Layout

    encoder = EncoderConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                            intermediate_size=24, max_position_embeddings=16)
    config = ClassifierConfig(encoder, head="pooler", num_labels=2)
    graphdef, params = nnx.split(SequenceClassifier(config, rngs=nnx.Rngs(0)))
    runner = PARALLEL[parallel](Layout.create(None), graphdef, make_optimizer(schedule, weight_decay=0.01), schedule,
                                "single_label_classification", params)
    batch = {"input_ids": np.ones((1, 2, 8), np.int32), "attention_mask": np.ones((1, 2, 8), np.int32),
             "token_type_ids": np.zeros((1, 2, 8), np.int32), "labels": np.zeros((1, 2), np.int32),
             "example_mask": np.ones((1, 2), np.float32)}
    if parallel == "pmap":
        batch = {k: v[None] for k, v in batch.items()}
        lowered = runner._step.lower(runner.init(params), batch, jax.random.key(0), runner._frozen_replicas,
                                     runner.schedule_values)
    else:
        lowered = runner._step.lower(runner.init(params), batch, jax.random.key(0), runner.frozen,
                                     runner.schedule_values)
    return lowered.as_text()


@pytest.mark.slow
@pytest.mark.parametrize("parallel", ["jit", "pmap"])
def test_runs_with_other_learning_rates_and_lengths_share_one_train_step_program(parallel):
    """The schedule's numbers are arguments of the train step (`optim.Schedule`), so the persistent
    cache's key (the lowered program) is the same for a run with another `--learning_rate`,
    `--max_steps`, number of epochs or warmup; only the kind of schedule makes another program."""
    from flaxheads.training.optim import learning_rate_schedule

    programs = {_lowered_train_step(learning_rate_schedule(*numbers), parallel)
                for numbers in [(1e-3, 10, 1), (5e-5, 400, 40), (2e-5, 3, 0)]}
    assert len(programs) == 1
    assert _lowered_train_step(learning_rate_schedule(1e-3, 10, 1, "cosine"), parallel) not in programs
