"""How `flaxheads serve` reads a request body (flaxheads/serving/requests.py), in this process and
without a server: /predict's `inputs` in text-embeddings-inference's shapes, and each mistake a
ClientError naming the field (its JSON path), the status and the fix. tests/test_serve.py asks
the same of a running server."""

from __future__ import annotations

import pytest

from flaxheads.serving import requests as req
from flaxheads.serving.requests import ClientError


@pytest.mark.parametrize("inputs, expected", [
    ("a film", ([("a film", None)], True)),
    (["a film"], ([("a film", None)], True)),
    (["a film", "a story"], ([("a film", "a story")], True)),  # two strings are a pair, as TEI reads them
    ([["a film"], ["a film", "a story"]], ([("a film", None), ("a film", "a story")], False)),
])
def test_predict_inputs_are_read_as_text_embeddings_inference_reads_them(inputs, expected):
    assert req.sequences(inputs, max_items=4) == expected


@pytest.mark.parametrize("inputs, status, words", [
    (None, 422, "`inputs` is missing"),
    (3, 422, "`inputs` is the number 3; it must be a string, a pair"),
    (["a", "b", "c"], 422, 'a batch of single texts is [["a"], ["b"], ...]'),
    ([["a"], "b"], 422, "`inputs[1]` is the string \"b\"; in a batch each input is [text] or [text, text_pair]"),
    ([["a"], ["b", ""]], 422, "`inputs[1][1]` is empty or blank"),
    ([["a"], [None]], 422, "`inputs[1][0]` must be a string, not the null null"),
    ([], 422, "`inputs` is an empty list"),
    ([["a"]] * 5, 413, "more than the 4 one request may hold (--max_client_batch_size)"),
])
def test_a_bad_predict_input_is_refused_naming_its_json_path_and_the_fix(inputs, status, words):
    with pytest.raises(ClientError) as refused:
        req.sequences(inputs, max_items=4)

    assert (refused.value.status, refused.value.error_type) == (status, "validation")
    assert words in refused.value.message


@pytest.mark.parametrize("raw, status, words", [
    (b'{"inputs": ', 400, "not valid JSON"),
    (b"\xff\xfe", 400, "not valid JSON"),
    (b'"a film"', 422, "a JSON string, not an object"),
])
def test_a_body_that_is_no_json_object_is_refused(raw, status, words):
    with pytest.raises(ClientError) as refused:
        req.parse_body(raw)

    assert refused.value.status == status and words in refused.value.message


def test_a_flag_must_be_a_json_boolean_and_an_unknown_field_is_named():
    with pytest.raises(ClientError, match=r"`truncate` must be true or false, not the string \"yes\""):
        req.flag({"truncate": "yes"}, "truncate")
    with pytest.raises(ClientError, match=r"unknown field\(s\) 'raw_score': this route reads 'inputs', 'raw_scores'"):
        req.check_fields({"inputs": "a", "raw_score": True}, ("inputs", "raw_scores"))


def _padded(length: int) -> int:
    """Powers of two from 16, as the server pads."""
    return max(16, 1 << (length - 1).bit_length())


def test_a_batch_is_cut_so_short_inputs_are_not_padded_to_a_long_ones_length():
    from flaxheads.serving.models import forward_groups

    # One pass: 8 rows of 128 tokens; cut: 8 rows of 16, then 1 row of 128.
    assert forward_groups([5] * 7 + [120], _padded, max_rows=128) == [7, 1]
    assert forward_groups([10] * 8, _padded, max_rows=128) == [8]  # like lengths stay one pass
    sizes = forward_groups([10] * 5, _padded, max_rows=2)
    assert sum(sizes) == 5 and max(sizes) == 2  # at most max_rows a pass


def test_a_packed_pass_has_any_row_count_up_to_16_then_two_an_octave():
    from flaxheads.serving.models import packed_row_counts

    assert packed_row_counts(256) == (*range(1, 17), 24, 32, 48, 64, 96, 128, 192, 256)
    assert packed_row_counts(2) == (1, 2)  # never more rows than a pass holds


def test_a_served_classifier_pads_to_half_octaves_and_counts_its_tokens_as_padded():
    from flaxheads.data import bucket_lengths
    from flaxheads.serving.models import ClassifierModel

    served = object.__new__(ClassifierModel)  # no model: only its padding rule
    served.max_input_length = 128
    options = ClassifierModel.pipeline_options(128)

    assert bucket_lengths(128, options["pad_to_multiple_of"]) == (16, 24, 32, 48, 64, 96, 128)
    assert [served._padded(n) for n in (5, 17, 25, 33, 49, 65, 97, 300)] == [16, 24, 32, 48, 64, 96, 128, 128]
