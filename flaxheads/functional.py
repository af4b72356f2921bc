"""A flaxheads model as Hugging Face Flax models present one: `.params` (a nested dict of arrays)
and a pure `__call__(..., params=, dropout_rng=, train=)`, so a training script written for a
`FlaxAutoModelFor...` class (`TrainState(apply_fn=model.__call__, params=model.params)`,
`jax.pmap`, optax masks) runs on flaxheads with its model lines changed.

`FunctionalModel` knows no task: each task's face is a subclass naming its model class and its
output type (`flaxheads.FunctionalClassifier`, `flaxheads.FunctionalTokenClassifier`,
`flaxheads.FunctionalMultipleChoice`, `flaxheads.FunctionalQuestionAnswering`, in
`tasks/<task>/functional.py`).

    model = FunctionalTokenClassifier.from_pretrained("path/to/bert", num_labels=9)
    logits = model(input_ids, attention_mask, params=model.params, dropout_rng=key, train=True).logits
    model.save_pretrained("out", params=trained_params)     # a directory transformers loads
"""

from __future__ import annotations

import os
import warnings
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from flax import nnx, traverse_util

from flaxheads.backbones.dropout import DropoutKeys
from flaxheads.model import PretrainedModel

Params = dict[str, Any]
"""{"backbone": {"layers": {"0": {"attention": {"query": {"kernel": array, ...}}}}}, "head": ...}"""


class FunctionalModel:
    """A flaxheads model split into structure and `.params`, called as a pure function.

    `.params` is a nested dict of plain arrays with string keys (layer indices "0", "1", ...), the
    layout of Hugging Face Flax models: `flax.traverse_util.flatten_dict`, optax masks,
    `flax.jax_utils.replicate` and `jax.pmap` take it as it is. The names are flaxheads' own
    (`backbone.layers.0.attention_norm.scale`), so mask weight decay with `flaxheads.decay_mask`.

    A subclass names `model_class` (the flaxheads model it wraps) and `output_class` (a
    NamedTuple whose first field is `logits`, as Hugging Face's `Flax...Output` has them, so
    `apply_fn(...)[0]` keeps working; or, for a model that already returns a NamedTuple of its
    outputs, that NamedTuple: question answering's `start_logits`, `end_logits`).
    """

    model_class: ClassVar[type[PretrainedModel]]
    """The model this face wraps (`SequenceClassifier`, `TokenClassifier`, `MultipleChoice`,
    `QuestionAnswering`): what `from_pretrained` loads and `to_model` returns."""
    output_class: ClassVar[type]
    """What `__call__` returns: `output_class(logits)`, or the model's output where it is an
    `output_class` already; a pytree, so it can leave `jax.jit` / `jax.pmap`."""

    def __init__(self, model: PretrainedModel):
        graphdef, params, self._rest = nnx.split(model, nnx.Param, ...)
        self._graphdef = graphdef
        flat = list(nnx.to_flat_state(params))
        self.params: Params = traverse_util.unflatten_dict({tuple(map(str, path)): var[...] for path, var in flat})
        # Shapes only: the arrays live in `self.params`, which the caller may replace.
        self._variables = [
            (path, ".".join(map(str, path)), var.replace(jax.ShapeDtypeStruct(var.shape, var.dtype)))
            for path, var in flat
        ]
        self.config = model.config

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, **options):
        """`model_class.from_pretrained(path, **options)` wrapped: the same options (`config=`,
        `num_labels=`, `seed=`, `dtype=`, `token=`, ...) and errors; with
        `output_loading_info=True`, `(face, LoadingInfo)`. Newly initialised parameters are named
        in a warning, as transformers' `from_pretrained` names them, since a script written for it
        relies on that. `use_auth_token=`, transformers 4.x's older name for `token=` (which
        scripts of that time pass), is taken as `token=`."""
        if "use_auth_token" in options:
            if options.get("token") is not None:
                raise ValueError("use_auth_token= is the older name of token=: pass token= alone")
            options["token"] = options.pop("use_auth_token")
        wants_info = options.pop("output_loading_info", False)
        model, info = cls.model_class.from_pretrained(path, output_loading_info=True, **options)
        if info.untrained:
            warnings.warn(
                f"Some weights of the model were not initialized from the checkpoint at {path} and are newly "
                f"initialized: {info.untrained}. You should probably TRAIN this model on a down-stream task to be "
                "able to use it for predictions and inference.", UserWarning, stacklevel=2)
        return (cls(model), info) if wants_info else cls(model)

    def __call__(
        self,
        input_ids: jax.Array,
        attention_mask: jax.Array | None = None,
        token_type_ids: jax.Array | None = None,
        position_ids: jax.Array | None = None,
        *,
        params: Params | None = None,
        dropout_rng: jax.Array | None = None,
        train: bool = False,
        **model_inputs,
    ):
        """`output_class(logits)`, the logits `model_class.__call__` gives for these inputs (and
        any other keyword input it takes, `model_inputs`).

        A pure function of its arguments (`params` default: `self.params`), usable as a
        `TrainState`'s `apply_fn` under `jax.jit` and `jax.pmap`. `train=True` turns dropout on,
        drawn from `dropout_rng` (required then) as the model draws it from
        `rngs=nnx.Rngs(dropout=dropout_rng)`; `train=False` is deterministic and ignores it.
        Raises ValueError naming the first key of `params` that does not fit the model."""
        if train and dropout_rng is None:
            raise ValueError(
                "train=True turns dropout on and needs its randomness: pass dropout_rng=jax.random.key(...) "
                "(under pmap, one key per device), or train=False for a deterministic call"
            )
        model = self.to_model(self.params if params is None else params)
        inputs = dict(attention_mask=attention_mask, token_type_ids=token_type_ids, position_ids=position_ids,
                      **model_inputs)
        if train:
            model.train()
            outputs = model(input_ids, **inputs, rngs=DropoutKeys(dropout_rng))
        else:
            model.eval()
            outputs = model(input_ids, **inputs)
        return outputs if isinstance(outputs, self.output_class) else self.output_class(outputs)

    def to_model(self, params: Params | None = None):
        """The `model_class` model holding `params` (default `self.params`), arrays as given (bit
        for bit). Raises ValueError naming the first missing, unexpected or ill-fitting key."""
        flat = _flat_by_dotted_name(self.params if params is None else params)
        expected = {name for _, name, _ in self._variables}
        unexpected = sorted(set(flat) - expected)
        if unexpected:
            raise ValueError(
                f"params has {unexpected[0]!r} ({len(unexpected)} key(s) in all), which this model lacks; "
                "params must come from this model's `.params` (same architecture, head and num_labels)"
            )
        leaves = []
        for path, name, var in self._variables:
            if name not in flat:
                raise ValueError(f"params lacks {name!r}: pass every parameter of this model's `.params`")
            value = flat[name]
            if tuple(value.shape) != tuple(var.shape) or jnp.dtype(value.dtype) != jnp.dtype(var.dtype):
                raise ValueError(
                    f"params[{name!r}] is {jnp.dtype(value.dtype).name}{list(value.shape)} but the model "
                    f"expects {jnp.dtype(var.dtype).name}{list(var.shape)}; under pmap pass the params of one "
                    "device (`flax.jax_utils.unreplicate`), and cast with jax.tree.map if the dtype differs"
                )
            leaves.append((path, var.replace(value if isinstance(value, jax.Array) else jnp.asarray(value))))
        return nnx.merge(self._graphdef, nnx.from_flat_state(leaves), self._rest)

    def save_pretrained(self, path: str | os.PathLike, params: Params | None = None, **options) -> None:
        """Writes the model holding `params` (default `self.params`) as `model.save_pretrained(path,
        **options)` does: a Hugging Face directory transformers loads (`format="pytorch"`)."""
        self.to_model(params).save_pretrained(path, **options)


def _flat_by_dotted_name(params) -> dict[str, Any]:
    """{"backbone.layers.0.attention.query.kernel": array} from a nested dict (plain or frozen) or
    an `nnx.State`."""
    if isinstance(params, nnx.State):
        params = nnx.to_pure_dict(params)
    if not hasattr(params, "items"):
        raise ValueError(f"params is a {type(params).__name__}; pass a nested dict of arrays like `model.params`")
    return {".".join(map(str, key)): value for key, value in traverse_util.flatten_dict(params).items()}


__all__ = ["FunctionalModel", "Params"]
