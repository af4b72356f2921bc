"""A backbone and a one-output head that scores every choice: the multiple-choice model (SWAG,
RACE, ...), exact to transformers' `*ForMultipleChoice`.

    model = flaxheads.MultipleChoice.from_pretrained("path/to/bert")
    logits = model(input_ids, attention_mask, token_type_ids)   # inputs (batch, choices, seq) -> (batch, choices)
    loss = model.loss(logits, labels)                           # labels (batch,): the right choice
    model.save_pretrained("out")                                 # BertForMultipleChoice

Each choice is read as its own sequence (the batch flattened to batch * choices, as transformers
does) by the family's sequence head with one output (`ArchitectureTable.tasks`): BERT's and
ALBERT's pooler, RoBERTa's pooler (not `RobertaClassificationHead`), DistilBERT's and DeBERTa's
heads, ELECTRA's and XLNet's sequence summary ("summary"), ModernBERT's prediction head.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from flaxheads import problem
from flaxheads.backbones import BackboneConfig, backbone_config_from_hf
from flaxheads.backbones.interface import check_inputs
from flaxheads.conversion.table import MULTIPLE_CHOICE
from flaxheads.heads import CHOICE_HEADS, HeadConfig, HeadInputs
from flaxheads.model import FLAXHEADS_CONFIG_KEY, PretrainedModel

CHOICE_DROPOUT: dict[str, Callable[[Any], float]] = {
    "roberta": lambda b: b.hidden_dropout_prob,  # RobertaForMultipleChoice ignores classifier_dropout
    "xlm-roberta": lambda b: b.hidden_dropout_prob,
}
"""The families whose `*ForMultipleChoice` picks its dropout rate otherwise than their backbone's
`default_classifier_dropout` (the "summary" head has dropouts of its own)."""

SUMMARY_DEFAULTS: dict[str, dict[str, Any]] = {
    # ElectraConfig's: it has no summary_first_dropout or summary_proj_to_labels (the head's defaults, 0 and False).
    "electra": {"summary_type": "first", "summary_use_proj": True, "summary_activation": "gelu",
                "summary_last_dropout": 0.1},
}
"""The "summary" head's options for families whose backbone config does not carry them (XLNet's
does: `XLNetConfig.summary_options`); config.json's summary_* fields override them."""


@dataclasses.dataclass(frozen=True)
class MultipleChoiceConfig:
    task: ClassVar[str] = MULTIPLE_CHOICE
    """What `from_pretrained` loads this config's models for (the loader picks transformers' class by it)."""

    backbone: BackboneConfig
    head: str
    """The family's one-output head (`heads.CHOICE_HEADS`), as its conversion table names it."""
    classifier_dropout: float | None = None
    """Dropout before the classifier; None: the family's transformers class's rule (`CHOICE_DROPOUT`).
    A value set here is recorded in config.json's "flaxheads" section (transformers keeps its rule)."""
    head_options: tuple[tuple[str, Any], ...] = ()
    """The head's options as config.json sets them (ELECTRA's and XLNet's summary_*, DeBERTa's pooler_*)."""

    def __post_init__(self):
        if self.head not in CHOICE_HEADS:
            raise ValueError(f"unknown head {self.head!r}; choose one of {tuple(CHOICE_HEADS)}")

    @property
    def dropout_rate(self) -> float:
        """The dropout before the classifier in train mode."""
        if self.classifier_dropout is not None:
            return self.classifier_dropout
        rule = CHOICE_DROPOUT.get(self.backbone.model_type)
        return rule(self.backbone) if rule else self.backbone.default_classifier_dropout

    def head_config(self) -> HeadConfig:
        b = self.backbone
        return HeadConfig(
            name=self.head,
            hidden_size=b.hidden_size,
            num_labels=1,  # one score per choice
            dropout_rate=self.dropout_rate,
            init_std=b.initializer_range,
            num_hidden_layers=b.num_hidden_layers,
            pad_token_id=b.pad_token_id,
            options=self.head_options,
        )

    @classmethod
    def from_hf_config(cls, hf: dict[str, Any], *, default_head: str, classifier_dropout: float | None = None,
                       **label_settings) -> "MultipleChoiceConfig":
        """Reads a Hugging Face config.json dict. `classifier_dropout` overrides its dropout rule;
        ValueError for any sequence-classifier setting the loader passes (num_labels, id2label,
        label2id, problem_type, head, head_options): a multiple-choice model scores each choice
        with its family's one-output head, and its loss is cross entropy over the choices."""
        given = sorted(name for name, value in label_settings.items() if value not in (None, {}, default_head))
        if given:
            raise ValueError(
                f"{', '.join(given)}: a multiple-choice model scores each choice with one output of its family's head "
                f"({default_head!r}, as transformers' *ForMultipleChoice); leave {', '.join(given)} out"
            )
        backbone = backbone_config_from_hf(hf)
        defaults = SUMMARY_DEFAULTS.get(backbone.model_type, {}) if default_head == "summary" else {}
        options = {**getattr(backbone, f"{default_head}_options", {}),
                   **defaults, **{name: hf[name] for name in defaults if name in hf}}
        saved = hf.get(FLAXHEADS_CONFIG_KEY, {})
        return cls(
            backbone=backbone,
            head=default_head,
            classifier_dropout=saved.get("classifier_dropout") if classifier_dropout is None else classifier_dropout,
            head_options=tuple(sorted(options.items())),
        )

    def to_hf_config(self, architecture: str) -> dict[str, Any]:
        hf = self.backbone.to_hf_config()
        # Options the backbone's config.json does not carry (ELECTRA's summary_*) go beside its fields.
        hf.update({name: value for name, value in self.head_options if name not in hf})
        hf["architectures"] = [architecture]
        if self.classifier_dropout is not None:
            hf[FLAXHEADS_CONFIG_KEY] = {"classifier_dropout": self.classifier_dropout}
        return hf


class MultipleChoice(PretrainedModel, nnx.Module):
    """backbone -> one-output head on every choice -> (batch, num_choices) logits.

    Train/eval mode, dtypes and LoRA as `SequenceClassifier`'s: built in train mode,
    `from_pretrained` returns an eval-mode model; logits are float32 whatever the compute dtype.
    """

    config_class = MultipleChoiceConfig
    """What `from_pretrained` reads config.json into."""

    head_registry = CHOICE_HEADS

    def __call__(
        self,
        input_ids: jax.Array,
        attention_mask: jax.Array | None = None,
        token_type_ids: jax.Array | None = None,
        position_ids: jax.Array | None = None,
        *,
        rngs: nnx.Rngs | None = None,
    ) -> jax.Array:
        """(batch, num_choices, seq) int inputs -> (batch, num_choices) float32 logits, each
        choice scored as its own sequence (padded on either side). ValueError for input_ids of
        another rank; `rngs` and the other ValueErrors as `SequenceClassifier.__call__`'s."""
        if input_ids.ndim != 3:
            raise ValueError(f"a multiple-choice model takes input_ids of shape (batch, num_choices, seq), got shape "
                             f"{tuple(input_ids.shape)}; stack each example's choices along axis 1")
        check_inputs(self.config.backbone, input_ids, attention_mask, token_type_ids, position_ids,
                     axes=("batch", "num_choices", "seq"))
        batch, num_choices, seq = input_ids.shape

        def flat(x_BCT):
            # Choices of one example stay adjacent: row b * num_choices + c, transformers' view(-1, seq).
            return None if x_BCT is None else jnp.reshape(x_BCT, (batch * num_choices, seq))

        ids, mask = flat(input_ids), flat(attention_mask)
        out = self.backbone_states(ids, mask, flat(token_type_ids), flat(position_ids), rngs=rngs)
        scores = self.head(HeadInputs(out.hidden_states, mask, ids), rngs)
        return jnp.reshape(scores, (batch, num_choices)).astype(jnp.float32)

    def loss(self, logits: jax.Array, labels: jax.Array) -> jax.Array:
        """`choice_loss`: the mean cross entropy of the right choices."""
        return choice_loss(logits, labels)


def choice_loss(logits_BC: jax.Array, labels_B: jax.Array) -> jax.Array:
    """Float32 mean cross entropy over the batch of the right choices `labels_B` (batch,) under
    `logits_BC` (batch, num_choices), as transformers' `*ForMultipleChoice` computes it. ValueError
    for labels that are not integers of shape (batch,), and for concrete ones outside [0, num_choices)."""
    batch, num_choices = logits_BC.shape
    if tuple(labels_B.shape) != (batch,) or not jnp.issubdtype(labels_B.dtype, jnp.integer):
        raise ValueError(f"multiple-choice labels must be the index of each example's right choice, integers of shape "
                         f"({batch},); got shape {tuple(labels_B.shape)} and dtype {labels_B.dtype}")
    if not isinstance(labels_B, jax.core.Tracer):
        values = np.asarray(labels_B)
        bad = values[(values < 0) | (values >= num_choices)]
        if bad.size:
            raise ValueError(f"choice {int(bad[0])} is outside [0, {num_choices}) for {num_choices} choices")
    numerators, _ = choice_loss_terms(logits_BC, labels_B)
    return jnp.mean(numerators)


def choice_loss_terms(logits_BC: jax.Array, labels_B: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(numerators, denominators), each (batch,): the float32 cross entropy of each example's
    right choice, and ones: the one loss of multiple choice (`choice_loss`, and the train step's
    through the task's objective)."""
    losses = problem.cross_entropy(logits_BC.astype(jnp.float32), labels_B)
    return losses, jnp.ones_like(losses)


__all__ = ["CHOICE_DROPOUT", "MultipleChoice", "MultipleChoiceConfig", "SUMMARY_DEFAULTS", "choice_loss",
           "choice_loss_terms"]
