"""What a head study trains: a grid of cells (checkpoint x head x data set x seed x mode) that
share one set of training settings, so that the cells differ only in what the grid varies.

A cell's identity (`cell_key`) is everything that decides its result: the cell's own choices, the
data's identity (file hashes for a user's files) and the shared settings, less those that only
decide which cells a grid holds (`GRID_ONLY_FIELDS`). The runner skips a cell whose key the
results file already holds, and the report merges lines by it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from flaxheads.names import BUILTIN_DATASET_NAMES

MODES = ("finetune", "probe", "lbfgs", "majority")
"""finetune: backbone and head trained end to end; probe: backbone frozen, only the head trained
(by the Trainer, as fine-tuning); lbfgs: a converged linear probe, logistic (ridge for regression)
regression fitted with L-BFGS on the head's frozen features (`study/probe.py`); majority: the
majority-class baseline (regression: the train mean), no model at all."""
MAJORITY = "majority"
"""The `head` of a majority-class baseline cell."""
ARMS = {"pooler_reinit": "pooler"}
"""Study arms that are a library head run differently: `pooler_reinit` is `pooler` with its
pretrained dense layer replaced by a fresh one (the control separating "pooler" from "pretrained")."""
STUDY_HEADS = ("pooler", "cls", "mean", "concat_last4", "roberta", "summary", "last_token")
"""The heads of the committed study; `pooler`, BERT's own, is the default the others are compared to."""
STUDY_DATASETS = ("movie_snippets", "sms_spam", "trec6", "movie_snippets_regression")
DEFAULT_HEAD = "pooler"
PROBE_HEADS = ("pooler", "cls", "mean")
PROBE_DATASETS = ("movie_snippets",)


@dataclasses.dataclass(frozen=True)
class DataSpec:
    """One data set of the study: a built-in one (`name` only), a user's files, or a Hugging Face
    data set (`dataset_name`). `name` labels it in the tables and plots."""

    name: str
    train_file: str | None = None
    validation_file: str | None = None
    test_file: str | None = None
    dataset_name: str | None = None
    text_column: str = "text"
    text_pair_column: str | None = None
    label_column: str = "label"

    @property
    def builtin(self) -> bool:
        return self.train_file is None and self.dataset_name is None

    def __post_init__(self):
        if self.builtin and self.name not in BUILTIN_DATASET_NAMES:
            raise ValueError(f"data set {self.name!r} is not built in ({', '.join(BUILTIN_DATASET_NAMES)}); for your "
                             f"own files write NAME=TRAIN[,VALIDATION[,TEST]], for a hub data set NAME=hub:ORG/NAME")

    @classmethod
    def parse(cls, text: str, **columns) -> DataSpec:
        """`movie_snippets` (built in), `NAME=train.csv,dev.csv,test.csv` (files; validation and test
        optional) or `NAME=hub:org/name` (a Hugging Face data set); `columns`: text_column etc."""
        name, sep, source = text.partition("=")
        if not sep:
            return cls(name, **columns)
        if source.startswith("hub:"):
            return cls(name, dataset_name=source[4:], **columns)
        files = source.split(",")
        if not 1 <= len(files) <= 3 or not all(files):
            raise ValueError(f"data set {text!r}: write NAME=TRAIN[,VALIDATION[,TEST]] (comma-separated files)")
        train, validation, test = (files + [None, None])[:3]
        return cls(name, train_file=train, validation_file=validation, test_file=test, **columns)

    def identity(self) -> dict[str, Any]:
        """What decides this data's content: the built-in name, the hub name, or each file's
        name and sha256 (so that edited files make new cells), with the columns read."""
        columns = {"text_column": self.text_column, "text_pair_column": self.text_pair_column,
                   "label_column": self.label_column}
        if self.builtin:
            return {"builtin": self.name}
        if self.dataset_name:
            return {"dataset_name": self.dataset_name, **columns}
        files = {"train": self.train_file, "validation": self.validation_file, "test": self.test_file}
        return {"files": {split: {"name": Path(f).name, "sha256": _sha256(f)} for split, f in files.items() if f},
                **columns}


def _sha256(file: str) -> str:
    digest = hashlib.sha256()
    with open(file, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


@dataclasses.dataclass(frozen=True)
class StudySettings:
    """The training settings every cell shares (the 'everything else equal')."""

    max_seq_length: int = 32
    """Longest input in tokens (the data sets here are short: most snippets and questions fit in 32;
    longer SMS messages are cut)."""
    max_steps: int = 60
    """Optimizer steps per cell."""
    batch_size: int = 16
    """Training examples per optimizer step."""
    learning_rate: float = 1e-4
    """Peak AdamW learning rate of fine-tuned cells."""
    probe_learning_rate: float = 1e-3
    """Peak learning rate of linear-probe cells: only a head trains, which wants larger steps."""
    warmup_ratio: float = 0.1
    eval_steps: int = 20
    """Validation metrics every N steps: the learning curve's points."""
    train_examples: int | None = 960
    """Train on this many examples of the train split (a fixed random subset drawn with
    split_seed, the same for every cell); None: the whole split."""
    validation_examples: int | None = 200
    """Score the learning curve and final validation metrics on this fixed random subset of the
    validation split; None: all of it."""
    test_examples: int | None = 500
    """Score the final test metrics on this fixed random subset of the test split (the same rows
    for every cell, so paired comparisons stay fair); None: all of it."""
    max_epochs: float | None = None
    """With it, cells train up to this many passes over the train subset and max_steps is ignored."""
    early_stopping_patience: int | None = None
    """With it, a cell stops after this many evaluations without a better validation metric and
    restores the weights of its best evaluation (TrainConfig load_best_model_at_end)."""
    learning_rates: tuple[float, ...] = ()
    """Candidate learning rates: each fine-tuned (checkpoint, head, data set) first trains once per
    candidate on `lr_search_seeds` and keeps the rate of the best validation metric (validation
    only, seeds outside the study's). Empty: learning_rate for every cell."""
    lr_search_seeds: tuple[int, ...] = (1000,)
    """Seeds of the learning-rate search cells (with learning_rates)."""
    split_seed: int = 0
    """Seed of the built-in data sets' 80/10/10 split and of the subsets: fixed for the study,
    so that cell seeds change the head's initialisation, dropout and data order, never the data."""
    train_options: tuple[tuple[str, Any], ...] = ()
    """Further TrainConfig fields, the same for every cell (e.g. (("dtype", "bfloat16"),))."""

    def __post_init__(self):
        for name in ("max_seq_length", "max_steps", "batch_size", "eval_steps"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        for name in ("train_examples", "validation_examples", "test_examples"):
            if getattr(self, name) is not None and getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive or None (the whole split), got {getattr(self, name)}")
        object.__setattr__(self, "train_options", tuple(sorted(dict(self.train_options).items())))
        object.__setattr__(self, "learning_rates", tuple(float(rate) for rate in self.learning_rates))
        object.__setattr__(self, "lr_search_seeds", tuple(int(seed) for seed in self.lr_search_seeds))

    def learning_rate_for(self, mode: str) -> float:
        return self.probe_learning_rate if mode == "probe" else self.learning_rate

    def to_dict(self) -> dict[str, Any]:
        """The settings as JSON values. Fields added after the first study appear only when they
        differ from their default, so a first-study grid keeps its cell keys (its results resume)."""
        settings = dataclasses.asdict(self)
        settings["train_options"] = dict(self.train_options)
        for name in LATER_FIELDS:
            if getattr(self, name) == _DEFAULTS[name]:
                del settings[name]
            elif isinstance(settings[name], tuple):
                settings[name] = list(settings[name])
        return settings


LATER_FIELDS = ("max_epochs", "early_stopping_patience", "learning_rates", "lr_search_seeds")
"""StudySettings fields the first study (docs/head_study.md, 2026-11) did not have."""
_DEFAULTS = {field.name: field.default for field in dataclasses.fields(StudySettings)}


@dataclasses.dataclass(frozen=True)
class Cell:
    """One training run of the study."""

    checkpoint: str | None
    """A checkpoint folder or hub id; None: the shipped MiniLM."""
    head: str
    data: DataSpec
    seed: int
    mode: str = "finetune"
    learning_rate: float | None = None
    """The fine-tuning rate when the study chooses one per head (learning_rates); None: the settings'."""
    lr_search: bool = False
    """A learning-rate search cell: it only decides the rate of its head's study cells."""

    @property
    def checkpoint_name(self) -> str:
        return self.checkpoint or "all-MiniLM-L6-v2"

    @property
    def library_head(self) -> str:
        """The flaxheads head the cell builds (`ARMS` maps study arms to theirs)."""
        return ARMS.get(self.head, self.head)

    @property
    def trains(self) -> bool:
        """Whether the cell runs the Trainer (the lbfgs and majority cells fit no network)."""
        return self.mode in ("finetune", "probe")


@dataclasses.dataclass(frozen=True)
class Block:
    """The product checkpoints x heads x data sets x seeds x modes."""

    heads: tuple[str, ...]
    datasets: tuple[DataSpec, ...]
    seeds: tuple[int, ...]
    modes: tuple[str, ...] = ("finetune",)
    checkpoints: tuple[str | None, ...] = (None,)

    def __post_init__(self):
        for mode in self.modes:
            if mode not in MODES:
                raise ValueError(f"mode {mode!r}: choose from {', '.join(MODES)}")
        for name in ("heads", "datasets", "seeds", "modes", "checkpoints"):
            if not getattr(self, name):
                raise ValueError(f"a study block needs at least one of {name}")

    def cells(self) -> Iterator[Cell]:
        # Seeds outermost: a study stopped early holds whole seeds of every head, not every seed of some.
        for seed, checkpoint, data, mode, head in itertools.product(
                self.seeds, self.checkpoints, self.datasets, self.modes, self.heads):
            yield Cell(checkpoint, head, data, seed, mode)


@dataclasses.dataclass(frozen=True)
class StudyGrid:
    """Blocks of cells and the settings they share; `cells()` is their union, each cell once."""

    blocks: tuple[Block, ...]
    settings: StudySettings = StudySettings()

    def cells(self) -> list[Cell]:
        seen, cells = set(), []
        for cell in itertools.chain.from_iterable(block.cells() for block in self.blocks):
            if cell not in seen:
                seen.add(cell)
                cells.append(cell)
        return cells


def committed_grid(seeds: Sequence[int] = range(5), settings: StudySettings = StudySettings()) -> StudyGrid:
    """The study behind docs/head_study.md: MiniLM, every study head on the four built-in data sets,
    fine-tuned; plus the linear probe of PROBE_HEADS on PROBE_DATASETS (the same seeds), to compare
    with their fine-tuned cells: 140 + 15 cells.

    Sizing (2026-11-23): one MiniLM cell of the earlier defaults (300 validation and all 1057 test
    examples) took 516 s wall and 116 s of CPU time on the 2-core development machine while ~15
    other processes shared it. Quiet, the README's default run (265 steps of 32 plus 2114 evaluated
    examples in 5-7 min) puts the current defaults (60 steps of 16, 600 + 500 evaluated examples)
    at about 45 s per cell with jax's persistent compilation cache, ~60 s without: 2 h or a little
    more for the 155 cells. The runner prints the pace after every cell; measure the first few
    (`--max_cells 5`) and lower max_steps if it runs slower."""
    builtin = tuple(DataSpec(name) for name in STUDY_DATASETS)
    seeds = tuple(seeds)
    return StudyGrid((
        Block(STUDY_HEADS, builtin, seeds),
        Block(PROBE_HEADS, tuple(DataSpec(name) for name in PROBE_DATASETS), seeds, modes=("probe",)),
    ), settings)


CONVERGED_HEADS = ("pooler", "pooler_reinit", "cls", "mean", "mean_max", "attention", "concat_last4")
CONVERGED_DATASETS = ("movie_snippets", "sms_spam", "trec6")
CONVERGED_SEEDS = tuple(range(12))
CONVERGED_SETTINGS = StudySettings(
    max_seq_length=32, batch_size=16, eval_steps=20, train_examples=640, validation_examples=200,
    test_examples=500, max_epochs=6, early_stopping_patience=3, learning_rates=(3e-5, 1e-4, 3e-4),
    lr_search_seeds=(1000,),
)


def converged_grid(seeds: Sequence[int] = CONVERGED_SEEDS, settings: StudySettings = CONVERGED_SETTINGS) -> StudyGrid:
    """The second study (issue 28): converged cells, 12 seeds, controls. `flaxheads study run
    --grid converged --study_dir studies/minilm-converged` (a new folder: the first study's
    results stay in docs/head_study/ under their own settings).

    - Cells: 7 arms (the first study's pooler/cls/mean/concat_last4, the new mean_max and
      attention, and pooler_reinit, the control for the untrained MiniLM pooler) x 3 data sets x
      12 seeds, fine-tuned: 252 cells; a learning-rate search of 3 rates x 1 seed per arm and
      data set: 63 cells; L-BFGS probes of every arm's frozen features on 3 seeds: 63 fits; one
      majority baseline per data set.
    - Why 3 candidate rates: with 1e-4 and 3e-4 alone, 1e-4 won 17 of the first 18 arms (3e-4
      only `cls` on sms_spam, 0.985 vs 0.980): the best rate sat at the edge of the candidates,
      so 3e-5 joined them (2026-11-25; the cells already run kept their keys, GRID_ONLY_FIELDS).
    - Why 12 seeds: the exact sign-flip test's smallest two-sided p is 2 / 2**n; Holm's first
      step over the 18 comparisons with the default needs p < 0.05 / 18 = 0.0028: 10 seeds
      (0.0020) pass only when every seed agrees, 12 (0.0005) leave room for one or two that do
      not. The first study's power analysis asked for more than 5 seeds everywhere.
    - Why these data: movie_snippets_regression is left out for time (its Pearson r moved least
      with the head); sms_spam stays as the near-ceiling, imbalanced case (majority 0.87).
    - Length: max_seq_length 32 holds most snippets and all trec6 questions (the first study's
      choice); cells pay per step, so shorter sequences would save little (trec6, padded to 16,
      took 42 s against ~51 s for the others at 32).
    - Budget: a cell trains at most 6 epochs of 640 examples = 240 steps of 16, evaluating 200
      validation examples every 20 steps and stopping after 3 evaluations (60 steps) without a
      better one. Why 6 epochs: the first 4 learning-rate search cells run with 3 epochs (120
      steps; 2026-11-25, quiet 2-core CPU) all had their best evaluation at the last step, still
      rising: `pooler` at 1e-4 on movie_snippets went 0.700, 0.750, 0.815, 0.825 at steps 60-120,
      `pooler_reinit` 0.715, 0.725, 0.795, 0.800; the first study's one 240-step trec6 seed brought
      `pooler` level with `mean` (0.940 vs 0.942). Those cells took 57-77 s for 120 steps
      (~0.45 s a step with the evaluations, ~4 s of compilation and scoring): at most
      240 x 0.45 + 4 = 112 s a cell; a head that plateaus by step 100 stops at 160 (~76 s). The
      first 36 search cells took 102 s on average (61-163 s, 174 steps; 30 of 36 stopped early):
      the 315 trained cells take about 315 x 102 s = 8.9 h; the L-BFGS probes ~63 x 8 s = 8 min
      (one forward pass over 1340 examples each). Run it in parts: the runner resumes, and
      --max_cells bounds a session.
    - Converged: a cell's validation curve is read as flat when the best evaluation lies before
      the last quarter of its steps or early stopping ended it; the report counts the cells that
      end on a still-rising curve (`table.unconverged`), so the claim is checked, not assumed.
    """
    builtin = tuple(DataSpec(name) for name in CONVERGED_DATASETS)
    seeds = tuple(seeds)
    return StudyGrid((
        Block(CONVERGED_HEADS, builtin, seeds),
        Block(CONVERGED_HEADS, builtin, seeds[:3], modes=("lbfgs",)),
        Block((MAJORITY,), builtin, seeds[:1], modes=("majority",)),
    ), settings)


GRIDS = {"committed": committed_grid, "converged": converged_grid}
"""The studies `flaxheads study run --grid` names: the first (docs/head_study.md) and the second."""


def cell_key_fields(cell: Cell, settings: StudySettings, data_identity: Mapping[str, Any]) -> dict[str, Any]:
    """Everything that decides a cell's result, as JSON-ready values (the learning rate and the
    search flag only where the study chooses rates, so first-study keys stay as they were)."""
    fields = {"checkpoint": cell.checkpoint_name, "head": cell.head, "dataset": cell.data.name,
              "data": dict(data_identity), "seed": cell.seed, "mode": cell.mode, "settings": settings.to_dict()}
    if cell.learning_rate is not None:
        fields["learning_rate"] = cell.learning_rate
    if cell.lr_search:
        fields["lr_search"] = True
    return fields


GRID_ONLY_FIELDS = ("learning_rates", "lr_search_seeds")
"""StudySettings fields that decide which cells a grid holds, never what a cell computes: a cell
trains at its own learning_rate and seed, both in its key. `cell_key` leaves them out, so a
candidate rate added to a running study keeps the cells already run."""


def cell_key(fields: Mapping[str, Any]) -> str:
    """A stable hash of `cell_key_fields` without GRID_ONLY_FIELDS: equal settings give the same
    key on every machine."""
    settings = {name: value for name, value in fields["settings"].items() if name not in GRID_ONLY_FIELDS}
    keyed = {**fields, "settings": settings}
    return hashlib.sha256(json.dumps(keyed, sort_keys=True, default=str).encode()).hexdigest()[:16]


def cell_dir_name(fields: Mapping[str, Any], key: str) -> str:
    """A readable folder name, unique by its key: `pooler-movie_snippets-s0-finetune-<key>`."""
    readable = f"{fields['head']}-{fields['dataset']}-s{fields['seed']}-{fields['mode']}"
    return f"{re.sub(r'[^A-Za-z0-9_.-]+', '_', readable)}-{key}"
