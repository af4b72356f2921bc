"""Where arrays live: the device mesh, and one small table of rules for parameters.

Mesh axes: `data` (pure data parallelism) and `fsdp` (data parallelism whose parameters and
optimizer state are also split, ZeRO-3/FSDP style). The batch is split over both; parameters
follow `PARAM_RULES`. Any layout runs the same train step: only the shardings change.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

MESH_AXES = ("data", "fsdp")
BATCH_AXES = ("data", "fsdp")

# (regex on the parameter path, spec when the mesh has an fsdp axis > 1). First match wins; a
# dimension that the fsdp size does not divide stays whole. Optimizer moments use their
# parameter's rule: their paths end with the same names.
PARAM_RULES: tuple[tuple[str, P], ...] = (
    (r"embedding$", P("fsdp", None)),  # (vocab or positions, hidden): split the rows
    (r"conv\.kernel$", P(None, "fsdp", None)),  # DeBERTa's Conv1d (width, in, out): split the input dimension
    (r"kernel$", P("fsdp", None)),  # (in, out): split the input dimension
    (r".*", P()),  # biases, LayerNorm scales, step counters: small, replicated
)


def parse_mesh(spec: str | None, device_count: int | None = None) -> dict[str, int]:
    """`"data=4,fsdp=2"` -> {"data": 4, "fsdp": 2}. One axis may be -1 (all remaining devices);
    missing axes are 1; None or "" means pure data parallelism over every device."""
    device_count = device_count or jax.device_count()
    sizes = {axis: 1 for axis in MESH_AXES}
    if not spec:
        sizes["data"] = -1
    else:
        for part in spec.split(","):
            name, _, value = part.partition("=")
            name = name.strip()
            if name not in MESH_AXES or not value.strip().lstrip("-").isdigit():
                raise ValueError(f"--mesh {spec!r}: expected axis=size pairs over {MESH_AXES}, e.g. data=4,fsdp=2")
            sizes[name] = int(value)
    free = [a for a, s in sizes.items() if s == -1]
    if len(free) > 1:
        raise ValueError(f"--mesh {spec!r}: at most one axis may be -1")
    fixed = math.prod(s for s in sizes.values() if s != -1)
    if free:
        if device_count % fixed:
            raise ValueError(f"--mesh {spec!r}: {device_count} devices are not divisible by {fixed}")
        sizes[free[0]] = device_count // fixed
    if math.prod(sizes.values()) != device_count:
        raise ValueError(
            f"--mesh {spec!r} covers {math.prod(sizes.values())} devices but there are {device_count}; "
            "the axis sizes must multiply to the device count"
        )
    return sizes


@dataclasses.dataclass(frozen=True)
class Layout:
    """A mesh and the shardings derived from it."""

    mesh: Mesh

    @classmethod
    def create(cls, spec: str | None = None) -> "Layout":
        sizes = parse_mesh(spec)
        axis_types = (jax.sharding.AxisType.Auto,) * len(MESH_AXES)
        # Auto axes: XLA propagates shardings through the model; nothing inside needs annotations.
        return cls(jax.make_mesh(tuple(sizes[a] for a in MESH_AXES), MESH_AXES, axis_types=axis_types))

    @property
    def data_parallel_size(self) -> int:
        return math.prod(self.mesh.shape[a] for a in BATCH_AXES)

    @property
    def replicated(self) -> NamedSharding:
        return NamedSharding(self.mesh, P())

    def batch(self, leading_axes: int = 0) -> NamedSharding:
        """Batch arrays split their example axis, after `leading_axes` (the accumulation axis)."""
        return NamedSharding(self.mesh, P(*([None] * leading_axes), BATCH_AXES))

    def put_batch(self, batch: dict[str, np.ndarray], leading_axes: int = 0) -> dict[str, jax.Array]:
        """Global arrays from this process's rows of the batch (every process passes its own)."""
        sharding = self.batch(leading_axes)
        return {k: jax.make_array_from_process_local_data(sharding, v) for k, v in batch.items()}

    def param_sharding(self, path: str, shape: tuple[int, ...]) -> NamedSharding:
        """The sharding `PARAM_RULES` give a parameter (or optimizer moment) at `path`."""
        fsdp = self.mesh.shape["fsdp"]
        for pattern, spec in PARAM_RULES:
            if re.search(pattern, path):
                break
        if fsdp == 1 or len(spec) > len(shape):
            return self.replicated
        dims = tuple(axis if axis is None or shape[i] % fsdp == 0 else None for i, axis in enumerate(spec))
        return NamedSharding(self.mesh, P(*dims))

    def tree_shardings(self, tree: Any) -> Any:
        """A sharding for every array leaf of `tree` (params, optimizer state, train state)."""

        def leaf(path, x):
            name = jax.tree_util.keystr(path, simple=True, separator=".")
            # An NNX State's leaves sit under each Variable's `value`: the rules match the parameter path.
            return self.param_sharding(name.removesuffix(".value"), tuple(x.shape))

        return jax.tree_util.tree_map_with_path(leaf, tree)
