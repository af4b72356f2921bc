"""Loading a trained model to answer with, whatever its task: the task-free part of `flaxheads
evaluate | predict` and of `flaxheads.pipeline`. Each task's own evaluation, prediction and
scorers live in its folder (`flaxheads.tasks.<task>.inference`) and start here: `open_trained`
(the model folder, its tokenizer, the trained model, the longest input it reads), `pipeline_model`
(a model in memory or a folder for a pipeline), and the helpers their batching shares.

All refuse to answer from weights that were never trained, from a folder without the model's
tokenizer, and with non-finite scores: a confident-looking wrong answer is worse than an error.
"""

from __future__ import annotations

import math
import os
import unicodedata
from pathlib import Path
from typing import Any, Iterable, NamedTuple

import jax
import numpy as np
from flax import nnx

from flaxheads import compile_cache
from flaxheads.backbones import backbone_spec
from flaxheads.conversion import architecture_table
from flaxheads.conversion.model_folder import Checkpoint, open_checkpoint
from flaxheads.model import PretrainedModel, require_trained
from flaxheads.tokenizer import fitting_max_length, load_tokenizer, model_pad_token_id, pad_token_ids, read_tokenizer
from flaxheads.training import run_files
from flaxheads.training.sharding import Layout


def require_model_folder(model_dir: str | os.PathLike) -> None:
    """ValueError, with the way to the model, when `model_dir` is a training run that has not
    exported yet or one of its checkpoints (neither holds config.json)."""
    reason = run_files.not_a_model(model_dir) if Path(model_dir).is_dir() else None
    if reason:
        raise ValueError(reason)


def open_model_folder(model_dir: str | os.PathLike | Checkpoint) -> Checkpoint:
    """The model folder `model_dir` names, opened once (`model_folder.open_checkpoint`; an opened one
    as it is), after `require_model_folder`'s check: what every command that answers with a saved
    model reads, and passes along instead of the path."""
    if isinstance(model_dir, Checkpoint):
        return model_dir
    require_model_folder(model_dir)
    return open_checkpoint(model_dir)


def load_trained(model_dir: str | os.PathLike, *, model_class: type[PretrainedModel],
                 pad_token_id: int | None = None, **options):
    """A saved `model_class` model whose every parameter comes from the checkpoint.

    Raises UntrainedModel naming the parameters that would be newly initialised (a bare
    pretrained encoder such as `BertModel` has no classifier): fine-tune it first.
    """
    model, info = model_class.from_pretrained(model_dir, pad_token_id=pad_token_id, output_loading_info=True,
                                              **options)
    require_trained(info, model, model_dir, fix=f"Fine-tune it first (flaxheads train --model_name_or_path "
                                                f"{model_dir}) and use the trained output folder")
    return model


class Trained(NamedTuple):
    """A trained model opened to answer with (`open_trained`)."""

    model: Any
    tokenizer: Any
    max_seq_length: int | None
    """The longest input in tokens: the one asked for, or the model's position limit when shorter
    (None when none was asked for)."""


def open_trained(model_dir: str | os.PathLike, model_class: type[PretrainedModel], *,
                 max_seq_length: int | None = None, tokenizer_name: str | None = None, **options) -> Trained:
    """The trained `model_class` model saved in `model_dir`, its tokenizer (`tokenizer_name`'s,
    else the folder's own) and the longest input it reads: what every evaluation and prediction
    from a folder starts with. Raises ValueError for a run folder that has not exported (or one of
    its checkpoints), a folder without the model's tokenizer; UntrainedModel for a head never
    trained. `options` go to `from_pretrained` (a sequence classifier's num_labels, problem_type)."""
    model_dir = open_model_folder(model_dir)
    tokenizer, pad_token_id = load_tokenizer(model_dir, tokenizer_name)
    model = load_trained(model_dir, model_class=model_class, pad_token_id=pad_token_id, **options)
    fitted = None if max_seq_length is None else fitting_max_length(model.config.backbone, max_seq_length)
    return Trained(model, tokenizer, fitted)


def pipeline_model(model, tokenizer, model_class: type[PretrainedModel]) -> tuple[Any, Any, str]:
    """(model, tokenizer, the model as errors name it) for a pipeline over `model_class` models.

    `model` is a `model_class` in memory, which needs `tokenizer` (a transformers tokenizer or
    its folder), or the folder of a trained one, read with its own tokenizer unless `tokenizer`
    is given (`load_tokenizer`: refused when the folder has none or it is not the model's), and
    loaded by `load_trained` (UntrainedModel when its head was never trained).

    Raises ValueError for no model, an in-memory model without a tokenizer, and a model or a
    checkpoint of another task (naming the pipeline task that reads it).
    """
    task = model_class.config_class.task  # the task's name is its pipeline's name
    if model is None:
        raise ValueError(f"pipeline({task!r}) needs model=: a {model_class.__name__} or the folder of a trained one")
    if isinstance(model, PretrainedModel):
        if not isinstance(model, model_class):
            raise ValueError(other_task(f"model= is a {type(model).__name__}", model.config.task, task))
        if tokenizer is None:
            raise ValueError(
                f"pipeline(model=<{model_class.__name__}>) needs tokenizer=: the tokenizer the model was trained "
                "with (a transformers tokenizer or its folder); a model in memory carries none"
            )
        tokenizer = read_tokenizer(tokenizer) if isinstance(tokenizer, (str, os.PathLike)) else tokenizer
        return model, tokenizer, "the model"
    model = open_model_folder(model)
    theirs = model.task
    if theirs not in (None, model_class.config_class.task):
        raise ValueError(other_task(f"{model} holds a {theirs} model", theirs, task))
    if tokenizer is None or isinstance(tokenizer, (str, os.PathLike)):
        tokenizer, pad_token_id = load_tokenizer(model, tokenizer)
    else:
        pad_token_id = model_pad_token_id(model, tokenizer)
    return load_trained(model, model_class=model_class, pad_token_id=pad_token_id), tokenizer, \
        f"the model in {model}"


def other_task(what: str, theirs: str, asked: str, *, has_pipeline: bool = True) -> str:
    """The message for a model of task `theirs` given to pipeline(`asked`): `what` it is, and the
    pipeline that reads it (or that none does)."""
    fix = (f"read it with flaxheads.pipeline({theirs!r}, model=...)" if has_pipeline
           else "flaxheads.pipeline has no task for it")
    return f"{what}, which pipeline({asked!r}) does not read: {fix}"


def checkpoint_task(model_dir: str | os.PathLike) -> str | None:
    """The task of the transformers class config.json's `architectures` name
    (its name in `flaxheads.tasks.TASKS`); None for a bare or pretraining
    checkpoint, whose head any task would start anew."""
    checkpoint = open_checkpoint(model_dir)
    architecture_table(checkpoint.config.get("model_type"))  # ValueError naming the families flaxheads reads
    return checkpoint.task


def check_batch_size(batch_size: int) -> None:
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise ValueError(f"batch_size={batch_size!r}: it must be an int of at least 1 (texts per forward pass)")


def padding(tokenizer, backbone) -> dict[str, Any]:
    """`BatchFormat`'s padding fields for `backbone`'s batches read with `tokenizer`."""
    return dict(
        pad_token_id=pad_token_ids(tokenizer, backbone.pad_token_id).input_ids,
        pad_token_type_id=getattr(tokenizer, "pad_token_type_id", 0),
        padding_side=backbone_spec(backbone.model_type).padding_side,
    )


def eval_copy(model) -> tuple[Any, Any]:
    """(graphdef, params) of an eval-mode copy of `model`: the caller's model keeps its mode."""
    runnable = nnx.merge(*nnx.split(model))
    runnable.eval()
    return nnx.split(runnable)


def forward_devices() -> list:
    """The devices a pipeline's forward passes run on (`data_parallel`): every local device of a
    single-process run, else the default one."""
    if jax.process_count() > 1:  # the mesh would span other processes' devices, whose rows this one lacks
        return jax.local_devices()[:1]
    return jax.local_devices()


def data_parallel(params, forward):
    """(params, forward) to run a compiled forward pass `forward(params, *arrays)` over every
    device of `forward_devices()`, as evaluation splits its batches (`training.sharding.Layout`:
    the batch's leading axis over the mesh's data axes, parameters replicated): `params` placed on
    every device, and a forward whose array arguments (None passes through) and outputs have the
    batch's rows first, whose rows are padded to a multiple of the device count (repeating the
    last row) and split over the devices, and whose outputs come back as numpy arrays of the rows
    given. With one device both are returned as they are. Each row is computed alone either way,
    so the answers are the same (float32 rounding)."""
    devices = len(forward_devices())
    if devices == 1:
        return params, forward
    layout = Layout.create()
    rows_sharding = layout.batch()
    params = jax.device_put(params, layout.replicated)

    def over_devices(params, *arrays):
        rows = next(array.shape[0] for array in arrays if array is not None)
        padded = -(-rows // devices) * devices

        def placed(array):
            array = np.asarray(array)
            filler = [(0, padded - rows)] + [(0, 0)] * (array.ndim - 1)
            return jax.device_put(np.pad(array, filler, mode="edge"), rows_sharding)

        out = forward(params, *(None if array is None else placed(array) for array in arrays))
        # An output may hold several entries a row (packed rows' segments): cut in proportion.
        return jax.tree.map(lambda x: np.asarray(x)[: x.shape[0] // padded * rows], out)

    return params, over_devices


def compiled_forward(model, body):
    """(params, forward) of `model` for inference: `forward(params, *arrays)` is `body(the model in
    eval mode, *arrays)` compiled (`compile_cache.forward_jit`, once per shape of the arrays) over
    every local device (`data_parallel`), and `params` an eval-mode copy's (the caller's model
    keeps its mode). What every task's scorer runs its forward passes with."""
    graphdef, params = eval_copy(model)

    def forward(params, *arrays):
        return body(nnx.merge(graphdef, params), *arrays)

    return data_parallel(params, compile_cache.forward_jit(forward, graphdef=graphdef))


def rows_per_batch(needed: int, batch_size: int) -> int:
    """As many rows as `needed`, as a power of two (fewer shapes to compile), up to `batch_size`."""
    return min(batch_size, 1 << (needed - 1).bit_length())


def refuse_non_finite(finite: np.ndarray, source: str, what: str) -> None:
    bad = np.flatnonzero(~finite)
    if bad.size:
        raise FloatingPointError(
            f"{source} gave non-finite scores for {what} {bad[:5].tolist()} (0-based); no prediction "
            f"is given from weights that produce NaN or infinity. Check {source} (was its training "
            "stopped by a non-finite loss?)"
        )


def readable_texts(texts: Iterable[str], name: str = "texts") -> list[str]:
    """`texts` as a list, each a str the model can read: ValueError naming the index of the first
    that is missing (None, NaN), no str, or blank (white space, or characters that print nothing:
    the model would read no word of it, and any label would be made up, so none is given), and
    for one str given where a list of them goes. Every text path (`predict`, `TextScorer`, the
    pipeline) checks its texts here."""
    if isinstance(texts, (str, bytes)):
        raise ValueError(f"{name} is one {type(texts).__name__}, not a list of texts: pass [{_short(texts)}] "
                         "(a str would be read one character at a time)")
    try:
        texts = list(texts)
    except TypeError:
        raise ValueError(f"{name} is {type(texts).__name__} {_short(texts)}, not a list of texts") from None
    for index, text in enumerate(texts):
        if isinstance(text, str) and not _blank(text):
            continue
        if text is None or (isinstance(text, float) and math.isnan(text)):
            problem = f"is missing ({text!r})"
        elif not isinstance(text, str):
            problem = f"is {type(text).__name__} {_short(text)}, not a str"
        else:
            problem = f"is blank ({_short(text)}): the model would read no word of it, and a label for it would be " \
                      "made up"
        raise ValueError(f"the text at index {index} of {name} {problem}. Give every text its words, or leave it out")
    return texts


def _blank(text: str) -> bool:
    """Only white space and characters that print nothing (zero-width spaces, controls)."""
    return all(ch.isspace() or unicodedata.category(ch) in ("Cf", "Cc") for ch in text)


def _short(value, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


UNBOUNDED = 1 << 30
"""The max_length given to the tokenizer when texts are not to be cut."""
UNBOUNDED_START = 128
"""The smallest bucket when texts are not cut: longer texts get the next power of two."""


__all__ = ["Trained", "open_model_folder", "UNBOUNDED", "UNBOUNDED_START", "check_batch_size", "checkpoint_task",
           "compiled_forward", "data_parallel", "eval_copy", "forward_devices", "load_trained", "open_trained", "other_task", "padding",
           "pipeline_model", "readable_texts", "refuse_non_finite", "require_model_folder", "rows_per_batch"]
