"""Texts one per line: what `flaxheads predict --input_file` reads (a UTF-8 file, or standard
input), each line answered by one output row."""

from __future__ import annotations

import pathlib
import sys

from flaxheads.data.files import not_utf8_message


def read_lines(input_file: str) -> list[str]:
    """One text per line of a UTF-8 file ("-": standard input), so that output row i answers
    input line i. A blank line (only white space) is refused, naming it: a label for it would be
    made up from nothing. Only the line ending goes: "\\n" or "\\r\\n"."""
    if input_file == "-":
        # A replaced sys.stdin (a StringIO in tests, say) has text but no bytes.
        data = sys.stdin.buffer.read() if hasattr(sys.stdin, "buffer") else sys.stdin.read().encode("utf-8")
    else:
        with open(input_file, "rb") as f:
            data = f.read()
    try:
        text = data.decode("utf-8-sig")  # -sig: a byte-order mark (Notepad) is not part of the first text
    except UnicodeDecodeError as error:
        if input_file == "-":
            raise ValueError(
                f"--input_file -: standard input is not UTF-8 (byte 0x{data[error.start]:02x} at position "
                f"{error.start}); pipe it through `iconv -f latin-1 -t utf-8` (or -f cp1252 for Windows text)"
            ) from None
        raise ValueError(not_utf8_message(pathlib.Path(input_file), "--input_file", data, error, 0, 0)) from None
    lines = text.split("\n")  # not splitlines(): it also splits at \x0b, \x1c, \u2028..., which are no line ends
    if lines[-1] == "":
        lines.pop()  # the newline that ends the last line starts no new one
    lines = [line[:-1] if line.endswith("\r") else line for line in lines]
    blank = next((number for number, line in enumerate(lines, 1) if not line.strip()), None)
    if blank is not None:
        raise ValueError(f"--input_file {input_file} line {blank} is blank: each line is one text, and a blank one "
                         "has nothing to label. Remove the blank lines (output row i answers input line i)")
    return lines


def text_and_pair(line: str, number: int) -> tuple[str, str]:
    """A line "text<TAB>text_pair" of `--input_file` (line `number`, from 1) as its two texts."""
    if "\t" not in line:
        raise ValueError(f"--input_file line {number} has no tab: the model was trained on text pairs, so each line "
                         "is text<TAB>text_pair")
    text, pair = line.split("\t", 1)
    return text, pair


__all__ = ["read_lines", "text_and_pair"]
