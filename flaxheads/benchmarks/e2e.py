"""`flaxheads bench e2e`: one training job end to end, by flaxheads and by transformers' Trainer.

The job is `flaxheads train`'s default (a `TrainConfig`: the shipped MiniLM on movie_snippets,
seed-42 split, lr 1e-4, 10% warmup, linear decay, weight decay 0.01, clipping 1.0, max length 128,
one epoch of batches of 32 examples: flaxheads packs them, 11 rows of 80 tokens a batch; the
Trainer groups them by length and pads), optionally cut short (`max_steps`,
`max_train_samples`, `max_eval_samples`). Each side runs in a fresh process; `process_s` is from
starting it to its exit, `wall_s` what the row's speed-up compares: the whole process for the
`flaxheads train` command, from loading the model to the test split's scores otherwise:

- flaxheads: the `flaxheads train` command itself (`python -m flaxheads.cli train`, what the
  console script runs, with `--output_dir` a temporary folder and the job's other settings as its
  flags; `run_command`), so with everything the command does beyond training (flag parsing,
  loading the data set by name, the final checkpoint, the best and final exports, the report's
  figures), timed from the process's start to its exit; a job cut to sample limits (which the
  command has no flags for) runs `Trainer.from_config(cfg, task).train()` in a process of this
  module instead. jax's persistent compilation cache is in a folder of this benchmark: empty for the
  first run ("cold"), reused by the second ("warm"), which then compiles nothing.
- transformers: `AutoModelForSequenceClassification` + `Trainer` with `DataCollatorWithPadding`,
  `train_sampling_strategy="group_by_length"` and the same hyperparameters (bf16 autocast with
  dtype bfloat16), no checkpoints, then `evaluate` on validation and test.

Both read the same splits (`flaxheads.tasks.sources.load_task`) and tokenise them themselves. A process of
this module prints one JSON line: wall seconds, train seconds, train examples/s, accuracies; the
command's row comes from its results.json.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from flaxheads import host_memory

SIDES = ("transformers", "flaxheads")


@dataclasses.dataclass(frozen=True)
class E2EJob:
    """The job both sides run: `config`'s data, model and hyperparameters, cut to at most
    `max_train_samples` train and `max_eval_samples` validation and test examples when given."""

    config: dict[str, Any]
    """The TrainConfig fields (as `dataclasses.asdict` gives them)."""
    max_train_samples: int | None = None
    max_eval_samples: int | None = None

    @classmethod
    def default(cls, *, max_steps: int = -1, max_train_samples: int | None = None,
                max_eval_samples: int | None = None, dtype: str = "float32", model: str | None = None,
                max_seq_length: int | None = None) -> E2EJob:
        """`flaxheads train`'s default job with these changes."""
        from flaxheads.training.config import TrainConfig

        changes = dict(max_steps=max_steps, dtype=dtype, model_name_or_path=model)
        if max_seq_length is not None:
            changes["max_seq_length"] = max_seq_length
        return cls(dataclasses.asdict(TrainConfig(**changes)), max_train_samples, max_eval_samples)

    def unpacked(self) -> E2EJob:
        """This job without sequence packing (`flaxheads train --no_packing`): batches of
        per_device_train_batch_size examples grouped by length and padded."""
        return dataclasses.replace(self, config={**self.config, "packing": False})

    def train_config(self):
        from flaxheads.training.config import TrainConfig

        return TrainConfig(**self.config)

    def command_flags(self) -> list[str] | None:
        """The flags that make `flaxheads train` run this job (`--output_dir` aside), or None for a
        job cut to sample limits, which the command cannot express."""
        from flaxheads.training.config import TrainConfig

        if self.max_train_samples is not None or self.max_eval_samples is not None:
            return None
        default, flags = dataclasses.asdict(TrainConfig()), []
        changed = {name: value for name, value in self.config.items() if value != default[name]}
        unknown = set(changed) - set(COMMAND_FLAGS)
        if unknown:
            raise ValueError(f"the e2e job changes {sorted(unknown)}, which command_flags does not spell")
        for name, value in changed.items():
            flags += COMMAND_FLAGS[name](value)
        return flags


COMMAND_FLAGS = {
    "max_steps": lambda value: ["--max_steps", str(value)],
    "dtype": lambda value: ["--dtype", value],
    "model_name_or_path": lambda value: ["--model_name_or_path", value],
    "max_seq_length": lambda value: ["--max_seq_length", str(value)],
    "packing": lambda value: ["--packing" if value else "--no_packing"],
}
"""`flaxheads train` flags for the TrainConfig fields an e2e job may change."""


def load_job_task(job: E2EJob):
    """The splits both sides train and score on."""
    from flaxheads.tasks.sources import load_task

    task = load_task(**job.train_config().data_source())
    limits = {"train": job.max_train_samples, "validation": job.max_eval_samples, "test": job.max_eval_samples}
    splits = {name: split.select(range(min(len(split), limits[name]))) if limits.get(name) else split
              for name, split in task.splits.items()}
    return dataclasses.replace(task, splits=type(task.splits)(splits))


# -- the two sides, each run in its own process ---------------------------------------------------


def run_flaxheads(job: E2EJob) -> dict[str, Any]:
    """A job cut to sample limits, run by the Trainer that `flaxheads train` runs (the command has
    no flags for the limits); the compilation cache is the environment's, as the command's."""
    start = time.perf_counter()
    from flaxheads import compile_cache

    cache = compile_cache.enable()
    timer = compile_cache.CompileTimer().start()
    from flaxheads.tasks.runs import Trainer

    with tempfile.TemporaryDirectory() as output_dir:
        cfg = dataclasses.replace(job.train_config(), output_dir=output_dir, report_to="none", disable_tqdm=True)
        results = Trainer.from_config(cfg, load_job_task(job)).train().metrics
    wall = time.perf_counter() - start
    timer.stop()
    return dict(wall_s=wall, **_result_columns(results), compilation_cache="off" if cache is None else "on",
                **timer.as_dict())


def _result_columns(results: dict[str, Any]) -> dict[str, Any]:
    train_seconds = results["seconds"] - results["eval_seconds"]
    return dict(train_s=train_seconds, train_examples_per_s=results["train_examples"] / train_seconds,
                steps=results["steps"], validation_accuracy=results["validation"]["accuracy"],
                test_accuracy=results["test"]["accuracy"])


def run_command(job: E2EJob, *, env: dict[str, str], cache: str) -> dict[str, Any]:
    """The job as a user runs it: the `flaxheads train` command (`python -m flaxheads.cli`, what
    the console script and `scripts/flaxheads` run) in a fresh process with `env`, its output in a
    temporary folder, jax's compilation cache in `cache`. Its row's wall seconds run from starting
    the process to its exit; `new_cache_entries` counts the executables it compiled and wrote to
    the cache (0: it loaded every one)."""
    before = set(Path(cache).rglob("*"))
    with tempfile.TemporaryDirectory() as output_dir:
        command = [sys.executable, "-m", "flaxheads.cli", "train", "--output_dir", output_dir, *job.command_flags()]
        start = time.perf_counter()
        proc = subprocess.run(command, capture_output=True, text=True,
                              env={**env, "FLAXHEADS_COMPILATION_CACHE": cache})
        wall = time.perf_counter() - start
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(command[2:])} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
        results = json.loads((Path(output_dir) / "results.json").read_text())
    added = [path for path in set(Path(cache).rglob("*")) - before if path.is_file()]
    row = dict(wall_s=wall, **_result_columns(results), compilation_cache="on", new_cache_entries=len(added),
               process_s=wall)
    print(f"e2e flaxheads train: {json.dumps(row)}", file=sys.stderr, flush=True)
    return row


def run_transformers(job: E2EJob) -> dict[str, Any]:
    """The same job with transformers' PyTorch Trainer."""
    start = time.perf_counter()
    import numpy as np
    import transformers

    cfg = job.train_config()
    task = load_job_task(job)
    src = str(cfg.model_folder())
    tokenizer = transformers.AutoTokenizer.from_pretrained(cfg.tokenizer_name or src)
    hf_config = transformers.AutoConfig.from_pretrained(src)
    max_length = min(cfg.max_seq_length, getattr(hf_config, "max_position_embeddings", cfg.max_seq_length))
    pair = task.has_text_pair

    def tokenize(rows):
        texts = (rows["text"], rows["text_pair"]) if pair else (rows["text"],)
        return tokenizer(*texts, truncation=True, max_length=max_length)

    splits = {name: split.map(tokenize, batched=True, remove_columns=[c for c in split.column_names if c != "label"],
                              load_from_cache_file=False)
              for name, split in task.splits.items()}
    model = transformers.AutoModelForSequenceClassification.from_pretrained(
        src, num_labels=task.num_labels, id2label=dict(task.id2label), label2id=task.label2id,
        problem_type=task.problem_type)

    def accuracy(prediction):
        return {"accuracy": float(np.mean(np.argmax(prediction.predictions, -1) == prediction.label_ids))}

    with tempfile.TemporaryDirectory() as output_dir:
        args = training_arguments(cfg, output_dir)
        trainer = transformers.Trainer(model=model, args=args, train_dataset=splits["train"],
                                       data_collator=transformers.DataCollatorWithPadding(tokenizer),
                                       compute_metrics=accuracy)
        train = trainer.train().metrics
        scores = {name: trainer.evaluate(splits[name]) for name in ("validation", "test") if name in splits}
    wall = time.perf_counter() - start
    return dict(wall_s=wall, train_s=train["train_runtime"], train_examples_per_s=train["train_samples_per_second"],
                steps=trainer.state.global_step, validation_accuracy=scores["validation"]["eval_accuracy"],
                test_accuracy=scores["test"]["eval_accuracy"])


def training_arguments(cfg, output_dir: str):
    """transformers' TrainingArguments for the TrainConfig `cfg`: the same hyperparameters, no
    checkpoints, no evaluation during training (the job scores validation and test after it)."""
    import torch
    import transformers

    return transformers.TrainingArguments(
        output_dir=output_dir, per_device_train_batch_size=cfg.per_device_train_batch_size,
        per_device_eval_batch_size=cfg.per_device_eval_batch_size,
        gradient_accumulation_steps=cfg.gradient_accumulation_steps, learning_rate=cfg.learning_rate,
        weight_decay=cfg.weight_decay, adam_beta1=cfg.adam_beta1, adam_beta2=cfg.adam_beta2,
        adam_epsilon=cfg.adam_epsilon, max_grad_norm=cfg.max_grad_norm, num_train_epochs=cfg.num_train_epochs,
        max_steps=cfg.max_steps, warmup_steps=cfg.warmup_steps or cfg.warmup_ratio,
        lr_scheduler_type=cfg.lr_scheduler_type, train_sampling_strategy=cfg.sampling, seed=cfg.seed,
        bf16=cfg.dtype == "bfloat16", eval_strategy="no", save_strategy="no", logging_steps=cfg.logging_steps,
        report_to="none", disable_tqdm=True, dataloader_num_workers=0,
        use_cpu=not torch.cuda.is_available(),  # bf16 autocast on a CPU needs it said
    )


RUNNERS = {"flaxheads": run_flaxheads, "transformers": run_transformers}


# -- the benchmark: both sides in subprocesses ------------------------------------------------------


def run_side(side: str, job: E2EJob, *, env: dict[str, str] | None = None) -> dict[str, Any]:
    """One side's row, run in a fresh Python process (its seconds from start to exit included)
    with `env` (default: this process's environment)."""
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "flaxheads.benchmarks.e2e", side, json.dumps(dataclasses.asdict(job))],
                          capture_output=True, text=True, env=os.environ if env is None else env)
    if proc.returncode != 0:
        raise RuntimeError(f"the {side} side of the e2e benchmark failed (exit {proc.returncode}):\n"
                           f"{proc.stderr[-3000:]}")
    row = dict(json.loads(proc.stdout.strip().splitlines()[-1]), process_s=time.perf_counter() - start)
    print(f"e2e {side}: {json.dumps(row)}", file=sys.stderr, flush=True)  # kept should a later side fail
    return row


def measure(job: E2EJob, *, torch_peer: bool = True, flaxheads_runs: int = 2,
            unpacked_job: E2EJob | None = None, trainer_huge_pages: bool = False,
            rounds: int = 1) -> list[dict[str, Any]]:
    """Rows of `flaxheads bench e2e`: the Trainer (when `torch_peer`), then flaxheads
    `flaxheads_runs` times sharing a compilation cache that starts empty (run 1 cold, then warm),
    then as many runs of `unpacked_job` (when given) with a cache of their own. With `rounds` > 1
    the Trainer and one warm run of each flaxheads job take turns `rounds - 1` times more, so that
    a drift of the machine's speed (±15% over minutes here) reaches both sides alike. Each row's
    speed-up is the Trainer's process seconds in its round over its own: both sides timed from
    starting their process to its exit, as a user runs a script or the command (the Trainer's
    `wall_s` leaves out its interpreter's start and teardown, ~2 s; flaxheads' is the process's).

    flaxheads runs with glibc's huge pages, as `scripts/flaxheads` and the `flaxheads` command
    start it (`host_memory`); the Trainer as a plain `python` runs it, without them, unless
    `trainer_huge_pages`, and then a second Trainer row runs with them too."""
    if rounds < 1:
        raise ValueError(f"rounds={rounds}: give at least 1")
    rows = []
    variants = [("flaxheads", job)] + ([("flaxheads --no_packing", unpacked_job)] if unpacked_job else [])
    with contextlib.ExitStack() as stack:
        caches = [stack.enter_context(tempfile.TemporaryDirectory()) for _ in variants]
        for round_ in range(1, rounds + 1):
            peer = _trainer_rows(job, trainer_huge_pages, round_) if torch_peer else []
            flaxheads = []
            for (name, variant), cache in zip(variants, caches):
                for run in range(flaxheads_runs if round_ == 1 else 1):
                    cold = round_ == 1 and run == 0
                    flaxheads.append(dict(impl=f"{name} ({'cold' if cold else 'warm'} compilation cache)",
                                          round=round_, **_flaxheads_row(variant, cache)))
            trainer_s = peer[0]["process_s"] if peer else None
            rows += [dict(row, speedup_vs_trainer=trainer_s / row["process_s"] if trainer_s else None)
                     for row in peer + flaxheads]
    return [_rounded(dict(bench="e2e", dtype=job.config["dtype"], **row)) for row in rows]


def _trainer_rows(job: E2EJob, huge_pages: bool, round_: int) -> list[dict[str, Any]]:
    """The Trainer as a plain `python` runs it, and with glibc's huge pages when `huge_pages`."""
    rows = [dict(impl="transformers Trainer (PyTorch)", round=round_,
                 **run_side("transformers", job, env=host_memory.without_huge_pages(os.environ)))]
    if huge_pages:
        rows.append(dict(impl="transformers Trainer (PyTorch), glibc huge pages", round=round_,
                         **run_side("transformers", job, env=host_memory.with_huge_pages(os.environ))))
    return rows


def _flaxheads_row(job: E2EJob, cache: str) -> dict[str, Any]:
    """One flaxheads run of `job`, as scripts/flaxheads and the command start it (huge pages)."""
    env = host_memory.with_huge_pages(os.environ)
    if job.command_flags() is not None:
        return run_command(job, env=env, cache=cache)
    return run_side("flaxheads", job, env={**env, "FLAXHEADS_COMPILATION_CACHE": cache})


def _rounded(row: dict[str, Any]) -> dict[str, Any]:
    return {k: round(v, 4 if "accuracy" in k else 2) if isinstance(v, float) else v for k, v in row.items()}


def main(argv: list[str]) -> int:
    side, job = argv
    row = RUNNERS[side](E2EJob(**json.loads(job)))
    print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
