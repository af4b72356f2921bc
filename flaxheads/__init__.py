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
"""

from collections.abc import Callable

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
from flaxheads.functional import ClassifierOutput, FunctionalClassifier
from flaxheads.heads import HEAD_NAMES
from flaxheads.model import ClassifierConfig, SequenceClassifier, UntrainedModel, load_backbone, save_pretrained
from flaxheads.multiple_choice import MultipleChoice, MultipleChoiceConfig
from flaxheads.pipeline import TextClassificationPipeline, text_classification_pipeline
from flaxheads.problem import MULTI_LABEL, PROBLEM_TYPES, REGRESSION, SINGLE_LABEL
from flaxheads.token_classifier import TokenClassifier, TokenClassifierConfig
from flaxheads.token_pipeline import TokenClassificationPipeline, token_classification_pipeline
from flaxheads.training.optim import decay_mask
from flaxheads.version import __version__

MODELS: dict[str, type] = {
    SEQUENCE_CLASSIFICATION: SequenceClassifier,
    TOKEN_CLASSIFICATION: TokenClassifier,
    MULTIPLE_CHOICE: MultipleChoice,
}
"""The model class of each task, by transformers' pipeline names (`*ForSequenceClassification`,
`*ForTokenClassification`, `*ForMultipleChoice`). A new task is one model module plus one line here."""


def from_pretrained(path, *, task: str = SEQUENCE_CLASSIFICATION, **options):
    """`MODELS[task].from_pretrained(path, **options)`: a `SequenceClassifier` by default, a
    `TokenClassifier` for task="token-classification", a `MultipleChoice` for
    task="multiple-choice" (options: `SequenceClassifier.from_pretrained`'s). ValueError naming
    the tasks for an unknown one; a checkpoint of another task's transformers class is refused
    with the task to pass."""
    if task not in MODELS:
        raise ValueError(f"unknown task {task!r}; choose one of {tuple(MODELS)}")
    return MODELS[task].from_pretrained(path, **options)


PIPELINES: dict[str, Callable] = {
    "text-classification": text_classification_pipeline,
    "sentiment-analysis": text_classification_pipeline,  # transformers' alias
    "token-classification": token_classification_pipeline,
    "ner": token_classification_pipeline,  # transformers' alias
}
"""The pipeline builder of each task, by transformers' pipeline names. A new task is one pipeline
module plus its lines here."""


# Defined after the submodule flaxheads.pipeline is imported (above), so the name is this function.
def pipeline(task: str = "text-classification", model=None, tokenizer=None, **options):
    """`PIPELINES[task](model, tokenizer, **options)`: a pipeline answering as
    `transformers.pipeline(task, model=..., tokenizer=..., **options)`, over a flaxheads model in
    memory or the folder of a trained one.

    - "text-classification" ("sentiment-analysis"): `text_classification_pipeline`; options
      `max_seq_length`, `batch_size`.
    - "token-classification" ("ner"): `token_classification_pipeline`; options
      `aggregation_strategy`, `ignore_labels`, `stride`, `batch_size`.

    ValueError naming the tasks for an unknown one; a model of another task is refused naming the
    task that reads it.
    """
    if task not in PIPELINES:
        raise ValueError(f"flaxheads.pipeline answers task={' or '.join(map(repr, PIPELINES))}, not {task!r}")
    return PIPELINES[task](model, tokenizer, **options)


_LAZY = {
    "EvalPrediction": "flaxheads.training.trainer",
    "PredictionOutput": "flaxheads.training.trainer",
    "Trainer": "flaxheads.training.trainer",
    "TrainOutput": "flaxheads.training.trainer",
    "TrainConfig": "flaxheads.training.config",
}
"""Names whose modules pull in Orbax and TensorBoard: imported on first use."""


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'flaxheads' has no attribute {name!r}")



__all__ = [
    "__version__",
    "HEAD_NAMES",
    "MULTI_LABEL",
    "PROBLEM_TYPES",
    "REGRESSION",
    "SINGLE_LABEL",
    "Albert",
    "AlbertConfig",
    "BackboneOutput",
    "CheckpointError",
    "ClassifierOutput",
    "ClassifierConfig",
    "EvalPrediction",
    "Encoder",
    "Decoder",
    "DecoderConfig",
    "DistilBert",
    "DistilBertConfig",
    "EncoderConfig",
    "FunctionalClassifier",
    "GPT2",
    "GPT2Config",
    "LoadingInfo",
    "MODELS",
    "MULTIPLE_CHOICE",
    "PIPELINES",
    "ModernBert",
    "ModernBertConfig",
    "MultipleChoice",
    "MultipleChoiceConfig",
    "PredictionOutput",
    "SEQUENCE_CLASSIFICATION",
    "SequenceClassifier",
    "ShapeMismatch",
    "TOKEN_CLASSIFICATION",
    "TextClassificationPipeline",
    "TokenClassificationPipeline",
    "TokenClassifier",
    "TokenClassifierConfig",
    "TrainConfig",
    "TrainOutput",
    "Trainer",
    "UntrainedModel",
    "XLNet",
    "XLNetConfig",
    "decay_mask",
    "from_pretrained",
    "load_backbone",
    "pipeline",
    "save_pretrained",
]
