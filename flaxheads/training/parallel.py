"""One train-step body, two wrappers: `jax.jit` over a device mesh, or `jax.pmap`.

Both wrappers take and give host batches and rngs the same way, checkpoint the same
unreplicated state (so a checkpoint restores under either wrapper, on any mesh), and hand the
evaluator parameters laid out on the mesh. The train state holds the trainable parameters; the
frozen ones (`flaxheads.training.trainable`) stay with the runner, a step input outside it.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from flaxheads import compile_cache
from flaxheads.training.optim import Schedule
from flaxheads.training.sharding import Layout
from flaxheads.training.step import TrainState, make_train_step
from flaxheads.training.trainable import merge_trainable

PMAP_AXIS = "devices"


def _init_fn(tx: optax.GradientTransformation) -> Callable[[nnx.State], TrainState]:
    return lambda params: TrainState(jnp.zeros((), jnp.int32), params, tx.init(params))


def _schedule_values(schedule, optimizer_values: dict | None = None) -> dict | None:
    """The step's `schedule_values` argument: a `Schedule`'s numbers and the optimizer's
    (`optim.optimizer_values`, when given), which every run with the same kind of schedule then
    shares one compiled step for (None for another schedule: constants)."""
    if not isinstance(schedule, Schedule):
        return None
    return {**schedule.values(), **(optimizer_values or {})}


def _program(programs: dict | None, key, build: Callable[[], Any]):
    """The compiled step `programs` holds under `key`, else `build()` (kept there under `key`): the
    runs of a hyperparameter search hand each other their step this way, so a search whose
    values are all run-time arguments traces and compiles its train step once."""
    if programs is None:
        return build()
    if key not in programs:
        programs[key] = build()
    return programs[key]


def _abstract(tree: Any) -> Any:
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)


class JitParallel:
    """The step jitted once with explicit in/out shardings (from the layout's rules) and the
    state donated; XLA inserts the collectives for data and FSDP parallelism."""

    name = "jit"

    def __init__(self, layout: Layout, graphdef, tx, schedule, objective, params: nnx.State,
                 frozen: nnx.State | None = None, *, loss_options: dict | None = None,
                 optimizer_values: dict | None = None, programs: dict | None = None, program_key=None):
        self.layout = layout
        frozen = nnx.State({}) if frozen is None else frozen
        frozen_shardings = layout.tree_shardings(frozen)
        self.frozen = jax.device_put(frozen, frozen_shardings)  # where the loader put them: no copy
        init = _init_fn(tx)
        # Sharded from the start: shapes first, then shardings, then an init that writes each
        # device's shard only.
        self.state_shardings = layout.tree_shardings(jax.eval_shape(init, params))
        self._init = _program(programs, ("jit init", program_key),
                              lambda: jax.jit(init, out_shardings=self.state_shardings))
        self.schedule_values = jax.device_put(_schedule_values(schedule, optimizer_values), layout.replicated)
        self._step = _program(programs, ("jit", program_key), lambda: compile_cache.train_jit(
            make_train_step(graphdef, tx, schedule, objective, **(loss_options or {})),
            graphdef=graphdef,
            in_shardings=(self.state_shardings, layout.batch(1), layout.replicated, frozen_shardings,
                          layout.replicated),
            out_shardings=(self.state_shardings, layout.replicated),
            donate_argnums=0,
        ))

    def init(self, params: nnx.State) -> TrainState:
        return self._init(params)

    def step(self, state: TrainState, batch: dict[str, np.ndarray], rng: jax.Array):
        return self._step(state, self.layout.put_batch(batch, leading_axes=1), rng, self.frozen,
                          self.schedule_values)

    def checkpointable(self, state: TrainState) -> TrainState:
        return state

    def restore_target(self, state: TrainState) -> TrainState:
        return _abstract(state)

    def from_restored(self, restored: TrainState) -> TrainState:
        return restored

    def params(self, state: TrainState) -> nnx.State:
        return merge_trainable(state.params, self.frozen)

    def host_params(self, state: TrainState) -> nnx.State:
        """numpy copies of the whole model's parameters, on every process (a collective)."""
        return host_copy(self.params(state), self.layout)


class PmapParallel:
    """The same step body under `jax.pmap`: state replicated on every local device, each device
    a slice of this process's batch, gradients and metrics combined with `lax.psum`."""

    name = "pmap"

    def __init__(self, layout: Layout, graphdef, tx, schedule, objective, params: nnx.State,
                 frozen: nnx.State | None = None, *, loss_options: dict | None = None,
                 optimizer_values: dict | None = None, programs: dict | None = None, program_key=None):
        self.layout = layout
        self.devices = jax.local_devices()
        self.frozen = nnx.State({}) if frozen is None else frozen
        self._frozen_replicas = self._replicate(self.frozen)
        self._init = _program(programs, ("pmap init", program_key), lambda: jax.jit(_init_fn(tx)))
        self.schedule_values = _schedule_values(schedule, optimizer_values)
        self._step = _program(programs, ("pmap", program_key), lambda: jax.pmap(
            compile_cache.precise(make_train_step(graphdef, tx, schedule, objective, axis_name=PMAP_AXIS,
                                                  **(loss_options or {}))),
            axis_name=PMAP_AXIS,
            in_axes=(0, 0, None, 0, None),
            donate_argnums=0,
        ))

    def init(self, params: nnx.State) -> TrainState:
        return self._replicate(self._init(params))

    def step(self, state: TrainState, batch: dict[str, np.ndarray], rng: jax.Array):
        n = len(self.devices)
        # (accum, B_process, ...) -> (devices, accum, B_process / devices, ...)
        split = {
            k: np.moveaxis(v.reshape(v.shape[0], n, v.shape[1] // n, *v.shape[2:]), 1, 0) for k, v in batch.items()
        }
        state, metrics = self._step(state, split, rng, self._frozen_replicas, self.schedule_values)
        return state, jax.tree.map(lambda m: m[0], metrics)

    def checkpointable(self, state: TrainState) -> TrainState:
        """One replica, as a global array replicated over the mesh (what Orbax saves)."""
        return jax.tree.map(
            lambda x: jax.make_array_from_single_device_arrays(
                x.shape[1:], self.layout.replicated, [shard.data[0] for shard in x.addressable_shards]
            ),
            state,
        )

    def restore_target(self, state: TrainState) -> TrainState:
        """One replica's shapes, replicated over the mesh. From the shapes alone: a run resumes
        before its first step, when the state is still the host copies `init` gives pmap to place."""
        return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape[1:], x.dtype, sharding=self.layout.replicated),
                            state)

    def from_restored(self, restored: TrainState) -> TrainState:
        return self._replicate(restored)

    def params(self, state: TrainState) -> nnx.State:
        return merge_trainable(self.checkpointable(state).params, self.frozen)

    def host_params(self, state: TrainState) -> nnx.State:
        """numpy copies of the whole model's parameters, on every process."""
        return host_copy(self.params(state), self.layout)

    def _replicate(self, tree: Any) -> Any:
        """One copy per local device, stacked on a leading axis; pmap places the copies."""
        n = len(self.devices)
        return jax.tree.map(lambda x: np.broadcast_to(np.asarray(x.addressable_data(0)), (n, *x.shape)), tree)


PARALLEL = {"jit": JitParallel, "pmap": PmapParallel}


def host_values(tree: Any) -> Any:
    """numpy values of replicated (or single-device) arrays, on any process."""
    return jax.tree.map(lambda x: np.asarray(x.addressable_data(0)), tree)


def host_copy(tree: Any, layout: Layout) -> Any:
    """numpy copies of a (possibly sharded, possibly multi-host) tree, on every process."""
    return host_values(jax.jit(lambda t: t, out_shardings=layout.replicated)(tree))
