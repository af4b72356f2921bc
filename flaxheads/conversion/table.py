"""Declarative Hugging Face <-> flaxheads parameter mapping, applied with a shape check on every tensor.

A table is a list of `Rule`s: a Hugging Face name pattern, a flaxheads parameter path and a
`Transform`. `{i}` in both stands for a layer index (ALBERT's table names a shared layer by group
`{g}` and layer `{j}` instead) and `{base}` in the Hugging Face name for the base-model prefix
(`"bert."`, or `""` for a bare `BertModel` checkpoint). Nothing is renamed by guessing: a tensor
is converted only if a rule names it.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import string
from typing import Any, Callable, Iterable, Mapping

import numpy as np


@dataclasses.dataclass(frozen=True)
class Transform:
    """How one tensor's layout differs between the two sides. Both directions are exact."""

    name: str
    to_flax: Callable[[np.ndarray], np.ndarray]
    to_hf: Callable[[np.ndarray], np.ndarray]
    hf_shape: Callable[[tuple[int, ...]], tuple[int, ...]]
    """The Hugging Face shape that corresponds to a flaxheads shape."""


ALIGNMENT = 64
"""Bytes. jax on CPU adopts a numpy array aligned to this without copying it (`jax.device_put`);
any other array is copied, so a checkpoint read into unaligned memory briefly lives twice."""


def aligned_empty(shape: tuple[int, ...], dtype) -> np.ndarray:
    """`np.empty`, but starting on an `ALIGNMENT`-byte boundary."""
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    raw = np.empty(nbytes + ALIGNMENT, np.uint8)
    start = -raw.ctypes.data % ALIGNMENT
    return raw[start:start + nbytes].view(dtype).reshape(shape)


def transposed(a: np.ndarray) -> np.ndarray:
    """`a.T` as a new aligned C-contiguous array."""
    out = aligned_empty(a.shape[::-1], a.dtype)
    np.copyto(out, a.T)
    return out


IDENTITY = Transform("identity", lambda a: a, lambda a: a, lambda s: s)
# torch.nn.Linear stores (out, in); Flax kernels are (in, out).
LINEAR = Transform("transpose", transposed, transposed, lambda s: s[::-1])
# transformers' `Conv1D` (GPT, GPT-2) already stores (in, out), like a Flax kernel: no transpose.
CONV1D = Transform("conv1d (in, out) as is", lambda a: a, lambda a: a, lambda s: s)


@dataclasses.dataclass(frozen=True)
class Rule:
    hf: str
    flax: str
    transform: Transform = IDENTITY


def linear(hf: str, flax: str) -> list[Rule]:
    """A torch `nn.Linear` at `hf` <-> a Flax `nnx.Linear` at `flax`."""
    return [Rule(f"{hf}.weight", f"{flax}.kernel", LINEAR), Rule(f"{hf}.bias", f"{flax}.bias")]


def conv1d(hf: str, flax: str) -> list[Rule]:
    """A transformers `Conv1D` at `hf` (weight (in, out)) <-> a Flax `nnx.Linear` at `flax`."""
    return [Rule(f"{hf}.weight", f"{flax}.kernel", CONV1D), Rule(f"{hf}.bias", f"{flax}.bias")]


def token_classification(architecture: str, hf: str = "classifier", head: str = "linear", *rules: Rule) -> TaskTable:
    """A `*ForTokenClassification` whose per-token Linear is `hf` (after the head's own `rules`)."""
    return TaskTable(architecture, head, (*rules, *linear(hf, "classifier")))


def layer_norm(hf: str, flax: str) -> list[Rule]:
    return [Rule(f"{hf}.weight", f"{flax}.scale"), Rule(f"{hf}.bias", f"{flax}.bias")]


def embedding(hf: str, flax: str) -> list[Rule]:
    return [Rule(f"{hf}.weight", f"{flax}.embedding")]


def expand(
    rules: Iterable[Rule], *, num_layers: int = 0, base: str, counts: Mapping[str, int] | None = None
) -> list[Rule]:
    """Concrete rules: `{i}` repeated for every layer, `{base}` filled in.

    `counts`, when given, replaces `num_layers`: how many values each index takes (ALBERT's `{g}`
    groups and `{j}` layers per group); a rule repeats over every combination of the indices it names."""
    counts = {"i": num_layers} if counts is None else counts
    out = []
    for rule in rules:
        named = [name for _, name, _, _ in string.Formatter().parse(rule.hf) if name and name != "base"]
        for values in itertools.product(*(range(counts[name]) for name in named)):
            index = dict(zip(named, values))
            out.append(Rule(rule.hf.format(base=base, **index), rule.flax.format(**index), rule.transform))
    return out


class ShapeMismatch(ValueError):
    """A checkpoint tensor whose shape does not fit the model built from the config."""

    def __init__(self, hf_name: str, got: tuple, expected: tuple, hint: str = ""):
        self.hf_name, self.got, self.expected = hf_name, tuple(got), tuple(expected)
        super().__init__(
            f"{hf_name}: checkpoint has shape {self.got}, the model built from config.json expects "
            f"{self.expected}" + (f"; {hint}" if hint else "")
        )

    def with_hint(self, hint: str) -> "ShapeMismatch":
        return ShapeMismatch(self.hf_name, self.got, self.expected, hint)


def hf_to_flax(
    read: Callable[[str], np.ndarray],
    hf_names: Iterable[str],
    rules: Iterable[Rule],
    flax_shapes: Mapping[str, tuple[int, ...]],
    place: Callable[[str, np.ndarray], Any] | None = None,
) -> tuple[dict[str, Any], list[Rule], list[ShapeMismatch]]:
    """Converts every tensor a rule names. Returns (flax arrays, rules with no tensor, mismatches).

    `read(name)` loads one tensor, so only the tensors that are used are ever read. `place(flax
    path, array)`, when given, takes each converted tensor as soon as it is read (e.g. onto a
    device) and the result holds what it returns: one host tensor at a time, not the model.
    """
    available = set(hf_names)
    arrays, absent, mismatched = {}, [], []
    for rule in rules:
        if rule.hf not in available:
            absent.append(rule)
            continue
        expected = flax_shapes[rule.flax]
        tensor = read(rule.hf)
        if tuple(tensor.shape) != rule.transform.hf_shape(expected):
            mismatched.append(ShapeMismatch(rule.hf, tensor.shape, rule.transform.hf_shape(expected)))
            continue
        converted = rule.transform.to_flax(tensor)
        del tensor  # a transform's copy replaces the read tensor: never both held beyond this line
        arrays[rule.flax] = converted if place is None else place(rule.flax, converted)
    return arrays, absent, mismatched


def flax_to_hf(flax_arrays: Mapping[str, np.ndarray], rules: Iterable[Rule]) -> dict[str, np.ndarray]:
    """Hugging Face tensors for every rule; each flaxheads parameter must be named by exactly one rule."""
    rules = list(rules)
    covered = {r.flax for r in rules}
    if covered != set(flax_arrays):
        stray = sorted(set(flax_arrays) - covered)
        absent = sorted(covered - set(flax_arrays))
        raise ValueError(
            "conversion table and model disagree: "
            f"parameters with no rule {stray[:5]}, rules with no parameter {absent[:5]}"
        )
    out = {}
    for rule in rules:
        array = rule.transform.to_hf(np.asarray(flax_arrays[rule.flax]))
        expected = rule.transform.hf_shape(tuple(flax_arrays[rule.flax].shape))
        if tuple(array.shape) != expected:  # a transform bug, never user input
            raise ShapeMismatch(rule.hf, array.shape, expected)
        out[rule.hf] = array
    return out


SEQUENCE_CLASSIFICATION = "text-classification"
TOKEN_CLASSIFICATION = "token-classification"
MULTIPLE_CHOICE = "multiple-choice"
"""The tasks a model class serves, each by its one name, transformers' pipeline name:
`*ForSequenceClassification` (`SequenceClassifier`) is "text-classification",
`*ForTokenClassification` (`TokenClassifier`) "token-classification", `*ForMultipleChoice`
(`MultipleChoice`) "multiple-choice". `flaxheads.tasks.TASKS` holds what each task is; the
conversion tables name transformers' class of each task by these names."""


@dataclasses.dataclass(frozen=True)
class TaskTable:
    """transformers' class for a task on one family, and its head's tensors: a row of
    `ArchitectureTable.tasks` (text classification's row is made from the table's `heads`)."""

    architecture: str
    """`BertForSequenceClassification`, `BertForTokenClassification`, `RobertaForMultipleChoice`, ..."""
    head: str
    """The flaxheads head that computes the class's head (`heads.HEADS`, `heads.TOKEN_HEADS`,
    `heads.CHOICE_HEADS`)."""
    rules: tuple[Rule, ...]
    """The head's tensors; flax paths relative to the model's `head`, `{base}` as in `backbone`."""
    other_heads: Mapping[str, tuple[Rule, ...]] = dataclasses.field(default_factory=dict)
    """Where the task's model may have another head than the class's (text classification: any
    head of `heads.HEADS`), the rules of those that have some; the others are stored in
    flaxheads' own layout (`head_layout`)."""
    other_architecture: str | None = None
    """The transformers class an export with another head names (the bare model, whose backbone
    transformers loads); None: the task's head is its class's alone."""
    head_classes: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """Other transformers classes of the task on this family, by the head each computes (its
    rules in `other_heads`): XLNet's `XLNetForQuestionAnswering` ("squad") beside
    `XLNetForQuestionAnsweringSimple`. A checkpoint naming one is of the task and loads with its
    head; an export with that head names it."""
    base_prefix: str | None = None
    """The attribute holding the base model in this class, when it is not the table's
    (`LlamaForQuestionAnswering` keeps `transformer` where `LlamaForCausalLM` has `model`)."""


@dataclasses.dataclass(frozen=True)
class ArchitectureTable:
    """Everything conversion needs to know about one Hugging Face architecture.

    Flax paths in `backbone` are relative to the model's `backbone`, those in `heads` to its
    `head`. A head with no entry in `heads` is stored in flaxheads' own layout (`head_layout`).
    """

    model_type: str
    base_prefix: str
    """Attribute holding the base model in `*ForSequenceClassification` (`"bert"` -> `"bert."` keys)."""
    base_architecture: str
    classification_architecture: str
    canonical_head: str
    """The head transformers' `*ForSequenceClassification` uses; the default when loading."""
    backbone: tuple[Rule, ...]
    heads: Mapping[str, tuple[Rule, ...]]
    pooler: tuple[Rule, ...] = ()
    """The base model's own pooler, for a standalone backbone (`load_backbone`)."""
    nsp_classifier: tuple[Rule, ...] = ()
    """Rules that fill a 2-label "pooler" head's classifier from a pretraining checkpoint's NSP head."""
    loading_notes: tuple[str, ...] = ()
    """Said in every loading info of this architecture (e.g. parameters kept but never used)."""
    own_head_prefix: str = "head."
    """Where `head_layout` stores the heads this architecture has no table rules for; another prefix
    where transformers' own classes already use `head.` (ModernBERT's prediction head)."""
    layer_indices: Mapping[str, str] = dataclasses.field(default_factory=lambda: {"i": "num_hidden_layers"})
    """Each index the `backbone` rules name -> the backbone config field that counts its values,
    outermost first (ALBERT names a shared layer by group `{g}`, then layer `{j}` in the group)."""
    tasks: Mapping[str, TaskTable] = dataclasses.field(default_factory=dict)
    """Each other task (by its name: TOKEN_CLASSIFICATION, MULTIPLE_CHOICE, ...) -> the family's
    transformers class for it; a task transformers has no class for on this family is absent.
    Text classification's row is made from `classification_architecture`, `canonical_head` and
    `heads` (`task_tables`)."""

    def is_canonical(self, head: str) -> bool:
        """Whether transformers' `*ForSequenceClassification` holds exactly this head."""
        return head == self.canonical_head

    @property
    def task_tables(self) -> Mapping[str, TaskTable]:
        """Every task this family has a transformers class for, by the task's name: the row the
        text-classification heads make, and `tasks`."""
        text = TaskTable(self.classification_architecture, self.canonical_head,
                         tuple(self.heads.get(self.canonical_head, ())), other_heads=self.heads,
                         other_architecture=self.base_architecture)
        return {SEQUENCE_CLASSIFICATION: text, **self.tasks}

    def task(self, task: str) -> TaskTable:
        """The family's table for `task`; ValueError when transformers has no class for it."""
        if task not in self.task_tables:
            have = sorted(self.task_tables)
            raise ValueError(
                f"model_type {self.model_type!r} has no {task} model in transformers (its tasks: {', '.join(have)}), "
                "so flaxheads has none either"
            )
        return self.task_tables[task]

    def default_head(self, task: str, architectures: Iterable[str] = ()) -> str:
        """The head transformers' class for `task` computes, or that of another class of the task
        `architectures` (config.json's) name (`TaskTable.head_classes`); ValueError as `task`."""
        table = self.task(task)
        return next((head for head, name in table.head_classes.items() if name in (architectures or ())), table.head)

    def architecture(self, task: str, head: str) -> str:
        """The transformers class an export of a `task` model with `head` names in config.json."""
        table = self.task(task)
        if head in table.head_classes:
            return table.head_classes[head]
        if head == table.head or table.other_architecture is None:
            return table.architecture
        return table.other_architecture

    def head_rules(self, task: str, head: str) -> tuple[Rule, ...] | None:
        """The rules of a `task` model's `head` (None: stored in flaxheads' own layout)."""
        table = self.task(task)
        return table.rules if head == table.head else table.other_heads.get(head)

    def task_of(self, architecture: str) -> str | None:
        """The task of this family's transformers class `architecture`; None for a class of no
        task (the bare model, a pretraining head)."""
        return next((task for task, t in self.task_tables.items()
                     if architecture == t.architecture or architecture in t.head_classes.values()), None)

    def base_prefix_of(self, task: str) -> str:
        """The attribute holding the base model in the family's transformers class for `task`."""
        return self.task(task).base_prefix or self.base_prefix

    @property
    def base_prefixes(self) -> tuple[str, ...]:
        """Every attribute the family's transformers classes hold the base model in, the table's first."""
        return tuple(dict.fromkeys((self.base_prefix, *(t.base_prefix for t in self.tasks.values() if t.base_prefix))))

    def index_counts(self, backbone_config: Any) -> dict[str, int]:
        """How many values each index of the backbone rules takes for a model of `backbone_config`."""
        return {index: getattr(backbone_config, field) for index, field in self.layer_indices.items()}


def head_layout(head_flax_paths: Iterable[str], prefix: str = "head.") -> list[Rule]:
    """flaxheads' own layout for heads transformers has no class for.

    Every Linear at head path `P` is stored as `head.P.weight` (out, in) and `head.P.bias`, a
    LayerNorm as `head.P.weight` (its scale) and `head.P.bias`,
    i.e. in torch's layout under a `head.` prefix (`prefix`), so the file stays a valid PyTorch
    state dict and a transformers `*Model` loads the backbone from it, ignoring the head.
    """
    rules = []
    for path in sorted(head_flax_paths):
        module, leaf = path.rsplit(".", 1)
        if leaf == "kernel":
            rules.append(Rule(f"{prefix}{module}.weight", path, LINEAR))
        elif leaf == "bias":
            rules.append(Rule(f"{prefix}{module}.bias", path))
        elif leaf == "scale":  # a LayerNorm (the "modernbert" head's): torch calls it weight
            rules.append(Rule(f"{prefix}{module}.weight", path))
        else:
            raise ValueError(f"flaxheads head layout has no rule for parameter {path!r}")
    return rules
