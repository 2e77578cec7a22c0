"""The sizes a run works at, from its config alone: the mesh as sizes, and the worst-case rows, slots
and games of one step (`Workload`)."""
from __future__ import annotations

import dataclasses
import math

import jax
from jax.sharding import AbstractMesh

from spiral_jax.policies import PolicySpec
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
    games_per_batch: int  # rollout.games_per_batch: a step's games, over all hosts
    rollout_new: int
    eval_games: int  # as configured; evaluation plays them `eval_in_flight` at a time per host
    final_games: int
    eval_new: int
    snapshots: int  # other policies' weights kept on the devices: pool snapshots, a frozen opponent
    max_in_flight: int = 0  # rollout.max_in_flight: games at once per host (0: unset)
    lora_merged: bool = True  # with LoRA: the sampler reads a merged copy of the weights (model.lora.sample)
    continuous: bool = False  # rollout.schedule=continuous: decode engines play the games, not sampler calls
    frozen_opponent: bool = False  # rollout.opponent is a model folder: a whole model of its own
    eval_self: bool = False  # eval.opponents has "self": the model plays itself as a second policy

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

    @property
    def rollout_games(self) -> int:
        """Games of one rollout call on one host: games_per_batch, or max_in_flight where smaller."""
        return min(self.games_per_batch, self.max_in_flight) if self.max_in_flight else self.games_per_batch

    @property
    def eval_in_flight(self) -> int:
        """Games an evaluation plays at once per host (`RolloutSpec.eval_in_flight`): max_in_flight,
        else games_per_batch."""
        return self.max_in_flight or self.games_per_batch

    def in_flight(self, games: int) -> int:
        """Games of an evaluation of `games` in one sampler call on one host: chunks of at most
        `eval_in_flight` (0 would mean all at once)."""
        return min(games, self.eval_in_flight) if self.eval_in_flight > 0 else games

    def sampler_calls(self, hosts: int = 1) -> list[tuple[str, int, int, int]]:
        """(name, games, new tokens, engines) of the rollout's and evaluations' sampler calls on one
        host, as `Rollout.play` makes them: each host plays its share of the games (`process_slice`:
        the first host the largest).

        Rounds: calls of min(share, max_in_flight) games, one policy's after another (engines 1).
        Continuous: a decode engine per LLM policy the call seats (`Rollout._play_continuous`), each
        with its own KV cache until the call ends, of max_in_flight slots (`Rollout._engine`), or the
        host's share without it; evaluation's Rollout has max_in_flight = `eval_in_flight`, so its
        engines have that many slots however few games it plays. The rollout seats the model, every
        pool snapshot and a frozen opponent; evaluation the model, and it again as "self"."""
        def share(n: int) -> int:
            return -(-n // hosts)

        evals = [("eval", self.eval_games), ("final eval", self.final_games)]
        if self.continuous:
            rollout = [("rollout", self.max_in_flight or share(self.games_per_batch), self.rollout_new,
                        1 + self.snapshots)]
            return rollout + [(name, self.eval_in_flight if n > 0 else 0, self.eval_new, 1 + self.eval_self)
                              for name, n in evals]
        rollout = share(self.games_per_batch)
        return ([("rollout", min(rollout, self.max_in_flight) if self.max_in_flight else rollout, self.rollout_new, 1)]
                + [(name, self.in_flight(share(n)), self.eval_new, 1) for name, n in evals])


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
    frozen_opponent = r.mode == "fixed_opponent" and PolicySpec.parse(r.opponent).kind == "checkpoint"
    return Workload(
        samples=samples, micro_batch=spec.train.micro_batch_size or samples, row=row,
        chunk=response_chunk(spec.train.logprob_chunk, row.response_slots.shape[1]),
        prompt_len=bucket_length(r.max_prompt_len), games_per_batch=r.games_per_batch,
        rollout_new=r.sampling.max_new_tokens, eval_games=e.games, final_games=e.final_games,
        eval_new=e.sampling.max_new_tokens, max_in_flight=r.max_in_flight or 0,
        snapshots=r.pool_size if r.mode == "pool" else int(frozen_opponent),
        lora_merged=spec.lora_merged, continuous=r.schedule == "continuous", frozen_opponent=frozen_opponent,
        eval_self="self" in e.opponents)
