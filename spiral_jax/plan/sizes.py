"""The sizes a run works at, from its config alone: the mesh as sizes, and the worst-case rows, slots
and games of one step (`Workload`)."""
from __future__ import annotations

import dataclasses
import math

import jax
from jax.sharding import AbstractMesh

from spiral_jax.policies import SCRIPTED
from spiral_jax.rl.losses import response_chunk
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
    continuous: bool = False  # rollout.schedule=continuous: decode engines play the games, not sampler calls

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


def longest_row(spec) -> Batch:
    """The packed `Batch` of one training row of a run (`RunSpec`) at its worst case: the longest
    prompt plus the longest response, laid out by `pack` itself, so its buckets and dtypes are the
    trainer's."""
    r = spec.rollout
    new = r.sampling.max_new_tokens
    return pack([TurnSample([0] * r.max_prompt_len, [0] * new, [0.0] * new, "plan", 0, 0)])


def workload(spec) -> Workload:
    """Worst-case sizes of a run (`RunSpec`; see `longest_row`)."""
    r, e = spec.rollout, spec.evaluation
    row = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), longest_row(spec))
    samples = r.samples_per_step
    return Workload(
        samples=samples, micro_batch=spec.train.micro_batch_size or samples, row=row,
        chunk=response_chunk(spec.train.logprob_chunk, row.response_slots.shape[1]),
        prompt_len=bucket_length(r.max_prompt_len),
        rollout_games=min(r.games_per_batch, r.eval_in_flight),
        rollout_new=r.sampling.max_new_tokens, eval_games=e.games, final_games=e.final_games,
        eval_new=e.sampling.max_new_tokens,
        snapshots=r.pool_size if r.mode == "pool" else int(r.mode == "fixed_opponent" and r.opponent not in SCRIPTED),
        lora_merged=spec.lora_merged, continuous=r.schedule == "continuous")
