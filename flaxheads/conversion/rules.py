"""From an architecture's table to the concrete rules for one model: every layer's rules with
`{i}` and `{base}` filled in, only for the parameters the model has, renamed for the weight
format at hand; and the patterns that count a checkpoint's layers.

`table.py` holds the vocabulary (`Rule`, `Transform`, `ArchitectureTable`) and applies rules in
either direction; the tables themselves are one module per family; `loading.py` uses this module
to read and write checkpoints.
"""

from __future__ import annotations

import re
from typing import Callable, Iterable

from flaxheads.conversion.table import SEQUENCE_CLASSIFICATION, ArchitectureTable, Rule, expand, head_layout


def under(prefix: str, rules) -> list[Rule]:
    """The same rules with flax paths inside the model's `prefix` ("backbone" or "head")."""
    return [Rule(r.hf, f"{prefix}.{r.flax}", r.transform) for r in rules]


def backbone_rules(
    table: ArchitectureTable, backbone_config, base: str, param_paths: Iterable[str] | None = None
) -> list[Rule]:
    """The rules for every backbone tensor of a model built from `backbone_config`. With
    `param_paths` (the model's, from `backbone.`), only the rules for parameters the model has: a
    table names every parameter its backbone may have, and one built without an optional part
    (ELECTRA's embeddings_project when embedding_size == hidden_size) skips it."""
    rules = under("backbone", expand(table.backbone, counts=table.index_counts(backbone_config), base=base))
    if param_paths is None:
        return rules
    present = set(param_paths)
    return [r for r in rules if r.flax in present]


def head_rules(table: ArchitectureTable, head: str, head_param_paths: list[str], base: str,
               task: str = SEQUENCE_CLASSIFICATION) -> list[Rule]:
    """`head_param_paths` are relative to the head ('classifier.kernel'). A table names every
    parameter its head may have; one built without an optional part (XLNet's summary projection
    with summary_use_proj=False) keeps only the rules for the parameters it has. The rules are the
    task's transformers class's (`ArchitectureTable.head_rules`); a head it has none for is stored
    in flaxheads' own layout."""
    table_rules = table.head_rules(task, head)
    if table_rules:
        rules = [r for r in table_rules if r.flax in set(head_param_paths)]
    else:
        rules = head_layout(head_param_paths, table.own_head_prefix)
    return under("head", expand(rules, num_layers=0, base=base))


Rename = Callable[[list[Rule]], list[Rule]]
"""Expanded rules naming Hugging Face PyTorch tensors -> the same rules naming another weight
format's tensors (flaxheads' own, Hugging Face Flax)."""


def pytorch_names(rules: list[Rule]) -> list[Rule]:
    """The identity `Rename`: the tables already name Hugging Face PyTorch tensors."""
    return rules


def native_names(rules: list[Rule]) -> list[Rule]:
    """The `Rename` for flaxheads' own format, which stores every parameter under its flax path
    (`backbone.layers.0.attention.query.kernel`) in the flax layout."""
    return [Rule(r.flax, r.flax) for r in rules]


def base_prefix(table: ArchitectureTable, names: list[str], rename: Rename = pytorch_names) -> str:
    """`"bert."` when the checkpoint's backbone tensors sit under the base model's attribute (a
    model with a head, `BertForSequenceClassification`), `""` for a bare `BertModel`; the
    attribute is any of the family's classes' (`ArchitectureTable.base_prefixes`: Llama's
    `model.`, or `transformer.` in `LlamaForQuestionAnswering`)."""
    present = set(names)
    one_each = {index: 1 for index in table.layer_indices}
    for attribute in table.base_prefixes:
        first_layer = under("backbone", expand(table.backbone, counts=one_each, base=f"{attribute}."))
        if any(r.hf in present for r in rename(first_layer)):
            return f"{attribute}."
    return ""


def nsp_rules(table: ArchitectureTable, base: str) -> list[Rule]:
    """The rules filling a 2-label "pooler" head's classifier from the pretraining NSP head
    (`cls.seq_relationship`); [] for architectures without one."""
    return under("head", expand(table.nsp_classifier, num_layers=0, base=base))


_LAYER_SENTINEL = 987654321
"""A layer index no checkpoint has: where it lands in a renamed tensor name marks the index."""


def layer_name_patterns(table: ArchitectureTable, base: str, rename: Rename = pytorch_names) -> list[re.Pattern]:
    """Patterns matching the names of one backbone layer's tensors (group 1: the layer index, or
    the outermost index the table names: ALBERT's group), in the format `rename` gives."""
    sentinel = str(_LAYER_SENTINEL)
    outer, *inner = table.layer_indices
    index = {outer: sentinel, **{name: 0 for name in inner}}
    one_layer = [Rule(r.hf.format(base=base, **index), r.flax.format(**index), r.transform)
                 for r in table.backbone if f"{{{outer}}}" in r.hf]
    patterns = []
    for rule in rename(under("backbone", one_layer)):
        before, after = rule.hf.split(sentinel, 1)
        patterns.append(re.compile(re.escape(before) + r"(\d+)" + re.escape(after)))
    return patterns


def deepest_layer(names: list[str], patterns: list[re.Pattern]) -> tuple[int, str]:
    """(the highest layer index among `names`, a name of that layer); (-1, "") when none match."""
    deepest, example = -1, ""
    for name in names:
        for pattern in patterns:
            match = pattern.fullmatch(name) if isinstance(name, str) else None
            if match and int(match.group(1)) > deepest:
                deepest, example = int(match.group(1)), name
    return deepest, example


__all__ = [
    "Rename",
    "backbone_rules",
    "base_prefix",
    "deepest_layer",
    "head_rules",
    "layer_name_patterns",
    "native_names",
    "nsp_rules",
    "pytorch_names",
    "under",
]
