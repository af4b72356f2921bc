"""XLNet's full question-answering head, transformers' `XLNetForQuestionAnswering` (flaxheads'
"squad" head): its inference outputs (the start_n_top starts, end_n_top ends per start, the
answer class) and its training loss (start and end, the end read with the gold start, and the
answer-class loss) equal transformers', a checkpoint of the class loads with this head and
round-trips bit-identical, the head starts new on a bare XLNet when asked for, and what it cannot
take is refused. `XLNetForQuestionAnsweringSimple` is row "xlnet" of tests/test_family_qa.py."""

from __future__ import annotations

import json

import jax.numpy as jnp
import numpy as np
import pytest
import transformers

import flaxheads
from families import xlnet_batch
from family_parity import assert_close, assert_state_dicts_identical, flax_inputs, state_dict, torch_forward
from flaxheads.heads.squad import SquadBeams, SquadLogits

TOPS = {"start_n_top": 3, "end_n_top": 4}
"""Beam widths off XLNetConfig's defaults (5, 5) and unequal, so a transposed flat layout fails."""


def _squad(hf_checkpoint):
    return hf_checkpoint("XLNetForQuestionAnswering", **TOPS)


def _question_mask(batch: dict) -> np.ndarray:
    """p_mask: 1.0 on the question (segment 0) and the padding, where no answer lies."""
    return np.isin(batch["token_type_ids"], (0, 3)).astype(np.float32)


@pytest.mark.parametrize("padding, masked", [("none", True), ("left", False)], ids=["p_mask-cls_index", "neither"])
def test_squad_beams_match_transformers(hf_checkpoint, padding, masked):
    """Every row keeps more unmasked positions than end_n_top (rows wholly masked give tied
    probabilities, whose order top-k leaves open in both libraries); cls_index points the answer
    class at other positions than the last, which it reads without one."""
    checkpoint = _squad(hf_checkpoint)
    model = flaxheads.QuestionAnswering.from_pretrained(checkpoint.path)
    batch = xlnet_batch(padding)
    extra = {"p_mask": _question_mask(batch), "cls_index": np.array([9, 3, 0])} if masked else {}
    out = model(**flax_inputs({**batch, **extra}))
    expected = torch_forward(checkpoint.model, {**batch, **extra})

    assert isinstance(out, SquadBeams) and out.end_top_index.shape == (3, TOPS["start_n_top"] * TOPS["end_n_top"])
    for field in SquadBeams._fields:
        if field.endswith("index"):
            np.testing.assert_array_equal(getattr(out, field), getattr(expected, field).numpy(), err_msg=field)
        else:
            assert getattr(out, field).dtype == jnp.float32
            assert_close(getattr(out, field), getattr(expected, field), field)


def test_squad_training_loss_matches_transformers_with_and_without_the_answer_class(hf_checkpoint):
    """The end logits read the gold start; is_impossible with cls_index adds half the answer
    class's binary cross entropy. p_mask leaves segment 1 only, so row 2 (two tokens, no segment
    1) is masked whole: its logits are all -1e30, each side's cross entropy log(10) as PyTorch
    computes it (a normaliser taken at -1e30's precision would give 0)."""
    checkpoint = _squad(hf_checkpoint)
    model = flaxheads.QuestionAnswering.from_pretrained(checkpoint.path)
    batch = xlnet_batch("left")
    start, end, impossible = np.array([5, 6, 9]), np.array([7, 8, 9]), np.array([0.0, 1.0, 0.0])
    gold = {"start_positions": start, "end_positions": end}
    context_only = (batch["token_type_ids"] != 1).astype(np.float32)
    for extra in ({"p_mask": context_only, "cls_index": np.full(3, 9), "is_impossible": impossible}, {}):
        inputs = {k: v for k, v in extra.items() if k != "is_impossible"}
        out = model(**flax_inputs({**batch, **inputs}), start_positions=jnp.asarray(start))
        expected = torch_forward(checkpoint.model, {**batch, **extra, **gold})
        options = {"is_impossible": jnp.asarray(impossible)} if extra else {}

        assert isinstance(out, SquadLogits) and out.end_logits.shape == (3, 10)
        assert_close(model.loss(out, jnp.asarray(start), jnp.asarray(end), **options), expected.loss,
                     f"squad loss, {sorted(extra)}")


def test_a_squad_checkpoint_loads_with_its_head_and_round_trips_bit_identical(hf_checkpoint, tmp_path):
    checkpoint = _squad(hf_checkpoint)
    model, info = flaxheads.from_pretrained(checkpoint.path, task="question-answering", output_loading_info=True)
    model.save_pretrained(tmp_path)
    _, report = transformers.XLNetForQuestionAnswering.from_pretrained(tmp_path, output_loading_info=True)

    assert model.config.head == "squad" and info.fully_pretrained and info.unused == []
    assert flaxheads.tasks.of_checkpoint(checkpoint.path).name == "question-answering"
    assert_state_dicts_identical(state_dict(tmp_path), state_dict(checkpoint.path))
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == ["XLNetForQuestionAnswering"] and {k: config[k] for k in TOPS} == TOPS
    assert not report["missing_keys"] and not report["unexpected_keys"] and not report["mismatched_keys"], report
    with pytest.raises(ValueError, match=r"XLNetForQuestionAnswering, a question-answering model.*task='question-ans"):
        flaxheads.from_pretrained(checkpoint.path)


@pytest.mark.slow  # a new head, compiled
def test_the_squad_head_is_new_on_a_bare_xlnet_when_asked_for_and_exports_as_its_class(hf_checkpoint, tmp_path):
    source = hf_checkpoint("XLNetModel")
    squad_names = sorted(name for name in state_dict(_squad(hf_checkpoint).path) if not name.startswith("transformer."))
    simple = flaxheads.QuestionAnswering.from_pretrained(source.path)
    model, info = flaxheads.QuestionAnswering.from_pretrained(source.path, head="squad", output_loading_info=True)
    model.save_pretrained(tmp_path)
    _, report = transformers.XLNetForQuestionAnswering.from_pretrained(tmp_path, output_loading_info=True)

    assert simple.config.head == "linear"  # XLNetForQuestionAnsweringSimple, as AutoModelForQuestionAnswering
    assert info.newly_initialized == squad_names and info.unused == []
    assert not report["missing_keys"] and not report["unexpected_keys"], report


def test_what_the_squad_head_cannot_take_is_refused_naming_the_fix(hf_checkpoint):
    model = flaxheads.QuestionAnswering.from_pretrained(_squad(hf_checkpoint).path)
    batch = flax_inputs(xlnet_batch("left"))

    with pytest.raises(ValueError, match="inference outputs.*call model\\(..., start_positions=...,"):
        model.loss(model(**batch), jnp.zeros(3, jnp.int32), jnp.zeros(3, jnp.int32))
    with pytest.raises(ValueError, match="start_positions holds 10, outside the 10 tokens.*at cls_index"):
        model(**batch, start_positions=jnp.array([0, 10, 2]))
    with pytest.raises(ValueError, match=r"p_mask has shape \(3, 9\); the squad head takes \(3, 10\)"):
        model(**batch, p_mask=jnp.zeros((3, 9)))
    with pytest.raises(ValueError, match="XLNetForQuestionAnsweringSimple \\('linear'\\) or XLNetForQuestionAnswering "
                                         "\\('squad'\\)"):
        flaxheads.QuestionAnswering.from_pretrained(_squad(hf_checkpoint).path, head="summary")
    with pytest.raises(ValueError, match=r"is_impossible has shape \(2,\)"):
        model.loss(model(**batch, start_positions=jnp.zeros(3, jnp.int32)), jnp.zeros(3, jnp.int32),
                   jnp.zeros(3, jnp.int32), is_impossible=jnp.zeros(2))


def test_the_squad_head_runs_under_jit_as_it_runs_eagerly(hf_checkpoint):
    """Beams (static widths from the config) and the training loss leave `nnx.jit` as pytrees."""
    from flax import nnx

    model = flaxheads.QuestionAnswering.from_pretrained(_squad(hf_checkpoint).path)
    batch = flax_inputs(xlnet_batch("left"))
    start, end = jnp.array([5, 6, 9]), jnp.array([7, 8, 9])

    @nnx.jit
    def run(model, batch, start, end):
        return model(**batch), model.loss(model(**batch, start_positions=start), start, end)

    beams, loss = run(model, batch, start, end)
    eager = model(**batch)
    for field in SquadBeams._fields:
        np.testing.assert_allclose(getattr(beams, field), getattr(eager, field), rtol=1e-6, atol=1e-6, err_msg=field)
    assert_close(loss, model.loss(model(**batch, start_positions=start), start, end), "loss under jit")
