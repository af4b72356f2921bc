"""A search space written as text (`flaxheads search`'s flags and `--search_space` JSON), read
without jax or Optuna, and turned into an `hp_space(trial)` function for
`Trainer.hyperparameter_search`.

    --learning_rate 1e-5:3e-4:log     a float from 1e-5 to 3e-4, log-uniform
    --warmup_ratio 0:0.2              a float from 0 to 0.2, uniform
    --num_train_epochs 1:4            an int from 1 to 4 (the field is an int)
    --per_device_train_batch_size 8,16,32   one of these (categorical)
    --weight_decay 0:0.1:0.01         from 0 to 0.1 in steps of 0.01

`--search_space` takes the same in JSON, a file or the text itself:
`{"learning_rate": "1e-5:3e-4:log", "lr_scheduler_type": ["linear", "cosine"]}`, or a range as
`{"low": 1e-5, "high": 3e-4, "log": true}`.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Callable


@dataclasses.dataclass(frozen=True)
class Range:
    """Numbers from `low` to `high` (both included): log-uniform with `log`, in steps of `step`."""

    low: float
    high: float
    kind: type = float
    log: bool = False
    step: float | None = None

    def suggest(self, trial, name: str):
        if self.kind is int:
            return trial.suggest_int(name, int(self.low), int(self.high), step=int(self.step or 1), log=self.log)
        return trial.suggest_float(name, self.low, self.high, step=self.step, log=self.log)


@dataclasses.dataclass(frozen=True)
class Choice:
    """One of `values` (Optuna's categorical)."""

    values: tuple

    def suggest(self, trial, name: str):
        return trial.suggest_categorical(name, list(self.values))


def parse(name: str, text: str, kind: type, choices=None) -> Any:
    """A flag's value: a plain value of `kind`, or a `Range` (`low:high[:log|:step]`, numbers only)
    or `Choice` (`a,b,...`); ValueError saying the forms."""
    if kind in (int, float) and ":" in text:
        return _range(name, text.split(":"), kind)
    if "," in text and (kind in (int, float) or choices):
        return Choice(tuple(_value(name, part, kind, choices) for part in text.split(",")))
    return _value(name, text, kind, choices)


def _range(name: str, parts: list[str], kind: type) -> Range:
    usage = (f"--{name} takes a value, a range LOW:HIGH (LOW:HIGH:log, LOW:HIGH:STEP) or choices A,B: "
             f"e.g. --{name} {'1:4' if kind is int else '1e-5:3e-4:log'}")
    if len(parts) not in (2, 3):
        raise ValueError(f"{':'.join(parts)!r}: {usage}")
    try:
        low, high = kind(parts[0]), kind(parts[1])
        log = len(parts) == 3 and parts[2] == "log"
        step = None if len(parts) == 2 or log else kind(parts[2])
    except ValueError:
        raise ValueError(f"{':'.join(parts)!r}: {usage}") from None
    if not low < high:
        raise ValueError(f"--{name} {':'.join(parts)}: the range's low end must be below its high end "
                         f"(--{name} {parts[1]}:{parts[0]})")
    if log and low <= 0:
        raise ValueError(f"--{name} {':'.join(parts)}: a log range needs a positive low end, or drop :log")
    return Range(low, high, kind, log, step)


def _value(name: str, text: str, kind: type, choices=None):
    try:
        value = kind(text)
    except ValueError:
        raise ValueError(f"--{name} {text}: not a {kind.__name__}") from None
    if choices and value not in choices:
        raise ValueError(f"--{name} {text}: choose from {', '.join(map(str, choices))}")
    return value


def from_json(text_or_file: str, kinds: dict[str, type], choices: dict[str, tuple]) -> dict[str, Range | Choice]:
    """The space a `--search_space` names: a JSON file, or JSON text; ValueError naming what is wrong."""
    path = Path(text_or_file)
    text = path.read_text(encoding="utf-8") if not text_or_file.lstrip().startswith("{") and path.is_file() else \
        text_or_file
    try:
        given = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"--search_space {text_or_file}: neither a JSON file nor JSON ({error.msg}): pass e.g. "
                         """--search_space '{"learning_rate": "1e-5:3e-4:log"}'""") from None
    if not isinstance(given, dict):
        raise ValueError("--search_space: a JSON object of TrainConfig field names, e.g. "
                         """'{"learning_rate": "1e-5:3e-4:log", "lr_scheduler_type": ["linear", "cosine"]}'""")
    space = {}
    for name, spec in given.items():
        if name not in kinds:
            raise ValueError(f"--search_space names {name!r}, which is no flag of flaxheads train: name TrainConfig "
                             "fields (learning_rate, warmup_ratio, ...)")
        kind = kinds[name]
        if isinstance(spec, list):
            space[name] = Choice(tuple(spec))
        elif isinstance(spec, dict):
            space[name] = Range(kind(spec["low"]), kind(spec["high"]), kind, bool(spec.get("log", False)),
                                spec.get("step"))
        elif isinstance(spec, str) and (":" in spec or "," in spec):
            space[name] = parse(name, spec, kind, choices.get(name))
        else:
            raise ValueError(f"--search_space {name}: {spec!r} is not a range (\"LOW:HIGH\", {{\"low\": ..., \"high\": "
                             f"...}}) or a list of choices; a fixed value is a flag: --{name} {spec}")
    return space


def hp_space(space: dict[str, Range | Choice]) -> Callable[[Any], dict[str, Any]]:
    """`hp_space(trial)` for `Trainer.hyperparameter_search`: each name's value suggested by the trial."""
    def suggest(trial) -> dict[str, Any]:
        return {name: spec.suggest(trial, name) for name, spec in space.items()}

    return suggest


def described(space: dict[str, Range | Choice]) -> str:
    """'learning_rate 1e-05..0.0003 (log), lr_scheduler_type in linear, cosine', for the log."""
    parts = []
    for name, spec in space.items():
        if isinstance(spec, Choice):
            parts.append(f"{name} in {', '.join(map(str, spec.values))}")
        else:
            parts.append(f"{name} {spec.low:g}..{spec.high:g}" + (" (log)" if spec.log else "")
                         + (f" step {spec.step:g}" if spec.step else ""))
    return ", ".join(parts)


def check(space: dict[str, Range | Choice], cfg) -> None:
    """ValueError (TrainConfig's own) when a value the space may give is no valid setting: both ends
    of each range and every choice are tried on `cfg` before the search starts."""
    for name, spec in space.items():
        for value in spec.values if isinstance(spec, Choice) else (spec.low, spec.high):
            dataclasses.replace(cfg, **{name: value})
