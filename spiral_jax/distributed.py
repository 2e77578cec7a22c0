"""Multi-host start-up: one JAX program per host, joined by `jax.distributed`.

Every host runs the same `spiral-jax train` command. With `distributed.enabled`, each process calls
`jax.distributed.initialize` before touching a device; on Cloud TPU pods (and SLURM, Kubernetes, ...)
JAX finds the coordinator, process count and process id by itself, so the config only needs
`enabled=True`. On GPU or CPU hosts pass them in the config or through the environment:

    JAX_COORDINATOR_ADDRESS=10.0.0.1:1234  JAX_NUM_PROCESSES=2  JAX_PROCESS_ID=0  spiral-jax train ...

The coordinator address is host:port of process 0; any free port works.
"""
from __future__ import annotations

import dataclasses
import os

import jax

_initialized = False


@dataclasses.dataclass(frozen=True)
class DistributedSetup:
    """How this process joins a multi-host job (config section `distributed`): empty / 0 / -1 fields
    come from JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID, else JAX's detection."""
    enabled: bool = False
    coordinator_address: str = ""
    num_processes: int = 0
    process_id: int = -1


def initialize(d: DistributedSetup) -> None:
    """Join the other processes of a multi-host job (a no-op unless `d.enabled`; idempotent)."""
    global _initialized
    if not d.enabled or _initialized:
        return
    address = d.coordinator_address or os.environ.get("JAX_COORDINATOR_ADDRESS") or None
    count = d.num_processes if d.num_processes > 0 else _env_int("JAX_NUM_PROCESSES", "num_processes", 0)
    pid = d.process_id if d.process_id >= 0 else _env_int("JAX_PROCESS_ID", "process_id", -1)
    count, pid = count or None, None if pid < 0 else pid
    setup = (f"(got address={address!r}, num_processes={count}, process_id={pid}; config keys distributed.* or "
             f"JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID)")
    if (count is None) != (pid is None) or (count is not None and address is None):
        raise ValueError(
            "distributed.enabled with a partial setup: give coordinator_address, num_processes and "
            "process_id together, or none of them on a TPU pod or SLURM/Kubernetes cluster where JAX "
            f"detects them {setup}")
    if address is not None and not address.rpartition(":")[2].isdigit():
        raise ValueError(f"the coordinator address {address!r} needs a port: host:port of process 0, e.g. "
                         f"10.0.0.1:1234 {setup}")
    try:
        jax.distributed.initialize(coordinator_address=address, num_processes=count, process_id=pid)
    except ValueError as e:  # JAX detected no cluster to take the missing values from
        raise ValueError(f"jax.distributed could not start: {e} Outside a TPU pod or SLURM/Kubernetes "
                         f"cluster, give coordinator_address, num_processes and process_id {setup}") from None
    _initialized = True


def _env_int(name: str, key: str, unset: int) -> int:
    """The integer in environment variable `name`; `unset` where it is absent or empty."""
    value = os.environ.get(name, "").strip()
    if not value:
        return unset
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{name}={value!r} is not an integer; set it to one, or unset it and give "
                         f"distributed.{key} in the config") from None


def is_leader() -> bool:
    """Process 0: the one that writes logs, tables and transcripts."""
    return jax.process_index() == 0


# ------------------------------------------------------------------------ work split and exchange
#
# Each host samples its own share of the games on its own chips (a host-local mesh, with a full copy
# of the weights in the SAMPLE layout), so hosts never wait on each other while games are in flight.
# When a batch of games is finished the hosts exchange them, and from there on every host holds the
# same global list: RAE, sample selection and packing run identically everywhere, and the train step
# is one global SPMD program over all chips.


def process_slice(n: int) -> tuple[int, int]:
    """[lo, hi): this process's share of n items (the first n % count processes take one more)."""
    count, index = jax.process_count(), jax.process_index()
    base, extra = divmod(n, count)
    lo = index * base + min(index, extra)
    return lo, lo + base + (index < extra)


def allgather_json(obj) -> list:
    """Every process's `obj` (lists, dicts, strings, numbers), in process order, on every process.

    Plain JSON on the wire: a peer's bytes are parsed, never unpickled."""
    if jax.process_count() == 1:
        return [obj]
    import json

    import numpy as np
    from jax.experimental import multihost_utils

    data = np.frombuffer(json.dumps(obj, separators=(",", ":")).encode(), np.uint8)
    sizes = multihost_utils.process_allgather(np.array([data.size], np.int64)).reshape(-1)
    padded = np.zeros(int(sizes.max()), np.uint8)
    padded[:data.size] = data
    gathered = multihost_utils.process_allgather(padded)
    return [json.loads(gathered[i, :int(sizes[i])].tobytes()) for i in range(len(sizes))]


def host_local_mesh(mesh, process: int | None = None):
    """The part of `mesh` on one host's devices (this host's by default), as a (1, n, tensor) mesh
    for the sampler.

    Tensor groups must not span hosts (the sampler splits weights over 'tensor' only), which holds
    whenever `mesh.tensor` divides the devices per host.
    """
    if mesh is None or len({d.process_index for d in mesh.devices.flat}) == 1:
        return mesh
    process = jax.process_index() if process is None else process
    import numpy as np
    from jax.sharding import Mesh

    from spiral_jax.sharding import MESH_AXES, MeshError

    groups = np.asarray(mesh.devices).reshape(-1, mesh.shape["tensor"])
    mine = [g for g in groups if g[0].process_index == process]
    if any(len({d.process_index for d in g}) > 1 for g in groups) or not mine:
        raise MeshError(f"mesh.tensor={mesh.shape['tensor']} splits tensor groups across hosts; use a "
                        f"tensor size that divides the devices per host")
    return Mesh(np.asarray(mine).reshape(1, len(mine), -1), MESH_AXES)


def to_host_local(tree, local_mesh):
    """Arrays laid out on the global mesh -> the same values on `local_mesh`, without copying.

    Only for layouts that keep a whole copy on every host (split over 'tensor' at most), like the
    SAMPLE layout of the weights.
    """
    if local_mesh is None or jax.process_count() == 1:
        return tree
    from jax.sharding import NamedSharding

    def localize(x):
        spec = x.sharding.spec
        if any(axis not in (None, "tensor") for axis in spec):
            raise ValueError(f"cannot make a host-local copy of an array split as {spec}")
        return jax.make_array_from_single_device_arrays(
            x.shape, NamedSharding(local_mesh, spec), [s.data for s in x.addressable_shards])

    return jax.tree.map(localize, tree)
