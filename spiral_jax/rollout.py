"""Rollout: many games in flight, their LLM moves sampled in batches.

Each game slot has two seats, each played by a policy: a name in `params` ("model" for the current
weights, "pool/3" for a frozen snapshot, ...) is sampled by the LLM; `openai:MODEL@URL` is a model
behind an API (`api_player.py`; its moves in a round are requested concurrently); anything else is a
scripted opponent ("random", or "scripted" for the game's strongest script). Responses go through the
trainer-side action rules (an unusable response, or one cut at the token limit, is an invalid move,
never an exception), and finished games come back with every LLM turn's token ids and log-probs.

Two schedules play the same games with the same tokens:

- "rounds": per loop the runner's pending moves are grouped by policy and each LLM group is one
  `Sampler.generate` call, which runs until its longest response ends;
- "continuous": one `DecodeEngine` per LLM policy keeps its slots busy: when a move's response ends,
  its game steps on the host and the game's next move takes a slot at once, in the slot of the same
  player's last move when that is free, so the prompt's shared head is not prefilled again. With
  fewer slots (`max_in_flight`) than games, waiting games start as slots free up.

Either way a call plays a fixed set of games with one set of parameters per policy and returns when
the last one ends, so a training step stays on-policy and the trainer's selection (whole games, then
exactly N samples) is unchanged; the continuous schedule's only idle slots are in that final drain.
Each policy has its own engine because its weights differ: a slot-to-policy index would have to
stack every policy's weights and gather them per row each step.

A move's randomness is keyed by (seed, the game's global index, its turn), never by the schedule. On
several hosts each plays its share of the games on its own chips and the finished games are
exchanged (spiral_jax/distributed.py).
"""
from __future__ import annotations

import dataclasses
import time
from collections import defaultdict
from typing import Mapping, Sequence

import jax
import numpy as np

from spiral_jax.api_player import ApiPlayer
from spiral_jax.policies import kind
from spiral_jax.distributed import allgather_json, process_slice
from spiral_jax.envs import BatchRunner, GameRecord, RandomOpponent, Turn, make, scripted_opponent
from spiral_jax.sampling import Sampler, SamplingParams, batch_bucket
from spiral_jax.sampling.engine import DecodeEngine
from spiral_jax.sampling.engine import Request as EngineRequest
from spiral_jax.sampling.stats import DecodeStats


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
    raise ValueError(f"unknown opponent {name!r}; use 'random', 'scripted', openai:MODEL@URL or a model "
                     "policy name")


class Rollout:
    """Plays batches of games between LLM policies and scripted opponents."""

    def __init__(self, sampler: Sampler, tokenizer, sampling: SamplingParams, *,
                 invalid_rewards: Sequence[float] = (-1.5, 0.5), max_turns: int | None = 50,
                 max_in_flight: int | None = None, schedule: str = "rounds", api: Mapping | None = None):
        """max_in_flight: play at most this many games at once per host (bounds the sampler's batch and
        KV cache, e.g. for a 512-game evaluation); None: all of them. With the continuous schedule it
        is the number of decode slots per policy. schedule: "rounds" or "continuous" (module docstring).
        api: settings of API players (the config's `api` section: key_env, timeout_s, retries,
        concurrency); they sample with `sampling`'s temperature, top-p and token limit."""
        if schedule not in ("rounds", "continuous"):
            raise ValueError(f"unknown rollout schedule {schedule!r}; use 'rounds' or 'continuous'")
        self.sampler, self.tokenizer = sampler, tokenizer
        self.max_in_flight, self.schedule = max_in_flight, schedule
        self.sampling = dataclasses.replace(sampling, stop_token_ids=tokenizer.stop_ids)
        self.invalid_rewards, self.max_turns = tuple(invalid_rewards), max_turns
        self.engines: dict[str, DecodeEngine] = {}  # continuous schedule: one per LLM policy, kept warm
        self.api, self.api_players = dict(api or {}), {}
        # Running totals of every call, for throughput logs (a caller takes `after - before`). Seconds:
        # the sampler calls ("rounds"), the whole decode loop with its game steps ("continuous").
        self.stats = DecodeStats()

    def play(self, env_ids: Sequence[str], seats: Sequence[tuple[str, str]], params: Mapping[str, object],
             seed: int) -> list[PlayedGame]:
        """Play one game per (env id, seats) pair to the end; results in slot order.

        With several hosts each plays its own slice of the games (seeded by their global index, so
        the results do not depend on the number of hosts) and all of them get every game back.
        """
        lo, hi = process_slice(len(env_ids))
        if self.schedule == "continuous":
            games = self._play_continuous(list(env_ids[lo:hi]), list(seats[lo:hi]), params, seed, lo)
        else:
            chunk = self.max_in_flight or max(hi - lo, 1)
            games = [g for start in range(lo, hi, chunk)
                     for g in self._play(list(env_ids[start:min(start + chunk, hi)]),
                                         list(seats[start:min(start + chunk, hi)]), params, seed, start)]
        if jax.process_count() == 1:
            return games
        parts = allgather_json([g.to_plain() for g in games])
        return [PlayedGame.from_plain(g) for part in parts for g in part]

    def _start(self, env_ids, seats, params, seed, first):
        """The runner of these games and their scripted players."""
        runner = BatchRunner([make(e) for e in env_ids], seed=seed, invalid_rewards=self.invalid_rewards,
                             max_turns=self.max_turns, auto_reset=False, first_game=first)
        scripted = {(g, p): make_opponent(seats[g][p], env_ids[g], seed * 7919 + 2 * (first + g) + p)
                    for g in range(len(env_ids)) for p in (0, 1)
                    if seats[g][p] not in params and kind(seats[g][p]) != "api"}
        return runner, scripted

    def api_player(self, spec: str) -> ApiPlayer:
        """The client of an `openai:MODEL@URL` seat, made once and kept (its failure count with it)."""
        if spec not in self.api_players:
            self.api_players[spec] = ApiPlayer.playing(spec, self.sampling, self.api)
        return self.api_players[spec]

    def _api_moves(self, moves: Mapping[str, list], responses: dict[int, str]) -> None:
        """Answer each API player's waiting moves ({spec: [request]}), concurrently per player."""
        for spec, group in moves.items():
            prompts = [self.tokenizer.template.user_text(r.observation) for r in group]
            for r, text in zip(group, self.api_player(spec).replies(prompts)):
                responses[r.game] = text

    @staticmethod
    def _turn_seed(seed: int, r) -> int:
        """The seed of a game's move; with the game's global index as row id it keys every sample."""
        return (seed * 100003 + r.turn + 1) % (1 << 31)

    def _prompt(self, policy, r, responses, turns) -> list[int] | None:
        """The move's prompt ids, or None after recording an invalid move for a prompt that does not fit."""
        prompt = self.tokenizer.prompt_ids(r.observation)
        if len(prompt) <= self.sampler.max_prompt_len:
            return prompt
        responses[r.game] = ""  # an observation too long for the sampler is an invalid move, not a crash
        turns[r.game].append(ModelTurn(r.player, policy, prompt, [], np.zeros(0), "prompt_too_long"))
        return None

    def _respond(self, policy, r, prompt, ids, logprobs, reason, responses, turns):
        # A response cut at the token limit is an invalid move even if a box came before the cut:
        # a turn must end, and a policy that never stops would otherwise go unpunished.
        responses[r.game] = self.tokenizer.decode(ids) if reason == "stop" else ""
        turns[r.game].append(ModelTurn(r.player, policy, prompt, ids, logprobs, reason))

    @staticmethod
    def _games(finished, seats, turns, first) -> list[PlayedGame]:
        """The played games in order; a record's `game` is its global index, `first` that of slot 0."""
        finished.sort(key=lambda rec: rec.game)
        return [PlayedGame(rec, tuple(seats[rec.game - first]), turns[rec.game - first]) for rec in finished]

    def _play(self, env_ids, seats, params, seed, first):
        """The "rounds" schedule."""
        runner, scripted = self._start(env_ids, seats, params, seed, first)
        turns: list[list[ModelTurn]] = [[] for _ in env_ids]
        finished: list[GameRecord] = []
        while requests := runner.pending():
            responses: dict[int, str] = {}
            groups, api = defaultdict(list), defaultdict(list)
            for r in requests:
                policy = seats[r.game][r.player]
                if policy in params:
                    groups[policy].append(r)
                elif kind(policy) == "api":
                    api[policy].append(r)
                else:
                    responses[r.game] = scripted[r.game, r.player].act(runner.envs[r.game])
            self._api_moves(api, responses)
            for policy, group in sorted(groups.items()):
                self._sample(policy, group, params[policy], seed, first, responses, turns)
            finished += runner.submit(responses)
        return self._games(finished, seats, turns, first)

    def _sample(self, policy, group, params, seed, first, responses, turns):
        live = [(r, p) for r in group if (p := self._prompt(policy, r, responses, turns)) is not None]
        if not live:
            return
        # Games started together move in step, so a round's moves share one turn index and one seed.
        out = self.sampler.generate(params, [p for _, p in live], self.sampling,
                                    seed=self._turn_seed(seed, live[0][0]),
                                    row_ids=[first + r.game for r, _ in live])
        self.stats += out.stats
        for (r, p), ids, lp, reason in zip(live, out.tokens, out.raw_logprobs, out.finish_reasons):
            self._respond(policy, r, p, ids, lp, reason, responses, turns)

    def _engine(self, policy: str, games: int) -> DecodeEngine:
        slots = batch_bucket(self.max_in_flight or games, self.sampler.min_batch_bucket)
        engine = self.engines.get(policy)
        if engine is None or engine.slots != slots:
            engine = self.engines[policy] = DecodeEngine(self.sampler, self.sampling, slots)
        return engine

    def _play_continuous(self, env_ids, seats, params, seed, first):
        """The "continuous" schedule."""
        runner, scripted = self._start(env_ids, seats, params, seed, first)
        turns: list[list[ModelTurn]] = [[] for _ in env_ids]
        finished: list[GameRecord] = []
        engines = {policy: self._engine(policy, len(env_ids)) for policy in sorted(params)}
        # Cast once for the whole call: an engine's decode calls are often a few steps each.
        params = {policy: engine.setup.decode_weights(params[policy]) for policy, engine in engines.items()}
        home: dict[tuple[int, int, str], int] = {}  # (game, player, policy) -> the slot of its last move
        waiting: dict[str, list] = {policy: [] for policy in engines}  # LLM moves not yet in a slot
        busy: set[int] = set()  # games with a move waiting or in a slot
        before = {policy: engine.stats for policy, engine in engines.items()}
        start = time.perf_counter()
        responses: dict[int, str] = {}
        while True:
            # Step the games whose move is known, play scripted moves at once, queue the LLM moves.
            while True:
                for record in runner.submit(responses):
                    finished.append(record)
                    for key in [k for k in home if k[0] == record.game - first]:
                        del home[key]  # a finished game's slots are anyone's
                responses, api = {}, defaultdict(list)
                for r in runner.pending():
                    if r.game in busy:
                        continue
                    policy = seats[r.game][r.player]
                    if kind(policy) == "api":
                        api[policy].append(r)
                    elif policy not in params:
                        responses[r.game] = scripted[r.game, r.player].act(runner.envs[r.game])
                    elif (prompt := self._prompt(policy, r, responses, turns)) is not None:
                        waiting[policy].append((r, prompt))
                        busy.add(r.game)
                self._api_moves(api, responses)
                if not responses:
                    break
            if not any(waiting.values()) and not any(e.live for e in engines.values()):
                break
            for policy, engine in engines.items():
                self._admit(policy, engine, waiting[policy], home, params[policy], seed, first)
                for f in engine.decode(params[policy]):
                    r, prompt = f.request.tag
                    home[r.game, r.player, policy] = f.slot
                    busy.discard(r.game)
                    self._respond(policy, r, prompt, f.tokens, f.raw_logprobs, f.finish_reason, responses, turns)
        seconds = time.perf_counter() - start
        for engine in engines.values():
            engine.forget()  # its KV cache, until the next call (with new parameters)
        used = sum((engine.stats - before[policy] for policy, engine in engines.items()), DecodeStats())
        self.stats += dataclasses.replace(used, seconds=seconds)  # the engines' own seconds leave out the games
        return self._games(finished, seats, turns, first)

    def _admit(self, policy, engine: DecodeEngine, waiting: list, home, params, seed, first) -> None:
        """Move waiting LLM moves into free slots, oldest first. A player goes back to the slot of its
        last move when that slot is free: the slot's cache holds the head its prompts share. Other
        moves take first the free slots that no player calls home."""
        free = engine.free_slots()
        claimed = {slot for (_, _, owner), slot in home.items() if owner == policy}
        free = [s for s in free if s not in claimed] + [s for s in free if s in claimed]
        requests, rest = [], []
        for r, prompt in waiting:
            own = home.get((r.game, r.player, policy))
            if own in free:
                free.remove(own)
                requests.append(EngineRequest(prompt, self._turn_seed(seed, r), first + r.game, own, (r, prompt)))
            else:
                rest.append((r, prompt))
        for (r, prompt), slot in zip(rest, free):
            requests.append(EngineRequest(prompt, self._turn_seed(seed, r), first + r.game, slot, (r, prompt)))
        waiting[:] = rest[len(free):]
        engine.insert(params, requests)
