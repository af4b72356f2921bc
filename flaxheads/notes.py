"""Notes the library prints for the person running it (a run that is already complete, thresholds
dropped, a tokenizer without a pad id), in the words of whoever called. A note names Python
parameters (`overwrite_output_dir=True`), as errors do. An error reaches the command line as an
exception, which it words in its flags (`cli._in_flag_terms`); a note is printed where it arises,
so the command line sets `wording` while its command runs and every note passes through `worded`."""

from __future__ import annotations

from collections.abc import Callable

wording: Callable[[str], str] | None = None
"""message -> the same message in the caller's words; None (Python's): as written."""


def worded(message: str) -> str:
    """`message` in the words `wording` gives it."""
    return message if wording is None else wording(message)
