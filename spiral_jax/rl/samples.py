"""Turn samples and their packing into padded, bucketed arrays for the train step.

Every turn of every player is one sample: the templated observation (prompt) and the model's whole
response, stop token included. Packing lays each sample out as one row, *right-padded*:

    tokens    = prompt + response + pad            positions = 0, 1, 2, ... (RoPE)
    targets   = tokens shifted left by one         (targets[t] is the token predicted at slot t)
    loss_mask = 1 where targets[t] is a response token of a real row, else 0

so `log p(targets[t] | tokens[:t+1])` is read at slot t and the loss covers exactly the response
tokens. `response_slots` [B, R] lists, per row, the slots that predict its response tokens (R is the
longest response, bucketed), so logits are only ever formed there: with short answers after long
prompts (most game turns) that skips almost all of the unembedding. Right padding keeps positions
trivial; the decoder's key mask makes the padding invisible, so a row's log-probs equal those the
(left-padded) sampler saw. Lengths are bucketed in quarter octaves (64, 80, 96, 112, 128, 160, ...: a
72-token TicTacToe turn costs 80 slots, not 128) and the row count is padded with all-zero rows (loss_mask 0, advantage 0), so the jitted step compiles
once per bucket and padding never changes the loss.
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from spiral_jax.sampling.sampler import bucket_length


@dataclasses.dataclass(frozen=True)
class TurnSample:
    """One player's turn. `sampler_logprobs` are the sampler's raw (temperature 1, untruncated)
    log-probs of the response tokens; `advantage` is filled in by RAE once the game has ended."""

    prompt_ids: Sequence[int]
    response_ids: Sequence[int]
    sampler_logprobs: Sequence[float]
    game_id: str
    role: int | str
    turn: int
    advantage: float = 0.0

    def __post_init__(self):
        if not len(self.prompt_ids) or not len(self.response_ids):
            raise ValueError(f"turn {self.turn} of {self.game_id} (role {self.role}) has an empty "
                             f"prompt or response; every sample needs both")
        if len(self.sampler_logprobs) != len(self.response_ids):
            raise ValueError(f"turn {self.turn} of {self.game_id}: {len(self.sampler_logprobs)} "
                             f"sampler log-probs for {len(self.response_ids)} response tokens")


class Batch(NamedTuple):
    """Device-ready arrays; [B, T] unless noted. Log-prob fields are aligned with `targets`.

    `old_logprobs` (PPO's behaviour policy, recomputed by the learner) and `ref_logprobs` (a frozen
    reference, for the optional KL) are zeros until a caller fills them in with `_replace`.
    """

    tokens: np.ndarray  # int32
    positions: np.ndarray  # int32
    input_mask: np.ndarray  # bool: real (prompt or response) tokens
    targets: np.ndarray  # int32
    loss_mask: np.ndarray  # float32
    advantages: np.ndarray  # float32 [B]
    sampler_logprobs: np.ndarray  # float32
    old_logprobs: np.ndarray  # float32
    ref_logprobs: np.ndarray  # float32
    response_slots: np.ndarray  # int32 [B, R]: slot predicting each response token (0 past the end)

    @property
    def shape(self) -> tuple[int, int]:
        return self.tokens.shape


def pack(samples: Sequence[TurnSample], *, rows: int | None = None, row_multiple: int = 1,
         min_length: int = 16, max_length: int | None = None) -> Batch:
    """Pack samples into a right-padded Batch (see the module docstring).

    rows: the exact row count (e.g. a fixed 128 per step, so the step compiles once); by default the
    sample count rounded up to `row_multiple` (the micro-batch size, a multiple of the batch shards).
    """
    if not samples:
        raise ValueError("pack() needs at least one sample")
    n_rows = rows if rows is not None else -(-len(samples) // row_multiple) * row_multiple
    if n_rows < len(samples) or n_rows % row_multiple:
        raise ValueError(f"rows={n_rows} must hold {len(samples)} samples and be a multiple of "
                         f"row_multiple={row_multiple}")
    longest = max(len(s.prompt_ids) + len(s.response_ids) for s in samples)
    length = bucket_length(longest, min_length, per_octave=4)
    if max_length is not None and length > max_length:
        raise ValueError(f"a {longest}-token sample needs a {length}-slot bucket, above "
                         f"max_length={max_length}; raise max_length or cap the response length")

    tokens = np.zeros((n_rows, length), np.int32)
    loss_mask = np.zeros((n_rows, length), np.float32)
    sampler_logprobs = np.zeros((n_rows, length), np.float32)
    input_mask = np.zeros((n_rows, length), bool)
    advantages = np.zeros((n_rows,), np.float32)
    response_slots = np.zeros((n_rows, bucket_length(max(len(s.response_ids) for s in samples), 1)),
                              np.int32)
    for row, s in enumerate(samples):
        p, r = len(s.prompt_ids), len(s.response_ids)
        tokens[row, :p] = s.prompt_ids
        tokens[row, p:p + r] = s.response_ids
        input_mask[row, :p + r] = True
        # Slot t predicts token t+1, so the response tokens are predicted at slots p-1 .. p+r-2.
        loss_mask[row, p - 1:p + r - 1] = 1.0
        sampler_logprobs[row, p - 1:p + r - 1] = s.sampler_logprobs
        response_slots[row, :r] = np.arange(p - 1, p + r - 1)
        advantages[row] = s.advantage
    targets = np.zeros_like(tokens)
    targets[:, :-1] = tokens[:, 1:]
    positions = np.broadcast_to(np.arange(length, dtype=np.int32), tokens.shape).copy()
    zeros = np.zeros((n_rows, length), np.float32)
    return Batch(tokens, positions, input_mask, targets, loss_mask, advantages, sampler_logprobs,
                 zeros, zeros.copy(), response_slots)


def row_multiple(micro_batch_size: int | None, shards: int, samples_per_step: int | None = None) -> int:
    """The rows of a packed batch come in multiples of this: the micro-batch (default one row per
    data x fsdp shard). It must split over the `shards` evenly and, when a step trains exactly
    `samples_per_step` rows, divide them."""
    micro = micro_batch_size or shards
    if micro % shards or (samples_per_step and samples_per_step % micro):
        divide = f" and divide rollout.samples_per_step={samples_per_step}" if samples_per_step else ""
        raise ValueError(f"optim.micro_batch_size={micro} must be a multiple of the data x fsdp mesh size "
                         f"({shards}){divide}")
    return micro


def padded_rows(n: int, multiple: int) -> int:
    """Rows to pack `n` samples into: a bucketed count (few shapes, few compiles), in whole multiples."""
    return -(-bucket_length(n, 1) // multiple) * multiple


def batch_shardings(mesh: Mesh) -> Batch:
    """NamedSharding per field: rows over the ('data', 'fsdp') mesh axes, everything else whole."""
    rows = NamedSharding(mesh, PartitionSpec(("data", "fsdp")))
    return Batch(*(rows for _ in Batch._fields))


def shard_batch(batch: Batch, mesh: Mesh | None) -> Batch:
    """Put the global batch (the same on every host) on the mesh; each host uploads only the rows of
    its own devices."""
    if mesh is None:
        return jax.device_put(batch)
    return Batch(*(jax.make_array_from_callback(x.shape, s, lambda index, x=x: x[index])
                   for s, x in zip(batch_shardings(mesh), batch)))
