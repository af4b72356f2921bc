"""Hugging Face PyTorch <-> flaxheads conversion: declarative tables, checkpoint I/O, loading info."""

from __future__ import annotations

from flaxheads.conversion.bert import BERT, ROBERTA
from flaxheads.conversion.gpt2 import GPT2
from flaxheads.conversion.loading_info import LoadingInfo
from flaxheads.conversion.table import ArchitectureTable, Rule, expand, head_layout
from flaxheads.conversion.xlnet import XLNET

TABLES: dict[str, ArchitectureTable] = {t.model_type: t for t in (BERT, ROBERTA, GPT2, XLNET)}


def architecture_table(model_type: str | None) -> ArchitectureTable:
    try:
        return TABLES[model_type]
    except KeyError:
        raise ValueError(
            f"model_type {model_type!r} has no conversion table; supported: {sorted(TABLES)}"
        ) from None


def under(prefix: str, rules) -> list[Rule]:
    """The same rules with flax paths inside the model's `prefix` ("backbone" or "head")."""
    return [Rule(r.hf, f"{prefix}.{r.flax}", r.transform) for r in rules]


def backbone_rules(table: ArchitectureTable, num_layers: int, base: str) -> list[Rule]:
    return under("backbone", expand(table.backbone, num_layers=num_layers, base=base))


def head_rules(table: ArchitectureTable, head: str, head_param_paths: list[str], base: str) -> list[Rule]:
    """`head_param_paths` are relative to the head ('classifier.kernel'). A table names every
    parameter its head may have; one built without an optional part (XLNet's summary projection
    with summary_use_proj=False) keeps only the rules for the parameters it has."""
    table_rules = table.heads.get(head)
    if table_rules:
        rules = [r for r in table_rules if r.flax in set(head_param_paths)]
    else:
        rules = head_layout(head_param_paths)
    return under("head", expand(rules, num_layers=0, base=base))


def is_canonical(table: ArchitectureTable, head: str) -> bool:
    """Whether transformers' `*ForSequenceClassification` holds exactly this head."""
    return head == table.canonical_head


__all__ = [
    "TABLES",
    "ArchitectureTable",
    "LoadingInfo",
    "Rule",
    "architecture_table",
    "backbone_rules",
    "head_rules",
    "is_canonical",
    "under",
]
