"""flaxheads: transformer sequence classifiers in Flax NNX, exact to Hugging Face PyTorch.

    model, info = flaxheads.from_pretrained("path/to/bert", num_labels=3, output_loading_info=True)
    print(info)                      # which weights are pretrained, which must be trained
    logits = model(input_ids, attention_mask)
    model.save_pretrained("out")     # a directory transformers loads
    clf = flaxheads.pipeline("text-classification", model="out")   # transformers' answers, batched
"""

from flaxheads.backbones import BackboneOutput, Encoder, EncoderConfig
from flaxheads.backbones.gpt2 import GPT2, GPT2Config
from flaxheads.backbones.xlnet import XLNet, XLNetConfig
from flaxheads.conversion.checkpoint_io import CheckpointError
from flaxheads.conversion.loading_info import LoadingInfo
from flaxheads.conversion.table import ShapeMismatch
from flaxheads.functional import ClassifierOutput, FunctionalClassifier
from flaxheads.heads import HEAD_NAMES
from flaxheads.model import ClassifierConfig, SequenceClassifier, from_pretrained, load_backbone, save_pretrained
from flaxheads.pipeline import TextClassificationPipeline, pipeline
from flaxheads.problem import MULTI_LABEL, PROBLEM_TYPES, REGRESSION, SINGLE_LABEL
from flaxheads.training.optim import decay_mask

__version__ = "0.1.0"

__all__ = [
    "HEAD_NAMES",
    "MULTI_LABEL",
    "PROBLEM_TYPES",
    "REGRESSION",
    "SINGLE_LABEL",
    "BackboneOutput",
    "CheckpointError",
    "ClassifierOutput",
    "ClassifierConfig",
    "Encoder",
    "EncoderConfig",
    "FunctionalClassifier",
    "GPT2",
    "GPT2Config",
    "LoadingInfo",
    "SequenceClassifier",
    "ShapeMismatch",
    "TextClassificationPipeline",
    "XLNet",
    "XLNetConfig",
    "decay_mask",
    "from_pretrained",
    "load_backbone",
    "pipeline",
    "save_pretrained",
]
