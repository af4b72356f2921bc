"""Writes tests/fixtures/qa_pipeline/: a tiny BERT question-answering model and the answers
transformers 4.57.6's `QuestionAnsweringPipeline` gives with it, for tests/test_qa_pipeline.py.

transformers 5 removed the question-answering pipeline, so its answers come from a second
environment with transformers 4.57.6 (the tests read the answers, and need no transformers 4.x):

    python -m venv /work/venv457 && /work/venv457/bin/pip install transformers==4.57.6 torch==2.13.0 numpy
    /work/venv457/bin/python scripts/make_qa_pipeline_fixtures.py

It writes
- model/: a seeded random `BertForQuestionAnswering` (hidden 32, 2 layers, 128 positions) with
  its fast WordPiece tokenizer over a vocabulary of a few hundred words drawn from the contexts
  below (plus letters and ##letters, so an unknown word is read as several pieces and
  `align_to_words` has words of several tokens to align to), as `save_pretrained` saves them;
- expected.json: per case, how the pipeline was called (`args`, `kwargs`, the tokenizer's
  `padding_side`) and what it answered (`expected`), scores as Python floats; or, for a call
  transformers refuses, the exception's type name under `error`.

The cases cover every option of the pipeline (top_k, max_answer_len, doc_stride, max_seq_len,
max_question_len, handle_impossible_answer, align_to_words, padding, the deprecated topk), each
way to pass inputs (question=/context= keywords, single or lists, positional dicts and strings),
contexts read in several windows, unicode, punctuation and whitespace, and a left-padding
tokenizer (context first). Re-running writes the same files (fixed seed, fixed cases).
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import unicodedata
import warnings
from pathlib import Path

import torch
import transformers

OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "qa_pipeline"
SEED = 1234
MAX_POSITIONS = 128
CONFIG = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
              max_position_embeddings=MAX_POSITIONS, initializer_range=0.2)
QA_SCALE = 4.0
"""initializer_range 0.2 (BERT's is 0.02) and the start/end layer's weights times QA_SCALE: logits
spread over several units, so that candidate answers are far apart compared with the last-bit
differences of two environments' forward passes, and both rank them the same."""
VOCAB_WORDS = 100
"""The most frequent words of the contexts that get a token of their own; the rest (most of them) are
spelled in letters, so that answers start and end inside words and `align_to_words` matters."""

TOWER = ("The Iron Tower was built by the engineer Gustave Brun in 1889 for the World Fair in Paris. "
         "It stands 330 metres tall on the south bank of the river, and for forty-one years it was the "
         "tallest structure in the world. Critics called it useless; today nearly seven million visitors "
         "climb it every year.")
RIVER = ("The Amstel river flows north through the old city and meets the harbour near the central station. "
         "Its canals were dug in the seventeenth century, when merchants grew rich from trade with Asia. "
         "The city council voted in 1974 to keep the canal houses, and the water is now cleaner than at any "
         "time since the war.")
LIBRARY = ("The National Library opened in 1753 with the collections of three private donors. It moved to "
           "a new building at Kings Cross in 1997, where it keeps more than 150 million items, among them "
           "two copies of the Magna Carta and the notebooks of Leonardo. Readers need a free pass, which "
           "the library gives to anyone over eighteen with a reason to study there.")
UNICODE = ("Zürich's Café Odeon opened in 1911; Einstein and Lenin were regulars. The menu lists crème brûlée, "
           "Bircher-müesli (invented nearby) and coffee at 7.50 CHF — prices rose in 2020. "
           "中文 visitors call it 咖啡馆. The naïve façade is painted green 🙂 and faces the lake.")
PUNCTUATION = ('"Who said that?" asked the judge... The witness -- a Mr. J. R. Smith, Jr. -- replied: '
               "'I did, sir!' (Laughter.) Exhibit #12 [a letter dated 3/4/1921] was then read aloud; "
               "its author's name, A.B. O'Neil, drew gasps.")
SPACES = "The   ship\tsailed  at\n\ndawn from   Lisbon,\n carrying   wine   and   salt to    Bristol."
LONG = " ".join([TOWER, RIVER, LIBRARY])
SHORT = "Paris."


def vocabulary(texts: list[str]) -> list[str]:
    """A WordPiece vocabulary for the texts: special tokens, punctuation, digits, letters and
    ##letters (any word can be spelled), and the `VOCAB_WORDS` most frequent lowercased words."""
    counts: dict[str, int] = {}
    for text in texts:
        folded = "".join(ch for ch in unicodedata.normalize("NFD", text.lower()) if unicodedata.category(ch) != "Mn")
        for word in re.findall(r"[a-z0-9]+", folded):
            counts[word] = counts.get(word, 0) + 1
    words = sorted(counts, key=lambda w: (-counts[w], w))[:VOCAB_WORDS]
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)] + [str(d) for d in range(10)]
    pieces = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *".,;:!?'\"()-#[]/&—", "中", "咖", *letters,
              *("##" + p for p in letters), "##s", "##ed", "##ing", "##er", "##ly", *words]
    return list(dict.fromkeys(pieces))


QUESTIONS = {
    "tower_who": "Who built the Iron Tower?",
    "tower_when": "When was the tower built?",
    "tower_height": "How tall is the tower?",
    "river_where": "Where does the river meet the harbour?",
    "river_vote": "What did the city council vote to keep in 1974?",
    "library_items": "How many items does the library keep?",
    "library_pass": "Who can get a reader's pass?",
    "cafe_regulars": "Who were regulars at the café?",
    "cafe_price": "What does the coffee cost?",
    "judge": "Who replied to the judge?",
    "ship": "Where did the ship sail from?",
    "unanswerable": "What colour is the moon over Tokyo?",
}


def cases() -> list[dict]:
    """Each case: name, args, kwargs, padding_side."""
    q = QUESTIONS
    right = "right"
    out = []

    def case(name, *args, padding_side=right, **kwargs):
        out.append({"name": name, "args": list(args), "kwargs": kwargs, "padding_side": padding_side})

    # How inputs are passed.
    case("keywords", question=q["tower_who"], context=TOWER)
    case("positional_dict", {"question": q["tower_when"], "context": TOWER})
    case("positional_strings", q["tower_height"], TOWER)
    case("positional_dicts", {"question": q["tower_who"], "context": TOWER},
         {"question": q["river_where"], "context": RIVER})
    case("list_of_dicts", [{"question": q["river_vote"], "context": RIVER},
                           {"question": q["library_items"], "context": LIBRARY},
                           {"question": q["cafe_regulars"], "context": UNICODE}])
    case("questions_one_context", question=[q["tower_who"], q["tower_when"], q["tower_height"]], context=TOWER)
    case("questions_contexts", question=[q["river_where"], q["library_pass"], q["judge"], q["ship"]],
         context=[RIVER, LIBRARY, PUNCTUATION, SPACES])
    case("list_of_one", question=[q["library_items"]], context=[LIBRARY])
    case("empty_list", question=[], context=[])
    # top_k and max_answer_len.
    case("top_k_3", question=q["tower_who"], context=TOWER, top_k=3)
    case("top_k_10_batched", question=[q["river_vote"], q["cafe_price"]], context=[RIVER, UNICODE], top_k=10)
    case("top_k_more_than_spans", question=q["tower_who"], context=SHORT, top_k=20)
    case("top_k_more_than_spans_no_align", question=q["tower_who"], context="Paris is big.", top_k=20,
         align_to_words=False)
    case("topk_deprecated", question=q["library_pass"], context=LIBRARY, topk=2)
    case("max_answer_len_1", question=q["library_items"], context=LIBRARY, top_k=4, max_answer_len=1)
    case("max_answer_len_3", question=q["cafe_price"], context=UNICODE, top_k=4, max_answer_len=3)
    case("max_answer_len_40", question=q["river_vote"], context=RIVER, top_k=3, max_answer_len=40)
    # Windows: max_seq_len and doc_stride.
    case("long_default_windows", question=q["library_items"], context=LONG, top_k=3)
    case("windows_32_8", question=q["tower_who"], context=LONG, max_seq_len=32, doc_stride=8, top_k=5)
    case("windows_24_0", question=q["river_where"], context=LONG, max_seq_len=24, doc_stride=0, top_k=3)
    case("windows_48_20_batched", question=[q["tower_height"], q["library_pass"], q["cafe_regulars"]],
         context=[LONG, LONG, UNICODE + " " + PUNCTUATION], max_seq_len=48, doc_stride=20, top_k=2)
    case("windows_26_stride_default", question=q["ship"], context=SPACES + " " + RIVER, max_seq_len=26)
    case("max_question_len_ignored", question=q["river_vote"] + " " + q["river_where"], context=RIVER,
         max_question_len=4, max_seq_len=64, doc_stride=16)
    # Impossible answers.
    case("impossible", question=q["unanswerable"], context=TOWER, handle_impossible_answer=True)
    case("impossible_top_k", question=q["unanswerable"], context=RIVER, handle_impossible_answer=True, top_k=4)
    case("impossible_windows", question=q["unanswerable"], context=LONG, handle_impossible_answer=True, top_k=3,
         max_seq_len=40, doc_stride=10)
    case("impossible_windows_all", question=q["unanswerable"], context=RIVER + " " + PUNCTUATION,
         handle_impossible_answer=True, top_k=200, max_seq_len=48, doc_stride=16)
    case("impossible_off", question=q["unanswerable"], context=LIBRARY, handle_impossible_answer=False, top_k=2)
    # Words: align_to_words both ways on pieces, unicode, punctuation and whitespace.
    for align in (True, False):
        tag = "align" if align else "no_align"
        case(f"{tag}_unicode", question=q["cafe_regulars"], context=UNICODE, top_k=6, align_to_words=align)
        case(f"{tag}_punctuation", question=q["judge"], context=PUNCTUATION, top_k=6, align_to_words=align)
        case(f"{tag}_spaces", question=q["ship"], context=SPACES, top_k=6, align_to_words=align)
        case(f"{tag}_windows", question=q["cafe_price"], context=UNICODE + " " + LIBRARY, top_k=4,
             align_to_words=align, max_seq_len=30, doc_stride=12)
    case("unicode_question", question="Café Zürich — 中文?", context=UNICODE, top_k=3)
    case("whitespace_question", question=" ", context=TOWER, top_k=2)
    # Padding to max_seq_len (the model reads pads; their scores are masked).
    case("padding_max_length", question=q["tower_when"], context=TOWER, padding="max_length", max_seq_len=96,
         top_k=3)
    # A left-padding tokenizer: the context comes first, truncated "only_first".
    case("left_keywords", question=q["tower_who"], context=TOWER, top_k=3, padding_side="left")
    case("left_windows", question=q["river_where"], context=LONG, max_seq_len=40, doc_stride=10, top_k=3,
         padding_side="left")
    case("left_no_align", question=q["judge"], context=PUNCTUATION, align_to_words=False, top_k=4,
         padding_side="left")
    case("left_padding_max_length", question=q["library_items"], context=LIBRARY, padding="max_length",
         max_seq_len=100, top_k=3, padding_side="left")
    case("left_padding_more_than_spans", question="Who?", context="Paris is big.", padding="max_length",
         max_seq_len=24, top_k=40, padding_side="left")
    case("left_impossible", question=q["unanswerable"], context=TOWER, handle_impossible_answer=True, top_k=2,
         padding_side="left")
    # Refused: by the pipeline (ValueError), or by the tokenizer (which panics: PanicException).
    case("refused_top_k_0", question=q["tower_who"], context=TOWER, top_k=0)
    case("refused_max_answer_len_0", question=q["tower_who"], context=TOWER, max_answer_len=0)
    case("refused_doc_stride_over_max_seq_len", question=q["tower_who"], context=TOWER, max_seq_len=20,
         doc_stride=21)
    case("refused_doc_stride_over_room", question=q["tower_who"], context=TOWER, max_seq_len=20, doc_stride=12)
    case("refused_question_over_max_seq_len", question=q["river_vote"] * 3, context=TOWER, max_seq_len=24,
         doc_stride=2)
    case("refused_empty_question", question="", context=TOWER)
    case("refused_none_context", {"question": q["tower_who"], "context": None})
    case("refused_missing_context", {"question": q["tower_who"]})
    case("refused_unequal_lists", question=[q["tower_who"], q["tower_when"]], context=[TOWER])
    return out


def build_model(folder: Path) -> None:
    folder.mkdir(parents=True)
    texts = [TOWER, RIVER, LIBRARY, UNICODE, PUNCTUATION, SPACES, *QUESTIONS.values()]
    (folder / "vocab.txt").write_text("\n".join(vocabulary(texts)) + "\n", encoding="utf-8")
    tokenizer = transformers.BertTokenizerFast(str(folder / "vocab.txt"), model_max_length=MAX_POSITIONS)
    (folder / "vocab.txt").unlink()  # save_pretrained writes it again beside tokenizer.json
    torch.manual_seed(SEED)
    config = transformers.BertConfig(vocab_size=len(tokenizer), **CONFIG)
    model = transformers.BertForQuestionAnswering(config).eval()
    with torch.no_grad():
        model.qa_outputs.weight.mul_(QA_SCALE)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def answer(pipelines: dict, case: dict):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return {"expected": jsonable(pipelines[case["padding_side"]](*case["args"], **case["kwargs"]))}
        except BaseException as err:  # the refusal is the answer, the tokenizer's panic (a BaseException) too
            if isinstance(err, (KeyboardInterrupt, SystemExit)):
                raise
            return {"error": type(err).__name__}


def jsonable(value):
    if isinstance(value, list):
        return [jsonable(v) for v in value]
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if hasattr(value, "item"):
        return value.item()
    return value


def main() -> int:
    if transformers.__version__ != "4.57.6":
        sys.exit(f"run with transformers 4.57.6 (this is {transformers.__version__}); see the docstring")
    if OUT.exists():
        shutil.rmtree(OUT)
    build_model(OUT / "model")
    model = transformers.BertForQuestionAnswering.from_pretrained(OUT / "model").eval()
    pipelines = {}
    for side in ("right", "left"):
        tokenizer = transformers.AutoTokenizer.from_pretrained(OUT / "model", padding_side=side)
        pipelines[side] = transformers.pipeline("question-answering", model=model, tokenizer=tokenizer,
                                                device="cpu")
    written = [{**case, **answer(pipelines, case)} for case in cases()]
    (OUT / "expected.json").write_text(json.dumps({"transformers": transformers.__version__, "cases": written},
                                                  indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    size = sum(f.stat().st_size for f in OUT.rglob("*") if f.is_file())
    print(f"wrote {len(written)} cases and the model to {OUT} ({size / 1e3:.0f} kB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
