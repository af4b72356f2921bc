"""Multi-host start-up: `jax.distributed.initialize` from flags or the environment."""

from __future__ import annotations

import os

import jax


def initialize(
    coordinator_address: str | None, num_processes: int | None, process_id: int | None, *, auto: bool = False
) -> None:
    """Joins the job's other processes before any device is touched.

    With `coordinator_address` (and `num_processes`, `process_id`) the job is set up from flags;
    with none of them but a cluster environment jax recognises (TPU pods, SLURM, Open MPI) or
    `JAX_COORDINATOR_ADDRESS`, from the environment; otherwise this is a single-process run and
    nothing happens. `auto=True` always initialises, letting jax detect the cluster. CPU
    processes exchange data over gloo.
    """
    from_env = any(os.environ.get(v) for v in ("JAX_COORDINATOR_ADDRESS", "TPU_WORKER_HOSTNAMES", "SLURM_JOB_ID"))
    if coordinator_address is None and not from_env and not auto:
        return
    if jax.config.jax_platforms in (None, "", "cpu") or os.environ.get("JAX_PLATFORMS", "") == "cpu":
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if coordinator_address is None:
        jax.distributed.initialize()
    else:
        jax.distributed.initialize(coordinator_address, num_processes, process_id)
