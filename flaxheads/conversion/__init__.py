"""Hugging Face <-> flaxheads conversion. The two registries live here:

- `TABLES`: one declarative table per architecture (`model_type`), each in its family's module
  (`bert.py`, `decoder.py`, ...), built from `table.py`'s vocabulary.
- `WEIGHT_FORMATS`: the weight formats a checkpoint folder may hold, in the order a folder is
  searched (`formats.py`).

The rest: `rules.py` turns a table into the rules for one model, `checkpoint_io.py` reads and
writes the files, `loading.py` loads and saves models (`from_pretrained`, `save_pretrained`),
`peft.py` is the peft adapter format, `hub.py` finds a checkpoint folder, `loading_info.py` is
the loading report. A new architecture is one table module plus one entry in `TABLES`; a new
weight format one `WeightFormat` plus one entry in `WEIGHT_FORMATS`.
"""

from __future__ import annotations

from flaxheads.conversion.albert import ALBERT
from flaxheads.conversion.bert import BERT, ROBERTA, XLM_ROBERTA
from flaxheads.conversion.deberta import DEBERTA_V2
from flaxheads.conversion.decoder import DECODER_TABLES
from flaxheads.conversion.distilbert import DISTILBERT
from flaxheads.conversion.electra import ELECTRA
from flaxheads.conversion.formats import FLAXHEADS, HF_FLAX, PYTORCH, WeightFormat
from flaxheads.conversion.gpt2 import GPT2
from flaxheads.conversion.modernbert import MODERNBERT
from flaxheads.conversion.table import ArchitectureTable, TaskTable
from flaxheads.conversion.xlnet import XLNET

TABLES: dict[str, ArchitectureTable] = {
    t.model_type: t
    for t in (BERT, ROBERTA, GPT2, XLNET, ELECTRA, ALBERT, XLM_ROBERTA, DISTILBERT, DEBERTA_V2, MODERNBERT, *DECODER_TABLES)
}
"""Every architecture flaxheads converts, by Hugging Face `model_type`."""


def _add_built_in_task_rows() -> None:
    """Question answering's rows (`question_answering.py`), known to every loader from the start."""
    from flaxheads.conversion.question_answering import CONVERSION_ROWS, QUESTION_ANSWERING

    add_task_rows(QUESTION_ANSWERING, CONVERSION_ROWS)


WEIGHT_FORMATS: dict[str, WeightFormat] = {f.name: f for f in (PYTORCH, FLAXHEADS, HF_FLAX)}
"""Every weight format by name, in the order a checkpoint folder is searched for them."""


def add_task_rows(task: str, rows: dict[str, TaskTable]) -> None:
    """Each family's (`model_type`'s) transformers class for `task`, from a task registered beside
    the built-in ones (`flaxheads.tasks.register`): one row per family in its table's `tasks`.
    ValueError for a family flaxheads has no table of, and for a row that would replace another
    task's."""
    for model_type, row in rows.items():
        table = architecture_table(model_type)
        if table.task_tables.get(task, row) != row:
            raise ValueError(f"{model_type!r} already has a {task} row: register the task under another name")
        table.tasks[task] = row


def architecture_table(model_type: str | None) -> ArchitectureTable:
    """The table of `model_type`; ValueError naming the supported ones otherwise."""
    try:
        return TABLES[model_type]
    except KeyError:
        raise ValueError(
            f"model_type {model_type!r} has no conversion table; supported: {sorted(TABLES)}"
        ) from None


_add_built_in_task_rows()


__all__ = ["TABLES", "WEIGHT_FORMATS", "ArchitectureTable", "TaskTable", "WeightFormat", "add_task_rows",
           "architecture_table"]
