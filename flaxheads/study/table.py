"""A study's records arranged for reading: which metric each data set is judged by, the values
per (checkpoint, data set, mode, head) and seed, their summaries and paired comparisons.
The report and the plots both read them from here."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping
from typing import Any

from flaxheads.study import stats
import numpy as np

from flaxheads.study.grid import CONVERGED_HEADS, DEFAULT_HEAD, MAJORITY, STUDY_HEADS

PRIMARY_METRIC = {"single_label_classification": "accuracy", "multi_label_classification": "micro_f1",
                  "regression": "pearson"}
"""The metric a data set is compared by, per problem type (all higher-is-better)."""
LOWER_IS_BETTER = frozenset({"mse", "loss"})

Group = tuple[str, str, str, str]
"""(checkpoint, dataset, mode, head)."""


@dataclasses.dataclass
class StudyTable:
    """Records of a study grouped by cell (seeds apart)."""

    records: list[dict[str, Any]]
    split: str = "test"
    """The split whose final metrics are compared (the learning curves are validation's)."""
    metric_override: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """{dataset: metric name} instead of PRIMARY_METRIC."""
    default_head: str = DEFAULT_HEAD

    def __post_init__(self):
        _check_comparable(self.records)
        self.groups: dict[Group, dict[int, dict[str, Any]]] = {}
        self.searches = [record for record in self.records if record.get("lr_search")]
        """The learning-rate search cells: they chose rates, they are no result."""
        for record in self.records:
            if record.get("lr_search"):
                continue
            group = (record["checkpoint"], record["dataset"], record["mode"], record["head"])
            self.groups.setdefault(group, {})[record["seed"]] = record
        self.problem_types = {r["dataset"]: r["problem_type"] for r in self.records if "problem_type" in r}

    # -- what there is ---------------------------------------------------------------------------

    def checkpoints(self) -> list[str]:
        return _in_order(group[0] for group in self.groups)

    def datasets(self) -> list[str]:
        return _in_order(group[1] for group in self.groups)

    def modes(self) -> list[str]:
        return _in_order(group[2] for group in self.groups)

    def heads(self) -> list[str]:
        """Heads in the study's order (the default first), unknown ones after."""
        present = [h for h in _in_order(group[3] for group in self.groups) if h != MAJORITY]
        known = [h for h in dict.fromkeys((self.default_head, *STUDY_HEADS, *CONVERGED_HEADS)) if h in present]
        return list(dict.fromkeys(known + present))

    def failed(self) -> list[dict[str, Any]]:
        """Records of cells whose training failed (a non-finite loss): they have no metrics."""
        return [record for record in self.records if "error" in record]

    def seeds(self) -> list[int]:
        """The seeds of the result cells (the learning-rate search's seeds are `search_seeds`)."""
        return sorted({record["seed"] for record in self.records if not record.get("lr_search")})

    def search_seeds(self) -> list[int]:
        return sorted({record["seed"] for record in self.searches})

    def metric(self, dataset: str) -> str:
        return self.metric_override.get(dataset) or PRIMARY_METRIC.get(self.problem_types.get(dataset), "accuracy")

    def higher_is_better(self, dataset: str) -> bool:
        return self.metric(dataset) not in LOWER_IS_BETTER

    # -- numbers ---------------------------------------------------------------------------------

    def values(self, group: Group) -> dict[int, float]:
        """{seed: the group's metric on self.split} for the seeds that have it."""
        metric = self.metric(group[1])
        values = {}
        for seed, record in self.groups.get(group, {}).items():
            value = (record.get(self.split) or {}).get(metric)
            if value is not None:
                values[seed] = float(value)
        return values

    def summary(self, group: Group) -> stats.Summary | None:
        values = self.values(group)
        return stats.summarize(list(values.values())) if values else None

    def comparison(self, group: Group) -> stats.Comparison | None:
        """`group`'s head against the default head of the same checkpoint, data set and mode, its
        p-value Holm-adjusted over every such comparison of the checkpoint and mode."""
        checkpoint, dataset, mode, head = group
        return self.comparisons(checkpoint, mode).get((dataset, head))

    def comparisons(self, checkpoint: str, mode: str) -> dict[tuple[str, str], stats.Comparison]:
        """{(dataset, head): comparison with the default head}, Holm-adjusted as one family."""
        family = {}
        for dataset in self.datasets():
            for head in self.heads():
                if head != self.default_head:
                    found = self.paired((checkpoint, dataset, mode, head), (checkpoint, dataset, mode, self.default_head))
                    if found is not None:
                        family[(dataset, head)] = found
        return stats.with_holm(family)

    def paired(self, group: Group, reference: Group) -> stats.Comparison | None:
        """`group` minus `reference` on their common seeds, with the seed x example bootstrap where
        both hold per-example test predictions (not Holm-adjusted)."""
        values, base = self.values(group), self.values(reference)
        seeds = sorted(set(values) & set(base))
        examples = None
        if self.split == "test" and seeds:
            rows = [[self.groups[g][s].get("test_predictions") for s in seeds] for g in (group, reference)]
            labels = self.groups[group][seeds[0]].get("test_labels")
            if labels is not None and all(r is not None for row in rows for r in row):
                examples = (np.array(rows[0], float), np.array(rows[1], float), np.array(labels, float),
                            self.metric(group[1]))
        return stats.paired_comparison(values, base, higher_is_better=self.higher_is_better(group[1]),
                                       examples=examples)

    def ranks(self, checkpoint: str, mode: str = "finetune") -> stats.RankAnalysis | None:
        """Friedman / Nemenyi over the (data set, seed) blocks that hold every head of the study."""
        heads = self.heads()
        blocks = []
        for dataset in self.datasets():
            per_head = [self.values((checkpoint, dataset, mode, head)) for head in heads]
            sign = 1.0 if self.higher_is_better(dataset) else -1.0
            for seed in sorted(set.intersection(*(set(v) for v in per_head)) if per_head else ()):
                blocks.append([sign * values[seed] for values in per_head])
        return stats.rank_analysis(heads, np.array(blocks)) if blocks else None

    def majority(self, checkpoint: str, dataset: str) -> float | None:
        """The majority-class baseline's metric on `dataset` (None without its cell)."""
        values = self.values((checkpoint, dataset, "majority", MAJORITY))
        return next(iter(values.values()), None)

    def unconverged(self) -> list[dict[str, Any]]:
        """Fine-tuned cells whose best validation evaluation came in the last quarter of their
        steps: their curve may still have been rising when they ended."""
        return [record for group, seeds in self.groups.items() if group[2] == "finetune" for record in seeds.values()
                if (record.get("best") or {}).get("step") and record.get("steps")
                and record["best"]["step"] > 0.75 * record["steps"]]

    def chosen_rates(self, checkpoint: str, dataset: str, head: str) -> list[float]:
        """The learning rates the fine-tuned cells of `head` on `dataset` ran with."""
        seeds = self.groups.get((checkpoint, dataset, "finetune", head), {})
        return sorted({r["learning_rate"] for r in seeds.values() if r.get("learning_rate") is not None})

    def curves(self, group: Group) -> dict[int, list[tuple[int, float]]]:
        """{seed: [(step, validation metric), ...]} of the group's cells."""
        metric = self.metric(group[1])
        return {seed: [(point["step"], float(point[metric])) for point in record.get("curve") or []
                       if point.get(metric) is not None]
                for seed, record in self.groups.get(group, {}).items()}


def _check_comparable(records: list[dict[str, Any]]) -> None:
    """ValueError when the records do not come from one study: other shared settings, or two
    contents under one data set name (their seeds would be pooled as if equal)."""
    settings = {json.dumps(r["settings"], sort_keys=True) for r in records}
    if len(settings) > 1:
        shown = " vs ".join(sorted(settings)[:2])
        raise ValueError(f"the results come from {len(settings)} different study settings ({shown}); report each "
                         "settings' results files separately")
    for dataset in {r["dataset"] for r in records}:
        contents = {json.dumps(r["data"], sort_keys=True) for r in records if r["dataset"] == dataset}
        if len(contents) > 1:
            raise ValueError(f"data set {dataset!r} has {len(contents)} different contents in the results "
                             f"({' vs '.join(sorted(contents)[:2])}); report them separately")


def _in_order(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(items))
