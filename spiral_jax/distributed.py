"""Multi-host start-up: one JAX program per host, joined by `jax.distributed`.

Every host runs the same `spiral-jax train` command. With `distributed.enabled`, each process calls
`jax.distributed.initialize` before touching a device; on Cloud TPU pods (and SLURM, Kubernetes, ...)
JAX finds the coordinator, process count and process id by itself, so the config only needs
`enabled=True`. On GPU or CPU hosts pass them in the config or through the environment:

    JAX_COORDINATOR_ADDRESS=10.0.0.1:1234  JAX_NUM_PROCESSES=2  JAX_PROCESS_ID=0  spiral-jax train ...

The coordinator address is host:port of process 0; any free port works.
"""
from __future__ import annotations

import os

import jax
from ml_collections import ConfigDict

_initialized = False


def initialize(d: ConfigDict) -> None:
    """Join the other processes of a multi-host job (a no-op unless `d.enabled`; idempotent)."""
    global _initialized
    if not d.enabled or _initialized:
        return
    env = os.environ
    address = d.coordinator_address or env.get("JAX_COORDINATOR_ADDRESS") or None
    count = d.num_processes or int(env.get("JAX_NUM_PROCESSES", 0)) or None
    pid = d.process_id if d.process_id >= 0 else int(env.get("JAX_PROCESS_ID", -1))
    pid = None if pid < 0 else pid
    if (count is None) != (pid is None) or (count is not None and address is None):
        raise ValueError(
            "distributed.enabled with a partial setup: give coordinator_address, num_processes and "
            "process_id together (config keys distributed.* or JAX_COORDINATOR_ADDRESS / "
            "JAX_NUM_PROCESSES / JAX_PROCESS_ID), or none of them on a TPU pod or SLURM/Kubernetes "
            f"cluster where JAX detects them (got address={address!r}, num_processes={count}, "
            f"process_id={pid})")
    jax.distributed.initialize(coordinator_address=address, num_processes=count, process_id=pid)
    _initialized = True


def is_leader() -> bool:
    """Process 0: the one that writes logs, tables and transcripts."""
    return jax.process_index() == 0
