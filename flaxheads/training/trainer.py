"""Fine-tuning, evaluation and prediction: the library functions behind `flaxheads train |
evaluate | predict`."""

from __future__ import annotations

import dataclasses
import json
import math
import time
from pathlib import Path
from typing import Any, Iterable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from flaxheads import data, problem
from flaxheads.backbones import backbone_spec
from flaxheads.model import SequenceClassifier
from flaxheads.pretrained import from_pretrained, save_pretrained
from flaxheads.shipped_model import minilm_path
from flaxheads.training import metrics as metrics_lib
from flaxheads.training.checkpoints import RunCheckpoints
from flaxheads.training.config import TrainConfig
from flaxheads.training.optim import learning_rate_schedule, make_optimizer
from flaxheads.training.run_log import ProgressBar, RunLogger, format_summary
from flaxheads.training.step import TrainState, make_eval_step, make_train_step


class NonFiniteLoss(FloatingPointError):
    """Training produced a NaN or infinite loss; the last good checkpoint is kept."""


def load_task(cfg: TrainConfig) -> data.TaskData:
    """The data set the config names: local files, a hub data set, or a built-in one."""
    common = dict(
        text_column=cfg.text_column,
        text_pair_column=cfg.text_pair_column,
        label_column=cfg.label_column,
        problem_type=cfg.problem_type,
        num_labels=cfg.num_labels,
    )
    if cfg.train_file:
        return data.load_local_files(
            train_file=cfg.train_file, validation_file=cfg.validation_file, test_file=cfg.test_file, **common
        )
    if cfg.dataset_name:
        return data.load_named_dataset(cfg.dataset_name, **common)
    if cfg.dataset:
        return data.load_builtin(cfg.dataset, seed=cfg.seed)
    raise ValueError("no data: pass --train_file, --dataset_name or --dataset")


def model_path(cfg: TrainConfig) -> Path:
    return Path(cfg.model_name_or_path) if cfg.model_name_or_path else minilm_path()


def _tokenizer(path: Path, model_type: str):
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(path))
    tokenizer.padding_side = backbone_spec(model_type).padding_side
    return tokenizer


@dataclasses.dataclass
class _Layout:
    """Where arrays live: a 1-D data-parallel mesh over every device; parameters replicated."""

    mesh: jax.sharding.Mesh

    @classmethod
    def create(cls) -> "_Layout":
        # Auto axes: XLA propagates shardings through the model; nothing inside needs annotations.
        return cls(jax.make_mesh((jax.device_count(),), ("data",), axis_types=(jax.sharding.AxisType.Auto,)))

    @property
    def replicated(self) -> NamedSharding:
        return NamedSharding(self.mesh, P())

    def batch(self, leading_axes: int) -> NamedSharding:
        """Batch arrays shard their example axis, after `leading_axes` (the accumulation axis)."""
        return NamedSharding(self.mesh, P(*([None] * leading_axes), "data"))

    def put_batch(self, batch: dict[str, np.ndarray], leading_axes: int = 0) -> dict[str, jax.Array]:
        sharding = self.batch(leading_axes)
        return {k: jax.make_array_from_process_local_data(sharding, v) for k, v in batch.items()}


def _accumulation_view(batch: dict[str, np.ndarray], accum: int) -> dict[str, np.ndarray]:
    """(accum * B, ...) -> (accum, B, ...): micro-batch i is rows [i*B, (i+1)*B)."""
    return {k: v.reshape(accum, v.shape[0] // accum, *v.shape[1:]) for k, v in batch.items()}


def _identity(model: SequenceClassifier, task: data.TaskData, cfg: TrainConfig) -> dict[str, Any]:
    c = model.config
    return {
        "backbone": c.backbone.to_hf_config(),
        "head": c.head,
        "num_labels": c.num_labels,
        "problem_type": task.problem_type,
        "global_batch_size": _global_batch(cfg),
        "max_seq_length": cfg.max_seq_length,
    }


def _global_batch(cfg: TrainConfig) -> int:
    return cfg.per_device_train_batch_size * jax.device_count() * cfg.gradient_accumulation_steps


def _best_metric_name(cfg: TrainConfig, problem_type: str) -> str:
    return cfg.metric_for_best_model or ("mse" if problem_type == problem.REGRESSION else "accuracy")


class _Evaluator:
    def __init__(self, graphdef, problem_type: str, layout: _Layout, batch_format, eval_batch_size: int):
        self.problem_type = problem_type
        self.layout = layout
        self.batch_format = batch_format
        self.batch_size = eval_batch_size
        self.step = jax.jit(make_eval_step(graphdef, problem_type))

    def __call__(self, params, split) -> dict[str, float]:
        acc = metrics_lib.MetricAccumulator(self.problem_type)
        for batch in data.eval_batches(
            split, self.batch_format, global_batch_size=self.batch_size,
            process_index=jax.process_index(), process_count=jax.process_count(),
        ):
            out = jax.device_get(self.step(params, self.layout.put_batch(batch)))
            acc.add(out["logits"], batch["labels"], batch["example_mask"], loss=out["loss"])
        return acc.compute()


def train(cfg: TrainConfig = TrainConfig()) -> dict[str, Any]:
    """Fine-tunes, checkpoints and exports; resumes from `cfg.output_dir` when it holds checkpoints.

    Returns {"validation": metrics, "test": metrics, "steps": int, "seconds": float}.
    Raises ValueError for bad data or settings, CheckpointMismatch for an output_dir of another
    run, NonFiniteLoss (naming the step) when the loss stops being finite.
    """
    start_time = time.perf_counter()
    output_dir = Path(cfg.output_dir)
    src = model_path(cfg)
    task = load_task(cfg)
    model, info = from_pretrained(
        src,
        num_labels=task.num_labels,
        head=cfg.head,
        problem_type=task.problem_type,
        id2label=[task.id2label[i] for i in range(task.num_labels)],
        classifier_dropout=cfg.classifier_dropout,
        dtype=cfg.dtype,
        seed=cfg.seed,
        output_loading_info=True,
    )
    tokenizer = _tokenizer(src, model.config.backbone.model_type)
    tokenized = data.tokenize_task(task, tokenizer, cfg.max_seq_length, cache_dir=output_dir / "tokenized")
    batch_format = data.BatchFormat.for_task(task, tokenizer, cfg.max_seq_length)
    layout = _Layout.create()
    global_batch = _global_batch(cfg)
    batches_per_epoch = data.num_batches(len(tokenized["train"]), global_batch)
    total_steps = cfg.max_steps if cfg.max_steps > 0 else math.ceil(cfg.num_train_epochs * batches_per_epoch)
    schedule = learning_rate_schedule(
        cfg.learning_rate, total_steps, math.ceil(cfg.warmup_ratio * total_steps), cfg.lr_scheduler_type
    )
    tx = make_optimizer(
        schedule, weight_decay=cfg.weight_decay, max_grad_norm=cfg.max_grad_norm,
        adam_b1=cfg.adam_beta1, adam_b2=cfg.adam_beta2, adam_eps=cfg.adam_epsilon,
    )
    graphdef, params = nnx.split(model)
    init_state = jax.jit(lambda p: TrainState(jnp.zeros((), jnp.int32), p, tx.init(p)), out_shardings=layout.replicated)
    state = init_state(params)
    del params, model

    log = RunLogger(output_dir)
    checkpoints = RunCheckpoints(output_dir / "checkpoints", max_to_keep=cfg.save_total_limit,
                                 identity=_identity(nnx.merge(graphdef, state.params), task, cfg))
    position = data.DataPosition()
    best = {"metric": _best_metric_name(cfg, task.problem_type), "value": None, "step": None}
    if checkpoints.latest_step() is not None:
        abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state)
        state, meta = checkpoints.restore(abstract)
        position = data.DataPosition.from_dict(meta["data_position"])
        best = meta["best"]
        print(f"resuming from step {int(state.step)} of {total_steps} in {checkpoints.directory}")
    else:
        print(info)

    train_batches = data.TrainBatches(
        tokenized["train"], batch_format, global_batch_size=global_batch, seed=cfg.seed, start=position,
        process_index=jax.process_index(), process_count=jax.process_count(), group_by_length=cfg.group_by_length,
    )
    accum = cfg.gradient_accumulation_steps
    train_step = jax.jit(
        make_train_step(graphdef, tx, schedule, task.problem_type),
        in_shardings=(layout.replicated, layout.batch(1), layout.replicated),
        out_shardings=(layout.replicated, layout.replicated),
        donate_argnums=0,
    )
    evaluate = _Evaluator(graphdef, task.problem_type, layout, batch_format,
                          cfg.per_device_eval_batch_size * jax.device_count())
    rng = jax.random.key(cfg.seed)
    pending: list[tuple[int, dict]] = []

    def flush_pending() -> dict[str, float] | None:
        """Fetches the metrics of the steps run since the last flush; raises on a non-finite loss."""
        if not pending:
            return None
        fetched = jax.device_get([m for _, m in pending])
        for (step, _), m in zip(pending, fetched):
            if not np.isfinite(m["loss"]):
                raise NonFiniteLoss(
                    f"loss became {m['loss']} at step {step}; the last good checkpoint "
                    f"(step {checkpoints.latest_step()}) in {checkpoints.directory} is kept. Lower "
                    "--learning_rate or use --dtype float32"
                )
        pending.clear()
        examples = sum(float(m["examples"]) for m in fetched)
        return {"loss": float(np.mean([m["loss"] for m in fetched])),
                "learning_rate": float(fetched[-1]["learning_rate"]),
                "grad_norm": float(fetched[-1]["grad_norm"]), "examples": examples}

    def save() -> None:
        flush_pending()  # never checkpoint a state whose loss went non-finite
        checkpoints.save(state, {"data_position": train_batches.position.to_dict(), "best": best,
                                 "seed": cfg.seed, "total_steps": total_steps})

    last_eval: dict[str, Any] = {}

    def run_eval(step: int) -> dict[str, float] | None:
        if "validation" not in tokenized:
            return None
        if last_eval.get("step") == step:
            return last_eval["result"]
        result = evaluate(state.params, tokenized["validation"])
        last_eval.update(step=step, result=result)
        log.log(step, "eval", result)
        bar.write(format_summary("eval", step, result))
        value = result.get(best["metric"])
        if value is not None and np.isfinite(value) and (
            best["value"] is None
            or (value > best["value"] if metrics_lib.higher_is_better(best["metric"]) else value < best["value"])
        ):
            best.update(value=float(value), step=step)
            _export(graphdef, state.params, tokenizer, output_dir / "best_model")
        return result

    step = int(jax.device_get(state.step))
    bar = ProgressBar(total_steps, initial=step, disable=cfg.disable_tqdm)
    last_log = time.perf_counter()
    try:
        while step < total_steps:
            batch = _accumulation_view(next(train_batches), accum)
            state, step_metrics = train_step(state, layout.put_batch(batch, leading_axes=1), rng)
            step += 1
            pending.append((step, step_metrics))
            end_of_epoch = train_batches.position.batch_in_epoch == 0
            summary = {}
            if step % cfg.logging_steps == 0 or step == total_steps:
                summary = flush_pending()
                now = time.perf_counter()
                summary["examples_per_second"] = summary.pop("examples") / max(now - last_log, 1e-9)
                last_log = now
                log.log(step, "train", summary)
            bar.update(1, examples=int(batch["example_mask"].sum()), loss=summary.get("loss"),
                       learning_rate=summary.get("learning_rate"))
            if (cfg.eval_steps and step % cfg.eval_steps == 0) or (not cfg.eval_steps and end_of_epoch):
                run_eval(step)
            if step % cfg.save_steps == 0 or step == total_steps:
                save()
        if checkpoints.latest_step() != step:
            save()
        results = {"steps": step}
        if "validation" in tokenized:
            results["validation"] = run_eval(step)
        if "test" in tokenized:
            results["test"] = evaluate(state.params, tokenized["test"])
            log.log(step, "test", results["test"])
            bar.write(format_summary("test", step, results["test"]))
        _export(graphdef, state.params, tokenizer, output_dir)
    finally:
        bar.close()
        log.close()
        checkpoints.close()
    results["best"] = best
    results["seconds"] = time.perf_counter() - start_time
    if jax.process_index() == 0:
        (output_dir / "results.json").write_text(json.dumps(results, indent=2, default=float) + "\n")
    return results


def _export(graphdef, params, tokenizer, directory: Path) -> None:
    """A Hugging Face directory (config with id2label, weights, tokenizer) from process 0."""
    if jax.process_index() != 0:
        return
    model = nnx.merge(graphdef, jax.device_get(params))
    save_pretrained(model, directory)
    tokenizer.save_pretrained(str(directory))


def evaluate(model_dir: str | Path, task: data.TaskData, split: str, *, max_seq_length: int = 128,
             batch_size: int = 64) -> dict[str, float]:
    """Metrics of a saved classifier on one split of `task`."""
    model = from_pretrained(model_dir, num_labels=task.num_labels, problem_type=task.problem_type)
    if split not in task.splits:
        raise ValueError(f"the data has no {split!r} split; it has {sorted(task.splits)}")
    tokenizer = _tokenizer(Path(model_dir), model.config.backbone.model_type)
    tokenized = data.tokenize_split(task.splits[split], tokenizer, max_seq_length)
    batch_format = data.BatchFormat.for_task(task, tokenizer, max_seq_length)
    graphdef, params = nnx.split(model)
    evaluator = _Evaluator(graphdef, task.problem_type, _Layout.create(), batch_format, batch_size)
    return evaluator(params, tokenized)


def predict(model_dir: str | Path, texts: Iterable[str], *, max_seq_length: int = 128,
            batch_size: int = 64) -> list[dict[str, Any]]:
    """For each text: {"text", "label", "probabilities": {label name: p}} (or "score" for regression)."""
    model = from_pretrained(model_dir)
    cfg = model.config
    problem_type = cfg.problem_type or (problem.REGRESSION if cfg.num_labels == 1 else problem.SINGLE_LABEL)
    tokenizer = _tokenizer(Path(model_dir), cfg.backbone.model_type)
    texts = list(texts)
    step = jax.jit(lambda ids, mask, types: model(ids, mask, types))
    out = []
    for start in range(0, len(texts), batch_size):
        chunk = texts[start : start + batch_size]
        enc = tokenizer(chunk, truncation=True, max_length=max_seq_length, padding="longest", return_tensors="np")
        bucket = data.bucket_for(enc["input_ids"].shape[1], data.bucket_lengths(max_seq_length))
        arrays = {k: _pad_to(enc[k], bucket, tokenizer, k) for k in ("input_ids", "attention_mask")}
        types = _pad_to(enc["token_type_ids"], bucket, tokenizer, "token_type_ids") if "token_type_ids" in enc else None
        logits = np.asarray(step(arrays["input_ids"], arrays["attention_mask"], types))
        out += _describe_predictions(chunk, logits, problem_type, cfg.label_names)
    return out


def _pad_to(array: np.ndarray, length: int, tokenizer, name: str) -> np.ndarray:
    """Pads (batch, T) to (batch, length) on the tokenizer's side, so shapes come from few buckets."""
    value = {"input_ids": tokenizer.pad_token_id or 0, "attention_mask": 0}.get(name, 0)
    width = [(0, 0), (0, length - array.shape[1]) if tokenizer.padding_side == "right" else (length - array.shape[1], 0)]
    return np.pad(array, width, constant_values=value)


def _describe_predictions(texts, logits, problem_type, label_names) -> list[dict[str, Any]]:
    probs = metrics_lib.probabilities(problem_type, logits)
    preds = metrics_lib.predictions(problem_type, logits)
    rows = []
    for text, p, pred in zip(texts, probs, preds):
        if problem_type == problem.REGRESSION:
            rows.append({"text": text, "score": float(pred)})
        elif problem_type == problem.MULTI_LABEL:
            rows.append({"text": text, "labels": [n for n, on in zip(label_names, pred) if on],
                         "probabilities": dict(zip(label_names, map(float, p)))})
        else:
            rows.append({"text": text, "label": label_names[int(pred)],
                         "probabilities": dict(zip(label_names, map(float, p)))})
    return rows
