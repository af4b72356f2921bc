"""A study's records arranged for reading: which metric each data set is judged by, the values
per (checkpoint, data set, mode, head) and seed, their summaries and paired comparisons.
The report and the plots both read them from here."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping
from typing import Any

from flaxheads.study import stats
from flaxheads.study.grid import DEFAULT_HEAD, STUDY_HEADS

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
        for record in self.records:
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
        present = _in_order(group[3] for group in self.groups)
        known = [h for h in (self.default_head, *STUDY_HEADS) if h in present]
        return list(dict.fromkeys(known + present))

    def failed(self) -> list[dict[str, Any]]:
        """Records of cells whose training failed (a non-finite loss): they have no metrics."""
        return [record for record in self.records if "error" in record]

    def seeds(self) -> list[int]:
        return sorted({record["seed"] for record in self.records})

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
        """`group`'s head against the default head of the same checkpoint, data set and mode."""
        checkpoint, dataset, mode, head = group
        if head == self.default_head:
            return None
        return stats.paired_comparison(self.values(group), self.values((checkpoint, dataset, mode, self.default_head)),
                                       higher_is_better=self.higher_is_better(dataset))

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
