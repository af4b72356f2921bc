"""The command line on every family that has a tiny checkpoint with a tokenizer (`Family.cli`):
`flaxheads inspect`, `train`, `evaluate`, `predict` and `convert` work on it, the run exports
what transformers loads with the same probabilities, and what is particular to the family holds
(its pretraining head reported, its pad token, its tokenizer). On the rows whose `cli.tokens` is
set, the token-classification commands too, on CoNLL files."""

from __future__ import annotations

import pytest
from safetensors.torch import load_file

from families import FAMILIES, rows
from family_parity import check_cli_lifecycle, check_token_cli_lifecycle

pytestmark = pytest.mark.slow  # a training run per family


@pytest.mark.matrix()  # a third of the families a run (tests/conftest.py, MATRIX_PARTS)
@pytest.mark.parametrize("row", rows(having="cli"))
def test_inspect_train_evaluate_predict_and_convert_commands_work_on_the_family(
    row, cli_checkpoint, snippets_csv, tmp_path, capsys
):
    reference_options = {"attn_implementation": "eager"} if row.eager else None
    result = check_cli_lifecycle(cli_checkpoint(row.name), snippets_csv, tmp_path, capsys, model_type=row.model_type,
                                 head=row.head, reference_options=reference_options)

    for name in row.cli.inspect_names:
        assert name in result.inspected, name
    exported = load_file(result.run / "model.safetensors")
    for name in row.cli.exported_names:
        assert name in exported, name
    if row.cli.check is not None:
        row.cli.check(result, tmp_path, capsys)


@pytest.mark.parametrize("row", [pytest.param(row, id=row.name) for row in FAMILIES.values()
                                 if row.cli is not None and row.cli.tokens])
def test_token_classification_train_evaluate_and_predict_commands_work_on_the_family(
    row, cli_checkpoint, conll, tmp_path, capsys
):
    check_token_cli_lifecycle(cli_checkpoint(row.name), conll, tmp_path, capsys, architecture=row.token_classifier,
                              reference_options={"attn_implementation": "eager"} if row.eager else None)
