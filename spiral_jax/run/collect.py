"""One step's data: games played until enough RAE-labelled turn samples exist, then the selection.

The reference's rule: whole batches of games until at least `samples_per_step` samples exist, then
exactly that many drawn at random ("exact"), or every sample of the first batch that gives any
("all": a batch whose turns all have a zero advantage, all draws say, gives none). Who plays each
game comes from `draw_seats`; the games, the draws and the selection are seeded by (seed, step)
alone, so a resumed run, another schedule or another host count collects the very same data.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np

from spiral_jax.rl.rae import label_games
from spiral_jax.rl.samples import TurnSample
from spiral_jax.rollout import PlayedGame, Rollout
from spiral_jax.run.spec import RunSpec
from spiral_jax.sampling import bucket_length
from spiral_jax.sampling.stats import DecodeStats

MAX_ROUNDS = 1000


@dataclasses.dataclass
class Collected:
    """A step's games and selected samples, with what the selection saw and the sampler did."""
    samples: list[TurnSample]
    games: list[PlayedGame]
    turns: int  # the trained model's turns that produced a response
    candidates: int  # labelled samples before the selection (turns minus those of zero advantage)
    rae: dict  # the RAE state after these games
    decode: DecodeStats  # the sampler's work for these games

    @property
    def zero_dropped(self) -> float:
        """The share of the model's turns dropped for a zero advantage."""
        return (self.turns - self.candidates) / max(self.turns, 1)


def draw_seats(rng: np.random.Generator, n: int, mode: str, opponent: str, pool_steps: Sequence[int],
               self_weight: float, first: int = 0) -> list[tuple[str, str]]:
    """Who plays each of n games, as (seat 0, seat 1) policy names.

    self_play: the model in both seats. fixed_opponent: the model against `opponent`. pool: a game is
    self-play with probability `self_weight` (always while the pool is empty), else the model against
    a snapshot "pool/STEP" drawn uniformly. Against another player the model takes seat 0 in even games
    and seat 1 in odd ones, counted from `first`, so it learns both roles: `collect` counts a step's
    games on from step x games_per_batch, which alternates the seats of one-game batches too.
    """
    seats = []
    for g in range(first, first + n):
        if mode == "self_play" or (mode == "pool" and (not pool_steps or rng.random() < self_weight)):
            seats.append(("model", "model"))
            continue
        other = opponent if mode == "fixed_opponent" else f"pool/{pool_steps[int(rng.integers(len(pool_steps)))]}"
        seats.append(("model", other) if g % 2 == 0 else (other, "model"))
    return seats


def collect(spec: RunSpec, rollout: Rollout, policies: Mapping[str, object], step: int, rae: dict,
            pool_steps: Sequence[int], opponent: str) -> Collected:
    """Play step `step`'s games with `policies` (name -> sampler-layout weights; "model" is trained)
    against `opponent` (fixed_opponent mode) or the snapshots of `pool_steps`, label them with RAE
    from state `rae`, and select the step's samples."""
    r, games_spec = spec.rollout, spec.games
    rng, p = np.random.default_rng([spec.seed, step]), games_spec.probabilities
    before = rollout.stats
    samples, games, turns = [], [], 0
    for round_ in range(MAX_ROUNDS):
        env_ids = [games_spec.env_ids[i] for i in rng.choice(len(p), r.games_per_batch, p=p)]
        seats = draw_seats(rng, r.games_per_batch, r.mode, opponent, pool_steps, r.pool_self_weight,
                           first=step * r.games_per_batch + len(games))
        played = rollout.play(env_ids, seats, policies, seed=int(rng.integers(1 << 31)))
        new, rae = label_games(played, rae, spec.rae)
        if round_ == 0:
            check_prompt_lengths(played, r.max_prompt_len)
        turns += sum(1 for g in played for t in g.model_turns if t.policy == "model" and t.response_ids)
        samples += new
        games += played
        if len(samples) >= (1 if r.selection == "all" else r.samples_per_step):
            break
    else:
        raise RuntimeError(f"{MAX_ROUNDS} rounds of games gave only {len(samples)} trainable samples")
    candidates = len(samples)
    if r.selection == "exact":
        keep = np.sort(rng.choice(len(samples), r.samples_per_step, replace=False))
        samples = [samples[i] for i in keep]
    return Collected(samples, games, turns, candidates, rae, rollout.stats - before)


def check_prompt_lengths(games: list[PlayedGame], max_prompt_len: int) -> None:
    """Fail at once when no prompt of a round fits `rollout.max_prompt_len`: every such turn is an
    invalid move, so no round would ever yield a trainable sample."""
    turns = [t for g in games for t in g.model_turns]
    if turns and all(t.finish_reason == "prompt_too_long" for t in turns):
        shortest = min(len(t.prompt_ids) for t in turns)
        raise ValueError(
            f"every prompt of the first round of games is longer than rollout.max_prompt_len="
            f"{max_prompt_len} tokens (the shortest has {shortest}); raise "
            f"rollout.max_prompt_len (e.g. --config.rollout.max_prompt_len={bucket_length(shortest)})")
