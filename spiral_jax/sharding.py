"""Device mesh and the one logical-axis table that maps array axes to mesh axes.

Every weight and activation names its axes logically ("embed", "heads", "batch", ...). Two rule sets
map those names onto the mesh axes ('data', 'fsdp', 'tensor'):

- TRAIN: weights split over fsdp x tensor, the batch over data x fsdp.
- SAMPLE: weights split over tensor only (replicated elsewhere), the batch over data x fsdp.

A dimension that the mapped mesh axes do not divide is replicated instead, so odd vocabularies or
head counts never fail to shard.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import jax
import numpy as np
from jax.sharding import AbstractMesh, Mesh, NamedSharding, PartitionSpec

MESH_AXES = ("data", "fsdp", "tensor")

# logical axis -> mesh axis (or tuple of mesh axes, or None = replicated)
TRAIN_RULES = (
    ("batch", ("data", "fsdp")),
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("mlp", "tensor"),
    ("head_dim", None),
    ("layers", None),
    ("seq", None),
    ("act_embed", None),
)
# Sampling: the same, except that weights are not split over fsdp (no all-gathers while decoding).
SAMPLE_RULES = tuple((name, None if name == "embed" else target) for name, target in TRAIN_RULES)
RULE_SETS = {"train": TRAIN_RULES, "sample": SAMPLE_RULES}


class MeshError(ValueError):
    """A mesh shape that does not fit the available devices."""


def mesh_sizes(data: int, fsdp: int, tensor: int, devices: int) -> tuple[int, int, int]:
    """The (data, fsdp, tensor) sizes over `devices` devices; one size may be -1 for "the rest"."""
    sizes = [data, fsdp, tensor]
    if sizes.count(-1) > 1:
        raise MeshError(f"at most one mesh axis may be -1, got data={data}, fsdp={fsdp}, tensor={tensor}")
    known = math.prod(s for s in sizes if s != -1)
    if any(s == 0 or s < -1 for s in sizes) or devices % known:
        raise MeshError(
            f"mesh data={data} x fsdp={fsdp} x tensor={tensor} does not fit {devices} devices; "
            f"the sizes must multiply to {devices} (use -1 for one axis to take the rest)")
    sizes = [devices // known if s == -1 else s for s in sizes]
    if math.prod(sizes) != devices:
        raise MeshError(
            f"mesh data={sizes[0]} x fsdp={sizes[1]} x tensor={sizes[2]} = {math.prod(sizes)} devices, "
            f"but {devices} are available; make the sizes multiply to {devices}")
    return tuple(sizes)


def batch_shards(mesh: Mesh | None) -> int:
    """How many ways the batch is split: data x fsdp (1 without a mesh)."""
    return 1 if mesh is None else mesh.shape["data"] * mesh.shape["fsdp"]


def make_mesh(data: int = 1, fsdp: int = -1, tensor: int = 1, devices=None) -> Mesh:
    """A ('data', 'fsdp', 'tensor') mesh; one size may be -1 for "all remaining devices"."""
    devices = list(jax.devices() if devices is None else devices)
    return Mesh(np.asarray(devices).reshape(mesh_sizes(data, fsdp, tensor, len(devices))), MESH_AXES)


@dataclasses.dataclass(frozen=True)
class Rules:
    """A mesh plus a logical-axis table. Hashable, so it can be a static jit argument."""

    mesh: Mesh
    table: tuple[tuple[str, object], ...]

    @classmethod
    def create(cls, mesh: Mesh | None, kind: str = "train") -> "Rules | None":
        if kind not in RULE_SETS:
            raise ValueError(f"unknown sharding rules {kind!r}; use one of {sorted(RULE_SETS)}")
        if mesh is None:
            return None
        if not isinstance(mesh, (Mesh, AbstractMesh)) or set(mesh.axis_names) != set(MESH_AXES):
            raise TypeError(f"mesh must be None (one device) or a jax Mesh with axes {MESH_AXES} "
                            f"(spiral_jax.sharding.make_mesh), got {mesh!r}")
        return cls(mesh, RULE_SETS[kind])

    def spec(self, axes: Sequence[str | None], shape: Sequence[int]) -> PartitionSpec:
        """PartitionSpec for `shape`, replicating any dimension the mapped mesh axes do not divide."""
        table = dict(self.table)
        used: set[str] = set()
        out = []
        for name, size in zip(axes, shape):
            target = table.get(name) if name is not None else None
            mesh_axes = (target,) if isinstance(target, str) else tuple(target or ())
            mesh_axes = tuple(a for a in mesh_axes if a not in used and self.mesh.shape[a] > 1)
            if not mesh_axes or size % math.prod(self.mesh.shape[a] for a in mesh_axes):
                out.append(None)
                continue
            used.update(mesh_axes)
            out.append(mesh_axes[0] if len(mesh_axes) == 1 else mesh_axes)
        return PartitionSpec(*out)

    def sharding(self, axes: Sequence[str | None], shape: Sequence[int]) -> NamedSharding:
        return NamedSharding(self.mesh, self.spec(axes, shape))

    def replicated(self) -> NamedSharding:
        return NamedSharding(self.mesh, PartitionSpec())


def constrain(x: jax.Array, rules: Rules | None, axes: Sequence[str | None]) -> jax.Array:
    """with_sharding_constraint by logical axes; a no-op without a mesh."""
    if rules is None:
        return x
    return jax.lax.with_sharding_constraint(x, rules.sharding(axes, x.shape))
