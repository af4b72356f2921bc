"""A backbone and a start/end head: the extractive question-answering model (SQuAD), exact to
transformers' `*ForQuestionAnswering`.

    model = flaxheads.QuestionAnswering.from_pretrained("path/to/bert")
    out = model(input_ids, attention_mask, token_type_ids)     # QuestionAnsweringOutput, each (batch, seq)
    out.start_logits, out.end_logits
    loss = model.loss(out, start_positions, end_positions)     # (batch,) token positions each
    model.save_pretrained("out")                                # BertForQuestionAnswering

The head is the family's own (`CONVERSION_ROWS`): a Linear to two outputs on every token
(`qa_outputs`), after dropout on DistilBERT and after the prediction head and dropout on
ModernBERT (whose Linear is `classifier`). XLNet has two classes: `XLNetForQuestionAnsweringSimple`
(the "linear" head, the default, as `AutoModelForQuestionAnswering`) and `XLNetForQuestionAnswering`
(the "squad" head: `from_pretrained(..., head="squad")`, or a checkpoint of that class), whose
end logits read the start, with beam outputs at inference and an answer-class loss
(`heads/squad.py`). Families transformers has no class for (Gemma, Gemma2, Gemma3) are refused.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, ClassVar, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from flaxheads import conversion
from flaxheads.backbones import BackboneConfig, backbone_config_from_hf
from flaxheads.backbones.interface import check_inputs
from flaxheads.conversion.question_answering import CONVERSION_ROWS, QUESTION_ANSWERING
from flaxheads.heads import HeadConfig, HeadInputs
from flaxheads.heads.squad import SQUAD_DEFAULTS, SquadBeams, SquadHead, SquadLogits
from flaxheads.heads.token import TokenHead, modernbert_token_head
from flaxheads.model import FLAXHEADS_CONFIG_KEY, PretrainedModel

QA_HEADS = {"linear": TokenHead, "modernbert": modernbert_token_head, "squad": SquadHead}
"""Question-answering heads: "linear" and "modernbert" are the token heads with two outputs
(start, end); "squad" is XLNet's head with an end conditioned on the start (`heads/squad.py`)."""

QA_DROPOUT: dict[str, Callable[[Any], float]] = {
    "distilbert": lambda b: b.qa_dropout,  # DistilBertForQuestionAnswering: nn.Dropout(config.qa_dropout)
    "modernbert": lambda b: b.classifier_dropout or 0.0,  # ModernBertForQuestionAnswering: self.drop
}
"""The families whose `*ForQuestionAnswering` has dropout before its Linear; the others have none."""




class QuestionAnsweringOutput(NamedTuple):
    """What a question-answering model with a span head ("linear", "modernbert") returns: a pytree,
    so it can leave `jax.jit`; the fields of transformers' `QuestionAnsweringModelOutput`."""

    start_logits: jax.Array
    """(batch, seq) float32, padding positions included (as transformers computes them)."""
    end_logits: jax.Array
    """(batch, seq) float32."""


@dataclasses.dataclass(frozen=True)
class QuestionAnsweringConfig:
    task: ClassVar[str] = QUESTION_ANSWERING
    """What `from_pretrained` loads this config's models for (the loader picks transformers' class by it)."""

    backbone: BackboneConfig
    head: str = "linear"
    """The family's head (`QA_HEADS`), as its conversion row names it; XLNet's may be "squad"."""
    classifier_dropout: float | None = None
    """Dropout before the Linear; None: the family's transformers class's (`QA_DROPOUT`, else none).
    A value set here is recorded in config.json's "flaxheads" section (transformers keeps its rule)."""

    def __post_init__(self):
        if self.head not in QA_HEADS:
            raise ValueError(f"unknown question-answering head {self.head!r}; choose one of {tuple(QA_HEADS)}")

    @property
    def dropout_rate(self) -> float:
        """The dropout before the Linear in train mode (the "squad" head has none)."""
        if self.classifier_dropout is not None:
            return self.classifier_dropout
        rule = QA_DROPOUT.get(self.backbone.model_type)
        return rule(self.backbone) if rule else 0.0

    def head_config(self) -> HeadConfig:
        b = self.backbone
        if self.head == "squad":
            options = {name: getattr(b, name, default) for name, default in SQUAD_DEFAULTS.items()}
        else:  # the "modernbert" head takes the options ModernBERT's config.json sets for its prediction head
            options = dict(getattr(b, f"{self.head}_options", {}))
        return HeadConfig(
            name=self.head,
            hidden_size=b.hidden_size,
            num_labels=2,  # start and end
            dropout_rate=self.dropout_rate,
            init_std=b.initializer_range,
            num_hidden_layers=b.num_hidden_layers,
            pad_token_id=b.pad_token_id,
            options=tuple(sorted(options.items())),
        )

    @classmethod
    def from_hf_config(cls, hf: dict[str, Any], *, default_head: str, head: str | None = None,
                       classifier_dropout: float | None = None, **label_settings) -> "QuestionAnsweringConfig":
        """Reads a Hugging Face config.json dict. `head` picks another of the family's heads (XLNet's
        "squad"); `classifier_dropout` overrides its dropout rule. ValueError for another head, and
        for any sequence-classifier setting the loader passes (num_labels other than 2, id2label,
        label2id, problem_type, head_options): a question-answering model has two outputs per token,
        the start and end logits, and its loss is their cross entropy."""
        given = sorted(name for name, value in label_settings.items() if value not in (None, {})
                       and not (name == "num_labels" and value == 2))
        if given:
            raise ValueError(
                f"{', '.join(given)}: a question-answering model has two outputs per token (the start and end "
                f"logits of the answer) and its family's head; leave {', '.join(given)} out")
        row = conversion.architecture_table(hf.get("model_type")).task(QUESTION_ANSWERING)
        heads = (row.head, *row.head_classes)
        if head is not None and head not in heads:
            classes = {row.head: row.architecture, **row.head_classes}
            raise ValueError(
                f"head={head!r}: a {hf.get('model_type')} question-answering model has the head of transformers' "
                f"{' or '.join(f'{classes[h]} ({h!r})' for h in heads)}; pass head={heads[0]!r} or leave head out")
        saved = hf.get(FLAXHEADS_CONFIG_KEY, {})
        return cls(
            backbone=backbone_config_from_hf(hf),
            head=head or default_head,
            classifier_dropout=saved.get("classifier_dropout") if classifier_dropout is None else classifier_dropout,
        )

    def to_hf_config(self, architecture: str) -> dict[str, Any]:
        hf = self.backbone.to_hf_config()
        hf["architectures"] = [architecture]
        if self.classifier_dropout is not None:
            hf[FLAXHEADS_CONFIG_KEY] = {"classifier_dropout": self.classifier_dropout}
        return hf


class QuestionAnswering(PretrainedModel, nnx.Module):
    """backbone -> head on every token -> start and end logits of the answer span.

    Train/eval mode, dtypes and LoRA as `SequenceClassifier`'s: built in train mode,
    `from_pretrained` returns an eval-mode model; outputs are float32 whatever the compute dtype.
    """

    config_class = QuestionAnsweringConfig
    """What `from_pretrained` reads config.json into."""

    head_registry = QA_HEADS

    def __call__(
        self,
        input_ids: jax.Array,
        attention_mask: jax.Array | None = None,
        token_type_ids: jax.Array | None = None,
        position_ids: jax.Array | None = None,
        *,
        start_positions: jax.Array | None = None,
        cls_index: jax.Array | None = None,
        p_mask: jax.Array | None = None,
        rngs: nnx.Rngs | None = None,
    ) -> QuestionAnsweringOutput | SquadLogits | SquadBeams:
        """(batch, seq) int inputs, padded on either side -> `QuestionAnsweringOutput`:
        (batch, seq) float32 start and end logits, as transformers' `*ForQuestionAnswering`.
        `rngs` and the ValueErrors as `SequenceClassifier.__call__`'s.

        The "squad" head (XLNet's `XLNetForQuestionAnswering`) takes `p_mask` (batch, seq), 1.0
        where no answer may start or end, and `cls_index` (batch,), the <cls> position its answer
        class reads (the last position without it); it returns `SquadLogits` (start, end read with
        the gold start, answer class) given the gold `start_positions` (batch,) for training, and
        `SquadBeams` (transformers' top-k starts and ends) without them. ValueError for these
        three with another head, whose transformers class takes none of them."""
        check_inputs(self.config.backbone, input_ids, attention_mask, token_type_ids, position_ids)
        squad = self.config.head == "squad"
        extra = {"start_positions": start_positions, "cls_index": cls_index, "p_mask": p_mask}
        if not squad and any(value is not None for value in extra.values()):
            named = ", ".join(name for name, value in extra.items() if value is not None)
            raise ValueError(f"{named}: only the 'squad' head (XLNetForQuestionAnswering) reads them, and this model's "
                             f"head is {self.config.head!r}; leave them out (positions go to model.loss)")
        batch, seq = input_ids.shape
        for name, value, shape in (("start_positions", start_positions, (batch,)), ("cls_index", cls_index, (batch,)),
                                   ("p_mask", p_mask, (batch, seq))):
            if value is not None and tuple(value.shape) != shape:
                raise ValueError(f"{name} has shape {tuple(value.shape)}; the squad head takes {shape}, one per "
                                 f"{'example' if len(shape) == 1 else 'token'} of input_ids {tuple(input_ids.shape)}")
        if start_positions is not None:
            _check_positions("start_positions", start_positions, batch, seq, in_window=True)
        out = self.backbone_states(input_ids, attention_mask, token_type_ids, position_ids, rngs=rngs)
        inputs = HeadInputs(out.hidden_states, attention_mask, input_ids, cls_index=cls_index)
        if squad:
            return self.head(inputs, rngs, start_positions=start_positions, p_mask=p_mask)
        logits_BT2 = self.head(inputs, rngs).astype(jnp.float32)
        return QuestionAnsweringOutput(logits_BT2[..., 0], logits_BT2[..., 1])

    def loss(self, outputs: QuestionAnsweringOutput | SquadLogits, start_positions: jax.Array,
             end_positions: jax.Array, *, is_impossible: jax.Array | None = None) -> jax.Array:
        """The float32 training loss of `outputs` (this model's) for the gold span, transformers':

        - `QuestionAnsweringOutput`: `span_loss`, the mean of the start and end cross entropies,
          positions clamped to [0, seq] and those at seq (outside the window) ignored.
        - `SquadLogits` (the "squad" head called with `start_positions`): `squad_loss`, the same
          mean over positions in [0, seq), plus half the answer-class binary cross entropy when
          `is_impossible` (batch,) (1.0: no answer) is given.

        ValueError for `SquadBeams` (inference outputs have no loss: call the model with
        start_positions=...), and for is_impossible with a span head."""
        if isinstance(outputs, SquadBeams):
            raise ValueError("these are the squad head's inference outputs (SquadBeams); its loss needs the end logits "
                             "read with the gold start: call model(..., start_positions=..., cls_index=...) and pass "
                             "that to model.loss")
        if isinstance(outputs, SquadLogits):
            return squad_loss(outputs, start_positions, end_positions, is_impossible=is_impossible)
        if is_impossible is not None:
            raise ValueError(f"is_impossible: only the 'squad' head (XLNetForQuestionAnswering) has an answer class, "
                             f"and this model's head is {self.config.head!r}: an unanswerable question's start and "
                             "end positions are the <cls> token's (run_qa.py's labels); leave is_impossible out")
        return span_loss(outputs.start_logits, outputs.end_logits, start_positions, end_positions)


def _check_positions(name: str, positions_B: jax.Array, batch: int, seq: int, *, in_window: bool) -> None:
    """ValueError for positions that are not integers of shape (batch,), and, when `in_window`
    (every position must be a token of the sequence), for concrete ones outside [0, seq)."""
    if tuple(positions_B.shape) != (batch,) or not jnp.issubdtype(positions_B.dtype, jnp.integer):
        raise ValueError(f"{name} must be the token position of each example's answer, integers of shape ({batch},); "
                         f"got shape {tuple(positions_B.shape)} and dtype {positions_B.dtype}")
    if in_window and not isinstance(positions_B, jax.core.Tracer):
        values = np.asarray(positions_B)
        bad = values[(values < 0) | (values >= seq)]
        if bad.size:
            raise ValueError(f"{name} holds {int(bad[0])}, outside the {seq} tokens: the squad head reads the state "
                             "at each gold start (as XLNetForQuestionAnswering, which fails on it); put an answer "
                             "outside the window at cls_index, as run_qa_beam_search.py does")


def span_loss(start_logits_BT: jax.Array, end_logits_BT: jax.Array, start_positions_B: jax.Array,
              end_positions_B: jax.Array) -> jax.Array:
    """Float32 (start cross entropy + end cross entropy) / 2, each a mean over the examples whose
    position is scored, as transformers' `ForQuestionAnsweringLoss` (and every span head's class)
    computes it: positions are clamped to [0, seq] (a negative one counts as 0) and those at seq,
    outside the window, are ignored. A side whose every position is ignored adds 0 (PyTorch: nan).

    ValueError for positions that are not integers of shape (batch,)."""
    batch, seq = start_logits_BT.shape
    _check_positions("start_positions", start_positions_B, batch, seq, in_window=False)
    _check_positions("end_positions", end_positions_B, batch, seq, in_window=False)
    start_sum, start_count = position_loss_terms(start_logits_BT, start_positions_B)
    end_sum, end_count = position_loss_terms(end_logits_BT, end_positions_B)
    return (jnp.sum(start_sum) / jnp.maximum(jnp.sum(start_count), 1.0)
            + jnp.sum(end_sum) / jnp.maximum(jnp.sum(end_count), 1.0)) / 2


def span_loss_terms(start_logits_BT: jax.Array, end_logits_BT: jax.Array, start_positions_B: jax.Array,
                    end_positions_B: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(numerators, denominators), each (batch,): per example half its start and end cross
    entropies, and half the number of them scored (`position_loss_terms`). sum(numerators * mask) /
    sum(denominators * mask) over a batch is `span_loss` of its real examples whenever each
    example's start and end are scored or ignored together (run_qa.py's labels: both in the window,
    or both at the <cls> index), else the mean over every scored position."""
    start_sum, start_count = position_loss_terms(start_logits_BT, start_positions_B)
    end_sum, end_count = position_loss_terms(end_logits_BT, end_positions_B)
    return (start_sum + end_sum) / 2, (start_count + end_count) / 2


def position_loss_terms(logits_BT: jax.Array, positions_B: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(cross entropy, 1.0) per example of `positions_B` under `logits_BT` (float32), (0.0, 0.0)
    where the position is ignored: transformers' rule, the position clamped to [0, seq] and seq
    ignored (`CrossEntropyLoss(ignore_index=seq)`)."""
    seq = logits_BT.shape[1]
    clamped_B = jnp.clip(positions_B, 0, seq).astype(jnp.int32)
    scored_B = clamped_B != seq
    losses_B = cross_entropy(logits_BT, jnp.where(scored_B, clamped_B, 0))
    return jnp.where(scored_B, losses_B, 0.0), scored_B.astype(jnp.float32)


def cross_entropy(logits_BT: jax.Array, positions_B: jax.Array) -> jax.Array:
    """(batch,) float32 cross entropy of `positions_B` under `logits_BT`, as PyTorch computes it:
    the maximum subtracted before the normaliser, so a row p_mask set wholly to -1e30 gives
    log(seq), where optax's (normaliser taken at -1e30's precision) gives 0."""
    log_probs_BT = jax.nn.log_softmax(logits_BT.astype(jnp.float32), axis=-1)
    return -jnp.take_along_axis(log_probs_BT, positions_B.astype(jnp.int32)[:, None], axis=-1)[:, 0]


def squad_loss(outputs: SquadLogits, start_positions_B: jax.Array, end_positions_B: jax.Array, *,
               is_impossible: jax.Array | None = None) -> jax.Array:
    """`XLNetForQuestionAnswering`'s float32 training loss: (start cross entropy + end cross
    entropy) / 2, means over the batch, plus 0.5 * the answer class's mean binary cross entropy
    against `is_impossible` (batch,) when it is given (transformers adds that term when cls_index
    is given too; without one the answer class reads the last position, as at inference).

    ValueError for positions that are not integers of shape (batch,) in [0, seq) (transformers'
    class indexes the states with them and fails), and an is_impossible of another shape."""
    batch, seq = outputs.start_logits.shape
    _check_positions("start_positions", start_positions_B, batch, seq, in_window=True)
    _check_positions("end_positions", end_positions_B, batch, seq, in_window=True)
    if is_impossible is not None and tuple(is_impossible.shape) != (batch,):
        raise ValueError(f"is_impossible has shape {tuple(is_impossible.shape)}; give one value per example, shape "
                         f"({batch},): 1.0 where the question has no answer, else 0.0")
    numerators, _ = squad_loss_terms(outputs, start_positions_B, end_positions_B, is_impossible=is_impossible)
    return jnp.mean(numerators)


def squad_loss_terms(outputs: SquadLogits, start_positions_B: jax.Array, end_positions_B: jax.Array, *,
                     is_impossible: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
    """(numerators, denominators), each (batch,): per example its share of `squad_loss` (half its
    start and end cross entropies, plus half its answer-class binary cross entropy with
    `is_impossible` when given), and ones: the one loss of the "squad" head."""
    numerators = (cross_entropy(outputs.start_logits, start_positions_B)
                  + cross_entropy(outputs.end_logits, end_positions_B)) / 2
    if is_impossible is not None:
        numerators += 0.5 * optax.sigmoid_binary_cross_entropy(outputs.cls_logits.astype(jnp.float32),
                                                               is_impossible.astype(jnp.float32))
    return numerators, jnp.ones_like(numerators)


__all__ = ["CONVERSION_ROWS", "QA_DROPOUT", "QA_HEADS", "QUESTION_ANSWERING", "QuestionAnswering",
           "QuestionAnsweringConfig", "QuestionAnsweringOutput", "SquadBeams", "SquadLogits", "cross_entropy",
           "position_loss_terms", "span_loss", "span_loss_terms", "squad_loss", "squad_loss_terms"]
