"""The Hugging Face Flax faces (`.params` + pure `__call__`): FunctionalClassifier, and the token
classification, multiple-choice and question-answering faces over the same `FunctionalModel`; and
`decay_mask`."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx, traverse_util
from flax.core import freeze

import flaxheads
from flaxheads import conversion
from flaxheads.tasks.choice.functional import FunctionalMultipleChoice
from flaxheads.tasks.classification.functional import FunctionalClassifier
from flaxheads.tasks.classification.model import ClassifierConfig, SequenceClassifier
from flaxheads.tasks.qa.functional import FunctionalQuestionAnswering
from flaxheads.tasks.qa.model import QuestionAnswering, QuestionAnsweringOutput
from flaxheads.tasks.token.functional import FunctionalTokenClassifier


@pytest.fixture(scope="module")
def checkpoint(hf_checkpoint):
    return hf_checkpoint("BertForSequenceClassification", num_labels=3)


@pytest.fixture(scope="module")
def classifier(checkpoint) -> FunctionalClassifier:
    return FunctionalClassifier.from_pretrained(checkpoint.path)


def _batch(seed: int = 0) -> dict[str, jax.Array]:
    rng = np.random.default_rng(seed)
    input_ids = rng.integers(1, 99, size=(3, 9))
    attention_mask = np.ones_like(input_ids)
    attention_mask[1, 6:] = 0
    input_ids[1, 6:] = 0
    return {
        "input_ids": jnp.asarray(input_ids),
        "attention_mask": jnp.asarray(attention_mask),
        "token_type_ids": jnp.asarray((np.arange(9) >= 5).astype(np.int64)[None].repeat(3, 0)),
    }


def _perturbed(params, seed: int = 1):
    """Params unlike the checkpoint's, so a round trip that read the checkpoint again would fail."""
    leaves, treedef = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    return jax.tree.unflatten(treedef, [x + 0.01 * jax.random.normal(k, x.shape, x.dtype) for x, k in zip(leaves, keys)])


def _assert_bit_identical(actual, expected) -> None:
    actual, expected = traverse_util.flatten_dict(actual), traverse_util.flatten_dict(expected)
    assert actual.keys() == expected.keys()
    for key in expected:
        a, e = np.asarray(actual[key]), np.asarray(expected[key])
        assert a.dtype == e.dtype and a.shape == e.shape, key
        assert a.tobytes() == e.tobytes(), f"{key} differs"


def test_params_are_a_string_keyed_nested_dict_of_arrays_that_flatten_dict_handles(classifier):
    flat = traverse_util.flatten_dict(classifier.params)
    assert all(isinstance(k, str) for path in flat for k in path)
    assert sorted(classifier.params["backbone"]["layers"]) == ["0", "1"]
    assert all(isinstance(v, jax.Array) for v in flat.values())
    assert flat[("backbone", "layers", "0", "attention_norm", "scale")].shape == (32,)
    assert flat[("head", "classifier", "kernel")].shape == (32, 3)
    _, state = nnx.split(classifier.to_model(), nnx.Param)
    assert len(flat) == len(list(nnx.to_flat_state(state)))


@pytest.mark.slow
def test_apply_fn_in_eval_mode_gives_the_models_logits_and_index_0_is_the_logits(classifier, checkpoint):
    batch = _batch()
    out = jax.jit(classifier.__call__)(**batch, params=classifier.params)
    assert out[0] is out.logits and out.logits.shape == (3, 3) and out.logits.dtype == jnp.float32
    expected = classifier.to_model()(**batch)
    np.testing.assert_allclose(np.asarray(out.logits), np.asarray(expected), atol=1e-6, rtol=0)
    with torch.no_grad():
        torch_logits = checkpoint.model(**{k: torch.as_tensor(np.array(v)) for k, v in batch.items()}).logits
    print("max |apply_fn - transformers|", np.abs(np.asarray(out.logits) - torch_logits.numpy()).max())
    np.testing.assert_allclose(np.asarray(out.logits), torch_logits.numpy(), atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_train_mode_drops_units_reproducibly_per_key(classifier):
    batch, params = _batch(), classifier.params
    call = jax.jit(classifier.__call__, static_argnames="train")
    eval_logits = np.asarray(call(**batch, params=params).logits)
    first = np.asarray(call(**batch, params=params, dropout_rng=jax.random.PRNGKey(0), train=True).logits)
    again = np.asarray(call(**batch, params=params, dropout_rng=jax.random.PRNGKey(0), train=True).logits)
    other = np.asarray(call(**batch, params=params, dropout_rng=jax.random.PRNGKey(1), train=True).logits)
    np.testing.assert_array_equal(first, again)
    assert np.abs(first - eval_logits).max() > 1e-3
    assert np.abs(first - other).max() > 1e-3
    # eval ignores a key it is given
    np.testing.assert_array_equal(
        np.asarray(call(**batch, params=params, dropout_rng=jax.random.PRNGKey(0)).logits), eval_logits
    )


def test_train_without_dropout_rng_is_refused(classifier):
    with pytest.raises(ValueError, match="train=True .* pass dropout_rng="):
        classifier(**_batch(), train=True)


@pytest.mark.slow
def test_params_round_trip_bit_exact_through_to_model(classifier):
    params = _perturbed(classifier.params)
    _assert_bit_identical(FunctionalClassifier(classifier.to_model(params)).params, params)
    host = jax.device_get(params)  # what run_flax_glue saves: numpy arrays
    _assert_bit_identical(FunctionalClassifier(classifier.to_model(host)).params, params)
    _assert_bit_identical(FunctionalClassifier(classifier.to_model(freeze(params))).params, params)
    _, state = nnx.split(classifier.to_model(params), nnx.Param)  # an nnx.State fits too
    _assert_bit_identical(FunctionalClassifier(classifier.to_model(state)).params, params)


@pytest.mark.slow
def test_save_pretrained_with_params_writes_them_bit_exact_for_flaxheads_and_transformers(classifier, tmp_path):
    params = _perturbed(classifier.params)
    classifier.save_pretrained(tmp_path, params=jax.device_get(params))
    reloaded = FunctionalClassifier.from_pretrained(tmp_path)
    _assert_bit_identical(reloaded.params, params)
    assert reloaded.config == classifier.config

    batch = _batch()
    ours = np.asarray(reloaded(**batch).logits)
    torch_model = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        theirs = torch_model(**{k: torch.as_tensor(np.array(v)) for k, v in batch.items()}).logits.numpy()
    print("max |flaxheads - transformers| after save_pretrained(params=)", np.abs(ours - theirs).max())
    np.testing.assert_allclose(ours, theirs, atol=1e-5, rtol=1e-5)
    assert np.abs(ours - np.asarray(classifier(**batch).logits)).max() > 1e-4  # the new params, not the old


def test_a_params_dict_that_does_not_fit_names_the_first_mismatching_key(classifier):
    flat = traverse_util.flatten_dict(classifier.params)
    key = ("head", "classifier", "kernel")
    wrong_shape = traverse_util.unflatten_dict({**flat, key: jnp.zeros((32, 5))})
    with pytest.raises(ValueError, match=r"params\['head.classifier.kernel'\] is float32\[32, 5\] but the model "
                                         r"expects float32\[32, 3\]"):
        classifier(**_batch(), params=wrong_shape)
    wrong_dtype = traverse_util.unflatten_dict({**flat, key: flat[key].astype(jnp.bfloat16)})
    with pytest.raises(ValueError, match=r"is bfloat16\[32, 3\] but the model expects float32\[32, 3\]"):
        classifier.save_pretrained("never_written", params=wrong_dtype)
    missing = traverse_util.unflatten_dict({k: v for k, v in flat.items() if k != key})
    with pytest.raises(ValueError, match="params lacks 'head.classifier.kernel'"):
        classifier.to_model(missing)
    extra = traverse_util.unflatten_dict({**flat, ("head", "extra", "kernel"): flat[key]})
    with pytest.raises(ValueError, match="params has 'head.extra.kernel'"):
        classifier.to_model(extra)


def test_from_pretrained_passes_options_through_and_returns_the_loading_info_when_asked(checkpoint):
    classifier, info = FunctionalClassifier.from_pretrained(checkpoint.path, num_labels=3, output_loading_info=True)
    assert isinstance(info, flaxheads.LoadingInfo) and not info.newly_initialized
    fresh = FunctionalClassifier.from_pretrained(checkpoint.path, num_labels=5, ignore_mismatched_sizes=True)
    assert fresh.params["head"]["classifier"]["kernel"].shape == (32, 5) and fresh.config.num_labels == 5


def test_from_pretrained_takes_the_options_hugging_face_scripts_pass(checkpoint):
    config = transformers.AutoConfig.from_pretrained(checkpoint.path, num_labels=3, finetuning_task=None)
    config.id2label, config.label2id = {0: "a", 1: "b", 2: "c"}, {"a": 0, "b": 1, "c": 2}
    classifier = FunctionalClassifier.from_pretrained(checkpoint.path, config=config, token=None, trust_remote_code=False)
    assert classifier.config.label2id == {"a": 0, "b": 1, "c": 2}
    with pytest.raises(ValueError, match="trust_remote_code=True"):
        FunctionalClassifier.from_pretrained(checkpoint.path, trust_remote_code=True)


# ---- decay_mask ---------------------------------------------------------------------------------


def run_flax_glue_decay_mask_fn(params):
    """The rule of `decay_mask_fn` in transformers' examples/flax/text-classification/run_flax_glue.py
    (v4.40), restated: no decay for a parameter named "bias", nor for any (module, parameter) name
    pair that ends a path whose joined, lowercased names contain "layernorm", "layer_norm" or "ln"."""
    flat = traverse_util.flatten_dict(params)
    norm_pairs = {path[-2:] for path in flat if any(s in "".join(path).lower() for s in ("layernorm", "layer_norm", "ln"))}
    return traverse_util.unflatten_dict({path: path[-1] != "bias" and path[-2:] not in norm_pairs for path in flat})


TINY = {
    "bert": lambda: transformers.BertForSequenceClassification(transformers.BertConfig(
        vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37)),
    "roberta": lambda: transformers.RobertaForSequenceClassification(transformers.RobertaConfig(
        vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37)),
    "gpt2": lambda: transformers.GPT2ForSequenceClassification(transformers.GPT2Config(
        vocab_size=99, n_embd=32, n_layer=2, n_head=4, n_positions=64, pad_token_id=0)),
    "xlnet": lambda: transformers.XLNetForSequenceClassification(transformers.XLNetConfig(
        vocab_size=99, d_model=32, n_layer=2, n_head=4, d_inner=37)),
    "albert": lambda: transformers.AlbertForSequenceClassification(transformers.AlbertConfig(
        vocab_size=99, embedding_size=24, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37)),
}


def _hf_flax_tree(torch_model) -> dict:
    """The parameter tree Hugging Face Flax gives this model: torch names split at dots, `weight`
    renamed `scale` (norms), `embedding` (embeddings) or `kernel` (the rest)."""
    tree = {}
    for name, param in torch_model.named_parameters():
        path = name.split(".")
        if path[-1] == "weight":
            module = path[-2].lower()
            is_norm = "norm" in module or module.startswith("ln_")
            is_embedding = "embed" in module or module in ("wte", "wpe")
            path[-1] = "scale" if is_norm else "embedding" if is_embedding else "kernel"
        tree[tuple(path)] = np.zeros(param.shape[::-1] if path[-1] == "kernel" else param.shape, np.float32)
    return traverse_util.unflatten_dict(tree)


@pytest.mark.parametrize("family", ["bert", "roberta", "gpt2", "albert"])
def test_decay_mask_agrees_with_run_flax_glue_decay_mask_fn_on_hugging_face_flax_names(family):
    params = _hf_flax_tree(TINY[family]())
    ours = traverse_util.flatten_dict(flaxheads.decay_mask(params))
    theirs = traverse_util.flatten_dict(run_flax_glue_decay_mask_fn(params))
    assert ours == theirs
    assert 0 < sum(ours.values()) < len(ours)


def _abstract_flaxheads_params(torch_model) -> nnx.State:
    hf = torch_model.config.to_dict()
    table = conversion.architecture_table(hf["model_type"])
    config = ClassifierConfig.from_hf_config(hf, default_head=table.canonical_head)
    model = nnx.eval_shape(lambda: SequenceClassifier(config, rngs=nnx.Rngs(0)))
    return nnx.split(model, nnx.Param)[1]


@pytest.mark.parametrize("family", ["bert", "roberta", "gpt2", "xlnet", "albert"])
def test_decay_mask_decays_exactly_what_transformers_trainer_decays(family):
    """Counted in elements, so flaxheads' own layout (fused or split tensors) compares fairly."""
    torch_model = TINY[family]()
    trainer_decays = set(transformers.Trainer.get_decay_parameter_names(None, torch_model))
    sizes = {name: p.numel() for name, p in torch_model.named_parameters()}
    params = _abstract_flaxheads_params(torch_model)
    mask = flaxheads.decay_mask(params)
    decayed = sum(int(np.prod(p.shape)) for p, m in zip(jax.tree.leaves(params), jax.tree.leaves(mask)) if m)
    total = sum(int(np.prod(p.shape)) for p in jax.tree.leaves(params))
    assert total == sum(sizes.values())
    assert decayed == sum(sizes[n] for n in trainer_decays)


def test_decay_mask_exempts_flaxheads_norm_scales_that_run_flax_glue_decay_mask_fn_would_decay(classifier):
    ours = traverse_util.flatten_dict(flaxheads.decay_mask(classifier.params))
    naive = traverse_util.flatten_dict(run_flax_glue_decay_mask_fn(classifier.params))
    for norm in ("attention_norm", "output_norm"):
        key = ("backbone", "layers", "0", norm, "scale")
        assert ours[key] is False
        assert naive[key] is True  # the silent mistake flaxheads.decay_mask exists to prevent
    assert ours[("backbone", "layers", "0", "attention", "query", "kernel")] is True
    assert ours[("backbone", "embeddings", "word_embeddings", "embedding")] is True
    assert ours[("head", "classifier", "bias")] is False


def test_decay_mask_gives_the_same_answer_for_frozen_flat_and_nnx_state_params(classifier):
    expected = traverse_util.flatten_dict(flaxheads.decay_mask(classifier.params))
    frozen = flaxheads.decay_mask(freeze(classifier.params))
    assert type(frozen).__name__ == "FrozenDict"
    assert traverse_util.flatten_dict(frozen.unfreeze()) == expected
    flat_tuples = traverse_util.flatten_dict(classifier.params)
    assert flaxheads.decay_mask(flat_tuples) == expected
    flat_slashes = traverse_util.flatten_dict(classifier.params, sep="/")
    assert flaxheads.decay_mask(flat_slashes) == {"/".join(k): v for k, v in expected.items()}
    _, state = nnx.split(classifier.to_model(), nnx.Param)
    state_mask = {tuple(map(str, path)): var.get_value() for path, var in nnx.to_flat_state(flaxheads.decay_mask(state))}
    assert state_mask == expected


@pytest.mark.slow
def test_packed_call_returns_each_segments_logits_as_the_model_does(classifier):
    input_ids = jnp.asarray([[2, 11, 12, 3, 2, 13, 3, 0, 0]])
    segment_ids = jnp.asarray([[1, 1, 1, 1, 2, 2, 2, 0, 0]])
    packed = classifier(input_ids, segment_ids=segment_ids, num_segments=3).logits
    alone = [classifier(input_ids[:, :4]).logits[0], classifier(input_ids[:, 4:7]).logits[0]]
    assert packed.shape == (1, 3, 3)
    np.testing.assert_allclose(packed[0, :2], jnp.stack(alone), atol=1e-5)


def test_from_pretrained_warns_naming_the_newly_initialised_weights_as_transformers_does(checkpoint):
    with pytest.warns(UserWarning, match=r"newly initialized: \['classifier.weight', 'classifier.bias'\]"):
        FunctionalClassifier.from_pretrained(checkpoint.path, num_labels=5, ignore_mismatched_sizes=True)


# ---- the token-classification and multiple-choice faces -----------------------------------------


FACES = {
    # face, the checkpoint's transformers class, transformers' Auto class that loads an export, inputs
    "token": (FunctionalTokenClassifier, "BertForTokenClassification", transformers.AutoModelForTokenClassification,
              _batch),
    "choice": (FunctionalMultipleChoice, "BertForMultipleChoice", transformers.AutoModelForMultipleChoice,
               lambda: {name: jnp.stack([a, b]) for (name, a), b in zip(_batch(0).items(), _batch(1).values())}),
}
"""Each task's face beside FunctionalClassifier, tested for what `FunctionalModel` promises."""


@pytest.fixture(scope="module", params=list(FACES))
def face(request, hf_checkpoint):
    """(face, its checkpoint, inputs): a face loaded from a tiny BERT of its task."""
    face_class, architecture, _, batch = FACES[request.param]
    checkpoint = hf_checkpoint(architecture, num_labels=5)
    return face_class.from_pretrained(checkpoint.path), checkpoint, batch()


def _torch_logits(torch_model, batch) -> np.ndarray:
    with torch.no_grad():
        return torch_model(**{k: torch.as_tensor(np.array(v)) for k, v in batch.items()}).logits.numpy()


@pytest.mark.slow
def test_each_faces_eval_call_gives_its_models_logits_bit_for_bit_and_index_0_is_the_logits(face):
    model, checkpoint, batch = face
    out = model(**batch, params=model.params)
    expected = np.asarray(model.model_class.from_pretrained(checkpoint.path)(**batch))
    assert type(out) is model.output_class and out[0] is out.logits and out.logits.dtype == jnp.float32
    theirs = _torch_logits(checkpoint.model, batch)
    assert out.logits.shape == expected.shape == theirs.shape
    assert np.asarray(out.logits).tobytes() == expected.tobytes()
    print("max |apply_fn - transformers|", np.abs(np.asarray(out.logits) - theirs).max())
    np.testing.assert_allclose(np.asarray(out.logits), theirs, atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_each_faces_train_call_drops_what_the_model_drops_with_nnx_rngs_of_its_dropout_rng(face):
    model, checkpoint, batch = face
    key = jax.random.key(7)
    in_memory = model.model_class.from_pretrained(checkpoint.path)
    in_memory.train()
    expected = np.asarray(in_memory(**batch, rngs=nnx.Rngs(dropout=key)))
    train = np.asarray(model(**batch, dropout_rng=key, train=True).logits)
    assert train.tobytes() == expected.tobytes()
    assert np.abs(train - np.asarray(model(**batch).logits)).max() > 1e-3  # dropout was on


@pytest.mark.slow
def test_each_faces_params_round_trip_bit_exact_through_to_model(face):
    model, _, _ = face
    params = _perturbed(model.params)
    _assert_bit_identical(type(model)(model.to_model(params)).params, params)
    _assert_bit_identical(type(model)(model.to_model(jax.device_get(params))).params, params)


def test_each_faces_save_pretrained_with_params_reloads_to_those_params_in_flaxheads_and_transformers(face, tmp_path):
    model, checkpoint, batch = face
    params = _perturbed(model.params)
    model.save_pretrained(tmp_path, params=jax.device_get(params))
    reloaded = type(model).from_pretrained(tmp_path)
    _assert_bit_identical(reloaded.params, params)
    assert reloaded.config == model.config

    ours = np.asarray(reloaded(**batch).logits)
    auto_class = next(auto for face_class, _, auto, _ in FACES.values() if face_class is type(model))
    theirs = _torch_logits(auto_class.from_pretrained(tmp_path).eval(), batch)
    print("max |flaxheads - transformers| after save_pretrained(params=)", np.abs(ours - theirs).max())
    np.testing.assert_allclose(ours, theirs, atol=1e-5, rtol=1e-5)
    assert np.abs(ours - np.asarray(model(**batch).logits)).max() > 1e-4  # the new params, not the old


def test_each_faces_ill_fitting_params_are_refused_naming_the_key(face):
    model, _, batch = face
    flat = traverse_util.flatten_dict(model.params)
    key = next(path for path in flat if path[0] == "head" and path[-1] == "kernel")
    name, (rows, cols) = ".".join(key), flat[key].shape
    wrong_shape = traverse_util.unflatten_dict({**flat, key: jnp.zeros((rows, cols + 1))})
    with pytest.raises(ValueError, match=rf"params\['{name}'\] is float32\[{rows}, {cols + 1}\] but the model "
                                         rf"expects float32\[{rows}, {cols}\]"):
        model(**batch, params=wrong_shape)
    wrong_dtype = traverse_util.unflatten_dict({**flat, key: flat[key].astype(jnp.bfloat16)})
    with pytest.raises(ValueError, match=rf"params\['{name}'\] is bfloat16"):
        model.save_pretrained("never_written", params=wrong_dtype)
    with pytest.raises(ValueError, match=f"params lacks '{name}'"):
        model.to_model(traverse_util.unflatten_dict({k: v for k, v in flat.items() if k != key}))
    with pytest.raises(ValueError, match="params has 'head.extra.kernel'"):
        model.to_model(traverse_util.unflatten_dict({**flat, ("head", "extra", "kernel"): flat[key]}))


def test_token_face_takes_the_config_and_options_run_flax_ner_passes(hf_checkpoint):
    checkpoint = hf_checkpoint("BertModel")
    tags = ["O", "B-PER", "I-PER"]
    config = transformers.AutoConfig.from_pretrained(
        checkpoint.path, num_labels=3, label2id={tag: i for i, tag in enumerate(tags)},
        id2label={i: tag for i, tag in enumerate(tags)}, finetuning_task="ner")
    with pytest.warns(UserWarning, match=r"newly initialized: \['classifier.bias', 'classifier.weight'\]"):
        model = FunctionalTokenClassifier.from_pretrained(
            checkpoint.path, config=config, cache_dir=None, revision="main", token=None, trust_remote_code=False,
            seed=3, dtype=jnp.float32)
    assert model.config.num_labels == 3 and model.config.id2label == {0: "O", 1: "B-PER", 2: "I-PER"}
    assert model.config.label2id == {"O": 0, "B-PER": 1, "I-PER": 2}
    assert model.params["head"]["classifier"]["kernel"].shape == (32, 3)


def test_choice_face_loads_with_the_config_a_script_passes(hf_checkpoint):
    """A script's `AutoConfig.from_pretrained(path)` carries num_labels=2, which a multiple-choice
    model has no use for: it loads all the same, one score per choice."""
    checkpoint = hf_checkpoint("BertForMultipleChoice")
    model = FunctionalMultipleChoice.from_pretrained(checkpoint.path, config=transformers.AutoConfig.from_pretrained(
        checkpoint.path))
    assert model(**FACES["choice"][3]()).logits.shape == (2, 3)


def test_use_auth_token_is_taken_as_token_as_transformers_4_took_it(checkpoint, monkeypatch):
    """Older copies of the examples/flax scripts (run_flax_ner.py of transformers 4.22, for one) pass
    `use_auth_token=`."""
    passed = {}
    load = SequenceClassifier.from_pretrained.__func__

    def recording(cls, path, **options):
        passed.update(options)
        return load(cls, path, **options)

    monkeypatch.setattr(SequenceClassifier, "from_pretrained", classmethod(recording))
    FunctionalClassifier.from_pretrained(checkpoint.path, use_auth_token=None)
    assert passed["token"] is None and "use_auth_token" not in passed
    FunctionalClassifier.from_pretrained(checkpoint.path, use_auth_token=True)
    assert passed["token"] is True
    with pytest.raises(ValueError, match="use_auth_token= is the older name of token=: pass token= alone"):
        FunctionalClassifier.from_pretrained(checkpoint.path, use_auth_token=True, token="hf_x")


# -- question answering: two outputs, start and end logits ----------------------------------------


@pytest.fixture(scope="module")
def reader(hf_checkpoint):
    """(FunctionalQuestionAnswering of a tiny BertForQuestionAnswering, its checkpoint)."""
    checkpoint = hf_checkpoint("BertForQuestionAnswering")
    return FunctionalQuestionAnswering.from_pretrained(checkpoint.path), checkpoint


def _torch_spans(torch_model, batch) -> tuple[np.ndarray, np.ndarray]:
    with torch.no_grad():
        out = torch_model(**{k: torch.as_tensor(np.array(v)) for k, v in batch.items()})
    return out.start_logits.numpy(), out.end_logits.numpy()


@pytest.mark.slow
def test_qa_faces_eval_call_gives_the_models_start_and_end_logits_bit_for_bit_as_outputs_0_and_1(reader):
    """run_qa.py (Flax) reads `logits[0]`, `logits[1]` in its loss and `predictions[0]`,
    `predictions[1]` after pmap, as `FlaxQuestionAnsweringModelOutput` gives them."""
    model, checkpoint = reader
    batch = _batch()
    out = jax.jit(model.__call__)(**batch, params=model.params)
    expected = QuestionAnswering.from_pretrained(checkpoint.path)(**batch)
    assert type(out) is QuestionAnsweringOutput and len(out) == 2
    assert out[0] is out.start_logits and out[1] is out.end_logits
    start_logits, end_logits = out[:2]
    assert start_logits.shape == end_logits.shape == (3, 9) and start_logits.dtype == jnp.float32
    assert np.asarray(start_logits).tobytes() == np.asarray(expected.start_logits).tobytes()
    assert np.asarray(end_logits).tobytes() == np.asarray(expected.end_logits).tobytes()
    theirs = _torch_spans(checkpoint.model, batch)
    print("max |apply_fn - transformers|", max(np.abs(np.asarray(a) - b).max() for a, b in zip(out, theirs)))
    for ours, reference in zip(out, theirs):
        np.testing.assert_allclose(np.asarray(ours), reference, atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_qa_faces_train_call_drops_what_the_model_drops_with_nnx_rngs_of_its_dropout_rng(reader):
    model, checkpoint = reader
    batch, key = _batch(), jax.random.key(7)
    in_memory = QuestionAnswering.from_pretrained(checkpoint.path)
    in_memory.train()
    expected = in_memory(**batch, rngs=nnx.Rngs(dropout=key))
    train = model(**batch, dropout_rng=key, train=True)
    for ours, reference in zip(train, expected):
        assert np.asarray(ours).tobytes() == np.asarray(reference).tobytes()
    assert np.abs(np.asarray(train.start_logits) - np.asarray(model(**batch).start_logits)).max() > 1e-3


def test_qa_faces_save_pretrained_with_params_reloads_to_those_params_in_flaxheads_and_transformers(reader, tmp_path):
    model, _ = reader
    params = _perturbed(model.params)
    model.save_pretrained(tmp_path, params=jax.device_get(params))
    reloaded = FunctionalQuestionAnswering.from_pretrained(tmp_path)
    _assert_bit_identical(reloaded.params, params)
    assert reloaded.config == model.config

    batch = _batch()
    ours = reloaded(**batch)
    theirs = _torch_spans(transformers.AutoModelForQuestionAnswering.from_pretrained(tmp_path).eval(), batch)
    for mine, reference in zip(ours, theirs):
        np.testing.assert_allclose(np.asarray(mine), reference, atol=1e-5, rtol=1e-5)
    assert np.abs(np.asarray(ours.end_logits) - np.asarray(model(**batch).end_logits)).max() > 1e-4  # the new params


def test_qa_face_takes_the_config_and_options_run_qa_passes_and_names_the_new_head(hf_checkpoint):
    """run_qa.py (Flax) loads a bare encoder with `config=AutoConfig.from_pretrained(path)` (which
    carries num_labels=2 and id2label, unused by a span head), `cache_dir=`, `revision=`,
    `use_auth_token=`, `seed=` and `dtype=getattr(jnp, "float32")`."""
    checkpoint = hf_checkpoint("BertModel")
    config = transformers.AutoConfig.from_pretrained(checkpoint.path)
    with pytest.warns(UserWarning, match=r"newly initialized: \['qa_outputs.bias', 'qa_outputs.weight'\]"):
        model = FunctionalQuestionAnswering.from_pretrained(
            checkpoint.path, config=config, cache_dir=None, revision="main", use_auth_token=None, seed=42,
            dtype=getattr(jnp, "float32"))
    assert model.params["head"]["classifier"]["kernel"].shape == (32, 2)
    out = model(**_batch(), params=model.params, dropout_rng=jax.random.key(0), train=True)
    assert out.start_logits.shape == out.end_logits.shape == (3, 9)


def test_qa_face_refuses_xlnets_squad_head_naming_its_span_head(hf_checkpoint):
    """`XLNetForQuestionAnswering` gives beams and reads the gold start inside its forward pass; its
    span head (`XLNetForQuestionAnsweringSimple`) is what a run_qa.py-style loop can train."""
    checkpoint = hf_checkpoint("XLNetForQuestionAnswering")
    with pytest.raises(ValueError, match=r"head='squad' .*FunctionalQuestionAnswering.from_pretrained\(path, "
                                         r"head='linear'\)"):
        FunctionalQuestionAnswering.from_pretrained(checkpoint.path)
    with pytest.warns(UserWarning, match="qa_outputs"):
        simple = FunctionalQuestionAnswering.from_pretrained(checkpoint.path, head="linear")
    batch = {k: v for k, v in _batch().items() if k != "token_type_ids"}
    assert simple(**batch).start_logits.shape == (3, 9)
