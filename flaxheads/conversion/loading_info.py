"""What a load took from the checkpoint, what it created, and what it left: data, not a log line."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class LoadingInfo:
    """Hugging Face parameter names, sorted, in three disjoint groups (plus shape mismatches).

    `newly_initialized` are the parameters that must be trained before the model is useful
    (usually the classifier); `unused` are checkpoint tensors the model has no place for (an MLM
    or NSP head, say).
    """

    source: str
    head: str
    loaded: list[str]
    newly_initialized: list[str]
    unused: list[str]
    mismatched: list[tuple[str, tuple, tuple]] = dataclasses.field(default_factory=list)
    """(name, checkpoint shape, model shape) re-initialised because `ignore_mismatched_sizes=True`."""
    notes: list[str] = dataclasses.field(default_factory=list)

    @property
    def fully_pretrained(self) -> bool:
        return not self.newly_initialized and not self.mismatched

    @property
    def untrained(self) -> list[str]:
        """Every parameter that starts from random values: new, or re-initialised for its shape."""
        return list(self.newly_initialized) + [name for name, *_ in self.mismatched]

    def __str__(self) -> str:
        lines = [f"Loaded {self.source} with head {self.head!r}:"]
        lines.append(f"  from the checkpoint: {len(self.loaded)} tensors")
        if self.newly_initialized or self.mismatched:
            lines.append("  NEW, randomly initialised, must be trained before use:")
            lines += [f"    {name}" for name in self.newly_initialized]
            lines += [
                f"    {name} (checkpoint shape {got}, model needs {want})" for name, got, want in self.mismatched
            ]
        else:
            lines.append("  new: none; every parameter came from the checkpoint")
        if self.unused:
            lines.append(f"  in the checkpoint but unused by this model ({len(self.unused)}):")
            lines += [f"    {name}" for name in _summarise(self.unused)]
        lines += [f"  note: {note}" for note in self.notes]
        return "\n".join(lines)


def _summarise(names: list[str], limit: int = 12) -> list[str]:
    if len(names) <= limit:
        return names
    return names[:limit] + [f"... and {len(names) - limit} more"]
