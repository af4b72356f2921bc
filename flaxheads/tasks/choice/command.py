"""`flaxheads predict` on a saved multiple-choice model: each row of `--input_file` (a choice
file, as train reads them) gets one row, {"context", "label": the chosen index, "choice",
"probabilities"}."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flaxheads.tasks.choice.inference import predict_choices


def predict_rows(folder, inputs: Mapping[str, Any]) -> list[dict[str, Any]]:
    given = [flag for flag, on in (("texts", inputs.get("texts")), ("--text_pair", inputs.get("text_pairs")),
                                   ("--packing", inputs.get("packing")),
                                   ("--stride", inputs.get("stride") is not None)) if on]
    input_file = inputs.get("input_file")
    if given or not input_file or input_file == "-":
        raise ValueError("the model is a multiple-choice model: give its examples as --input_file, a CSV, JSON or "
                         "JSON Lines file with a context, the choices and optionally a label per row (as train reads "
                         "them)" + (f", and leave {' and '.join(given)} out" if given else ""))
    return predict_choices(folder, input_file, max_seq_length=inputs["max_seq_length"],
                           tokenizer_name=inputs.get("tokenizer_name"), context_column=inputs.get("context_column"),
                           question_column=inputs.get("question_column"), choice_columns=inputs.get("choice_columns"))


__all__ = ["predict_rows"]
