"""`flaxheads.pipeline("text-classification")` against `transformers.pipeline` on the same
exported model: the same labels, scores (1e-5) and answer shapes, for every problem type, with
texts of different lengths batched together (so padding happens), and the pad-id decision."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers

import flaxheads
from flaxheads.tokenizer import PadIds, pad_token_ids
from flaxheads.tasks.classification.inference import TextScorer, predict
from flaxheads.model import UntrainedModel

WORDS = "a fine film dull plot the worst story great moving gorgeous and what so ever tedious".split()
TEXTS = [
    "a fine film",
    "the worst plot ever , so dull and tedious",
    "great",
    "what a gorgeous moving story and so fine a film , what a great plot",
    "dull dull",
]
ATOL = 1e-5
CASES = {
    # name: (num_labels, problem_type given to from_pretrained)
    "single_label": (3, None),
    "multi_label": (3, flaxheads.MULTI_LABEL),
    "one_label_unset": (1, None),  # transformers applies a sigmoid
    "regression": (1, flaxheads.REGRESSION),  # transformers applies nothing
}
CALLS = [{}, {"top_k": None}, {"top_k": 2}, {"top_k": 1}, {"function_to_apply": "none"}]


@pytest.fixture(scope="module")
def bert_tokenizer(tmp_path_factory):
    """A BERT WordPiece tokenizer over a small vocabulary that fits the tiny models' 99 ids."""
    folder = tmp_path_factory.mktemp("bert_tokenizer")
    (folder / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ",", *WORDS]) + "\n")
    tokenizer = transformers.BertTokenizerFast.from_pretrained(folder)
    assert len(tokenizer) == len(WORDS) + 6  # every word its own token: texts differ
    return tokenizer


@pytest.fixture(scope="module")
def exported(hf_checkpoint, bert_tokenizer, tmp_path_factory):
    """`exported("multi_label")` -> (folder, model): a random BERT classifier saved by flaxheads
    with its tokenizer."""
    cache = {}

    def build(case: str):
        if case not in cache:
            num_labels, problem_type = CASES[case]
            source = hf_checkpoint("BertForSequenceClassification", num_labels=num_labels).path
            names = [f"{case}_{i}" for i in range(num_labels)]
            model = flaxheads.from_pretrained(source, problem_type=problem_type, id2label=names)
            folder = tmp_path_factory.mktemp(case)
            model.save_pretrained(folder)
            bert_tokenizer.save_pretrained(folder)
            cache[case] = folder, model
        return cache[case]

    return build


def assert_same_answers(ours, theirs, where: str) -> None:
    """Same nesting, same labels in the same order, scores within ATOL."""
    assert type(ours) is type(theirs), f"{where}: {type(ours).__name__} != {type(theirs).__name__}"
    if isinstance(theirs, list):
        assert len(ours) == len(theirs), f"{where}: {len(ours)} answers != {len(theirs)}"
        for i, (a, b) in enumerate(zip(ours, theirs)):
            assert_same_answers(a, b, f"{where}[{i}]")
        return
    assert set(ours) == {"label", "score"} and ours["label"] == theirs["label"], f"{where}: {ours} != {theirs}"
    np.testing.assert_allclose(ours["score"], theirs["score"], atol=ATOL, err_msg=where)


def _compare(ours, theirs, calls=CALLS, texts=TEXTS) -> float:
    """Every call shape on a list and on a single text; returns the largest score difference."""
    worst = 0.0
    for kwargs in calls:
        for inputs in (texts, texts[1]):
            mine, reference = ours(inputs, **kwargs), theirs(inputs, **kwargs)
            assert_same_answers(mine, reference, f"{kwargs} on {'a list' if isinstance(inputs, list) else 'a str'}")
            worst = max(worst, _largest_difference(mine, reference))
    print(f"largest score difference {worst:.2e}")
    return worst


def _largest_difference(ours, theirs) -> float:
    if isinstance(theirs, list):
        return max((_largest_difference(a, b) for a, b in zip(ours, theirs)), default=0.0)
    return abs(ours["score"] - theirs["score"])


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CASES))
def test_saved_model_answers_as_transformers_pipeline(exported, case):
    folder, _ = exported(case)
    theirs = transformers.pipeline("text-classification", model=str(folder), tokenizer=str(folder))
    ours = flaxheads.pipeline("text-classification", model=str(folder), batch_size=4)

    _compare(ours, theirs)


def test_in_memory_model_and_tokenizer_answer_as_transformers_pipeline(exported, bert_tokenizer):
    folder, model = exported("single_label")
    theirs = transformers.pipeline("text-classification", model=str(folder), tokenizer=str(folder))

    _compare(flaxheads.pipeline("text-classification", model=model, tokenizer=bert_tokenizer), theirs,
             calls=[{}, {"top_k": None}])


def test_default_answer_is_the_best_label_with_its_softmax_score(exported):
    folder, model = exported("single_label")
    clf = flaxheads.pipeline(model=str(folder))
    enc = clf.tokenizer(TEXTS[0], return_tensors="np")

    (answer,) = clf(TEXTS[0])

    probabilities = torch.softmax(torch.tensor(np.asarray(model(enc["input_ids"], enc["attention_mask"],
                                                                enc["token_type_ids"]))), -1)[0]
    assert answer["label"] == model.config.label_names[int(probabilities.argmax())]
    np.testing.assert_allclose(answer["score"], float(probabilities.max()), atol=ATOL)


def test_pair_input_answers_as_transformers_pipeline(exported):
    folder, _ = exported("single_label")
    theirs = transformers.pipeline("text-classification", model=str(folder), tokenizer=str(folder))
    pair = {"text": "a fine film", "text_pair": "so dull"}

    assert_same_answers(flaxheads.pipeline(model=str(folder))(pair), theirs(pair), "a pair")


def test_in_memory_model_without_tokenizer_is_refused_naming_tokenizer(exported):
    _, model = exported("single_label")

    with pytest.raises(ValueError, match="needs tokenizer="):
        flaxheads.pipeline("text-classification", model=model)


def test_other_tasks_are_refused(exported):
    folder, model = exported("single_label")

    with pytest.raises(ValueError, match="not 'summarization'"):
        flaxheads.pipeline("summarization", model=str(folder))
    for given in (str(folder), model):  # a sequence classifier is read by the text-classification pipeline
        with pytest.raises(ValueError, match=r"read it with flaxheads.pipeline\('text-classification'"):
            flaxheads.pipeline("token-classification", model=given, tokenizer=str(folder))


def test_unknown_function_to_apply_is_refused_naming_the_choices(exported):
    folder, _ = exported("single_label")

    with pytest.raises(ValueError, match="choose one of.*softmax"):
        flaxheads.pipeline(model=str(folder))("a fine film", function_to_apply="tanh")


def test_folder_without_a_trained_classifier_is_refused(hf_checkpoint, bert_tokenizer, tmp_path):
    bare = tmp_path / "bare"
    shutil.copytree(hf_checkpoint("BertModel").path, bare)
    bert_tokenizer.save_pretrained(bare)

    with pytest.raises(UntrainedModel, match="Fine-tune it first"):
        flaxheads.pipeline(model=str(bare))


def test_folder_without_a_tokenizer_is_refused_naming_tokenizer_name(exported, tmp_path):
    folder, _ = exported("single_label")
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(folder / name, bare / name)

    with pytest.raises(ValueError, match="holds no tokenizer.*tokenizer_name="):
        flaxheads.pipeline(model=str(bare))
    assert flaxheads.pipeline(model=str(bare), tokenizer=str(folder))("a fine film")


def test_foreign_tokenizer_is_refused(exported, tmp_path):
    _, model = exported("single_label")
    folder = tmp_path / "big"
    folder.mkdir()
    (folder / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", *(f"w{i}" for i in range(200))]) + "\n")

    with pytest.raises(ValueError, match="not this model's tokenizer"):
        flaxheads.pipeline(model=model, tokenizer=transformers.BertTokenizerFast.from_pretrained(folder))


def test_non_finite_scores_raise_naming_the_texts(exported, bert_tokenizer):
    broken = flaxheads.from_pretrained(exported("single_label")[0])
    broken.head.classifier.bias[...] = broken.head.classifier.bias[...] * np.nan

    with pytest.raises(FloatingPointError, match=r"non-finite scores for text\(s\) \[0, 1\]"):
        flaxheads.pipeline(model=broken, tokenizer=bert_tokenizer)(["a fine film", "dull"])


def test_forward_compiles_once_per_bucket_and_batch_size(exported, bert_tokenizer):
    _, model = exported("single_label")
    scorer = TextScorer(model, bert_tokenizer, max_seq_length=64, batch_size=8)

    for text in TEXTS:  # 3 to 17 tokens: all in the 32-token bucket or below
        scorer.logits([text])
    scorer.logits(TEXTS[:2])

    # One text at a time is one (1, bucket) shape per bucket; two texts one more batch size.
    lengths = {len(bert_tokenizer(t)["input_ids"]) for t in TEXTS}
    buckets = {16 if n <= 16 else 32 for n in lengths}
    assert scorer._forward._cache_size() == len(buckets) + 1


# ---------------------------------------------------------------------------------------------
# GPT-2: no pad token anywhere, a tokenizer that pads on the left


def _save_gpt2(folder: Path, **config) -> Path:
    """A random GPT2ForSequenceClassification (3 labels) and a byte-level BPE tokenizer without pad
    token that pads on the left, saved in `folder`; `config` overrides the GPT-2 config."""
    from tokenizers import ByteLevelBPETokenizer

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(TEXTS * 10, vocab_size=300, special_tokens=["<|endoftext|>"], show_progress=False)
    tokenizer = transformers.GPT2TokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>",
                                               bos_token="<|endoftext|>", unk_token="<|endoftext|>",
                                               padding_side="left")
    eos = tokenizer.eos_token_id
    config = transformers.GPT2Config(**{
        "vocab_size": len(tokenizer), "n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 64, "n_inner": 37,
        "bos_token_id": eos, "eos_token_id": eos, "initializer_range": 0.1, "num_labels": 3, **config})
    torch.manual_seed(0)
    model = transformers.GPT2ForSequenceClassification(config).eval()
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0.0, 0.1)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    assert tokenizer.pad_token is None
    return folder


@pytest.fixture(scope="module")
def gpt2_folder(tmp_path_factory) -> Path:
    """GPT-2 as it ships: no pad id in its config, no pad token in its tokenizer."""
    folder = _save_gpt2(tmp_path_factory.mktemp("gpt2"))
    assert transformers.AutoConfig.from_pretrained(folder).pad_token_id is None
    return folder


def test_gpt2_without_pad_token_answers_as_transformers_pipeline(gpt2_folder):
    theirs = transformers.pipeline("text-classification", model=str(gpt2_folder), tokenizer=str(gpt2_folder))
    ours = flaxheads.pipeline("text-classification", model=str(gpt2_folder), batch_size=8)

    _compare(ours, theirs, calls=[{}, {"top_k": None}])
    assert ours.model.config.backbone.pad_token_id == ours.tokenizer.eos_token_id


def test_gpt2_in_memory_with_a_left_padding_eos_tokenizer_answers_as_transformers_pipeline(gpt2_folder):
    theirs = transformers.pipeline("text-classification", model=str(gpt2_folder), tokenizer=str(gpt2_folder))
    tokenizer = transformers.AutoTokenizer.from_pretrained(gpt2_folder)
    tokenizer.pad_token = tokenizer.eos_token
    model = flaxheads.from_pretrained(gpt2_folder, pad_token_id=tokenizer.eos_token_id)
    assert tokenizer.padding_side == "left"

    _compare(flaxheads.pipeline(model=model, tokenizer=tokenizer), theirs, calls=[{}, {"top_k": None}])


def test_gpt2_batches_pad_with_the_models_pad_id_not_the_tokenizers_eos(tmp_path):
    # The pad id is an extra embedding row no text uses; the tokenizer knows nothing of it. Padding
    # with eos instead would make the "last_token" head read a pad as the end of shorter texts.
    vocab = len(transformers.AutoTokenizer.from_pretrained(_save_gpt2(tmp_path / "probe")))
    folder = _save_gpt2(tmp_path / "gpt2", vocab_size=vocab + 1, pad_token_id=vocab)
    theirs = transformers.pipeline("text-classification", model=str(folder), tokenizer=str(folder))
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)

    ours = flaxheads.pipeline(model=flaxheads.from_pretrained(folder), tokenizer=tokenizer, batch_size=8)

    assert ours.scorer.batch_format.pad_token_id == vocab
    _compare(ours, theirs, calls=[{"top_k": None}])


# ---------------------------------------------------------------------------------------------
# The pad id


def test_pad_ids_without_any_in_config_or_tokenizer_are_eos(gpt2_folder):
    tokenizer = transformers.AutoTokenizer.from_pretrained(gpt2_folder)

    ids = pad_token_ids(tokenizer, None)

    assert ids.input_ids == ids.model == tokenizer.eos_token_id


def test_batches_pad_with_the_models_pad_id_over_the_tokenizers(bert_tokenizer):
    assert bert_tokenizer.pad_token_id == 0

    ids = pad_token_ids(bert_tokenizer, 7)

    assert ids.input_ids == ids.model == 7


def test_without_any_pad_or_eos_token_the_model_has_none_and_batches_pad_with_zero():
    class NoSpecialTokens:
        pad_token_id = eos_token_id = None

    assert pad_token_ids(NoSpecialTokens(), None) == PadIds(input_ids=0, model=None)


# ---------------------------------------------------------------------------------------------
# Inputs transformers refuses, texts it does not cut, pairs


def test_a_tuple_is_refused_as_transformers_refuses_it_rather_than_read_as_two_texts(exported):
    folder, _ = exported("single_label")
    theirs = transformers.pipeline("text-classification", model=str(folder), tokenizer=str(folder))
    with pytest.raises(Exception):
        theirs(("a fine film", "so dull"))

    with pytest.raises(ValueError, match="does not read a tuple"):
        flaxheads.pipeline(model=str(folder))(("a fine film", "so dull"))


def test_texts_of_a_model_whose_positions_set_no_limit_are_not_cut(bert_tokenizer, tmp_path):
    """XLNet's positions are relative: transformers reads a 600-token text whole, and so does the
    pipeline, whatever the tokenizer's (unset) model_max_length."""
    folder = tmp_path / "xlnet"
    config = transformers.XLNetConfig(vocab_size=99, d_model=32, n_layer=2, n_head=4, d_inner=37, num_labels=2,
                                      initializer_range=0.1, mem_len=None)
    torch.manual_seed(0)
    transformers.XLNetForSequenceClassification(config).eval().save_pretrained(folder)
    bert_tokenizer.save_pretrained(folder)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    tokenizer.model_max_length = int(1e30)  # as a tokenizer without a known limit reports it
    text = " ".join(WORDS[i % len(WORDS)] for i in range(600))
    reference = transformers.XLNetForSequenceClassification.from_pretrained(folder).eval()
    enc = tokenizer(text, return_tensors="pt")
    assert enc["input_ids"].shape[1] > 600

    answer = flaxheads.pipeline(model=flaxheads.from_pretrained(folder), tokenizer=tokenizer)(text, top_k=None)

    with torch.no_grad():
        expected = torch.softmax(reference(**enc).logits, -1)[0].numpy()
    got = {row["label"]: row["score"] for row in answer}
    np.testing.assert_allclose([got["LABEL_0"], got["LABEL_1"]], expected, atol=ATOL)


def test_a_model_trained_on_pairs_needs_a_text_pair_for_every_text(exported, tmp_path, capsys):
    from flaxheads.cli import main

    folder = tmp_path / "pairs"
    shutil.copytree(exported("single_label")[0], folder)
    config = json.loads((folder / "config.json").read_text())
    config["flaxheads"]["text_pair"] = True
    (folder / "config.json").write_text(json.dumps(config))
    theirs = transformers.pipeline("text-classification", model=str(folder), tokenizer=str(folder), top_k=None)

    with pytest.raises(ValueError, match="trained on text pairs"):
        flaxheads.pipeline(model=str(folder))("a fine film")
    assert main(["predict", "--model_name_or_path", str(folder), "a fine film"]) == 2
    assert "trained on text pairs" in capsys.readouterr().err
    assert main(["predict", "--model_name_or_path", str(folder), "a fine film", "great",
                 "--text_pair", "so dull", "a great plot"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["text"], r["text_pair"]) for r in rows] == [("a fine film", "so dull"), ("great", "a great plot")]
    expected = theirs({"text": "great", "text_pair": "a great plot"})
    for answer in expected:
        np.testing.assert_allclose(rows[1]["probabilities"][answer["label"]], answer["score"], atol=ATOL)


# ---------------------------------------------------------------------------------------------
# Texts the model cannot read: refused naming where they are, never answered with a label
# (transformers' pipeline answers "" with a confident label; flaxheads gives no prediction from
# input the model cannot read)


@pytest.mark.parametrize("blank", ["", "   ", "\u200b", "\t\n"], ids=["empty", "spaces", "zero-width", "tab-newline"])
def test_a_blank_text_is_refused_by_the_pipeline_and_predict_naming_its_index(exported, blank):
    folder, _ = exported("single_label")
    classify = flaxheads.pipeline(model=str(folder))

    with pytest.raises(ValueError, match=r"the text at index 0 of texts is blank"):
        classify(blank)
    with pytest.raises(ValueError, match=r"the text at index 2 of texts is blank.*leave it out"):
        classify(["a fine film", "great", blank])
    with pytest.raises(ValueError, match=r"the text at index 1 of texts is blank"):
        predict(folder, ["a fine film", blank])
    with pytest.raises(ValueError, match=r"the text at index 0 of text_pairs is blank"):
        classify({"text": "a fine film", "text_pair": blank})


@pytest.mark.parametrize(("text", "problem"), [
    (None, r"is missing \(None\)"), (float("nan"), r"is missing \(nan\)"), (3, "is int 3, not a str"),
    (["a", "b"], r"is list \['a', 'b'\], not a str"),
], ids=["None", "NaN", "int", "list"])
def test_a_text_that_is_no_str_is_refused_naming_its_index(exported, text, problem):
    folder, _ = exported("single_label")

    with pytest.raises(ValueError, match=rf"the text at index 1 of texts {problem}"):
        flaxheads.pipeline(model=str(folder))(["a fine film", text])
    with pytest.raises(ValueError, match=rf"the text at index 1 of texts {problem}"):
        predict(folder, ["a fine film", text])


def test_one_str_given_to_predict_is_refused_not_read_letter_by_letter(exported):
    folder, _ = exported("single_label")

    with pytest.raises(ValueError, match=r"texts is one str, not a list of texts: pass \['a fine film'\]"):
        predict(folder, "a fine film")


@pytest.mark.parametrize("inputs", [None, 3], ids=["None", "int"])
def test_the_pipeline_refuses_what_is_no_text_nor_list_naming_what_it_takes(exported, inputs):
    folder, _ = exported("single_label")

    with pytest.raises(ValueError, match=rf"the pipeline takes a text \(str\).*got {type(inputs).__name__}"):
        flaxheads.pipeline(model=str(folder))(inputs)
