"""`flaxheads predict` on a saved text classifier: its texts (arguments and `--input_file`
lines, "text<TAB>text_pair" lines for a model trained on pairs) in, one row per text out."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from flaxheads.data.lines import read_lines, text_and_pair
from flaxheads.tasks.classification.inference import decision_thresholds, predict, reads_text_pairs


def predict_rows(folder, inputs: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The rows `flaxheads predict` prints for the text classifier in `folder` (`inference.predict`'s),
    after a note on the decision thresholds of a multi-label model."""
    if inputs.get("stride") is not None:
        raise ValueError("stride= windows the sentences of a token classifier, and the model is a sequence "
                         "classifier: leave --stride out")
    texts, pairs = list(inputs.get("texts") or ()), inputs.get("text_pairs")
    if inputs.get("input_file"):
        lines = read_lines(inputs["input_file"])
        if reads_text_pairs(folder):
            split = [text_and_pair(line, number) for number, line in enumerate(lines, 1)]
            texts += [text for text, _ in split]
            pairs = (pairs or []) + [pair for _, pair in split]
        else:
            texts += lines
    if not texts:
        raise ValueError("nothing to predict: give texts as arguments or --input_file (one text per line)")
    rows = predict(folder, texts, text_pairs=pairs, max_seq_length=inputs["max_seq_length"],
                   tokenizer_name=inputs.get("tokenizer_name"), packing=bool(inputs.get("packing")))
    thresholds = decision_thresholds(folder)
    if thresholds is not None:
        by_label, tuned = thresholds
        print("labels: those above their decision threshold, " + (
            "tuned on validation data (config.json): " + ", ".join(f"{n} {t:.3f}" for n, t in by_label.items())
            if tuned else "0.5 for every label (none were tuned: train with --tune_thresholds to tune them)"),
            file=sys.stderr)
    return rows


__all__ = ["predict_rows"]
