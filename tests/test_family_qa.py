"""Question answering on every family of tests/families.py that transformers has a
`*ForQuestionAnswering` for (`Family.question_answering`): start and end logits and the loss equal
transformers' on every padding side the row tests (gold positions inside the window, past it and
negative, clamped as transformers clamps them), PyTorch -> flaxheads -> PyTorch is bit-identical,
exports load in `AutoModelForQuestionAnswering` with no missing or unexpected keys, a head started
on a bare or pretraining checkpoint is reported new with what transformers' class leaves unused,
the dropout before the Linear is each class's, and a family without the class is refused.
XLNet's second class, `XLNetForQuestionAnswering` (the "squad" head), is tests/test_xlnet_squad.py's."""

from __future__ import annotations

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

import flaxheads
from families import FAMILIES, case
from family_parity import assert_close, assert_state_dicts_identical, flax_inputs, state_dict, torch_forward
from flaxheads.tasks.qa.model import QuestionAnsweringOutput, span_loss, span_loss_terms

TASK = "question-answering"


def _rows(*, fast: bool = True) -> list:
    """A param per row with a question-answering class; a second config of another row's classes
    (deberta-v2, llama_linear_rope) runs in the full suite only."""
    return [case(row, id=row.name, fast=fast and row.family_of_classes)
            for row in FAMILIES.values() if row.question_answering is not None]


def _six_rows(row, padding: str) -> dict:
    """(6, seq): the row's three sequences (padded on `padding`) under two seeds, the shape the
    token tests run too (each family's operations compile once for both)."""
    first, second = row.batch(padding, seed=0), row.batch(padding, seed=1)
    return {name: np.concatenate([first[name], second[name]]) for name in first}


def _positions(seq: int) -> tuple[np.ndarray, np.ndarray]:
    """Gold (start, end) of six rows: inside the window, past it (clamped to seq and ignored,
    alone or on both sides), exactly seq, and negative (clamped to 0: scored at position 0)."""
    return (np.array([1, seq + 5, -3, 2, seq, 0]), np.array([3, 4, seq + 1, seq - 1, seq, 100]))


def _eager(row) -> dict:
    return {"attn_implementation": "eager"} if row.eager else {}


def _torch_outputs(model, batch) -> QuestionAnsweringOutput:
    out = torch_forward(model, batch)
    return QuestionAnsweringOutput(out.start_logits.numpy(), out.end_logits.numpy())


def _assert_same_outputs(actual: QuestionAnsweringOutput, expected: QuestionAnsweringOutput, what: str) -> None:
    for field in QuestionAnsweringOutput._fields:
        got = getattr(actual, field)
        assert got.dtype == jnp.float32, f"{what} {field}: {got.dtype}"
        assert_close(got, getattr(expected, field), f"{what} {field}")


def _assert_export_loads_in_transformers(model, path, row, batch: dict) -> None:
    config = json.loads((path / "config.json").read_text())
    reloaded, info = transformers.AutoModelForQuestionAnswering.from_pretrained(path, output_loading_info=True,
                                                                                **_eager(row))

    assert config["architectures"] == [row.question_answering] == [type(reloaded).__name__]
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    _assert_same_outputs(model(**flax_inputs(batch)), _torch_outputs(reloaded.eval(), batch), f"{row.name} export")


@pytest.mark.parametrize("row", _rows())
def test_qa_logits_and_loss_match_transformers_and_the_round_trip_is_bit_identical(hf_checkpoint, tmp_path, row):
    checkpoint = hf_checkpoint(row.question_answering, family=row.name)
    model, info = flaxheads.from_pretrained(checkpoint.path, task=TASK, output_loading_info=True)

    assert isinstance(model, flaxheads.QuestionAnswering) and model.config.head != "squad"
    assert info.fully_pretrained and info.unused == []
    assert flaxheads.tasks.of_checkpoint(checkpoint.path).name == TASK  # what the command line and convert ask
    for padding in row.paddings:
        batch = _six_rows(row, padding)
        start, end = _positions(batch["input_ids"].shape[1])
        out = model(**flax_inputs(batch))
        expected = torch_forward(checkpoint.model, {**batch, "start_positions": start, "end_positions": end})
        assert out.start_logits.shape == batch["input_ids"].shape
        _assert_same_outputs(out, QuestionAnsweringOutput(expected.start_logits, expected.end_logits),
                             f"{row.question_answering}, {padding} padding")
        assert_close(model.loss(out, jnp.asarray(start), jnp.asarray(end)), expected.loss,
                     f"{row.question_answering} loss, {padding} padding")

    model.save_pretrained(tmp_path)
    assert_state_dicts_identical(state_dict(tmp_path), state_dict(checkpoint.path))
    _assert_export_loads_in_transformers(model, tmp_path, row, batch)
    with pytest.raises(ValueError, match=rf"{row.question_answering}.*task='question-answering'"):
        flaxheads.from_pretrained(checkpoint.path)  # a sequence classifier would start a new head beside it


def _expected_report(source, trained) -> tuple[list[str], list[str]]:
    """(newly_initialized, unused) of a load of `source` as transformers' class whose checkpoint
    is `trained`: the tensors one has and the other lacks once each drops its base-model prefix
    (Llama's causal LM keeps its backbone under `model.`, its question answering under
    `transformer.`), named as in `source`."""
    def bare(names, model):
        prefix = f"{model.base_model_prefix}."
        return {name.removeprefix(prefix): name for name in names}

    wanted = bare(state_dict(trained.path), trained.model)
    present = bare(state_dict(source.path), source.model)
    return sorted(wanted.keys() - present.keys()), sorted(present[name] for name in present.keys() - wanted.keys())


@pytest.mark.parametrize("row", [case(row, id=row.name, fast=False) for row in FAMILIES.values()
                                 if row.question_answering and row.family_of_classes])
def test_qa_head_is_new_on_the_bare_and_the_pretraining_checkpoint_and_exports_to_transformers(
    hf_checkpoint, tmp_path, row
):
    """The bare model's pooler and the pretraining heads are unused, as transformers' own class
    leaves them (ModernBERT's masked-LM prediction head is pretrained, as in transformers); the
    model started on the pretraining checkpoint exports under the class's own base-model prefix."""
    trained = hf_checkpoint(row.question_answering, family=row.name)
    for architecture in (row.base, row.pretrained):
        source = hf_checkpoint(architecture, family=row.name)
        model, info = flaxheads.QuestionAnswering.from_pretrained(source.path, seed=3, output_loading_info=True)

        new, unused = _expected_report(source, trained)
        assert new and info.newly_initialized == new, architecture
        assert info.unused == unused, architecture
        print(f"{architecture}: new {new}, unused {unused}")
    model.save_pretrained(tmp_path)
    _assert_export_loads_in_transformers(model, tmp_path, row, _six_rows(row, row.sample_padding))


def test_a_causal_lm_loads_as_question_answering_and_exports_under_the_classes_own_prefix(hf_checkpoint, tmp_path):
    """LlamaForQuestionAnswering keeps its backbone under `transformer.` (LlamaForCausalLM: `model.`):
    the backbone loads from either and the export is the one transformers' class reads."""
    source = hf_checkpoint("LlamaForCausalLM")
    model, info = flaxheads.QuestionAnswering.from_pretrained(source.path, output_loading_info=True)
    model.save_pretrained(tmp_path)
    exported = state_dict(tmp_path)

    assert info.newly_initialized == ["qa_outputs.bias", "qa_outputs.weight"] and info.unused == ["lm_head.weight"]
    assert {name.split(".")[0] for name in exported} == {"transformer", "qa_outputs"}
    for name, tensor in state_dict(source.path).items():
        if name.startswith("model."):
            assert torch.equal(exported[f"transformer.{name.removeprefix('model.')}"], tensor), name
    reloaded = flaxheads.QuestionAnswering.from_pretrained(tmp_path)
    batch = _six_rows(FAMILIES["llama"], "left")
    np.testing.assert_array_equal(reloaded(**flax_inputs(batch)).start_logits, model(**flax_inputs(batch)).start_logits)


def _dropouts_after_the_base_model(architecture: str, row) -> list[float]:
    """The rates of the nn.Dropout layers of transformers' class outside its base model."""
    cls = getattr(transformers, architecture)
    model = cls(cls.config_class(**row.config))
    return [module.p for name, module in model.named_modules() if isinstance(module, torch.nn.Dropout)
            and not name.startswith(f"{model.base_model_prefix}.")]


@pytest.mark.parametrize("row", [row for row in FAMILIES.values() if row.question_answering and row.family_of_classes],
                         ids=lambda row: row.name)
def test_the_dropout_before_the_linear_is_the_transformers_classes_own(row):
    """DistilBERT's qa_dropout and ModernBERT's classifier_dropout (set off their defaults here),
    none on the others, whatever classifier_dropout or hidden_dropout_prob the config holds."""
    overrides = {"qa_dropout": 0.23, "classifier_dropout": 0.17, "seq_classif_dropout": 0.31,
                 "hidden_dropout_prob": 0.29}
    row = dataclasses.replace(row, config={**row.config, **overrides})
    hf = row.hf_config()
    table = flaxheads.conversion.architecture_table(hf["model_type"])
    config = flaxheads.QuestionAnsweringConfig.from_hf_config(hf, default_head=table.default_head(TASK))
    rates = _dropouts_after_the_base_model(row.question_answering, row)

    assert config.dropout_rate == pytest.approx(rates[0] if rates else 0.0)


def test_span_loss_ignores_positions_past_the_window_and_its_terms_reduce_to_it_under_jit():
    """transformers' rule: positions clamped to [0, seq], seq ignored; a side with every position
    ignored adds 0 (PyTorch: nan); the (numerators, denominators) terms the train step sums give
    the same loss when each example's start and end are scored together."""
    rng = np.random.default_rng(0)
    start_logits, end_logits = (jnp.asarray(rng.normal(size=(4, 7)), jnp.float32) for _ in range(2))
    start, end = jnp.array([0, 6, -2, 7]), jnp.array([3, 6, 9, 40])
    ce = torch.nn.functional.cross_entropy

    def side(logits, positions):
        return ce(torch.tensor(np.asarray(logits)), torch.tensor(np.asarray(positions), dtype=torch.int64).clamp(0, 7),
                  ignore_index=7)

    def reference(s, e):
        return float(side(start_logits, s) + side(end_logits, e)) / 2

    assert_close(span_loss(start_logits, end_logits, start, end), reference(start, end), "span loss")
    together = jnp.array([0, 6, 7, 9]), jnp.array([3, 6, 8, 40])  # rows 2 and 3 ignored on both sides
    numerators, denominators = jax.jit(span_loss_terms)(start_logits, end_logits, *together)
    assert_close(jnp.sum(numerators) / jnp.sum(denominators), reference(*together), "summed terms")
    assert np.isnan(reference(start, jnp.full(4, 7)))
    assert_close(span_loss(start_logits, end_logits, start, jnp.full(4, 7)), float(side(start_logits, start)) / 2,
                 "every end ignored")
    with pytest.raises(ValueError, match=r"start_positions must be .* integers of shape \(4,\)"):
        span_loss(start_logits, end_logits, start.astype(jnp.float32), end)


def test_a_family_without_a_question_answering_class_is_refused_naming_it(hf_checkpoint):
    checkpoint = hf_checkpoint("GemmaForCausalLM", family="gemma")

    with pytest.raises(ValueError, match="'gemma' has no question-answering model in transformers"):
        flaxheads.from_pretrained(checkpoint.path, task=TASK)
    assert not hasattr(transformers, "GemmaForQuestionAnswering")


def test_settings_of_other_tasks_and_squad_only_inputs_are_refused_naming_the_fix(hf_checkpoint):
    path = hf_checkpoint("BertForQuestionAnswering").path

    with pytest.raises(ValueError, match="num_labels, problem_type: a question-answering model has two outputs"):
        flaxheads.QuestionAnswering.from_pretrained(path, num_labels=3, problem_type="regression")
    with pytest.raises(ValueError, match=r"head='squad'.*BertForQuestionAnswering \('linear'\); pass head='linear'"):
        flaxheads.QuestionAnswering.from_pretrained(path, head="squad")
    model = flaxheads.QuestionAnswering.from_pretrained(path, num_labels=2)
    batch = flax_inputs(_six_rows(FAMILIES["bert"], "right"))
    with pytest.raises(ValueError, match="p_mask: only the 'squad' head"):
        model(**batch, p_mask=jnp.zeros(batch["input_ids"].shape))
    with pytest.raises(ValueError, match="is_impossible: only the 'squad' head"):
        model.loss(model(**batch), jnp.zeros(6, jnp.int32), jnp.zeros(6, jnp.int32), is_impossible=jnp.zeros(6))


def test_a_qa_checkpoint_is_known_as_one_to_a_process_that_never_imported_the_task(hf_checkpoint):
    """ModernBertForQuestionAnswering's head has a token classifier's tensor names: loaded by a
    TokenClassifier in a process without flaxheads.tasks.qa, it must still be refused naming the
    task, never filled with the other task's weights."""
    import subprocess
    import sys

    checkpoint = hf_checkpoint("ModernBertForQuestionAnswering", family="modernbert")
    code = ("import sys; from flaxheads.tasks.token.model import TokenClassifier\n"
            "try:\n    TokenClassifier.from_pretrained(sys.argv[1])\nexcept ValueError as error:\n    print(error)\n"
            "assert 'flaxheads.tasks.qa' not in sys.modules\n")
    done = subprocess.run([sys.executable, "-c", code, str(checkpoint.path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "ModernBertForQuestionAnswering, a question-answering model" in done.stdout, done.stdout


def test_inspect_describes_a_qa_checkpoint_as_one(hf_checkpoint):
    from flaxheads.convert import describe

    text = describe(hf_checkpoint("BertForQuestionAnswering").path)
    assert "a question-answering model (no labels)" in text and "choice" not in text
    assert "task: question-answering" in text
