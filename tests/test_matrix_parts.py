"""The cross products' parts (tests/conftest.py `matrix_selection`): each part holds every value
of every axis, and the parts together hold every combination."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import pytest

from conftest import matrix_selection


@dataclass(frozen=True)
class _Marker:
    args: tuple


@dataclass(eq=False)
class _Item:
    nodeid: str
    params: dict
    axes: tuple
    callspec: object = field(init=False)

    def __post_init__(self):
        self.callspec = type("CallSpec", (), {"params": self.params})()

    def get_closest_marker(self, name):
        return _Marker(self.axes) if name == "matrix" else None


def _items(families, heads, sides):
    return [_Item(f"t.py::test_x[{f}-{h}-{s}]", {"row": f, "case": (h, s)}, ("row", "case.0", "case.1"))
            for f, h, s in itertools.product(families, heads, sides)]


@pytest.mark.parametrize("parts", [2, 3])
def test_every_part_holds_every_value_of_every_axis_and_the_parts_hold_every_combination(parts):
    families, heads, sides = ["bert", "gpt2", "llama"], ["cls", "mean", "pooler", "last_token", "max"], ["left", "right"]
    items = _items(families, heads, sides)
    seen = []
    for part in range(parts):
        kept = matrix_selection(items, part, parts)
        assert {i.params["row"] for i in kept} == set(families)
        assert {i.params["case"][0] for i in kept} == set(heads)
        assert {i.params["case"][1] for i in kept} == set(sides)
        assert len(kept) < len(items)
        seen += kept
    assert {id(i) for i in seen} == {id(i) for i in items}


def test_a_value_only_a_skipped_combination_holds_is_kept():
    # Part 0 of 2 takes items 0 and 2 ("bert-cls", "llama-cls"); "gpt2" and "mean" are only in the others.
    items = [_Item(f"t.py::test_y[{f}-{h}]", {"row": f, "head": h}, ("row", "head"))
             for f, h in [("bert", "cls"), ("gpt2", "cls"), ("llama", "cls"), ("bert", "mean")]]
    kept = matrix_selection(items, 0, 2)
    assert [i.nodeid for i in kept] == [i.nodeid for i in items]


@dataclass(frozen=True)
class _Run:
    name: str
    axes: dict


def test_each_entry_of_a_mapping_axis_is_an_axis_of_its_own():
    # Feature pairs' runs (`@pytest.mark.matrix("run.axes")`): every value of every feature in each part.
    runs = [_Run(f"r{i}", {"lora": bool(i & 1), "devices": 1 + (i >> 1 & 1), "dtype": ["f32", "bf16"][i >> 2 & 1]})
            for i in range(8)]
    items = [_Item(f"t.py::test_z[{r.name}]", {"run": r}, ("run.axes",)) for r in runs]
    seen = []
    for part in range(3):
        kept = matrix_selection(items, part, 3)
        for feature in ("lora", "devices", "dtype"):
            assert {i.params["run"].axes[feature] for i in kept} == {r.axes[feature] for r in runs}, feature
        assert len(kept) < len(items)
        seen += kept
    assert {id(i) for i in seen} == {id(i) for i in items}
