"""Entity metrics (flaxheads.tasks.token.entity_metrics) and the entities they count
(flaxheads.tasks.token.tags) against seqeval 1.2.2, the reference, on the same tags."""

from __future__ import annotations

import json
import math
import random
import warnings

import pytest
from seqeval import scheme as seqeval_schemes
from seqeval.metrics import accuracy_score, classification_report, f1_score
from seqeval.metrics.sequence_labeling import get_entities

from flaxheads.tasks.token import tags
from flaxheads.tasks.token.entity_metrics import entity_report, token_accuracy

SEQEVAL_SCHEMES = {"IOB1": seqeval_schemes.IOB1, "IOB2": seqeval_schemes.IOB2, "IOBES": seqeval_schemes.IOBES}
PREFIXES = {"IOB1": "BI", "IOB2": "BI", "IOBES": "BIES"}
AVERAGES = {"micro avg": "micro_avg", "macro avg": "macro_avg", "weighted avg": "weighted_avg"}


@pytest.fixture(autouse=True)
def _quiet_seqeval():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # seqeval's UndefinedMetricWarning and "seems not to be NE tag"
        yield


def _random_tags(rng: random.Random, lengths, prefixes: str, odd=()) -> list[list[str]]:
    """Tags of random prefixes and types, well-formed or not; `odd` tags sprinkled in."""
    sentences = []
    for length in lengths:
        sentence = []
        for _ in range(length):
            prefix = rng.choice(prefixes + "OO")
            if prefix == "O":
                sentence.append("O")
            elif rng.random() < 0.05:
                sentence.append(prefix)  # an untyped entity: seqeval's type "_"
            else:
                sentence.append(f"{prefix}-{rng.choice(['PER', 'LOC', 'MISC-X'])}")
            if odd and rng.random() < 0.05:
                sentence[-1] = rng.choice(odd)
        sentences.append(sentence)
    return sentences


def _corpus_pair(rng: random.Random, prefixes: str, odd=()):
    lengths = [rng.randint(0, 9) for _ in range(rng.randint(1, 6))]
    return _random_tags(rng, lengths, prefixes, odd), _random_tags(rng, lengths, prefixes, odd)


def _assert_same_as_seqeval(ours: dict, theirs: dict) -> None:
    """Every number of seqeval's dict report, exactly (its NaN macro average is our None)."""
    assert set(ours["per_type"]) == set(theirs) - set(AVERAGES)
    for name, row in theirs.items():
        mine = ours[AVERAGES[name]] if name in AVERAGES else ours["per_type"][name]
        expected = {"precision": row["precision"], "recall": row["recall"], "f1": row["f1-score"],
                    "support": row["support"]}
        for key, value in expected.items():
            if isinstance(value, float) and math.isnan(value):
                assert mine[key] is None, (name, key)
            else:
                assert mine[key] == value, (name, key, mine[key], value)


def test_lenient_report_equals_seqeval_default_mode_on_400_random_corpora():
    rng = random.Random(0)
    for _ in range(400):
        # Any prefix in any order, and tags seqeval reads oddly ("." ends nothing, "NN" is type N).
        true, predicted = _corpus_pair(rng, "BIES", odd=(".", ".-PER", "NN", "B--X", "-"))

        ours = entity_report(true, predicted)

        _assert_same_as_seqeval(ours, classification_report(true, predicted, output_dict=True))
        assert ours["f1"] == f1_score(true, predicted)
        if any(true):
            assert ours["accuracy"] == accuracy_score(true, predicted)


@pytest.mark.parametrize("scheme", ["IOB1", "IOB2", "IOBES"])
def test_strict_report_equals_seqeval_strict_mode_on_300_random_corpora(scheme):
    rng = random.Random(scheme)
    for _ in range(300):
        # Prefixes of the scheme in any order: ill-formed entities are what strict mode drops.
        true, predicted = _corpus_pair(rng, PREFIXES[scheme])

        ours = entity_report(true, predicted, mode="strict", scheme=scheme)

        reference = SEQEVAL_SCHEMES[scheme]
        _assert_same_as_seqeval(
            ours, classification_report(true, predicted, output_dict=True, mode="strict", scheme=reference))
        assert ours["f1"] == f1_score(true, predicted, mode="strict", scheme=reference)
        assert ours["scheme"] == scheme


def test_lenient_entities_are_seqevals_get_entities():
    rng = random.Random(1)
    for _ in range(300):
        sentences = _random_tags(rng, [rng.randint(0, 9) for _ in range(4)], "BIES", odd=(".", ".-LOC"))
        expected: dict[str, set] = {}
        for kind, start, end in get_entities(sentences):
            expected.setdefault(kind, set()).add((start, end))

        assert tags.lenient_entities(sentences) == expected


def test_lenient_entities_read_an_i_after_o_as_an_entity_and_strict_ones_do_not():
    sentences = [["O", "I-PER", "I-PER", "O", "B-LOC"]]

    assert tags.lenient_entities(sentences) == {"PER": {(1, 2)}, "LOC": {(4, 4)}}
    assert tags.strict_entities(sentences, "IOB2") == {(0, "LOC", 4, 5)}


EDGE_CASES = {
    "nothing predicted": ([["B-PER", "I-PER", "O"], ["B-LOC"]], [["O", "O", "O"], ["O"]]),
    "nothing true": ([["O", "O"], ["O"]], [["B-PER", "O"], ["B-LOC"]]),
    "no entity at all": ([["O", "O"], ["O"]], [["O", "O"], ["O"]]),
    "all right": ([["B-PER", "I-PER", "O"], ["B-LOC"]], [["B-PER", "I-PER", "O"], ["B-LOC"]]),
    "empty sentences": ([[], ["B-PER"], []], [[], ["B-PER"], []]),
    "a type only predicted": ([["B-PER", "O"]], [["B-PER", "B-ORG"]]),
}


@pytest.mark.parametrize("case", EDGE_CASES)
@pytest.mark.parametrize("mode", ["default", "strict"])
def test_edge_cases_equal_seqeval(case, mode):
    true, predicted = EDGE_CASES[case]
    options = {"mode": "strict", "scheme": seqeval_schemes.IOB2} if mode == "strict" else {}

    ours = entity_report(true, predicted, mode=mode, scheme="IOB2" if mode == "strict" else None)

    _assert_same_as_seqeval(ours, classification_report(true, predicted, output_dict=True, **options))
    assert ours["f1"] == f1_score(true, predicted, **options)
    assert ours["accuracy"] == accuracy_score(true, predicted)


def test_no_entity_anywhere_gives_zeros_and_a_null_macro_average_where_seqeval_gives_nan():
    ours = entity_report([["O", "O"]], [["O", "O"]])

    assert ours["per_type"] == {}
    assert (ours["precision"], ours["recall"], ours["f1"], ours["accuracy"]) == (0.0, 0.0, 0.0, 1.0)
    assert ours["macro_avg"] == {"precision": None, "recall": None, "f1": None, "support": 0}
    assert math.isnan(classification_report([["O", "O"]], [["O", "O"]], output_dict=True)["macro avg"]["f1-score"])


def test_strict_mode_without_a_scheme_reads_it_from_the_true_tags_as_seqeval_does():
    true = [["B-PER", "I-PER", "O", "B-LOC"], ["O", "B-PER"]]
    predicted = [["I-PER", "I-PER", "O", "B-LOC"], ["O", "B-PER"]]

    ours = entity_report(true, predicted, mode="strict")

    assert ours["scheme"] == "IOB2"
    _assert_same_as_seqeval(ours, classification_report(true, predicted, output_dict=True, mode="strict"))


def test_the_report_is_plain_json():
    rng = random.Random(3)
    true, predicted = _corpus_pair(rng, "BI")

    text = json.dumps(entity_report(true, predicted), allow_nan=False)

    assert json.loads(text)["mode"] == "default"


def test_sentences_of_different_lengths_are_refused_naming_the_sentence():
    with pytest.raises(ValueError, match=r"sentence 2 has 2 true tags and 1 predicted"):
        entity_report([["O"], ["O", "B-PER"]], [["O"], ["O"]])
    with pytest.raises(ValueError, match=r"2 sentences and predicted_tags 1"):
        token_accuracy([["O"], ["O"]], [["O"]])


def test_an_empty_tag_is_refused_naming_the_argument_and_word():
    with pytest.raises(ValueError, match=r"predicted_tags, sentence 1, word 2: the tag is empty"):
        entity_report([["O", "O"]], [["O", ""]])


def test_strict_mode_refuses_a_prefix_the_scheme_lacks():
    with pytest.raises(ValueError, match=r"true_tags, sentence 1, word 1: the tag 'S-PER' has a prefix IOB2"):
        entity_report([["S-PER"]], [["O"]], mode="strict", scheme="IOB2")
    with pytest.raises(ValueError, match="unknown mode"):
        entity_report([["O"]], [["O"]], mode="conll")


def test_token_accuracy_of_no_word_is_refused():
    with pytest.raises(ValueError, match="no word"):
        token_accuracy([[]], [[]])
