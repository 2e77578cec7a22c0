"""Many games in flight at once: hand out the pending turns, step the games whose answer is ready.

The trainer loop is: `requests = runner.pending()`, sample responses for any subset of them
(batched on the accelerator), `finished = runner.submit({game: response, ...})`, and turn the
finished `GameRecord`s into training samples.  Scripted opponents can answer a request directly
from `runner.envs[game]`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, NamedTuple, Sequence

import numpy as np

from spiral_jax.envs.actions import TRAIN_INVALID_REWARDS, apply_action
from spiral_jax.envs.base import Env


class Request(NamedTuple):
    """A game waiting for a move: its slot, the player to move, what they see and may play, and how
    many moves the game has had before this one."""

    game: int
    player: int
    observation: str
    legal_actions: list[str]
    turn: int = 0


@dataclass
class Turn:
    """One move as played: the prompt the player saw, the raw response and the extracted action."""

    player: int
    observation: str
    response: str
    action: str
    valid: bool


@dataclass
class GameRecord:
    """A finished game.  `game`: its index among all games, its slot plus the runner's `first_game`
    (the slot itself for a runner that plays them all).  `truncated`: ended by the runner's
    `max_turns` (a draw)."""

    game: int
    env_id: str
    seed: int
    turns: list[Turn] = field(default_factory=list)
    rewards: dict[int, float] | None = None
    reason: str = ""
    truncated: bool = False


class BatchRunner:
    """Plays one game per env in `envs`, restarting a slot with a fresh seed when its game ends.

    Args:
        envs: one env per slot (any mix of games).
        seed: base seed; the k-th game started gets a seed derived from (seed, first_game + k).
        mode, invalid_rewards: the trainer-side rules of `apply_action`.
        max_turns: end a game as a draw after this many submitted moves (SPIRAL: 50); None: never.
        auto_reset: start a new game in a slot as soon as its game finishes (else the slot idles).
        first_game: this runner's offset in a larger set of games split over several runners (hosts),
            so that every game's seed and record index depend only on its global index.  Needs
            auto_reset=False: a runner that restarts its slots plays more games than its share, and
            their seeds would be those of the next runner's games.
    """

    def __init__(self, envs: Sequence[Env], *, seed: int = 0, mode: str = "strict",
                 invalid_rewards: Sequence[float] = TRAIN_INVALID_REWARDS,
                 max_turns: int | None = 50, auto_reset: bool = True, first_game: int = 0):
        if first_game and auto_reset:
            raise ValueError(f"first_game={first_game} needs auto_reset=False: restarted games would "
                             "reuse the seeds of the games after this runner's share")
        self.envs = list(envs)
        self.mode, self.invalid_rewards = mode, tuple(invalid_rewards)
        self.max_turns, self.auto_reset = max_turns, auto_reset
        self._seed, self._first_game = seed, first_game
        self._games_started = 0
        self._records: list[GameRecord | None] = [None] * len(self.envs)
        self._requests: list[Request | None] = [None] * len(self.envs)
        for i in range(len(self.envs)):
            self._start(i)

    @property
    def games_started(self) -> int:
        return self._games_started

    def pending(self) -> list[Request]:
        """One request per game in progress, for the player to move."""
        return [self._request(i) for i, record in enumerate(self._records) if record is not None]

    def submit(self, responses: Mapping[int, str]) -> list[GameRecord]:
        """Play the given responses ({game slot: response text}); return the games that finished."""
        finished = []
        for i, response in responses.items():
            record = self._records[i]
            if record is None:
                raise ValueError(f"game slot {i} has no game in progress")
            request, env = self._request(i), self.envs[i]
            # A game without a list of legal moves (TextArena's) judges moves itself.
            mode = self.mode if env.legal_actions() else "env"
            result = apply_action(env, response, mode, self.invalid_rewards)
            record.turns.append(Turn(request.player, request.observation, response,
                                     result.info["action"], result.info["valid"]))
            self._requests[i] = None
            if not result.done and self.max_turns is not None and len(record.turns) >= self.max_turns:
                env.end({0: 0, 1: 0}, f"The limit of {self.max_turns} turns was reached; it is a draw.")
                record.truncated = True
            if env.done:
                record.rewards, record.reason = dict(env.rewards), env.reason
                finished.append(record)
                self._records[i] = None
                if self.auto_reset:
                    self._start(i)
        return finished

    def _request(self, i: int) -> Request:
        if self._requests[i] is None:
            env = self.envs[i]
            player = env.current_player()
            self._requests[i] = Request(i, player, env.observation(player), env.legal_actions(player),
                                        len(self._records[i].turns))
        return self._requests[i]

    def _start(self, i: int) -> None:
        key = (self._first_game + self._games_started,)  # = SeedSequence(seed).spawn()'s k-th child
        seed = int(np.random.SeedSequence(self._seed, spawn_key=key).generate_state(1)[0])
        self.envs[i].reset(seed)
        self._games_started += 1
        self._records[i] = GameRecord(self._first_game + i, self.envs[i].env_id, seed)
        self._requests[i] = None
