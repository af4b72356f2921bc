"""Fine-tuning, evaluation and prediction: the library functions behind `flaxheads train |
evaluate | predict`."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any, Iterable, NamedTuple

import datasets
import jax
import numpy as np
from flax import nnx
from jax.experimental import multihost_utils

from flaxheads import data, problem
from flaxheads.backbones import backbone_config_from_hf, backbone_spec
from flaxheads.conversion import checkpoint_io
from flaxheads.model import SequenceClassifier
from flaxheads.pretrained import from_pretrained, save_pretrained
from flaxheads.shipped_model import minilm_path
from flaxheads.training import metrics as metrics_lib
from flaxheads.training.checkpoints import RunCheckpoints
from flaxheads.training.config import TrainConfig
from flaxheads.training.optim import learning_rate_schedule, make_optimizer
from flaxheads.training.run_log import ProgressBar, RunLogger, format_summary
from flaxheads.training.distributed import initialize as initialize_distributed
from flaxheads.training.parallel import PARALLEL, host_copy, host_values
from flaxheads.training.sharding import Layout
from flaxheads.training.step import make_eval_step


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
    if tokenizer.pad_token is None and tokenizer.eos_token is not None:
        # GPT-2 ships without a pad token: pad with end-of-text, transformers' documented practice.
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def _checkpoint_tokenizer(path: Path):
    """(tokenizer, pad_token_id to load the model with): the tokenizer's pad id when config.json
    has none (GPT-2), so the "last_token" head can tell padding from text; else None (keep it).

    With pad = eos and right padding, a text that really ends in eos is classified from the token
    before it, exactly as transformers' `GPT2ForSequenceClassification` does.
    """
    hf_config = checkpoint_io.read_config(path)
    tokenizer = _tokenizer(path, hf_config.get("model_type"))
    if backbone_config_from_hf(hf_config).pad_token_id is not None or tokenizer.pad_token_id is None:
        return tokenizer, None
    if jax.process_index() == 0:
        print(f"note: {path} sets no pad_token_id; using the tokenizer's {tokenizer.pad_token!r} "
              f"(id {tokenizer.pad_token_id}), saved with the model")
    return tokenizer, tokenizer.pad_token_id


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
        # Only more than one data shard changes the data order: with one, the identity (and so
        # which existing checkpoints resume) stays as it was before data shards.
        **({"data_shards": cfg.data_shards} if cfg.data_shards > 1 else {}),
    }


def _global_batch(cfg: TrainConfig) -> int:
    """Examples per optimizer step, over every device of every process."""
    return cfg.per_device_train_batch_size * jax.device_count() * cfg.gradient_accumulation_steps


def _check_data_shards(cfg: TrainConfig, task: data.TaskData, train_batch: int, eval_batch: int) -> None:
    """ValueError naming --data_shards unless each process can read only its own shards."""
    shards, processes = cfg.data_shards, jax.process_count()
    if shards % processes:
        raise ValueError(
            f"--data_shards {shards} must be a multiple of the process count {processes}, so that each process "
            f"reads and tokenises only its own shards of the data: set it to {processes} (or a multiple)"
        )
    for name, size in (("train", train_batch), ("eval", eval_batch)):
        if size % shards:
            raise ValueError(
                f"--data_shards {shards} must divide the global {name} batch of {size} examples: each shard "
                "fills an equal part of every batch"
            )
    for name, split in task.splits.items():
        if len(split) < shards:
            raise ValueError(f"--data_shards {shards} is more than the {len(split)} examples of the {name} split")


class _OwnSplit(NamedTuple):
    """A split as this process holds it."""

    rows: datasets.Dataset
    """This process's rows of the split (those of its data shards), tokenised."""
    lengths: np.ndarray
    """Token count of every example of the whole split, the same on every process."""


def _tokenize_own_shards(task: data.TaskData, tokenizer, cfg: TrainConfig, cache_dir: Path) -> dict[str, _OwnSplit]:
    """Every split of `task`, of which this process tokenises only the rows of its data shards."""
    index, count = jax.process_index(), jax.process_count()
    shards = data.process_shards(cfg.data_shards, index, count)
    own, counts = {}, []
    for name, split in task.splits.items():
        rows = data.process_rows(len(split), cfg.data_shards, index, count)
        # The whole split is not re-selected, so that it keeps its tokenisation cache.
        selected = split if len(rows) == len(split) else split.select(rows)
        tokenized = data.tokenize_split(selected, tokenizer, cfg.max_seq_length, cache_dir=cache_dir)
        lengths = _gather_lengths(data.example_lengths(tokenized), len(split), cfg.data_shards)
        own[name] = _OwnSplit(tokenized, lengths)
        counts.append(f"{len(rows)} of {len(split)} {name}")
    print(f"process {index}/{count} tokenized {', '.join(counts)} examples "
          f"(shards {shards.start}-{shards.stop - 1} of {cfg.data_shards})")
    return own


def _gather_lengths(own_lengths: np.ndarray, num_examples: int, num_shards: int) -> np.ndarray:
    """Token counts of every example of a split, from each process's counts of its own rows: a
    collective every process takes part in (a single process holds every row already)."""
    count = jax.process_count()
    if count == 1:
        return own_lengths
    rows_by_process = [data.process_rows(num_examples, num_shards, p, count) for p in range(count)]
    # process_allgather stacks arrays of one shape: each process pads its counts to the longest.
    padded = np.zeros(max(map(len, rows_by_process)), np.int32)
    padded[: len(own_lengths)] = own_lengths
    gathered = np.asarray(multihost_utils.process_allgather(padded))
    lengths = np.empty(num_examples, np.int64)
    for p, rows in enumerate(rows_by_process):
        lengths[rows.start : rows.stop] = gathered[p, : len(rows)]
    return lengths


def _best_metric_name(cfg: TrainConfig, problem_type: str) -> str:
    return cfg.metric_for_best_model or ("mse" if problem_type == problem.REGRESSION else "accuracy")


class _Evaluator:
    """Metrics over a whole split; every process feeds its rows and gets the global result."""

    def __init__(self, graphdef, problem_type: str, layout: Layout, batch_format, eval_batch_size: int,
                 num_shards: int = 1):
        self.problem_type = problem_type
        self.num_shards = num_shards
        self.layout = layout
        self.batch_format = batch_format
        self.batch_size = eval_batch_size
        eval_step = make_eval_step(graphdef, problem_type)

        def step(params, batch):
            # Labels and masks ride along so that, replicated, every process sees all rows.
            return {**eval_step(params, batch), "labels": batch["labels"], "example_mask": batch["example_mask"]}

        self.step = jax.jit(step, out_shardings=layout.replicated)

    def __call__(self, params, rows, lengths: np.ndarray | None = None) -> dict[str, float]:
        """`rows`: the split, or this process's rows of it with `lengths` of the whole split."""
        acc = metrics_lib.MetricAccumulator(self.problem_type)
        for batch in data.eval_batches(
            rows, self.batch_format, global_batch_size=self.batch_size,
            process_index=jax.process_index(), process_count=jax.process_count(),
            num_shards=self.num_shards, lengths=lengths,
        ):
            out = host_values(self.step(params, self.layout.put_batch(batch)))
            acc.add(out["logits"], out["labels"], out["example_mask"], loss=out["loss"])
        return acc.compute()


def train(cfg: TrainConfig = TrainConfig()) -> dict[str, Any]:
    """Fine-tunes, checkpoints and exports; resumes from `cfg.output_dir` when it holds checkpoints.

    Returns {"validation": metrics, "test": metrics, "steps": int, "seconds": float}.
    Raises ValueError for bad data or settings, CheckpointMismatch for an output_dir of another
    run, NonFiniteLoss (naming the step) when the loss stops being finite.
    """
    initialize_distributed(cfg.coordinator_address, cfg.num_processes, cfg.process_id, auto=cfg.distributed)
    start_time = time.perf_counter()
    output_dir = Path(cfg.output_dir)
    src = model_path(cfg)
    task = load_task(cfg)
    global_batch = _global_batch(cfg)
    eval_batch = cfg.per_device_eval_batch_size * jax.device_count()
    _check_data_shards(cfg, task, global_batch, eval_batch)
    tokenizer, pad_token_id = _checkpoint_tokenizer(src)
    layout = Layout.create(cfg.mesh)
    if cfg.parallel not in PARALLEL:
        raise ValueError(f"--parallel {cfg.parallel!r}: choose one of {sorted(PARALLEL)}")
    model, info = from_pretrained(
        src,
        pad_token_id=pad_token_id,
        num_labels=task.num_labels,
        head=cfg.head,
        problem_type=task.problem_type,
        id2label=[task.id2label[i] for i in range(task.num_labels)],
        classifier_dropout=cfg.classifier_dropout,
        dtype=cfg.dtype,
        seed=cfg.seed,
        placement=layout.param_sharding if cfg.parallel == "jit" else None,
        output_loading_info=True,
    )
    tokenized = _tokenize_own_shards(task, tokenizer, cfg, output_dir / "tokenized")
    batch_format = data.BatchFormat.for_task(task, tokenizer, cfg.max_seq_length)
    batches_per_epoch = data.num_batches(len(tokenized["train"].lengths), global_batch)
    total_steps = cfg.max_steps if cfg.max_steps > 0 else math.ceil(cfg.num_train_epochs * batches_per_epoch)
    schedule = learning_rate_schedule(
        cfg.learning_rate, total_steps, math.ceil(cfg.warmup_ratio * total_steps), cfg.lr_scheduler_type
    )
    tx = make_optimizer(
        schedule, weight_decay=cfg.weight_decay, max_grad_norm=cfg.max_grad_norm,
        adam_b1=cfg.adam_beta1, adam_b2=cfg.adam_beta2, adam_eps=cfg.adam_epsilon,
    )
    graphdef, params = nnx.split(model)
    runner = PARALLEL[cfg.parallel](layout, graphdef, tx, schedule, task.problem_type, params)
    state = runner.init(params)
    identity = _identity(model, task, cfg)
    del params, model

    log = RunLogger(output_dir)
    checkpoints = RunCheckpoints(output_dir / "checkpoints", max_to_keep=cfg.save_total_limit, identity=identity)
    position = data.DataPosition()
    best = {"metric": _best_metric_name(cfg, task.problem_type), "value": None, "step": None}
    step = 0
    if checkpoints.latest_step() is not None:
        restored, meta = checkpoints.restore(runner.restore_target(state))
        state = runner.from_restored(restored)
        position = data.DataPosition.from_dict(meta["data_position"])
        best = meta["best"]
        step = checkpoints.latest_step()
        print(f"resuming from step {step} of {total_steps} in {checkpoints.directory}")
    elif jax.process_index() == 0:
        print(info)

    train_batches = data.TrainBatches(
        tokenized["train"].rows, batch_format, global_batch_size=global_batch, seed=cfg.seed, start=position,
        process_index=jax.process_index(), process_count=jax.process_count(), group_by_length=cfg.group_by_length,
        num_shards=cfg.data_shards, lengths=tokenized["train"].lengths,
    )
    accum = cfg.gradient_accumulation_steps
    evaluate = _Evaluator(graphdef, task.problem_type, layout, batch_format, eval_batch, cfg.data_shards)
    rng = jax.random.key(cfg.seed)
    pending: list[tuple[int, dict]] = []

    def flush_pending() -> dict[str, float] | None:
        """Fetches the metrics of the steps run since the last flush; raises on a non-finite loss."""
        if not pending:
            return None
        fetched = host_values([m for _, m in pending])
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
        checkpoints.save(runner.checkpointable(state), step,
                         {"data_position": train_batches.position.to_dict(), "best": best,
                          "seed": cfg.seed, "total_steps": total_steps})

    last_eval: dict[str, Any] = {}

    def run_eval(step: int) -> dict[str, float] | None:
        if "validation" not in tokenized:
            return None
        if last_eval.get("step") == step:
            return last_eval["result"]
        result = evaluate(runner.params(state), *tokenized["validation"])
        last_eval.update(step=step, result=result)
        log.log(step, "eval", result)
        bar.write(format_summary("eval", step, result))
        value = result.get(best["metric"])
        if value is not None and np.isfinite(value) and (
            best["value"] is None
            or (value > best["value"] if metrics_lib.higher_is_better(best["metric"]) else value < best["value"])
        ):
            best.update(value=float(value), step=step)
            _export(graphdef, runner.params(state), tokenizer, output_dir / "best_model", layout)
        return result

    bar = ProgressBar(total_steps, initial=step, disable=cfg.disable_tqdm)
    last_log = time.perf_counter()
    try:
        while step < total_steps:
            batch = _accumulation_view(next(train_batches), accum)
            state, step_metrics = runner.step(state, batch, rng)
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
            results["test"] = evaluate(runner.params(state), *tokenized["test"])
            log.log(step, "test", results["test"])
            bar.write(format_summary("test", step, results["test"]))
        _export(graphdef, runner.params(state), tokenizer, output_dir, layout)
    finally:
        bar.close()
        log.close()
        checkpoints.close()
    results["best"] = best
    results["seconds"] = time.perf_counter() - start_time
    if jax.process_index() == 0:
        (output_dir / "results.json").write_text(json.dumps(results, indent=2, default=float) + "\n")
    return results


def _export(graphdef, params, tokenizer, directory: Path, layout: Layout) -> None:
    """A Hugging Face directory (config with id2label, weights, tokenizer) from process 0.
    Sharded parameters are gathered first, a collective every process takes part in."""
    params = host_copy(params, layout)
    if jax.process_index() != 0:
        return
    model = nnx.merge(graphdef, params)
    save_pretrained(model, directory)
    tokenizer.save_pretrained(str(directory))


def evaluate(model_dir: str | Path, task: data.TaskData, split: str, *, max_seq_length: int = 128,
             batch_size: int = 64) -> dict[str, float]:
    """Metrics of a saved classifier on one split of `task`."""
    tokenizer, pad_token_id = _checkpoint_tokenizer(Path(model_dir))
    model = from_pretrained(model_dir, num_labels=task.num_labels, problem_type=task.problem_type,
                            pad_token_id=pad_token_id)
    if split not in task.splits:
        raise ValueError(f"the data has no {split!r} split; it has {sorted(task.splits)}")
    tokenized = data.tokenize_split(task.splits[split], tokenizer, max_seq_length)
    batch_format = data.BatchFormat.for_task(task, tokenizer, max_seq_length)
    graphdef, params = nnx.split(model)
    evaluator = _Evaluator(graphdef, task.problem_type, Layout.create(), batch_format, batch_size)
    return evaluator(params, tokenized)


def predict(model_dir: str | Path, texts: Iterable[str], *, max_seq_length: int = 128,
            batch_size: int = 64) -> list[dict[str, Any]]:
    """For each text: {"text", "label", "probabilities": {label name: p}} (or "score" for regression)."""
    tokenizer, pad_token_id = _checkpoint_tokenizer(Path(model_dir))
    model = from_pretrained(model_dir, pad_token_id=pad_token_id)
    cfg = model.config
    problem_type = cfg.problem_type or (problem.REGRESSION if cfg.num_labels == 1 else problem.SINGLE_LABEL)
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
