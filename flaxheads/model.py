"""A backbone and a head: the sequence classifier users load, train, call and save.

The module itself (`SequenceClassifier`) is model code; its `from_pretrained`, `save_pretrained`
and `with_lora` (`PretrainedModel`, which the other tasks' models in `token_classifier.py` and
`multiple_choice.py` share, with the label names of `LabelNames`) are the loader's and the peft
format's functions, which are generic over the model class (`cls.config_class` reads
config.json), so this module imports `conversion` and never the other way round.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from flaxheads import lora, problem
from flaxheads import thresholds as thresholds_lib
from flaxheads.backbones import BackboneConfig, backbone_config_from_hf, build_backbone, segments
from flaxheads.conversion import loading, peft
from flaxheads.conversion.loading import load_backbone
from flaxheads.conversion.loading_info import LoadingInfo
from flaxheads.conversion.table import SEQUENCE_CLASSIFICATION
from flaxheads.heads import HEAD_NAMES, HEADS, HeadBuilder, HeadConfig, HeadInputs, build_head

FLAXHEADS_CONFIG_KEY = "flaxheads"
"""config.json section recording what transformers' config cannot: the head, its options, and a
problem type transformers does not know (`pairwise_reward`: config.json's own is left unset)."""


class LabelNames:
    """The label names of a config with `num_labels` and `labels` fields, as transformers spells them."""

    num_labels: int
    labels: tuple[str, ...] | None

    @property
    def label_names(self) -> tuple[str, ...]:
        """The name of each class id, in id order."""
        return self.labels or tuple(f"LABEL_{i}" for i in range(self.num_labels))

    @property
    def id2label(self) -> dict[int, str]:
        """{class id: name}, int keys, as transformers' `PretrainedConfig.id2label`."""
        return dict(enumerate(self.label_names))

    @property
    def label2id(self) -> dict[str, int]:
        """{name: class id}, as transformers' `PretrainedConfig.label2id`."""
        return {name: i for i, name in enumerate(self.label_names)}

    def hf_labels(self) -> dict[str, Any]:
        """num_labels, id2label and label2id as config.json holds them (str ids)."""
        return dict(num_labels=self.num_labels, id2label={str(i): name for i, name in enumerate(self.label_names)},
                    label2id=self.label2id)


def resolve_labels(
    hf: dict[str, Any],
    *,
    num_labels: int | None,
    id2label: Sequence[str] | Mapping[int, str] | None,
    label2id: Mapping[str, int] | None,
) -> tuple[int, tuple[str, ...] | None]:
    """(num_labels, label names or None) from the caller's settings over config.json's `hf`:
    `id2label` / `label2id` set num_labels when it is not given; config.json's names are kept
    when their count is the one in effect."""
    saved_names = label_names_from(hf.get("id2label"), hf.get("label2id"), source="config.json")
    names = label_names_from(id2label, label2id)
    if num_labels is None:
        num_labels = len(names) if names else len(saved_names) if saved_names else hf.get("num_labels", 2)
    if names is None and saved_names is not None and len(saved_names) == num_labels:
        names = saved_names
    return num_labels, (tuple(names) if names else None)


@dataclasses.dataclass(frozen=True)
class SavedClasses:
    """What a saved sequence classifier's config.json says of its classes."""

    names: tuple[str, ...]
    """In id order: id2label's names, else LABEL_0, LABEL_1, ..."""
    problem_type: str | None
    """config.json's (or its flaxheads section's); None: not recorded."""


def saved_task_config(model_dir, task: str) -> dict[str, Any] | None:
    """config.json of the model saved in `model_dir` when it is a model of `task`: its
    architectures name that task's transformers class (or, for sequence classification, it names
    a flaxheads head on the bare backbone class); None for another model, or a folder that is not
    a readable model (loading it says what is wrong, in its own words)."""
    from flaxheads.conversion import TABLES, checkpoint_io
    from flaxheads.conversion.hub import resolve_checkpoint

    try:
        hf = checkpoint_io.read_config(resolve_checkpoint(model_dir))
    except (OSError, ValueError):
        return None
    table = TABLES.get(hf.get("model_type"))
    if table is None:
        return None
    if task == SEQUENCE_CLASSIFICATION and "head" in (hf.get(FLAXHEADS_CONFIG_KEY) or {}):
        return hf
    return hf if any(table.task_of(name) == task for name in hf.get("architectures") or ()) else None


def saved_label_names(hf: Mapping[str, Any]) -> tuple[str, ...]:
    """The labels of a saved config.json in id order: its id2label, else LABEL_0, LABEL_1, ..."""
    num_labels, names = resolve_labels(hf, num_labels=None, id2label=None, label2id=None)
    return names or tuple(f"LABEL_{i}" for i in range(num_labels))


def saved_classes(model_dir) -> SavedClasses | None:
    """The classes of the sequence classifier saved in `model_dir` (`saved_task_config`); None
    for another model or an unreadable folder."""
    hf = saved_task_config(model_dir, SEQUENCE_CLASSIFICATION)
    if hf is None:
        return None
    return SavedClasses(saved_label_names(hf),
                        hf.get("problem_type") or (hf.get(FLAXHEADS_CONFIG_KEY) or {}).get("problem_type"))


@dataclasses.dataclass(frozen=True)
class ClassifierConfig(LabelNames):
    task: ClassVar[str] = SEQUENCE_CLASSIFICATION
    """What `from_pretrained` loads this config's models for (the loader picks transformers' class by it)."""

    backbone: BackboneConfig
    head: str
    num_labels: int = 2
    problem_type: str | None = None
    """None: inferred from the labels on first use, as transformers does."""
    labels: tuple[str, ...] | None = None
    """Label names by class id; None means LABEL_0, LABEL_1, ... (see `id2label`, `label2id`)."""
    classifier_dropout: float | None = None
    """Dropout before the classifier; None: the backbone's own default (as transformers)."""
    head_options: tuple[tuple[str, Any], ...] = ()
    text_pair: bool = False
    """Trained on text pairs (premise, hypothesis): `predict` and the pipeline then need a second
    text for every text. Recorded in config.json's "flaxheads" section."""
    thresholds: tuple[float, ...] | None = None
    """Multi-label only: each label's decision threshold on its sigmoid probability (tuned on
    validation data by `TrainConfig.tune_thresholds`); None: 0.5 for every label. Recorded in
    config.json's "flaxheads" section as {label name: threshold}."""

    def __post_init__(self):
        if self.head not in HEAD_NAMES:
            raise ValueError(f"unknown head {self.head!r}; choose one of {HEAD_NAMES}")
        if self.num_labels < 1:
            raise ValueError(f"num_labels must be >= 1, got {self.num_labels}")
        problem.check_problem_type(self.problem_type, self.num_labels)
        if self.labels is not None and len(self.labels) != self.num_labels:
            raise ValueError(
                f"id2label has {len(self.labels)} names but num_labels={self.num_labels}; "
                "give one name per label"
            )
        self._check_options_the_backbone_shares()
        if self.thresholds is not None:
            if self.problem_type != problem.MULTI_LABEL:
                raise ValueError(f"decision thresholds are for {problem.MULTI_LABEL}, and this model's problem type "
                                 f"is {self.problem_type}: leave thresholds out")
            object.__setattr__(self, "thresholds", thresholds_lib.check(self.thresholds, self.num_labels))

    def _check_options_the_backbone_shares(self) -> None:
        """ValueError when `head_options` change a field the backbone's own layers read too
        (ModernBERT's norm_eps, norm_bias): config.json has one value for both, so the export
        could not describe the head and the backbone at once."""
        defaults = getattr(self.backbone, f"{self.head}_options", None) or {}
        for name, value in self.head_options:
            shared = name in getattr(self.backbone, "head_options_shared_with_layers", ())
            if shared and name in defaults and value != defaults[name]:
                raise ValueError(
                    f"head option {name}={value!r} differs from the backbone's {name}={defaults[name]!r}, and "
                    f"{self.backbone.model_type}'s config.json has one {name} for both; leave {name} out of "
                    "head_options (the head then uses the backbone's)"
                )

    def decision_thresholds(self) -> dict[str, float] | None:
        """{label name: threshold} a multi-label model decides with (`thresholds`, else 0.5 each);
        None for other problem types."""
        if self.problem_type != problem.MULTI_LABEL:
            return None
        return dict(zip(self.label_names, self.thresholds or (thresholds_lib.DEFAULT,) * self.num_labels))

    def head_config(self) -> HeadConfig:
        b = self.backbone
        dropout = b.default_classifier_dropout if self.classifier_dropout is None else self.classifier_dropout
        return HeadConfig(
            name=self.head,
            hidden_size=b.hidden_size,
            num_labels=self.num_labels,
            dropout_rate=dropout,
            init_std=b.initializer_range,
            num_hidden_layers=b.num_hidden_layers,
            pad_token_id=b.pad_token_id,
            options=tuple(sorted(self.head_options_in_effect().items())),
        )

    def head_options_in_effect(self) -> dict[str, Any]:
        """`head_options` over the defaults the backbone's config.json sets for this head (a
        backbone config may expose them as `<head>_options`: XLNet's `summary_options`, DeBERTa's
        `deberta_options`)."""
        defaults = getattr(self.backbone, f"{self.head}_options", {})
        return {**defaults, **dict(self.head_options)}

    @classmethod
    def from_hf_config(
        cls,
        hf: dict[str, Any],
        *,
        default_head: str,
        head: str | None = None,
        num_labels: int | None = None,
        problem_type: str | None = None,
        id2label: Sequence[str] | Mapping[int, str] | None = None,
        label2id: Mapping[str, int] | None = None,
        classifier_dropout: float | None = None,
        head_options: dict[str, Any] | None = None,
    ) -> "ClassifierConfig":
        """Reads a Hugging Face config.json dict; keyword arguments override what it says
        (`head_options` key by key, over those a flaxheads export recorded).

        `id2label` is a list of names or an {id: name} dict (int or str ids 0..n-1), `label2id`
        a {name: id} dict; either sets num_labels when that is not given."""
        saved = hf.get(FLAXHEADS_CONFIG_KEY, {})
        saved_names = label_names_from(hf.get("id2label"), hf.get("label2id"), source="config.json")
        num_labels, names = resolve_labels(hf, num_labels=num_labels, id2label=id2label, label2id=label2id)
        problem_type = next((p for p in (problem_type, hf.get("problem_type"), saved.get("problem_type"))
                             if p is not None), None)
        return cls(
            backbone=backbone_config_from_hf(hf),
            head=head or saved.get("head") or default_head,
            num_labels=num_labels,
            problem_type=problem_type,
            labels=names,
            classifier_dropout=classifier_dropout,
            head_options=tuple(sorted({**saved.get("head_options", {}), **(head_options or {})}.items())),
            text_pair=bool(saved.get("text_pair", False)),
            thresholds=(_saved_thresholds(saved.get("thresholds"), saved_names, names)
                        if problem_type == problem.MULTI_LABEL else None),
        )

    def to_hf_config(self, architecture: str) -> dict[str, Any]:
        backbone = self.backbone
        own_options = getattr(backbone, f"{self.head}_options", None)
        if own_options is not None:
            # transformers reads the head's options from the top level of config.json (XLNet's
            # summary_*, DeBERTa's pooler_*): the backbone's config writes them, with the values in effect.
            in_effect = self.head_options_in_effect()
            backbone = dataclasses.replace(backbone, **{k: in_effect[k] for k in own_options})
        hf = backbone.to_hf_config()
        hf.update(
            architectures=[architecture],
            **self.hf_labels(),
            problem_type=self.problem_type if self.problem_type in problem.HF_PROBLEM_TYPES else None,
        )
        # None means "the backbone's own"; writing None here would erase that value on export.
        # ALBERT names the field classifier_dropout_prob (`classifier_dropout_key`).
        hf[getattr(self.backbone, "classifier_dropout_key", "classifier_dropout")] = (
            self.backbone.classifier_dropout if self.classifier_dropout is None else self.classifier_dropout
        )
        hf[FLAXHEADS_CONFIG_KEY] = {"head": self.head, "head_options": dict(self.head_options)}
        if self.text_pair:
            hf[FLAXHEADS_CONFIG_KEY]["text_pair"] = True
        if self.thresholds is not None:
            hf[FLAXHEADS_CONFIG_KEY]["thresholds"] = dict(zip(self.label_names, self.thresholds))
        if self.problem_type not in (None, *problem.HF_PROBLEM_TYPES):
            hf[FLAXHEADS_CONFIG_KEY]["problem_type"] = self.problem_type
        return hf


def _saved_thresholds(saved, saved_names, names) -> tuple[float, ...] | None:
    """The thresholds config.json's "flaxheads" section records by label name, in the order of
    the model's labels; None when it records none, or when the model is loaded with other labels
    (thresholds tuned for other classes, or another number of them, mean nothing for these). ValueError for a record that names other
    labels than config.json's id2label."""
    if not saved:
        return None
    if saved_names is None or set(saved) != set(saved_names):
        raise ValueError(f"config.json's flaxheads.thresholds name the labels {sorted(saved)}, but its id2label "
                         f"has {sorted(saved_names or [])}: give one threshold per label of id2label, or remove "
                         "flaxheads.thresholds (0.5 for every label)")
    if names is None or tuple(names) != tuple(saved_names):
        return None
    return tuple(saved[name] for name in saved_names)


def label_names_from(
    id2label: Sequence[str] | Mapping[int | str, str] | None,
    label2id: Mapping[str, int | str] | None = None,
    *,
    source: str = "",
) -> list[str] | None:
    """Label names in id order from transformers' `id2label` (a list, or a dict with int or str
    ids) or, when that is empty, `label2id`; None when neither is given.

    Raises ValueError when the ids are not 0..n-1, or the two disagree."""
    where = f" in {source}" if source else ""
    from_id2label = _names_by_id(id2label, "id2label" + where) if id2label else None
    from_label2id = (
        _names_by_id({i: name for name, i in label2id.items()}, "label2id" + where) if label2id else None
    )
    if from_id2label and from_label2id and from_id2label != from_label2id:
        if source:  # transformers keeps config.json's id2label, whatever its label2id says
            return from_id2label
        raise ValueError(
            f"id2label {dict(enumerate(from_id2label))} and label2id {dict(label2id)} disagree; pass one of them"
        )
    return from_id2label or from_label2id


def _names_by_id(by_id: Sequence[str] | Mapping[int | str, str], what: str) -> list[str]:
    if isinstance(by_id, Mapping):
        ids = {int(i) if isinstance(i, str) and i.isdigit() else i: name for i, name in by_id.items()}
        if set(ids) != set(range(len(ids))):
            raise ValueError(f"{what} has ids {sorted(by_id, key=str)}; the ids must be 0..{len(ids) - 1}")
        return [ids[i] for i in range(len(ids))]
    return list(by_id)


class PretrainedModel:
    """What every flaxheads model (`SequenceClassifier`, `TokenClassifier`, `MultipleChoice`)
    shares: a `config` with a `backbone`, a `backbone` module, loading (`from_pretrained`, the
    loader's, which reads config.json into `config_class` and picks transformers' class of the
    config's `task`), saving and LoRA."""

    head_registry: ClassVar[Mapping[str, HeadBuilder]] = HEADS
    """Where `config.head_config().name` is looked up: sequence heads, token heads, choice heads."""

    def __init__(self, config, *, dtype=jnp.float32, param_dtype=jnp.float32, rngs: nnx.Rngs):
        self.config = config
        self.backbone = build_backbone(config.backbone, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.head = build_head(config.head_config(), registry=type(self).head_registry, dtype=dtype,
                               param_dtype=param_dtype, rngs=rngs)
        self.skip_unread_positions = True
        """Run the backbone's last layer only where the head reads it (`runs_last_layer_at`)."""

    # The loader's own function, so its signature and docstring live in one place: the classmethod
    # builds whichever class it is called on (`cls.config_class` reads config.json).
    from_pretrained = classmethod(loading.from_pretrained)

    def save_pretrained(self, path, *, format: str = "pytorch", tokenizer=None, replaces=()) -> None:
        """`flaxheads.save_pretrained(self, path, ...)`: see there."""
        save_pretrained(self, path, format=format, tokenizer=tokenizer, replaces=replaces)

    def with_lora(self, config: lora.LoRAConfig, *, seed: int = 0):
        """A copy whose backbone Linears named by `config.target_modules` (peft's names: Hugging
        Face module names, or "all-linear") carry fresh LoRA adapters; this model is left as it
        is and shares its weights with the copy. ValueError naming the Linears there are when a
        name matches none (`conversion.peft.resolve_targets`)."""
        targets = peft.resolve_targets(self.config, config.target_modules)
        return lora.add_adapters(self, config, [t.flax_module for t in targets], seed=seed)

    def backbone_states(self, input_ids, attention_mask=None, token_type_ids=None, position_ids=None, *,
                        segment_ids=None, last_layer_positions=None, rngs: nnx.Rngs | None = None):
        """The backbone's `BackboneOutput` for (batch, seq) inputs, LoRA dropout keyed by `rngs`;
        ValueError for concrete ids outside the vocabulary (`check_input_ids`). No mask: every
        token is real. `last_layer_positions` (batch, P), for a backbone that can
        (`runs_last_layer_at`): its last layer runs at those positions only, and the last hidden
        state is valid there only."""
        check_input_ids(input_ids, getattr(self.config.backbone, "vocab_size", None))
        backbone_mask = jnp.ones_like(input_ids) if attention_mask is None else attention_mask
        options = {} if last_layer_positions is None else {"last_layer_positions": last_layer_positions}
        with lora.adapter_dropout_key(lora.lora_config(self), rngs):  # LoRA layers take no rngs argument
            return self.backbone(input_ids, backbone_mask, token_type_ids, position_ids, segment_ids=segment_ids,
                                 rngs=rngs, **options)

    def runs_last_layer_at(self, head_inputs: HeadInputs) -> jax.Array | None:
        """The (batch, P) positions to run the backbone's last layer at, or None for all of them.

        Positions when the head reads the last layer there only (its `last_layer_positions`), the
        backbone can run its last layer at some positions (`LAST_LAYER_AT_POSITIONS`), and no
        LoRA adapter dropout draws masks shaped by the sequence. The skipped positions' queries,
        feed-forward and norms change nothing the head reads, so logits and gradients equal the
        full computation's (to float32 rounding; dropout drops the same units). A first-token
        head on a 6-layer encoder skips ~1/7 of the step's dense work. `skip_unread_positions =
        False` on the model turns it off."""
        reads = getattr(self.head, "last_layer_positions", None)
        if not (self.skip_unread_positions and reads and getattr(self.backbone, "LAST_LAYER_AT_POSITIONS", False)):
            return None
        adapters = lora.lora_config(self)
        if adapters is not None and adapters.dropout:
            return None
        return reads(head_inputs)


class SequenceClassifier(PretrainedModel, nnx.Module):
    """backbone -> head -> logits.

    Train/eval mode the NNX way: built in train mode (dropout on); `model.eval()` turns every
    dropout off and `model.train()` back on (`from_pretrained` returns an eval-mode model).
    `dtype` is the compute dtype (bfloat16 allowed), `param_dtype` the storage dtype; logits are
    returned as float32 whatever the compute dtype.
    """

    config_class = ClassifierConfig
    """What `from_pretrained` reads config.json into."""

    def __call__(
        self,
        input_ids: jax.Array,
        attention_mask: jax.Array | None = None,
        token_type_ids: jax.Array | None = None,
        position_ids: jax.Array | None = None,
        *,
        segment_ids: jax.Array | None = None,
        num_segments: int | None = None,
        cls_index: jax.Array | None = None,
        rngs: nnx.Rngs | None = None,
    ) -> jax.Array:
        """(batch, seq) int inputs -> (batch, num_labels) float32 logits.

        Packed rows: `segment_ids` (batch, seq), 1..S for the examples a row holds back to back
        and 0 for the padding after them, with `num_segments` S (a Python int) -> (batch, S,
        num_labels) logits, slot s - 1 equal to segment s's logits run alone and unpadded (an
        absent segment's slot holds finite values to mask out). Attention stays within a
        segment and positions restart per segment when position_ids is None (`backbones.segments`);
        attention_mask is then `segment_ids > 0` whatever is passed. ValueError for segment_ids
        without num_segments, or mismatched shapes.

        `cls_index` (batch,) is read only by the "summary" head with summary_type="cls_index";
        packed, it is (batch, S), positions counted from each segment's first token.
        `rngs` (an `nnx.Rngs` with a `dropout` stream) draws the dropout masks in train mode and
        is ignored in eval mode; in train mode without it (and a non-zero dropout rate) the call
        raises ValueError: pass rngs=nnx.Rngs(dropout=key), or call model.eval() for inference.

        Ids outside the vocabulary (negative, or past vocab_size) raise ValueError when the ids
        are concrete (an eager call); under jit they cannot be looked at, and the data pipeline's
        tokenizer check keeps them in range."""
        if segment_ids is not None:
            segments.check(segment_ids, num_segments, input_ids)
            attention_mask = (segment_ids > 0).astype(jnp.int32)
        else:
            num_segments = None
        # The head gets the caller's mask, None included: "last_token" lets a given mask decide.
        inputs = HeadInputs((), attention_mask, input_ids, cls_index, segment_ids, num_segments)
        out = self.backbone_states(input_ids, attention_mask, token_type_ids, position_ids, segment_ids=segment_ids,
                                   last_layer_positions=self.runs_last_layer_at(inputs), rngs=rngs)
        return self.head(inputs._replace(hidden_states=out.hidden_states), rngs).astype(jnp.float32)

    def loss(self, logits: jax.Array, labels: jax.Array, example_mask: jax.Array | None = None) -> jax.Array:
        """The loss for this model's problem type (inferred from the labels when unset)."""
        return problem.loss(
            logits,
            labels,
            problem_type=self.config.problem_type,
            num_labels=self.config.num_labels,
            example_mask=example_mask,
        )



def save_pretrained(model: PretrainedModel, path, *, format: str = "pytorch", tokenizer=None, replaces=()) -> None:
    """Saves `model` as a checkpoint folder that transformers loads (`format="pytorch"`: config.json
    + model.safetensors) or in flaxheads' own format (`"flaxheads"`); LoRA adapters are merged
    first, so the folder holds the plain model they compute (`conversion.peft.save_adapter` writes
    the adapters alone). With `tokenizer` its files are saved too. Written into a temporary folder
    and moved in only when complete; files a loader would read beside the new ones are refused,
    or removed when named in `replaces` (`conversion.loading.save_pretrained`)."""
    loading.save_pretrained(lora.merged(model), path, format=format, tokenizer=tokenizer, replaces=replaces)


from_pretrained = SequenceClassifier.from_pretrained
"""`flaxheads.from_pretrained(path, ...)`: `SequenceClassifier.from_pretrained` as a function."""


def check_input_ids(input_ids, vocab_size: int | None) -> None:
    """ValueError naming the first id outside [0, vocab_size) of concrete `input_ids` (a traced
    value, under jit, is let through). jax indexing would wrap a negative id around and clamp one
    past the end, giving finite logits for text the model never saw; PyTorch's embedding raises."""
    if isinstance(input_ids, jax.core.Tracer):
        return
    ids = np.asarray(input_ids)
    if ids.size == 0:
        return
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or (vocab_size is not None and high >= vocab_size):
        bad = low if low < 0 else high
        where = tuple(int(i) for i in np.argwhere(ids == bad)[0])
        raise ValueError(
            f"input_ids holds {bad} at {where}, outside the model's vocabulary [0, {vocab_size}): ids come from "
            "this model's own tokenizer, which never gives such an id"
        )


class UntrainedModel(ValueError):
    """A classifier whose head (or part of it) would be newly initialised: its answers are noise."""


def require_trained(info: LoadingInfo, model: SequenceClassifier, source, *, fix: str) -> None:
    """UntrainedModel naming the parameters of `model` (loaded from `source` with `info`) that
    would start from random values, and `fix`, the way out; nothing when every one is trained."""
    new = info.untrained
    if new:
        raise UntrainedModel(
            f"{source} has no trained {model.config.head!r} classifier: {len(new)} parameter(s) would start from "
            f"random values ({', '.join(new[:4])}{', ...' if len(new) > 4 else ''}), so its answers would be "
            f"noise. {fix}"
        )


__all__ = [
    "FLAXHEADS_CONFIG_KEY",
    "ClassifierConfig",
    "LabelNames",
    "PretrainedModel",
    "SequenceClassifier",
    "UntrainedModel",
    "from_pretrained",
    "label_names_from",
    "load_backbone",
    "require_trained",
    "resolve_labels",
    "save_pretrained",
    "saved_classes",
    "saved_label_names",
    "saved_task_config",
]
