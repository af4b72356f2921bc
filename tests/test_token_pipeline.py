"""`flaxheads.pipeline("token-classification")` against `transformers.pipeline` on the same exported
tagger: the same entities, words and character offsets exactly, scores within 1e-6, for every
aggregation strategy, on texts with words cut into several WordPiece tokens, punctuation, unknown
characters and odd spacing; long texts read in windows (`stride`); words given apart; a slow
tokenizer; GPT-2's byte-level BPE; and the settings and checkpoints it refuses."""

from __future__ import annotations

import contextlib
import shutil

import numpy as np
import pytest
import torch
import transformers

import flaxheads
from families import randomize_
from flaxheads.model import UntrainedModel
from flaxheads.shipped_model import minilm_path

TAGS = ("O", "B-PER", "I-PER", "B-LOC", "I-LOC")
STRATEGIES = ("none", "simple", "first", "average", "max")
SCORE_ATOL = 1e-6
TEXTS = [
    "Ada Lovelace met Charles Babbage in London, 1833.",
    "Unbelievably, the tokenizer splits antidisestablishmentarianism!",
    "hello",
    "New York's mayor (re-elected) visited Zurich and Sao Paulo.",
    "  leading   spaces\tand tabs  ",
    "\u2603 snowmen \u2603 melt",  # the snowman is [UNK] in MiniLM's vocabulary
    "",
]
LONG_TEXT = (" ".join(TEXTS[:4]) + " ") * 2
WINDOW = 24
"""The tokenizer's model_max_length in the stride tests: LONG_TEXT takes several windows."""


@pytest.fixture(scope="module")
def tagger(tmp_path_factory):
    """The folder of a random 2-layer BertForTokenClassification (labels TAGS, every one of them
    predicted, "O" the most) with MiniLM's WordPiece tokenizer, whose model_max_length is the
    model's 64 positions."""
    config = transformers.BertConfig(
        vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
        max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, initializer_range=0.1,
        id2label=dict(enumerate(TAGS)), label2id={tag: i for i, tag in enumerate(TAGS)},
    )
    torch.manual_seed(0)
    model = transformers.BertForTokenClassification(config).eval()
    randomize_(model, seed=0)
    tokenizer = transformers.AutoTokenizer.from_pretrained(minilm_path())
    tokenizer.model_max_length = 64
    # Random hidden states share most of their direction: centre the classifier on TEXTS' tokens, so
    # that each token's own part decides its label.
    batch = tokenizer(TEXTS, return_tensors="pt", padding=True)
    with torch.no_grad():
        hidden = model.bert(**batch).last_hidden_state[batch["attention_mask"].bool()]
        model.classifier.weight.normal_(0.0, 0.5, generator=torch.Generator().manual_seed(1))
        model.classifier.bias.copy_(-hidden.mean(0) @ model.classifier.weight.T)
        model.classifier.bias[0] += 1.0
    folder = tmp_path_factory.mktemp("tagger")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def theirs(tagger):
    return transformers.pipeline("token-classification", model=str(tagger))


@pytest.fixture(scope="module")
def ours(tagger):
    return flaxheads.pipeline("token-classification", model=str(tagger), batch_size=8)


def assert_same_entities(mine, reference, where: str) -> float:
    """The same nesting, keys in the same order, values equal (scores within SCORE_ATOL);
    returns the largest score difference."""
    assert type(mine) is type(reference), f"{where}: {type(mine).__name__} != {type(reference).__name__}"
    if isinstance(reference, list):
        assert len(mine) == len(reference), f"{where}: {len(mine)} answers != {len(reference)}\n{mine}\n{reference}"
        return max((assert_same_entities(a, b, f"{where}[{i}]") for i, (a, b) in enumerate(zip(mine, reference))),
                   default=0.0)
    assert list(mine) == list(reference), f"{where}: keys {list(mine)} != {list(reference)}"
    assert {k: v for k, v in mine.items() if k != "score"} == {k: v for k, v in reference.items() if k != "score"}, (
        f"{where}: {mine} != {reference}")
    assert type(mine["score"]) is float
    np.testing.assert_allclose(mine["score"], float(reference["score"]), atol=SCORE_ATOL, rtol=0, err_msg=where)
    return abs(mine["score"] - float(reference["score"]))


def _compare(ours, theirs, inputs_list, **kwargs) -> float:
    worst = 0.0
    for inputs in inputs_list:
        mine, reference = ours(inputs, **kwargs), theirs(inputs, **kwargs)
        worst = max(worst, assert_same_entities(mine, reference, f"{kwargs} on {inputs!r:.40}"))
    return worst


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_aggregation_strategy_answers_as_transformers_pipeline(ours, theirs, strategy):
    worst = _compare(ours, theirs, [TEXTS, TEXTS[1]], aggregation_strategy=strategy)

    assert sum(map(len, ours(TEXTS, aggregation_strategy=strategy))) > 5  # the random tagger finds entities
    print(f"{strategy}: largest score difference {worst:.2e}")


def test_ignore_labels_set_at_construction_or_per_call_answer_as_transformers(tagger, ours, theirs):
    keep_all = flaxheads.pipeline("ner", model=str(tagger), aggregation_strategy="simple", ignore_labels=[])
    reference = transformers.pipeline("ner", model=str(tagger), aggregation_strategy="simple", ignore_labels=[])

    _compare(keep_all, reference, [TEXTS])
    _compare(ours, theirs, [TEXTS], aggregation_strategy="first", ignore_labels=["O", "B-PER", "I-PER"])
    assert any(e["entity_group"] == "O" for entities in keep_all(TEXTS) for e in entities)


def test_in_memory_tagger_with_its_tokenizer_answers_as_transformers_pipeline(tagger, theirs):
    model = flaxheads.from_pretrained(tagger, task="token-classification")
    tokenizer = transformers.AutoTokenizer.from_pretrained(tagger)
    ours = flaxheads.pipeline("token-classification", model=model, tokenizer=tokenizer, aggregation_strategy="average")

    _compare(ours, theirs, [TEXTS], aggregation_strategy="average")


@pytest.mark.parametrize("strategy", ("simple", "first", "average", "max"))
def test_long_text_read_in_windows_with_stride_answers_as_transformers_pipeline(tagger, strategy):
    tokenizer = transformers.AutoTokenizer.from_pretrained(tagger)
    tokenizer.model_max_length = WINDOW
    reference = transformers.pipeline("token-classification", model=str(tagger), tokenizer=tokenizer,
                                      aggregation_strategy=strategy, stride=6)
    ours = flaxheads.pipeline("token-classification", model=str(tagger), tokenizer=tokenizer,
                              aggregation_strategy=strategy, stride=6)
    assert len(tokenizer(LONG_TEXT)["input_ids"]) > 3 * WINDOW

    _compare(ours, reference, [LONG_TEXT, [LONG_TEXT, TEXTS[0]]])
    assert ours(LONG_TEXT)[-1]["end"] > len(LONG_TEXT) - 20  # the end of the text is read too


def test_text_longer_than_the_model_reads_is_refused_naming_stride(tagger):
    tokenizer = transformers.AutoTokenizer.from_pretrained(tagger)
    tokenizer.model_max_length = WINDOW
    ours = flaxheads.pipeline("token-classification", model=str(tagger), tokenizer=tokenizer)

    with pytest.raises(ValueError, match=r"text 1 .* longer than the 24 tokens .*pass stride="):
        ours([TEXTS[2], LONG_TEXT], aggregation_strategy="simple")
    with pytest.raises(ValueError, match='`stride` was provided .* `aggregation_strategy="none"`'):
        ours(LONG_TEXT, stride=4)
    with pytest.raises(ValueError, match=r"stride=22: .* below the 22 text tokens"):
        ours(LONG_TEXT, aggregation_strategy="simple", stride=22)


def test_words_given_apart_answer_as_transformers_pipeline(ours, theirs):
    sentences = [text.split() for text in TEXTS[:4]]

    for strategy in ("none", "first"):
        _compare(ours, theirs, [sentences, sentences[3]], aggregation_strategy=strategy, is_split_into_words=True)
    _compare(ours, theirs, [sentences[:2]], aggregation_strategy="simple", is_split_into_words=True, delimiter="_")


def test_slow_tokenizer_answers_without_offsets_and_is_refused_word_strategies(tagger):
    from transformers.models.bert.tokenization_bert_legacy import BertTokenizerLegacy

    slow = BertTokenizerLegacy(vocab_file=str(minilm_path() / "vocab.txt"), do_lower_case=True, model_max_length=64)
    reference = transformers.pipeline("token-classification", model=str(tagger), tokenizer=slow)
    ours = flaxheads.pipeline("token-classification", model=str(tagger), tokenizer=slow)

    _compare(ours, reference, [TEXTS[:4]], aggregation_strategy="simple")
    assert ours(TEXTS[0])[0]["start"] is None
    with pytest.raises(ValueError, match="Slow tokenizers cannot handle subwords"):
        ours(TEXTS[0], aggregation_strategy="first")


def test_gpt2_byte_level_bpe_tagger_answers_as_transformers_pipeline(cli_checkpoint, tmp_path):
    source = cli_checkpoint("gpt2")  # a GPT2Model and its byte-level BPE tokenizer (no "##": no word prefix)
    model = transformers.GPT2ForTokenClassification.from_pretrained(
        source, id2label=dict(enumerate(TAGS)), label2id={tag: i for i, tag in enumerate(TAGS)}).eval()
    with torch.no_grad():
        model.classifier.weight.normal_(0.0, 1.0, generator=torch.Generator().manual_seed(0))
    model.save_pretrained(tmp_path)
    transformers.AutoTokenizer.from_pretrained(source).save_pretrained(tmp_path)
    texts = ["a gorgeous, moving film", "the worst plot ever", "what a great story, Zoe!", "tedious"]
    reference = transformers.pipeline("token-classification", model=str(tmp_path))
    ours = flaxheads.pipeline("token-classification", model=str(tmp_path))

    for strategy in STRATEGIES:
        word_strategy = strategy in ("first", "average", "max")  # words found by spaces: both warn
        with pytest.warns(UserWarning, match="fallback heuristic") if word_strategy else contextlib.nullcontext():
            _compare(ours, reference, [texts], aggregation_strategy=strategy)


def test_untrained_token_head_is_refused(tiny_bert):
    with pytest.raises(UntrainedModel, match="no trained .*random values"):
        flaxheads.pipeline("ner", model=str(tiny_bert))


def test_checkpoint_of_another_task_is_refused_naming_its_pipeline(hf_checkpoint, tagger):
    with pytest.raises(ValueError, match=r"text-classification model.*flaxheads.pipeline\('text-classification'"):
        flaxheads.pipeline("token-classification", model=str(hf_checkpoint("BertForSequenceClassification").path))
    with pytest.raises(ValueError, match=r"token-classification model.*flaxheads.pipeline\('token-classification'"):
        flaxheads.pipeline("text-classification", model=str(tagger))
    in_memory = flaxheads.from_pretrained(tagger, task="token-classification")
    with pytest.raises(ValueError, match=r"model= is a TokenClassifier.*'token-classification'"):
        flaxheads.pipeline("text-classification", model=in_memory, tokenizer=str(tagger))


def test_unknown_aggregation_strategy_and_no_input_are_refused(tagger, ours):
    with pytest.raises(ValueError, match=r"aggregation_strategy='longest': choose one of .*'average', 'max'"):
        flaxheads.pipeline("token-classification", model=str(tagger), aggregation_strategy="longest")
    with pytest.raises(ValueError, match="At least one input is required"):
        ours([])
    with pytest.raises(ValueError, match="must be an untokenized string"):
        ours([["Ada", "Lovelace"]])


def test_in_memory_tagger_without_tokenizer_is_refused(tagger):
    with pytest.raises(ValueError, match="needs tokenizer="):
        flaxheads.pipeline("token-classification", model=flaxheads.from_pretrained(tagger, task="token-classification"))


def test_folder_without_a_tokenizer_is_refused_unless_one_is_given(tagger, tmp_path):
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(tagger / name, bare / name)

    with pytest.raises(ValueError, match="holds no tokenizer"):
        flaxheads.pipeline("token-classification", model=str(bare))
    assert flaxheads.pipeline("token-classification", model=str(bare), tokenizer=str(tagger))(TEXTS[0])


def test_forward_compiles_once_per_bucket_and_batch_size(tagger):
    from flaxheads.data import bucket_for, bucket_lengths

    ours = flaxheads.pipeline("token-classification", model=str(tagger), batch_size=4)
    lengths = [len(ours.tokenizer(text)["input_ids"]) for text in TEXTS]

    for text in TEXTS[:3]:
        ours(text)
    ours(TEXTS)  # seven texts: two batches of four rows, each padded to its own bucket

    buckets = bucket_lengths(64)
    shapes = {(1, bucket_for(n, buckets)) for n in lengths[:3]}
    shapes |= {(4, bucket_for(max(lengths[:4]), buckets)), (4, bucket_for(max(lengths[4:]), buckets))}
    assert ours.scorer._forward._cache_size() == len(shapes)
