"""Every example of README.md and docs/*.md runs as written: each ```python, ```bash and ```sh
block, in the order of its page, in one temporary folder per page (a block may read what an
earlier block of its page wrote, as a reader who runs them in turn would), with the repository's
flaxheads (`flaxheads` and `python` on PATH are this checkout's). A block that fails fails its
page's test, with the block's line and output.

Placeholders run as they are written: the folder holds what the examples name, made small
(`MODEL_PLACEHOLDERS`: a tiny random BERT with MiniLM's tokenizer at `path/to/bert`, `my-bert`,
`M`, ...; a tiny Llama at `path/to/Llama-3.2-1B`; `INPUT_FILES`: train.csv, dev.conll,
swag_train.csv, pairs.jsonl, ...). Other blocks (```diff, ```text, none) are not run.

An HTML comment on the lines right above a block's opening fence (invisible on GitHub) changes how
the test runs it:

    <!-- test: replace "--num_train_epochs 3" "--max_steps 2" -->
        run it with every OLD replaced by NEW: for a training example, to make it a few steps
        long. Several may follow each other; each OLD must occur in the block.
    <!-- test: skip (a hub download: bert-base-cased) -->
        do not run it; the reason in parentheses is required. For what cannot run here: a hub
        download, a GPU, a multi-host pod, hours of training, the set-up itself. Keep these rare.

Each page is one test, marked slow: nearly every block starts jax or trains.

The `flaxheads` commands and the ```python blocks run in forks of one process that has imported
jax, transformers, torch and flaxheads already (`tests/forkserver.py`), each as a process of its
own would: its argv, environment, folder, streams, signals and exit status. Importing was ~5 s
of CPU of each of ~50 processes. `FLAXHEADS_TEST_FORK_SERVER=off` runs each in a process of its own.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import forkserver
import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUN_LANGUAGES = {"python": "python", "bash": "bash", "sh": "bash"}
"""The blocks that run, by their fence's language, and what runs them."""

_OPENING = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
_DIRECTIVE = re.compile(r"^\s*<!--\s*test:\s*(?P<body>.*?)\s*-->\s*$")
_REPLACE = re.compile(r'^replace\s+"(?P<old>(?:[^"\\]|\\.)*)"\s+"(?P<new>(?:[^"\\]|\\.)*)"$')
_SKIP = re.compile(r"^skip\s+\((?P<reason>.+)\)$")


@dataclasses.dataclass
class Block:
    page: Path
    line: int
    """The line of the opening fence (1-based)."""
    language: str
    code: str
    replacements: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    skip: str | None = None
    """Why the block does not run here (its `<!-- test: skip (...) -->`); None: it runs."""

    @property
    def where(self) -> str:
        return f"{_shown(self.page)}:{self.line}"

    def runnable_code(self) -> str:
        """The code as the test runs it: the block's, with its replacements made."""
        code = self.code
        for old, new in self.replacements:
            if old not in code:
                raise ValueError(f"{self.where}: `<!-- test: replace \"{old}\" ... -->`, but the block has no {old!r}")
            code = code.replace(old, new)
        return code


def _shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else path.name


def code_blocks(path: Path) -> list[Block]:
    """The fenced code blocks of a markdown page, each with the test directives above it.
    ValueError for a directive that is not one of the module docstring's."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks, number = [], 0
    while number < len(lines):
        opening = _OPENING.match(lines[number])
        if not opening:
            number += 1
            continue
        fence, info = opening.group("fence"), opening.group("info").strip()
        end = number + 1
        while end < len(lines) and not re.match(rf"^ {{0,3}}{fence[0]}{{{len(fence)},}}\s*$", lines[end]):
            end += 1
        indent = len(opening.group("indent"))  # an indented fence's lines lose up to as much indentation
        code = "".join(line[min(indent, len(line) - len(line.lstrip(" "))):] + "\n" for line in lines[number + 1:end])
        block = Block(path, number + 1, info.split()[0].lower() if info else "", code)
        above = number - 1
        while above >= 0 and (directive := _DIRECTIVE.match(lines[above])):
            _apply(directive.group("body"), block, f"{_shown(path)}:{above + 1}")
            above -= 1
        block.replacements.reverse()  # read top to bottom
        blocks.append(block)
        number = end + 1
    return blocks


def _apply(body: str, block: Block, where: str) -> None:
    if replace := _REPLACE.match(body):
        unescape = lambda text: re.sub(r"\\(.)", r"\1", text)  # noqa: E731
        block.replacements.append((unescape(replace.group("old")), unescape(replace.group("new"))))
    elif skip := _SKIP.match(body):
        block.skip = skip.group("reason")
    else:
        raise ValueError(f"{where}: unknown test directive {body!r}: write `skip (why)` or `replace \"OLD\" \"NEW\"`")


def runnable_blocks(path: Path) -> list[Block]:
    return [block for block in code_blocks(path) if block.language in RUN_LANGUAGES]


# --- what the examples name: models and data files, made small --------------------------------

MODEL_PLACEHOLDERS = {
    "path/to/bert": "tiny_bert", "path/to/hf-checkpoint": "tiny_bert", "path/to/checkpoint": "tiny_bert",
    "path/to/model": "tiny_bert", "my-bert": "tiny_bert", "M": "tiny_bert", "path/to/Llama-3.2-1B": "tiny_llama",
}
"""Folder an example names -> the session fixture (tests/conftest.py) whose checkpoint stands there."""

_REVIEWS = [("a gorgeous, moving film", "positive"), ("the worst plot ever, so dull", "negative"),
            ("what a great story", "positive"), ("tedious and dull", "negative"),
            ("a fine cast and a clever script", "positive"), ("I left before the end", "negative")]
_PEOPLE, _PLACES = ["Peter", "Angela Merkel", "Anna", "John Smith"], ["Berlin", "Paris", "New York", "Rome"]
_ACTS = ["opens the door", "picks up a ball", "sits at the piano", "walks to the car"]
_ENDINGS = ["and walks inside.", "and throws it far.", "and starts to play.", "and drives away."]


def _write_reviews(path: Path, copies: int) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["sentence", "label"])
        writer.writerows(_REVIEWS * copies)


def _write_conll(path: Path, sentences: int) -> None:
    blocks = []
    for i in range(sentences):
        person, place = _PEOPLE[i % 4].split(), _PLACES[(i + 1) % 4].split()
        rows = [(w, ("B-" if k == 0 else "I-") + "PER") for k, w in enumerate(person)]
        rows += [("lives", "O"), ("in", "O")]
        rows += [(w, ("B-" if k == 0 else "I-") + "LOC") for k, w in enumerate(place)] + [(".", "O")]
        blocks.append("\n".join(f"{word} {tag}" for word, tag in rows))
    path.write_text("\n\n".join(blocks) + "\n", encoding="utf-8")


def _write_swag(path: Path, rows: range) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["sent1", "sent2", "ending0", "ending1", "ending2", "ending3", "label"])
        for i in rows:
            act, label = i % 4, (i * 7) % 4
            others = [e for k, e in enumerate(_ENDINGS) if k != act]
            writer.writerow([f"{_PEOPLE[i % 4]} {_ACTS[act]}.", "Then the person",
                             *(others[:label] + [_ENDINGS[act]] + others[label:]), label])


def _write_pairs(path: Path, pairs: int) -> None:
    good, bad = [t for t, label in _REVIEWS if label == "positive"], [t for t, label in _REVIEWS if label == "negative"]
    path.write_text("".join(json.dumps({"chosen": good[i % len(good)], "rejected": bad[i % len(bad)]}) + "\n"
                            for i in range(pairs)), encoding="utf-8")


def _write_squad(path: Path, ids: range, *, answered: bool = True) -> None:
    rows = []
    for i in ids:
        person, place = _PEOPLE[i % 4], _PLACES[(i + 1) % 4]
        context = f"{person} lives in {place}. {_ACTS[i % 4].capitalize()} {_ENDINGS[i % 4]}"
        row = {"id": f"q{i}", "question": f"Where does {person} live?", "context": context}
        if answered:
            row["answers"] = {"text": [place], "answer_start": [context.index(place)]}
        rows.append(row)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")


INPUT_FILES = {
    "train.csv": lambda p: _write_reviews(p, 8), "dev.csv": lambda p: _write_reviews(p, 2),
    "test.csv": lambda p: _write_reviews(p, 2),
    "train.conll": lambda p: _write_conll(p, 24), "dev.conll": lambda p: _write_conll(p, 6),
    "test.conll": lambda p: _write_conll(p, 6),
    "swag_train.csv": lambda p: _write_swag(p, range(24)), "swag_val.csv": lambda p: _write_swag(p, range(24, 32)),
    "swag_test.csv": lambda p: _write_swag(p, range(32, 38)),
    "pairs.jsonl": lambda p: _write_pairs(p, 32), "dev.jsonl": lambda p: _write_pairs(p, 8),
    "squad_train.jsonl": lambda p: _write_squad(p, range(24)),
    "squad_dev.jsonl": lambda p: _write_squad(p, range(24, 32)),
    "squad_test.jsonl": lambda p: _write_squad(p, range(32, 36), answered=False),
    "studies/minilm-converged/results.jsonl": lambda p: shutil.copy(ROOT / "docs/head_study/results.jsonl", p),
}
"""File an example reads -> how the test writes it (small: a few dozen rows)."""


def _environment() -> dict[str, str]:
    """The environment the blocks run in, but for PATH."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
            "HF_HUB_OFFLINE": "1", "MPLBACKEND": "Agg"}


@pytest.fixture(scope="module")
def fork_server():
    """The fork server the pages' commands run through (module docstring); None when it is off, or
    where it cannot run (not Linux)."""
    if os.environ.get("FLAXHEADS_TEST_FORK_SERVER", "").lower() == "off" or not forkserver.AVAILABLE:
        yield None
        return
    folder = Path(tempfile.mkdtemp(prefix="flaxheads-fork-"))  # short: a socket's path has ~100 characters
    server = forkserver.Server(str(folder / "socket"), _environment())
    yield server
    server.close()
    shutil.rmtree(folder)


def _prepare(folder: Path, models: dict[str, Path], server: forkserver.Server | None) -> dict[str, str]:
    """`folder` with every placeholder model and input file, and the environment the blocks run
    in: this checkout's `flaxheads` (through `server`, if any) and `python` first on PATH."""
    for name, fixture in MODEL_PLACEHOLDERS.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).symlink_to(models[fixture], target_is_directory=True)
    for name, write in INPUT_FILES.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        write(folder / name)
    bin_dir = folder.parent / f"{folder.name}-bin"
    bin_dir.mkdir()
    (bin_dir / "python").symlink_to(sys.executable)
    launcher = bin_dir / "flaxheads"  # the installed command's entry point (pyproject's [project.scripts])
    command = [sys.executable, "-c", forkserver.LAUNCHER] if server is None else server.command("flaxheads")
    launcher.write_text(f"#!/bin/sh\nexec {shlex.join(command)} \"$@\"\n")
    launcher.chmod(0o755)
    return {**_environment(), "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}


def run_block(block: Block, folder: Path, env: dict[str, str], server: forkserver.Server | None = None,
              timeout: float = 1800) -> None:
    """Runs `block` in `folder` (a python block through `server`, if any); AssertionError with its
    output when it fails."""
    script = folder.parent / f"{folder.name}-block-{block.line}.{'py' if block.language == 'python' else 'sh'}"
    script.write_text(block.runnable_code(), encoding="utf-8")
    python = [sys.executable] if server is None else server.command("python")
    command = [*python, str(script)] if block.language == "python" else ["bash", "-e", "-o", "pipefail", str(script)]
    start = time.perf_counter()
    result = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=timeout)
    print(f"{block.where}: {block.language} block, {time.perf_counter() - start:.1f} s, exit status {result.returncode}")
    assert result.returncode == 0, (
        f"the example at {block.where} fails (exit status {result.returncode}):\n{block.runnable_code()}\n"
        f"--- stdout (end)\n{result.stdout[-3000:]}\n--- stderr (end)\n{result.stderr[-6000:]}")


_RUN_PAGES = [page for page in PAGES if any(not b.skip for b in runnable_blocks(page))]


@pytest.mark.slow
@pytest.mark.parametrize("page", _RUN_PAGES, ids=[str(page.relative_to(ROOT)) for page in _RUN_PAGES])
def test_every_example_of_the_page_runs_as_written(page, tiny_bert, tiny_llama, fork_server, tmp_path):
    folder = tmp_path / "examples"
    folder.mkdir()
    env = _prepare(folder, {"tiny_bert": tiny_bert, "tiny_llama": tiny_llama}, fork_server)
    for block in runnable_blocks(page):
        if block.skip:
            print(f"{block.where}: skipped ({block.skip})")
            continue
        run_block(block, folder, env, fork_server)


# --- the convention itself (fast) ----------------------------------------------------------------

def test_every_skip_names_its_reason_and_skips_stay_rare():
    skipped = [block for page in PAGES for block in runnable_blocks(page) if block.skip]
    total = sum(len(runnable_blocks(page)) for page in PAGES)
    print("\n".join(f"{b.where}: {b.skip}" for b in skipped))
    assert all(len(block.skip.split()) >= 2 for block in skipped)
    assert len(skipped) <= total // 2, f"{len(skipped)} of {total} examples are skipped"


def test_every_replacement_finds_its_text_in_its_block():
    for page in PAGES:
        for block in runnable_blocks(page):
            block.runnable_code()  # raises naming the directive whose OLD is gone


def test_directives_are_read_and_a_stale_or_unknown_one_is_an_error(tmp_path):
    page = tmp_path / "page.md"
    page.write_text('<!-- test: replace "epochs 3" "max_steps 2" -->\n<!-- test: replace "run" "go" -->\n```bash\n'
                    "run --epochs 3 a\n```\n\n<!-- test: skip (a GPU) -->\n```python\nimport gpu\n```\n\n"
                    "```diff\n-x\n```\n\n  ```python\n  for x in y:\n      pass\n ok\n  ```\n", encoding="utf-8")
    first, second, third, indented = code_blocks(page)
    assert indented.code == "for x in y:\n    pass\nok\n"  # as CommonMark: up to the fence's indentation goes
    assert (first.language, first.line, first.runnable_code()) == ("bash", 3, "go --max_steps 2 a\n")
    assert (second.language, second.skip) == ("python", "a GPU") and third.language == "diff"
    first.replacements.append(("gone", "x"))
    with pytest.raises(ValueError, match="page.md:3: .* the block has no 'gone'"):
        first.runnable_code()

    page.write_text("<!-- test: run faster -->\n```bash\nx\n```\n", encoding="utf-8")
    with pytest.raises(ValueError, match="page.md:1: unknown test directive 'run faster'"):
        code_blocks(page)
