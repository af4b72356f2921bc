"""A backbone and a per-token head: the token classifier (NER, POS tagging), exact to transformers'
`*ForTokenClassification`.

    model = flaxheads.TokenClassifier.from_pretrained("path/to/bert", id2label=["O", "B-PER", "I-PER"])
    logits = model(input_ids, attention_mask)        # (batch, seq, num_labels)
    loss = model.loss(logits, labels)                # labels (batch, seq), -100 where ignored
    model.save_pretrained("out")                     # BertForTokenClassification

The head is the family's own (`ArchitectureTable.tasks`): dropout and a Linear on every token
(`classifier`, or `score` on the decoder LLMs), after ModernBERT's prediction head on ModernBERT.
Its dropout rate follows each transformers class's own rule (`TOKEN_DROPOUT`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, ClassVar, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from flaxheads.problem import IGNORE_INDEX
from flaxheads.backbones import BackboneConfig, backbone_config_from_hf, segments
from flaxheads.backbones.interface import check_inputs
from flaxheads.conversion.table import TOKEN_CLASSIFICATION
from flaxheads.heads import TOKEN_HEADS, HeadConfig, HeadInputs
from flaxheads.model import (FLAXHEADS_CONFIG_KEY, LabelNames, PretrainedModel, resolve_labels, saved_label_names,
                             saved_task_config)


TOKEN_DROPOUT: dict[str, Callable[[Any], float]] = {
    "distilbert": lambda b: b.dropout,  # DistilBertForTokenClassification: config.dropout
    "deberta-v2": lambda b: b.hidden_dropout_prob,  # not cls_dropout, which its other heads read
    "xlnet": lambda b: 0.0,  # XLNetForTokenClassification has no dropout
    # classifier_dropout, else 0.1: GPT2Config has no hidden_dropout, so resid_pdrop is never read.
    "gpt2": lambda b: 0.1 if b.classifier_dropout is None else b.classifier_dropout,
}
"""The families whose `*ForTokenClassification` picks its dropout rate otherwise than their
backbone's `default_classifier_dropout` (classifier_dropout, else hidden_dropout_prob; ALBERT's
classifier_dropout_prob; ModernBERT's classifier_dropout; the decoder LLMs' classifier_dropout, else 0.1)."""


@dataclasses.dataclass(frozen=True)
class TokenClassifierConfig(LabelNames):
    task: ClassVar[str] = TOKEN_CLASSIFICATION
    """What `from_pretrained` loads this config's models for (the loader picks transformers' class by it)."""

    backbone: BackboneConfig
    head: str = "linear"
    """The family's token head (`heads.TOKEN_HEADS`), as its conversion table names it."""
    num_labels: int = 2
    labels: tuple[str, ...] | None = None
    """Label names by class id; None means LABEL_0, LABEL_1, ... (`id2label`, `label2id`)."""
    classifier_dropout: float | None = None
    """Dropout before the classifier; None: the family's transformers class's rule (`TOKEN_DROPOUT`).
    A value set here is recorded in config.json's "flaxheads" section (transformers keeps its rule)."""
    token_classification_bias: bool = True
    """Whether the per-token Linear has a bias: config.json's `token_classification_bias`, which
    transformers' `GenericForTokenClassification` (the decoder LLMs) reads; its other token
    classifiers always have one."""

    def __post_init__(self):
        if self.head not in TOKEN_HEADS:
            raise ValueError(f"unknown token head {self.head!r}; choose one of {tuple(TOKEN_HEADS)}")
        if self.num_labels < 1:
            raise ValueError(f"num_labels must be >= 1, got {self.num_labels}")
        if self.labels is not None and len(self.labels) != self.num_labels:
            raise ValueError(f"id2label has {len(self.labels)} names but num_labels={self.num_labels}; "
                             "give one name per label")

    @property
    def dropout_rate(self) -> float:
        """The dropout before the classifier in train mode."""
        if self.classifier_dropout is not None:
            return self.classifier_dropout
        rule = TOKEN_DROPOUT.get(self.backbone.model_type)
        return rule(self.backbone) if rule else self.backbone.default_classifier_dropout

    def head_config(self) -> HeadConfig:
        b = self.backbone
        # The "modernbert" token head takes the options ModernBERT's config.json sets for its prediction head.
        options = dict(getattr(b, f"{self.head}_options", {}))
        if not self.token_classification_bias:
            options["token_classification_bias"] = False
        return HeadConfig(
            name=self.head,
            hidden_size=b.hidden_size,
            num_labels=self.num_labels,
            dropout_rate=self.dropout_rate,
            init_std=b.initializer_range,
            num_hidden_layers=b.num_hidden_layers,
            pad_token_id=b.pad_token_id,
            options=tuple(sorted(options.items())),
        )

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
    ) -> "TokenClassifierConfig":
        """Reads a Hugging Face config.json dict (the loader's keyword arguments override it, as
        `ClassifierConfig.from_hf_config`'s). ValueError for `head`, `problem_type` or
        `head_options`: a token classifier's head is its family's own, and its loss is cross
        entropy over each token's class."""
        if head not in (None, default_head) or problem_type is not None or head_options:
            raise ValueError(
                "head, problem_type and head_options are sequence-classifier settings: a token classifier has its "
                f"family's head ({default_head!r}, as transformers' *ForTokenClassification) and a cross-entropy loss "
                "over each token; leave them out"
            )
        saved = hf.get(FLAXHEADS_CONFIG_KEY, {})
        num_labels, names = resolve_labels(hf, num_labels=num_labels, id2label=id2label, label2id=label2id)
        return cls(
            backbone=backbone_config_from_hf(hf),
            head=default_head,
            num_labels=num_labels,
            labels=names,
            classifier_dropout=saved.get("classifier_dropout") if classifier_dropout is None else classifier_dropout,
            token_classification_bias=bool(hf.get("token_classification_bias", True)),
        )

    def to_hf_config(self, architecture: str) -> dict[str, Any]:
        hf = self.backbone.to_hf_config()
        hf.update(architectures=[architecture], **self.hf_labels())
        if not self.token_classification_bias:
            hf["token_classification_bias"] = False
        if self.classifier_dropout is not None:
            hf[FLAXHEADS_CONFIG_KEY] = {"classifier_dropout": self.classifier_dropout}
        return hf


class TokenClassifier(PretrainedModel, nnx.Module):
    """backbone -> per-token head -> (batch, seq, num_labels) logits.

    Train/eval mode, dtypes and LoRA as `SequenceClassifier`'s: built in train mode,
    `from_pretrained` returns an eval-mode model; logits are float32 whatever the compute dtype.
    """

    config_class = TokenClassifierConfig
    """What `from_pretrained` reads config.json into."""

    head_registry = TOKEN_HEADS

    def __call__(
        self,
        input_ids: jax.Array,
        attention_mask: jax.Array | None = None,
        token_type_ids: jax.Array | None = None,
        position_ids: jax.Array | None = None,
        *,
        segment_ids: jax.Array | None = None,
        rngs: nnx.Rngs | None = None,
    ) -> jax.Array:
        """(batch, seq) int inputs -> (batch, seq, num_labels) float32 logits, padding positions
        included (as transformers computes them). Padding on either side; `rngs` and the
        ValueErrors as `SequenceClassifier.__call__`'s.

        Packed rows: `segment_ids` (batch, seq), 1..S for the examples a row holds back to back
        and 0 for the padding after them; each token's logits equal those of its example run
        alone (attention stays within a segment; positions restart per segment when position_ids
        is None), and attention_mask is then `segment_ids > 0` whatever is passed."""
        check_inputs(self.config.backbone, input_ids, attention_mask, token_type_ids, position_ids,
                     segment_ids=segment_ids)
        if segment_ids is not None:
            segments.check_ids(segment_ids, input_ids)
            attention_mask = (segment_ids > 0).astype(jnp.int32)
        out = self.backbone_states(input_ids, attention_mask, token_type_ids, position_ids, segment_ids=segment_ids,
                                   rngs=rngs)
        inputs = HeadInputs(out.hidden_states, attention_mask, input_ids)
        return self.head(inputs, rngs).astype(jnp.float32)

    def loss(self, logits: jax.Array, labels: jax.Array) -> jax.Array:
        """`token_loss`: the mean cross entropy over the tokens whose label is not -100."""
        return token_loss(logits, labels)


def saved_tags(model_dir) -> tuple[str, ...] | None:
    """The tags, in id order (config.json's id2label, else LABEL_0, ...), of the token classifier
    saved in `model_dir` (config.json names a `*ForTokenClassification`); None for another model
    or a folder that is not a readable model (loading it says what is wrong, in its own words)."""
    hf = saved_task_config(model_dir, TOKEN_CLASSIFICATION)
    return None if hf is None else saved_label_names(hf)


def token_loss(logits_BTL: jax.Array, labels_BT: jax.Array, *, ignore_index: int = IGNORE_INDEX) -> jax.Array:
    """Float32 mean cross entropy over the tokens whose label is not `ignore_index`, as
    transformers' token classifiers compute it (`CrossEntropyLoss()` over the flattened tokens);
    0.0 when every label is ignored (PyTorch gives nan).

    ValueError for labels that are not integers of the logits' (batch, seq) shape, and for
    concrete labels outside [0, num_labels) other than `ignore_index`."""
    num_labels = logits_BTL.shape[-1]
    if tuple(labels_BT.shape) != tuple(logits_BTL.shape[:-1]) or not jnp.issubdtype(labels_BT.dtype, jnp.integer):
        raise ValueError(
            f"token labels must be integer class ids of shape {tuple(logits_BTL.shape[:-1])} (batch, seq), "
            f"{ignore_index} where a token is not scored; got shape {tuple(labels_BT.shape)} and dtype "
            f"{labels_BT.dtype}"
        )
    if not isinstance(labels_BT, jax.core.Tracer):
        values = np.asarray(labels_BT)
        bad = values[(values != ignore_index) & ((values < 0) | (values >= num_labels))]
        if bad.size:
            raise ValueError(f"token label {int(bad[0])} is outside [0, {num_labels}) and is not {ignore_index} "
                             "(ignored); fix the labels or num_labels")
    numerators, denominators = token_loss_terms(logits_BTL, labels_BT, ignore_index=ignore_index)
    return jnp.sum(numerators) / jnp.maximum(jnp.sum(denominators), 1.0)


def token_loss_terms(logits_BTL: jax.Array, labels_BT: jax.Array, *, ignore_index: int = IGNORE_INDEX
                     ) -> tuple[jax.Array, jax.Array]:
    """(numerators, denominators), each (batch,): per example the summed float32 cross entropy of
    its tokens whose label is not `ignore_index`, and how many there are. sum(numerators * mask) /
    sum(denominators * mask) over a batch is PyTorch's `CrossEntropyLoss(ignore_index=-100)` over
    all its real examples' tokens, as transformers' token classifiers compute it: the one loss of
    token classification (`token_loss`, and the train step's through the task's objective)."""
    scored_BT = labels_BT != ignore_index
    losses_BT = optax.softmax_cross_entropy_with_integer_labels(
        logits_BTL.astype(jnp.float32), jnp.where(scored_BT, labels_BT, 0).astype(jnp.int32))
    return (jnp.sum(jnp.where(scored_BT, losses_BT, 0.0), axis=-1),
            jnp.sum(scored_BT, axis=-1).astype(jnp.float32))


__all__ = ["IGNORE_INDEX", "TOKEN_DROPOUT", "TokenClassifier", "TokenClassifierConfig", "saved_tags", "token_loss",
           "token_loss_terms"]
