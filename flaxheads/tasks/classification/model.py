"""A backbone and a head: the sequence classifier users load, train, call and save (text
classification's model), with its config (`ClassifierConfig`: the head, the problem type, the
classes, decision thresholds) and what a saved one says of its classes (`saved_classes`)."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Mapping, Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from flaxheads import problem
from flaxheads import thresholds as thresholds_lib
from flaxheads.backbones import BackboneConfig, backbone_config_from_hf, segments
from flaxheads.backbones.interface import check_inputs
from flaxheads.conversion.table import SEQUENCE_CLASSIFICATION
from flaxheads.heads import HEAD_NAMES, HeadConfig, HeadInputs
from flaxheads.model import (
    FLAXHEADS_CONFIG_KEY, LabelNames, PretrainedModel, label_names_from, resolve_labels,
    saved_config, saved_label_names, saved_task,
)


@dataclasses.dataclass(frozen=True)
class SavedClasses:
    """What a saved sequence classifier's config.json says of its classes."""

    names: tuple[str, ...]
    """In id order: id2label's names, else LABEL_0, LABEL_1, ..."""
    problem_type: str | None
    """config.json's (or its flaxheads section's); None: not recorded."""


def saved_classes(model_dir) -> SavedClasses | None:
    """The classes of the sequence classifier saved in `model_dir` (its architectures name a
    `*ForSequenceClassification`, or it names a flaxheads head on the bare backbone class); None
    for another model or an unreadable folder."""
    hf = saved_config(model_dir)
    if hf is None or (saved_task(hf) != SEQUENCE_CLASSIFICATION and "head" not in (hf.get(FLAXHEADS_CONFIG_KEY) or {})):
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

        ValueError (`backbones.interface.check_inputs`) for inputs of different shapes, a sequence
        longer than the position table, and, when the arrays are concrete (an eager call; under jit
        values cannot be looked at, and the data pipeline's tokenizer check keeps them in range),
        ids outside the vocabulary, token types or positions the model has."""
        check_inputs(self.config.backbone, input_ids, attention_mask, token_type_ids, position_ids,
                     segment_ids=segment_ids)
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


from_pretrained = SequenceClassifier.from_pretrained
"""`flaxheads.from_pretrained(path, ...)`: `SequenceClassifier.from_pretrained` as a function."""


__all__ = ["ClassifierConfig", "SavedClasses", "SequenceClassifier", "from_pretrained", "saved_classes"]
