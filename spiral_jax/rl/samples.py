"""Turn samples and their packing into padded, bucketed arrays for the train step.

Every turn of every player is one sample: the templated observation (prompt) and the model's whole
response, stop token included. Packing lays samples out in rows, one after another and
*right-padded*; a row holds one sample, or with `samples_per_row` > 1 several (first-fit, longest
first), which fills long rows with real tokens instead of padding:

    tokens      = prompt + response (+ prompt + response ...) + pad
    positions   = 0, 1, 2, ... restarting at each sample (RoPE)
    segment_ids = 1 on the row's first sample, 2 on its second, ...; 0 on padding
    targets     = tokens shifted left by one       (targets[t] is the token predicted at slot t)
    loss_mask   = 1 where targets[t] is a response token of the slot's own sample, else 0

so `log p(targets[t] | tokens[:t+1])` is read at slot t and the loss covers exactly the response
tokens. The decoder attends within a segment only, so a sample's log-probs are those it would have
alone in a row, which equal those the (left-padded) sampler saw. `advantages` [B, S] holds each
row's samples' advantages in segment order (S: the most samples a row holds, bucketed).
`response_slots` [B, R] lists, per row, the slots that predict its response tokens (R is the most
response tokens of a row, bucketed, at most the row's length), so logits are only ever formed
there: with short answers after long prompts (most game turns) that skips almost all of the
unembedding. Lengths are bucketed in quarter octaves (64, 80, 96, 112, 128, 160, ...: a 72-token
TicTacToe turn costs 80 slots, not 128) and the row count is padded with all-zero rows (segment 0,
loss_mask 0, advantage 0), so the jitted step compiles once per bucket and padding never changes
the loss.
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from spiral_jax.models import ModelConfig
from spiral_jax.models.fused_attention import resolve as resolve_attention
from spiral_jax.sampling.sampler import bucket_length

PACKED_PER_ROW = 16  # the most samples a row holds where packing is on by default (`per_row`)


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
    positions: np.ndarray  # int32: restarting at 0 on each sample
    segment_ids: np.ndarray  # int32: the slot's sample within its row, from 1; 0 on padding
    targets: np.ndarray  # int32
    loss_mask: np.ndarray  # float32
    advantages: np.ndarray  # float32 [B, S]: the row's samples' advantages, in segment order
    sampler_logprobs: np.ndarray  # float32
    old_logprobs: np.ndarray  # float32
    ref_logprobs: np.ndarray  # float32
    response_slots: np.ndarray  # int32 [B, R]: slot predicting each response token (the row's last slot past the end)

    @property
    def shape(self) -> tuple[int, int]:
        return self.tokens.shape

    @property
    def segments(self) -> int:
        """The most samples a row may hold (static: the advantages' width)."""
        return self.advantages.shape[1]


def advantage_slots(samples_in_row: int) -> int:
    """The width of `Batch.advantages` for rows of up to `samples_in_row` samples: a bucket, so the
    train step compiles once per bucket (it reads the width as `Batch.segments`)."""
    return bucket_length(samples_in_row, 1)


def rows_of(lengths: Sequence[int], length: int, per_row: int) -> list[list[int]]:
    """Sample indices per row: first-fit over the samples longest first, at most `per_row` to a row of
    `length` slots (per_row 1: a row each, in the samples' order). First-fit decreasing fills rows to
    within a few percent of the token count, and sorting is deterministic, so one list of samples
    always packs the same way."""
    if per_row == 1:
        return [[i] for i in range(len(lengths))]
    rows, free = [], []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        row = next((r for r, f in enumerate(free) if f >= lengths[i] and len(rows[r]) < per_row), None)
        if row is None:
            rows.append([])
            free.append(length)
            row = len(rows) - 1
        rows[row].append(i)
        free[row] -= lengths[i]
    return rows


def pack(samples: Sequence[TurnSample], *, rows: int | None = None, row_multiple: int = 1,
         bucket_rows: bool = False, samples_per_row: int = 1, min_length: int = 16,
         max_length: int | None = None) -> Batch:
    """Pack samples into a right-padded Batch (see the module docstring).

    samples_per_row: the most samples one row holds (1: a row each). rows: the exact row count (e.g. a
    fixed 128 per step, so the step compiles once); by default the rows the samples fill, rounded up to
    `row_multiple` (the micro-batch size, a multiple of the batch shards), and with bucket_rows to a
    bucketed count in whole multiples (`padded_rows`: few shapes, few compiles).
    """
    if not samples:
        raise ValueError("pack() needs at least one sample")
    if samples_per_row < 1:
        raise ValueError(f"samples_per_row={samples_per_row} must be at least 1")
    lengths = [len(s.prompt_ids) + len(s.response_ids) for s in samples]
    length = bucket_length(max(lengths), min_length, per_octave=4)
    if max_length is not None and length > max_length:
        raise ValueError(f"a {max(lengths)}-token sample needs a {length}-slot bucket, above "
                         f"max_length={max_length}; raise max_length or cap the response length")
    placed = rows_of(lengths, length, samples_per_row)
    if rows is not None:
        n_rows = rows
    elif bucket_rows:  # packed rows are long: pad them to quarter octaves, not powers of two
        n_rows = padded_rows(len(placed), row_multiple, 4 if samples_per_row > 1 else 1)
    else:
        n_rows = -(-len(placed) // row_multiple) * row_multiple
    if n_rows < len(placed) or n_rows % row_multiple:
        raise ValueError(f"rows={n_rows} must hold {len(placed)} rows of samples and be a multiple of "
                         f"row_multiple={row_multiple}")

    tokens = np.zeros((n_rows, length), np.int32)
    positions = np.zeros((n_rows, length), np.int32)
    segment_ids = np.zeros((n_rows, length), np.int32)
    loss_mask = np.zeros((n_rows, length), np.float32)
    sampler_logprobs = np.zeros((n_rows, length), np.float32)
    advantages = np.zeros((n_rows, advantage_slots(max(map(len, placed)))), np.float32)
    answers = max(sum(len(samples[i].response_ids) for i in row) for row in placed)
    # A row's entries past its response tokens point at its last slot, which never predicts a response
    # token (slot 0 does, after a one-token prompt): they read no token's log-prob a second time.
    response_slots = np.full((n_rows, min(bucket_length(answers, 1), length)), length - 1, np.int32)
    for row, members in enumerate(placed):
        start, answered = 0, 0
        for segment, i in enumerate(members):
            s = samples[i]
            p, r = len(s.prompt_ids), len(s.response_ids)
            end = start + p + r
            tokens[row, start:start + p] = s.prompt_ids
            tokens[row, start + p:end] = s.response_ids
            positions[row, start:end] = np.arange(p + r)
            segment_ids[row, start:end] = segment + 1
            # Slot t predicts token t+1, so the response tokens are predicted at slots p-1 .. p+r-2
            # of the sample (the sample's last slot predicts the next sample's first token: no loss).
            predict = np.arange(start + p - 1, end - 1)
            loss_mask[row, predict] = 1.0
            sampler_logprobs[row, predict] = s.sampler_logprobs
            response_slots[row, answered:answered + r] = predict
            advantages[row, segment] = s.advantage
            start, answered = end, answered + r
    targets = np.zeros_like(tokens)
    targets[:, :-1] = tokens[:, 1:]
    zeros = np.zeros((n_rows, length), np.float32)
    return Batch(tokens, positions, segment_ids, targets, loss_mask, advantages, sampler_logprobs,
                 zeros, zeros.copy(), response_slots)


def per_row(setting: int | None, cfg: ModelConfig, platform: str) -> int:
    """The most samples the trainer packs into one row: `optim.samples_per_row` when set, else
    PACKED_PER_ROW where the training attention kernel runs packed rows on any device of the
    platform (XLA's, splash on TPU), and 1 under cuDNN, whose packed layout needs a Hopper GPU."""
    if setting is not None:
        return setting
    kernel = resolve_attention(cfg.attention, platform, cfg.compute_dtype, cfg.head_dim)
    return 1 if kernel == "cudnn" else PACKED_PER_ROW


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


def padded_rows(n: int, multiple: int, per_octave: int = 1) -> int:
    """`n` rows padded to a bucketed count (few shapes, few compiles), in whole multiples."""
    return -(-bucket_length(n, 1, per_octave) // multiple) * multiple


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
