"""flaxheads: transformer sequence classifiers in Flax NNX, exact to Hugging Face PyTorch.

    model, info = flaxheads.from_pretrained("path/to/bert", num_labels=3, output_loading_info=True)
    print(info)                      # which weights are pretrained, which must be trained
    logits = model(input_ids, attention_mask)
    model.save_pretrained("out")     # a directory transformers loads
    clf = flaxheads.pipeline("text-classification", model="out")   # transformers' answers, batched
    ner = flaxheads.pipeline("token-classification", model="tagger", aggregation_strategy="simple")

    trainer = flaxheads.Trainer(model, flaxheads.TrainConfig(output_dir=None), tokenizer=tokenizer,
                                train_dataset=(texts, labels), eval_dataset=(dev_texts, dev_labels))
    model, metrics, _ = trainer.train()

    tagger = flaxheads.from_pretrained("path/to/bert", task="token-classification", num_labels=9)
    chooser = flaxheads.MultipleChoice.from_pretrained("path/to/bert")   # (batch, choices, seq) -> (batch, choices)
    reader = flaxheads.QuestionAnswering.from_pretrained("path/to/bert")  # .start_logits, .end_logits (batch, seq)

Importing the package is quick: each name below is imported from its module on first use (jax,
flax, datasets and transformers load then), so `flaxheads --help` and the installed command's
restart (`launcher`) pay for none of them. Subpackages and modules are attributes the same way:
`flaxheads.data.load_builtin(...)` works after `import flaxheads` alone.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import TYPE_CHECKING

from flaxheads.version import __version__

if TYPE_CHECKING:  # what the names are, for type checkers and editors; at run time `__getattr__`
    from flaxheads.backbones import BackboneOutput, Encoder, EncoderConfig
    from flaxheads.backbones.albert import Albert, AlbertConfig
    from flaxheads.backbones.decoder import Decoder
    from flaxheads.backbones.decoder_config import DecoderConfig
    from flaxheads.backbones.distilbert import DistilBert, DistilBertConfig
    from flaxheads.backbones.gpt2 import GPT2, GPT2Config
    from flaxheads.backbones.modernbert import ModernBert, ModernBertConfig
    from flaxheads.backbones.xlnet import XLNet, XLNetConfig
    from flaxheads.conversion.checkpoint_io import CheckpointError
    from flaxheads.conversion.loading_info import LoadingInfo
    from flaxheads.conversion.table import MULTIPLE_CHOICE, SEQUENCE_CLASSIFICATION, TOKEN_CLASSIFICATION, ShapeMismatch
    from flaxheads.tasks.classification.functional import ClassifierOutput, FunctionalClassifier
    from flaxheads.tasks.token.functional import FunctionalTokenClassifier, TokenClassifierOutput
    from flaxheads.tasks.choice.functional import FunctionalMultipleChoice, MultipleChoiceOutput
    from flaxheads.tasks.qa.functional import FunctionalQuestionAnswering
    from flaxheads.heads import HEAD_NAMES
    from flaxheads.model import UntrainedModel, load_backbone, save_pretrained
    from flaxheads.tasks.choice.model import MultipleChoice, MultipleChoiceConfig
    from flaxheads.tasks.qa.model import QUESTION_ANSWERING, QuestionAnswering, QuestionAnsweringConfig
    from flaxheads.problem import MULTI_LABEL, PROBLEM_TYPES, REGRESSION, SINGLE_LABEL
    from flaxheads.tasks import MODELS, PIPELINES, TASKS, from_pretrained, pipeline
    from flaxheads.tasks.classification.model import ClassifierConfig, SequenceClassifier
    from flaxheads.tasks.classification.pipeline import TextClassificationPipeline, text_classification_pipeline
    from flaxheads.tasks.token.model import TokenClassifier, TokenClassifierConfig
    from flaxheads.tasks.token.pipeline import TokenClassificationPipeline, token_classification_pipeline
    from flaxheads.serving import serve
    from flaxheads.training.config import TrainConfig
    from flaxheads.training.optim import decay_mask
    from flaxheads.tasks.runs import Trainer
    from flaxheads.training.trainer import EvalPrediction, PredictionOutput, TrainOutput

_EXPORTS: dict[str, tuple[str, ...]] = {
    "flaxheads.backbones": ("BackboneOutput", "Encoder", "EncoderConfig"),
    "flaxheads.backbones.albert": ("Albert", "AlbertConfig"),
    "flaxheads.backbones.decoder": ("Decoder",),
    "flaxheads.backbones.decoder_config": ("DecoderConfig",),
    "flaxheads.backbones.distilbert": ("DistilBert", "DistilBertConfig"),
    "flaxheads.backbones.gpt2": ("GPT2", "GPT2Config"),
    "flaxheads.backbones.modernbert": ("ModernBert", "ModernBertConfig"),
    "flaxheads.backbones.xlnet": ("XLNet", "XLNetConfig"),
    "flaxheads.conversion.checkpoint_io": ("CheckpointError",),
    "flaxheads.conversion.loading_info": ("LoadingInfo",),
    "flaxheads.conversion.table": (
        "MULTIPLE_CHOICE", "SEQUENCE_CLASSIFICATION", "TOKEN_CLASSIFICATION", "ShapeMismatch"),
    "flaxheads.tasks.classification.functional": ("ClassifierOutput", "FunctionalClassifier"),
    "flaxheads.tasks.token.functional": ("FunctionalTokenClassifier", "TokenClassifierOutput"),
    "flaxheads.tasks.choice.functional": ("FunctionalMultipleChoice", "MultipleChoiceOutput"),
    "flaxheads.tasks.qa.functional": ("FunctionalQuestionAnswering",),
    "flaxheads.heads": ("HEAD_NAMES",),
    "flaxheads.model": ("UntrainedModel", "load_backbone", "save_pretrained"),
    "flaxheads.tasks.choice.model": ("MultipleChoice", "MultipleChoiceConfig"),
    "flaxheads.tasks.qa.model": ("QUESTION_ANSWERING", "QuestionAnswering", "QuestionAnsweringConfig"),
    "flaxheads.problem": ("MULTI_LABEL", "PROBLEM_TYPES", "REGRESSION", "SINGLE_LABEL"),
    "flaxheads.tasks": ("MODELS", "PIPELINES", "TASKS", "from_pretrained", "pipeline"),
    "flaxheads.tasks.classification.model": ("ClassifierConfig", "SequenceClassifier"),
    "flaxheads.tasks.classification.pipeline": ("TextClassificationPipeline", "text_classification_pipeline"),
    "flaxheads.tasks.token.model": ("TokenClassifier", "TokenClassifierConfig"),
    "flaxheads.tasks.token.pipeline": ("TokenClassificationPipeline", "token_classification_pipeline"),
    "flaxheads.serving": ("serve",),
    "flaxheads.training.config": ("TrainConfig",),
    "flaxheads.training.optim": ("decay_mask",),
    "flaxheads.tasks.runs": ("Trainer",),
    "flaxheads.training.trainer": ("EvalPrediction", "PredictionOutput", "TrainOutput"),
}
"""The public names by the module that defines them (the block above lists the same; a test checks)."""
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}
_SUBMODULES = frozenset(module.name for module in pkgutil.iter_modules(__path__))
"""The package's subpackages and modules (`data`, `training`, ...): a listing of its folder, nothing imported."""


def __getattr__(name: str):
    """The public `name`, or the subpackage or module `name`, imported on first use and kept."""
    if name in _MODULE_OF:
        value = getattr(importlib.import_module(_MODULE_OF[name]), name)
    elif name in _SUBMODULES:
        value = importlib.import_module(f"{__name__}.{name}")
    else:
        raise AttributeError(f"module 'flaxheads' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_MODULE_OF, *_SUBMODULES})


__all__ = ["__version__", *sorted(_MODULE_OF)]
