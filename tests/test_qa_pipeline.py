"""flaxheads' question-answering pipeline against transformers 4.57.6's `QuestionAnsweringPipeline`
(which transformers 5 removed): the same answers and character offsets exactly, scores within
1e-5, on the answers tests/fixtures/qa_pipeline/expected.json keeps (written by
scripts/make_qa_pipeline_fixtures.py in an environment with transformers 4.57.6) for its tiny BERT
model: every option, each way of passing inputs, batched lists, contexts read in several windows,
impossible answers, align_to_words both ways, unicode, punctuation and whitespace, a left-padding
tokenizer; and the settings and inputs it refuses, each naming its fix.

The model is the fixture's, read by flaxheads (`flaxheads.pipeline("question-answering",
model=folder)`, the path users take), and by transformers 5's PyTorch `BertForQuestionAnswering`
behind the pipeline's `SpanScorer` interface (the pipeline's own rules apart from the model)."""

from __future__ import annotations

import contextlib
import json
import pathlib
import re

import numpy as np
import pytest
import torch
import transformers

import flaxheads
from flaxheads.tasks.qa.pipeline import (
    QuestionAnsweringPipeline, Settings, decode_spans, question_answering_pipeline, start_end_logits,
)

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "qa_pipeline"
CASES = json.loads((FIXTURES / "expected.json").read_text(encoding="utf-8"))["cases"]
ANSWERED = [case for case in CASES if "expected" in case]
REFUSED = [case for case in CASES if "error" in case]
SCORE_ATOL = 1e-5
BATCH_SIZE = 4
"""Windows per forward pass in the parity tests: several batches, and rows padded past the windows."""


class TorchScorer:
    """transformers 5's PyTorch question-answering model as a `SpanScorer`; counts its calls."""

    def __init__(self, model):
        self.model, self.calls = model.eval(), 0

    def __call__(self, input_ids, attention_mask, token_type_ids):
        self.calls += 1
        with torch.no_grad():
            out = self.model(input_ids=torch.from_numpy(np.asarray(input_ids)).long(),
                             attention_mask=torch.from_numpy(np.asarray(attention_mask)).long(),
                             token_type_ids=None if token_type_ids is None
                             else torch.from_numpy(np.asarray(token_type_ids)).long())
        return out.start_logits.numpy(), out.end_logits.numpy()


@pytest.fixture(scope="module")
def torch_model():
    return transformers.BertForQuestionAnswering.from_pretrained(FIXTURES / "model")


def _pipeline(torch_model, padding_side: str = "right", **options) -> QuestionAnsweringPipeline:
    tokenizer = transformers.AutoTokenizer.from_pretrained(FIXTURES / "model", padding_side=padding_side)
    return question_answering_pipeline(TorchScorer(torch_model), tokenizer, **options)


@pytest.fixture(scope="module")
def pipelines(torch_model):
    return {side: _pipeline(torch_model, side, batch_size=BATCH_SIZE) for side in ("right", "left")}


@pytest.fixture(scope="module")
def flaxheads_pipelines():
    """`flaxheads.pipeline` over the fixture folder, read by flaxheads' own QuestionAnswering."""
    return {side: flaxheads.pipeline("question-answering", model=FIXTURES / "model", batch_size=BATCH_SIZE,
                                     tokenizer=transformers.AutoTokenizer.from_pretrained(
                                         FIXTURES / "model", padding_side=side))
            for side in ("right", "left")}


def _assert_same_answers(got, expected, name: str) -> float:
    """Equal answers and offsets, scores within SCORE_ATOL; the largest score difference."""
    if isinstance(expected, dict):
        assert isinstance(got, dict), f"{name}: transformers answers a dict, flaxheads {got!r}"
        got, expected = [got], [expected]
    assert isinstance(got, list) and len(got) == len(expected), f"{name}: {got!r} != {expected!r}"
    worst = 0.0
    for one, theirs in zip(got, expected):
        if isinstance(theirs, list) or (isinstance(theirs, dict) and isinstance(one, list)):
            worst = max(worst, _assert_same_answers(one, theirs, name))
            continue
        assert set(one) == {"score", "start", "end", "answer"}
        assert (one["answer"], one["start"], one["end"]) == (theirs["answer"], theirs["start"], theirs["end"]), name
        assert isinstance(one["score"], float) and isinstance(one["start"], int) and isinstance(one["end"], int)
        worst = max(worst, abs(one["score"] - theirs["score"]))
    assert worst <= SCORE_ATOL, f"{name}: scores differ by {worst}"
    return worst


@pytest.mark.parametrize("reader", ["flaxheads", "pytorch"])
@pytest.mark.parametrize("case", ANSWERED, ids=[case["name"] for case in ANSWERED])
def test_answers_as_transformers_457_pipeline(request, case, reader):
    pipeline = request.getfixturevalue("flaxheads_pipelines" if reader == "flaxheads" else "pipelines")[
        case["padding_side"]]
    with pytest.warns(UserWarning, match="topk") if "topk" in case["kwargs"] else contextlib.nullcontext():
        got = pipeline(*case["args"], **case["kwargs"])
    worst = _assert_same_answers(got, case["expected"], case["name"])
    print(f"{case['name']}: largest score difference {worst:.2e}")


@pytest.mark.parametrize("case", REFUSED, ids=[case["name"] for case in REFUSED])
def test_refuses_what_transformers_457_refuses_with_a_value_error(pipelines, case):
    """transformers refuses these with ValueError, KeyError, a bare Exception or a tokenizer
    panic; flaxheads with a ValueError."""
    with pytest.raises(ValueError):
        pipelines[case["padding_side"]](*case["args"], **case["kwargs"])


def test_pipeline_options_are_the_defaults_of_each_call(torch_model):
    case = next(case for case in ANSWERED if case["name"] == "windows_32_8")
    kwargs = dict(case["kwargs"])
    question, context = kwargs.pop("question"), kwargs.pop("context")
    pipeline = _pipeline(torch_model, **kwargs)
    _assert_same_answers(pipeline(question=question, context=context), case["expected"], case["name"])


def test_batch_size_groups_forward_passes_without_changing_answers(torch_model):
    case = next(case for case in ANSWERED if case["name"] == "windows_48_20_batched")
    one_at_a_time, all_at_once = _pipeline(torch_model, batch_size=1), _pipeline(torch_model, batch_size=256)
    answers = [pipeline(*case["args"], **case["kwargs"]) for pipeline in (one_at_a_time, all_at_once)]
    assert one_at_a_time.scorer.calls > 1 and all_at_once.scorer.calls == 1
    for got in answers:
        _assert_same_answers(got, case["expected"], case["name"])


@pytest.mark.parametrize("options, fix", [
    (dict(top_k=0), "top_k=0: it is how many answers to return, an int of at least 1"),
    (dict(top_k=2.5), "top_k=2.5"),
    (dict(max_answer_len=0), "max_answer_len=0: it is the most tokens an answer may span"),
    (dict(max_seq_len=20, doc_stride=21), "pass a doc_stride below max_seq_len, e.g. doc_stride=5"),
    (dict(doc_stride=-1), "doc_stride=-1: give an int of at least 0"),
    (dict(max_seq_len=20, doc_stride=12), "leave 11 context tokens each, and doc_stride=12 (how many tokens they "
                                          "overlap by) must be below that: pass doc_stride=5"),
    (dict(max_seq_len=8, doc_stride=1), "no room for its context: pass a larger max_seq_len (at least 11)"),
])
def test_a_setting_the_pipeline_or_its_tokenizer_refuses_names_its_fix(pipelines, options, fix):
    with pytest.raises(ValueError, match=_literal(fix)):
        pipelines["right"](question="Who built the Iron Tower?", context="The Iron Tower was built by Brun. " * 4,
                           **options)


def test_a_doc_stride_too_large_is_fine_for_a_context_that_fits_one_window(pipelines):
    # transformers' tokenizer only cuts (and only then checks the stride) when the context does not fit.
    answer = pipelines["right"](question="Who?", context="Paris tower.", max_seq_len=20, doc_stride=18)
    assert answer["answer"]


def test_a_pipeline_built_with_a_setting_transformers_refuses_is_refused_at_once(torch_model):
    with pytest.raises(ValueError, match=_literal("top_k=0: it is how many answers")):
        _pipeline(torch_model, top_k=0)


@pytest.mark.parametrize("args, kwargs, fix", [
    ((), dict(question="Who?"), "needs context=: call it as qa(question='Who?', context='...')"),
    ((), dict(context="Paris."), "needs question=: call it as"),
    ((), {}, "needs question= and context="),
    (({"question": "Who?"},), {}, "input 0 has no 'context': each input is a dict"),
    (({"question": "Who?", "context": None},), {}, "`context` cannot be None (input 0): give it a str"),
    (({"question": "", "context": "Paris."},), {}, "`question` cannot be empty (input 0)"),
    (({"question": "Who?", "context": "Paris.", "id": 1},), {}, "keys ['id'] besides 'question' and 'context'"),
    (({"question": ["Who?"], "context": "Paris."},), {}, "`question` of input 0 is a list: give one str per input"),
    ((["Who?", "Paris."],), {}, "input 0 is a str: each input is a dict"),
    (("Who built it?",), {}, "not a str: give question= and context="),
    (((q for q in ["Who?"]),), {}, "not a generator: give a list"),
    ((), dict(question=["Who?", "When?"], context=["Paris."]),
     "question= has 2 questions and context= 1 contexts: give one context per question"),
    ((), dict(question="Who?", context=["Paris.", "Rome."]), "give a str each, a list of questions with one context"),
    (({"question": "Who?", "context": "Paris."},), dict(question="When?"), "positionally"),
])
def test_inputs_the_pipeline_cannot_read_are_refused_naming_the_fix(pipelines, args, kwargs, fix):
    with pytest.raises(ValueError, match=_literal(fix)):
        pipelines["right"](*args, **kwargs)


def test_a_slow_tokenizer_is_refused_naming_the_fast_one(torch_model):
    class SlowTokenizer:
        is_fast = False

    with pytest.raises(ValueError, match=_literal("AutoTokenizer.from_pretrained(<folder>)")):
        QuestionAnsweringPipeline(TorchScorer(torch_model), SlowTokenizer())


def test_a_callable_model_needs_a_tokenizer(torch_model):
    with pytest.raises(ValueError, match=_literal("model=<a callable>) needs tokenizer=")):
        question_answering_pipeline(TorchScorer(torch_model))


def test_the_tokenizer_may_be_given_as_its_folder(torch_model):
    pipeline = question_answering_pipeline(TorchScorer(torch_model), FIXTURES / "model")
    case = next(case for case in ANSWERED if case["name"] == "keywords")
    _assert_same_answers(pipeline(**case["kwargs"]), case["expected"], case["name"])


def test_non_finite_logits_are_refused_naming_the_question(pipelines):
    tokenizer = pipelines["right"].tokenizer

    def nan_for_second(input_ids, attention_mask, token_type_ids):
        start = np.zeros(input_ids.shape, np.float32)
        start[np.asarray(input_ids)[:, 1] == tokenizer.convert_tokens_to_ids("when")] = np.nan
        return start, np.zeros(input_ids.shape, np.float32)

    pipeline = question_answering_pipeline(nan_for_second, tokenizer)
    with pytest.raises(FloatingPointError, match=_literal("non-finite start or end logits for question 1")):
        pipeline(question=["Who built it?", "When was it built?"], context="The Iron Tower was built in 1889.")


def test_logits_of_the_wrong_shape_are_refused(pipelines):
    pipeline = question_answering_pipeline(lambda ids, mask, types: (ids[:, :1], ids[:, :1]),
                                           pipelines["right"].tokenizer)
    with pytest.raises(ValueError, match="one start and one end logit per token"):
        pipeline(question="Who?", context="Paris.")


def test_settings_fill_transformers_defaults_from_the_tokenizer(pipelines):
    tokenizer = pipelines["right"].tokenizer  # model_max_length 128
    assert Settings().for_tokenizer(tokenizer) == Settings(max_seq_len=128, doc_stride=64)
    assert Settings(max_seq_len=500).for_tokenizer(tokenizer).doc_stride == 128


@pytest.mark.parametrize("output", [
    (np.ones(3), np.zeros(3)),
    {"start_logits": np.ones(3), "end_logits": np.zeros(3)},
    transformers.modeling_outputs.QuestionAnsweringModelOutput(start_logits=np.ones(3), end_logits=np.zeros(3)),
], ids=["pair", "mapping", "model_output"])
def test_start_and_end_logits_are_read_from_a_pair_a_mapping_or_an_output_object(output):
    start, end = start_end_logits(output)
    assert start.tolist() == [1, 1, 1] and end.tolist() == [0, 0, 0]


def test_decode_spans_never_filters_out_index_0_as_transformers_does():
    # transformers tests a span's ends against the (rows, columns) nonzero() of the (1, sequence)
    # mask: the row index 0 is among them, so index 0 passes even where the mask is 0.
    start = np.array([[0.8, 0.1, 0.1]], np.float32)
    end = np.array([[0.1, 0.8, 0.1]], np.float32)
    starts, ends, scores = decode_spans(start, end, 1, 15, np.array([[0, 1, 1]]))
    assert (starts.tolist(), ends.tolist()) == ([0], [1])
    np.testing.assert_allclose(scores, [0.64], rtol=1e-6)
    starts, ends, _ = decode_spans(start, end, 1, 15, np.array([[0, 0, 1]]))
    assert starts.size == 0  # index 1, not allowed, is filtered out


def _literal(text: str) -> str:
    return re.escape(text)
