"""flaxheads: transformer sequence classifiers in Flax NNX, exact to Hugging Face PyTorch.

    model, info = flaxheads.from_pretrained("path/to/bert", num_labels=3, output_loading_info=True)
    print(info)                      # which weights are pretrained, which must be trained
    logits = model(input_ids, attention_mask)
    model.save_pretrained("out")     # a directory transformers loads
    clf = flaxheads.pipeline("text-classification", model="out")   # transformers' answers, batched

    trainer = flaxheads.Trainer(model, flaxheads.TrainConfig(output_dir=None), tokenizer=tokenizer,
                                train_dataset=(texts, labels), eval_dataset=(dev_texts, dev_labels))
    model, metrics, _ = trainer.train()
"""

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
from flaxheads.conversion.table import ShapeMismatch
from flaxheads.functional import ClassifierOutput, FunctionalClassifier
from flaxheads.heads import HEAD_NAMES
from flaxheads.model import (
    ClassifierConfig, SequenceClassifier, UntrainedModel, from_pretrained, load_backbone, save_pretrained,
)
# Imported here, not lazily: the submodule flaxheads.pipeline, once imported anywhere, would
# otherwise shadow the function of the same name.
from flaxheads.pipeline import TextClassificationPipeline, pipeline
from flaxheads.problem import MULTI_LABEL, PROBLEM_TYPES, REGRESSION, SINGLE_LABEL
from flaxheads.training.optim import decay_mask
from flaxheads.version import __version__

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
    "ModernBert",
    "ModernBertConfig",
    "PredictionOutput",
    "SequenceClassifier",
    "ShapeMismatch",
    "TextClassificationPipeline",
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
