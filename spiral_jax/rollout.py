"""Rollout: many games in flight, every pending model move of every game in one sampler call.

Each game slot has two seats, each played by a policy: a name in `params` ("model" for the current
weights, "pool/3" for a frozen snapshot, ...) is sampled by the LLM; anything else is a scripted
opponent ("random", or "scripted" for the game's strongest script). Per loop the runner's pending
requests are grouped by policy, each LLM group is one `Sampler.generate` call, responses go through
the trainer-side action rules (an unusable response, or one cut at the token limit, is an invalid
move, never an exception), and
finished games come back with every LLM turn's token ids and log-probs. On several hosts each plays its
share of the games on its own chips and the finished games are exchanged (spiral_jax/distributed.py).
"""
from __future__ import annotations

import dataclasses
import time
from collections import defaultdict
from typing import Mapping, Sequence

import jax
import numpy as np

from spiral_jax.distributed import allgather_json, process_slice
from spiral_jax.envs import BatchRunner, GameRecord, RandomOpponent, Turn, make, scripted_opponent
from spiral_jax.sampling import Sampler, SamplingParams


@dataclasses.dataclass
class ModelTurn:
    """An LLM move: the prompt it saw, what it generated, and the sampler's raw log-probs."""

    player: int
    policy: str
    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: np.ndarray
    finish_reason: str  # "stop", "length", or "prompt_too_long" (no tokens generated)


@dataclasses.dataclass
class PlayedGame:
    record: GameRecord
    seats: tuple[str, str]
    model_turns: list[ModelTurn]

    def to_plain(self) -> dict:
        """Lists, dicts, strings and numbers only: what hosts exchange (no pickled objects)."""
        plain = dataclasses.asdict(self)
        plain["record"]["rewards"] = None if self.record.rewards is None else \
            [[int(k), float(v)] for k, v in self.record.rewards.items()]
        for turn, model_turn in zip(plain["model_turns"], self.model_turns):
            turn["logprobs"] = np.asarray(model_turn.logprobs, np.float32).tolist()  # exact as float64
        return plain

    @classmethod
    def from_plain(cls, d: dict) -> "PlayedGame":
        record = dict(d["record"], turns=[Turn(**t) for t in d["record"]["turns"]],
                      rewards=None if d["record"]["rewards"] is None else
                      {int(k): v for k, v in d["record"]["rewards"]})
        turns = [ModelTurn(**dict(t, logprobs=np.asarray(t["logprobs"], np.float32))) for t in d["model_turns"]]
        return cls(GameRecord(**record), tuple(d["seats"]), turns)


def make_opponent(name: str, env_id: str, seed: int):
    if name == "random":
        return RandomOpponent(seed)
    if name == "scripted":
        return scripted_opponent(env_id, seed)
    raise ValueError(f"unknown opponent {name!r}; use 'random', 'scripted' or a model policy name")


class Rollout:
    """Plays batches of games between LLM policies and scripted opponents."""

    def __init__(self, sampler: Sampler, tokenizer, sampling: SamplingParams, *,
                 invalid_rewards: Sequence[float] = (-1.5, 0.5), max_turns: int | None = 50,
                 max_in_flight: int | None = None):
        """max_in_flight: play at most this many games at once per host (bounds the sampler's batch and
        KV cache, e.g. for a 512-game evaluation); None: all of them."""
        self.sampler, self.tokenizer = sampler, tokenizer
        self.max_in_flight = max_in_flight
        self.sampling = dataclasses.replace(sampling, stop_token_ids=tokenizer.stop_ids)
        self.invalid_rewards, self.max_turns = tuple(invalid_rewards), max_turns
        self.sample_seconds, self.generated_tokens = 0.0, 0  # running totals, for throughput logs

    def play(self, env_ids: Sequence[str], seats: Sequence[tuple[str, str]], params: Mapping[str, object],
             seed: int) -> list[PlayedGame]:
        """Play one game per (env id, seats) pair to the end; results in slot order.

        With several hosts each plays its own slice of the games (seeded by their global index, so
        the results do not depend on the number of hosts) and all of them get every game back.
        """
        lo, hi = process_slice(len(env_ids))
        chunk = self.max_in_flight or max(hi - lo, 1)
        games = [g for start in range(lo, hi, chunk)
                 for g in self._play(list(env_ids[start:min(start + chunk, hi)]),
                                     list(seats[start:min(start + chunk, hi)]), params, seed, start)]
        if jax.process_count() == 1:
            return games
        parts = allgather_json([g.to_plain() for g in games])
        return [PlayedGame.from_plain(g) for part in parts for g in part]

    def _play(self, env_ids, seats, params, seed, first):
        runner = BatchRunner([make(e) for e in env_ids], seed=seed, invalid_rewards=self.invalid_rewards,
                             max_turns=self.max_turns, auto_reset=False, first_game=first)
        scripted = {(g, p): make_opponent(seats[g][p], env_ids[g], seed * 7919 + 2 * (first + g) + p)
                    for g in range(len(env_ids)) for p in (0, 1) if seats[g][p] not in params}
        turns: list[list[ModelTurn]] = [[] for _ in env_ids]
        finished: list[GameRecord] = []
        round_ = 0
        while requests := runner.pending():
            responses: dict[int, str] = {}
            groups = defaultdict(list)
            for r in requests:
                policy = seats[r.game][r.player]
                if policy in params:
                    groups[policy].append(r)
                else:
                    responses[r.game] = scripted[r.game, r.player].act(runner.envs[r.game])
            round_ += 1  # a game has one pending move per round, so (round, game) keys every sample
            for policy, group in sorted(groups.items()):
                self._sample(policy, group, params[policy], seed * 100003 + round_, first, responses, turns)
            finished += runner.submit(responses)
        finished.sort(key=lambda rec: rec.game)
        return [PlayedGame(rec, tuple(seats[rec.game]), turns[rec.game]) for rec in finished]

    def _sample(self, policy, group, params, seed, first, responses, turns):
        prompts = [self.tokenizer.prompt_ids(r.observation) for r in group]
        fits = [len(p) <= self.sampler.max_prompt_len for p in prompts]
        for r, p, ok in zip(group, prompts, fits):
            if not ok:  # an observation too long for the sampler is an invalid move, not a crash
                responses[r.game] = ""
                turns[r.game].append(ModelTurn(r.player, policy, p, [], np.zeros(0), "prompt_too_long"))
        live = [(r, p) for r, p, ok in zip(group, prompts, fits) if ok]
        if not live:
            return
        start = time.perf_counter()
        out = self.sampler.generate(params, [p for _, p in live], self.sampling, seed=seed % (1 << 31),
                                    row_ids=[first + r.game for r, _ in live])
        self.sample_seconds += time.perf_counter() - start
        self.generated_tokens += sum(len(t) for t in out.tokens)
        for (r, p), ids, lp, reason in zip(live, out.tokens, out.raw_logprobs, out.finish_reasons):
            # A response cut at the token limit is an invalid move even if a box came before the cut:
            # a turn must end, and a policy that never stops would otherwise go unpunished.
            responses[r.game] = self.tokenizer.decode(ids) if reason == "stop" else ""
            turns[r.game].append(ModelTurn(r.player, policy, p, ids, lp, reason))
