"""Multi-host start-up: `jax.distributed.initialize` from flags or the environment."""

from __future__ import annotations

import os
import sys
from typing import NoReturn

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


def joined() -> bool:
    """Whether this process is one of a multi-process job (`initialize` joined it to others)."""
    from jax._src import distributed

    return distributed.global_state.client is not None and jax.process_count() > 1


def leave(code: int) -> NoReturn:
    """Ends this process of a multi-process job now, with exit status `code`, once its error is
    printed. A normal exit would wait at jax's shutdown barrier (5 minutes) for the other
    processes, which wait for this one in the run's next collective: its exit ends their wait
    (the job's coordination service, or the collectives' connections, tell them it is gone)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
