"""The sizes a run works at, from its config alone: the mesh as sizes, and the worst-case rows, slots
and games of one step (`Workload`)."""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import jax
from jax.sharding import AbstractMesh

from spiral_jax.models import ModelConfig
from spiral_jax.policies import SCRIPTED
from spiral_jax.rl.samples import Batch, TurnSample, pack
from spiral_jax.sampling import bucket_length
from spiral_jax.sharding import MESH_AXES, RULE_SETS, Rules, mesh_sizes


@dataclasses.dataclass(frozen=True)
class MeshShape:
    """A ('data', 'fsdp', 'tensor') mesh as sizes only: the arithmetic of `make_mesh`, no devices."""

    data: int
    fsdp: int
    tensor: int

    @classmethod
    def resolve(cls, data: int, fsdp: int, tensor: int, devices: int) -> "MeshShape":
        return cls(*mesh_sizes(data, fsdp, tensor, devices))

    @property
    def batch_shards(self) -> int:
        return self.data * self.fsdp

    def rows(self, n: int) -> int:
        """Rows of `n` on one device when they are split over the batch shards."""
        return -(-n // self.batch_shards)

    def rules(self, kind: str) -> Rules:
        """The project's sharding rules on an abstract mesh of these sizes (nothing is allocated)."""
        return Rules(AbstractMesh((self.data, self.fsdp, self.tensor), MESH_AXES), RULE_SETS[kind])

    def __str__(self):
        return f"data={self.data} fsdp={self.fsdp} tensor={self.tensor}"


def shard_elements(rules: Rules, axes, shape) -> int:
    """Elements of one device's shard of an array with these logical axes (`Rules.spec` decides)."""
    n = 1
    for size, entry in zip(shape, rules.spec(axes, shape)):
        names = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
        n *= size // math.prod(rules.mesh.shape[a] for a in names)
    return n


@dataclasses.dataclass(frozen=True)
class Workload:
    """The sizes a step runs at, worst case (every bucket at its configured maximum)."""

    samples: int  # rows per update
    micro_batch: int  # rows per micro-batch
    row: Batch  # one packed training row, abstract (jax.ShapeDtypeStruct per field): `longest_row`
    chunk: int  # response slots unembedded at a time
    prompt_len: int  # prompt bucket of the sampler
    rollout_games: int  # games per rollout call (or decode slots), and evaluation's chunk: games_per_batch
    # or rollout.max_in_flight where that is smaller
    rollout_new: int
    eval_games: int  # as configured; evaluation plays them `in_flight` at a time
    final_games: int
    eval_new: int
    snapshots: int  # other policies' weights kept on the devices: pool snapshots, a frozen opponent
    lora_merged: bool = True  # with LoRA: the sampler reads a merged copy of the weights (model.lora.sample)

    @property
    def train_len(self) -> int:
        """T: prompt + response slots of a training row, bucketed."""
        return self.row.tokens.shape[1]

    @property
    def response_len(self) -> int:
        """R: response slots of a training row, bucketed."""
        return self.row.response_slots.shape[1]

    @property
    def row_bytes(self) -> int:
        """One packed training row on the device, every Batch field."""
        return sum(x.size * x.dtype.itemsize for x in self.row)

    def in_flight(self, games: int) -> int:
        """Games of an evaluation of `games` in one sampler call: chunks of at most games_per_batch
        (`Rollout.max_in_flight`; 0 or unset would mean all at once)."""
        return min(games, self.rollout_games) if self.rollout_games > 0 else games


def longest_row(c) -> Batch:
    """The packed `Batch` of one training row of config `c` at its worst case: the longest prompt plus
    the longest response, laid out by `pack` itself, so its buckets and dtypes are the trainer's."""
    r = c.rollout
    return pack([TurnSample([0] * r.max_prompt_len, [0] * r.max_new_tokens, [0.0] * r.max_new_tokens, "plan", 0, 0)])


def workload(c) -> Workload:
    """Worst-case sizes of config `c` (see `longest_row`)."""
    r, e = c.rollout, c.eval
    row = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), longest_row(c))
    samples = r.samples_per_step
    return Workload(
        samples=samples, micro_batch=c.optim.micro_batch_size or samples, row=row,
        chunk=min(c.optim.logprob_chunk, row.response_slots.shape[1]), prompt_len=bucket_length(r.max_prompt_len),
        rollout_games=min(r.games_per_batch, r.max_in_flight or r.games_per_batch), rollout_new=r.max_new_tokens,
        eval_games=e.games, final_games=e.final_games, eval_new=e.max_new_tokens,
        snapshots=r.pool_size if r.mode == "pool" else int(r.mode == "fixed_opponent" and r.opponent not in SCRIPTED),
        lora_merged=c.model.lora.sample == "merged")


def model_config(c) -> tuple[ModelConfig, str]:
    """The architecture from model.path's config.json, else model.random (also for a preset whose
    model.path is not downloaded yet); and where it came from."""
    import copy

    from spiral_jax.run.setup import model_config as configured

    path = c.model.path
    if path and (Path(path) / "config.json").exists():
        return configured(c), f"{path}/config.json"
    if path:
        c = copy.deepcopy(c)
        c.model.path = ""
    return configured(c), "model.random" if not path else f"model.random (no config.json at {path!r})"
