"""What every flaxheads model shares, whatever its task: `PretrainedModel` (a backbone and a head,
loading, saving, LoRA), the label names of `LabelNames`, what a saved model's config.json says of
its task and labels, and the checks of what a model is asked.

Each task's model lives in its folder (`flaxheads.tasks.classification.model.SequenceClassifier`,
`tasks.token.model.TokenClassifier`, `tasks.choice.model.MultipleChoice`). Their
`from_pretrained`, `save_pretrained` and `with_lora` are the loader's and the peft format's
functions, which are generic over the model class (`cls.config_class` reads config.json), so
this module imports `conversion` and never the other way round.
"""

from __future__ import annotations

from typing import Any, ClassVar, Mapping, Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from flaxheads import lora
from flaxheads.backbones import build_backbone
from flaxheads.conversion import loading, peft
from flaxheads.conversion.loading import load_backbone
from flaxheads.conversion.loading_info import LoadingInfo
from flaxheads.conversion.model_folder import open_checkpoint
from flaxheads.heads import HEADS, HeadBuilder, HeadInputs, build_head

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


def saved_config(model_dir) -> dict[str, Any] | None:
    """config.json of the model saved in `model_dir`; None for a folder that is not a readable
    model of a family flaxheads knows (loading it says what is wrong, in its own words)."""
    try:
        checkpoint = open_checkpoint(model_dir)  # a Checkpoint opened by the caller is not read again
    except (OSError, ValueError):
        return None
    return checkpoint.config if checkpoint.known_family else None


def saved_task(hf: Mapping[str, Any]) -> str | None:
    """The task of the transformers class a saved config.json's `architectures` name; None for a
    bare or pretraining class (whose head any task would start anew)."""
    from flaxheads.conversion import TABLES

    table = TABLES[hf["model_type"]]
    return next((task for name in hf.get("architectures") or () if (task := table.task_of(name)) is not None), None)


def saved_task_config(model_dir, task: str) -> dict[str, Any] | None:
    """config.json of the model saved in `model_dir` when its architectures name `task`'s
    transformers class; None for another model, or a folder that is not a readable model."""
    hf = saved_config(model_dir)
    return hf if hf is not None and saved_task(hf) == task else None


def saved_label_names(hf: Mapping[str, Any]) -> tuple[str, ...]:
    """The labels of a saved config.json in id order: its id2label, else LABEL_0, LABEL_1, ..."""
    num_labels, names = resolve_labels(hf, num_labels=None, id2label=None, label2id=None)
    return names or tuple(f"LABEL_{i}" for i in range(num_labels))


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
    """What every flaxheads model (a task's: `SequenceClassifier`, `TokenClassifier`, `MultipleChoice`)
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
        """The backbone's `BackboneOutput` for (batch, seq) inputs, LoRA dropout keyed by `rngs`
        (inputs already checked by the caller's `check_inputs`). No mask: every token is real.
        `last_layer_positions` (batch, P), for a backbone that can (`runs_last_layer_at`): its last
        layer runs at those positions only, and the last hidden state is valid there only."""
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



def save_pretrained(model: PretrainedModel, path, *, format: str = "pytorch", tokenizer=None, replaces=()) -> None:
    """Saves `model` as a checkpoint folder that transformers loads (`format="pytorch"`: config.json
    + model.safetensors) or in flaxheads' own format (`"flaxheads"`); LoRA adapters are merged
    first, so the folder holds the plain model they compute (`conversion.peft.save_adapter` writes
    the adapters alone). With `tokenizer` its files are saved too. Written into a temporary folder
    and moved in only when complete; files a loader would read beside the new ones are refused,
    or removed when named in `replaces` (`conversion.loading.save_pretrained`)."""
    loading.save_pretrained(lora.merged(model), path, format=format, tokenizer=tokenizer, replaces=replaces)


class UntrainedModel(ValueError):
    """A classifier whose head (or part of it) would be newly initialised: its answers are noise."""


def require_trained(info: LoadingInfo, model: PretrainedModel, source, *, fix: str) -> None:
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
    "LabelNames",
    "PretrainedModel",
    "UntrainedModel",
    "label_names_from",
    "load_backbone",
    "require_trained",
    "resolve_labels",
    "save_pretrained",
    "saved_config",
    "saved_label_names",
    "saved_task",
    "saved_task_config",
]
