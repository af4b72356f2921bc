"""`flaxheads predict` on a saved token classifier: each argument (or `--input_file` line) is a
sentence of words separated by whitespace; one row per sentence, {"words", "tags", "entities"}."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flaxheads.data.lines import read_lines
from flaxheads.tasks.token.inference import predict_words


def predict_rows(folder, inputs: Mapping[str, Any]) -> list[dict[str, Any]]:
    if inputs.get("text_pairs"):
        raise ValueError("text_pair= gives second texts to a sequence classifier, and the model is a token "
                         "classifier: leave --text_pair out")
    if inputs.get("packing"):
        raise ValueError("packing=True (--packing) does not apply to token classification: each sentence is a row "
                         "of its own. Predict without packing")
    lines = list(inputs.get("texts") or ()) + (read_lines(inputs["input_file"]) if inputs.get("input_file") else [])
    if not lines:
        raise ValueError("nothing to predict: give sentences as arguments or --input_file (one sentence per line, "
                         "words separated by spaces)")
    return predict_words(folder, [line.split() for line in lines], max_seq_length=inputs["max_seq_length"],
                         tokenizer_name=inputs.get("tokenizer_name"), stride=inputs.get("stride"))


__all__ = ["predict_rows"]
