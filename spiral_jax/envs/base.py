"""The protocol every game implements: turn order, invalid moves, messages and observations.

A game subclasses `Env` and writes `_setup` (deal, first messages), `_legal` (canonical action
strings) and `_play` (one submitted action).  The base class owns what all games share with the
reference: the retry allowance for invalid moves, the turn counter, game results, and the per-player
message logs from which observations are rendered.

Every message is a `Message`: who sent it, a fact (`kind` + `data`, plain comparable values) and our
wording of it (`text`).  Tests compare the facts with the reference traces; models read the text.
"""
from __future__ import annotations

import unicodedata
from collections import deque
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import numpy as np

GAME = -1  # sender id of messages from the game itself
OBSERVATION_STYLES = ("full_history", "first_last")
_FIRST_LAST_PROMPT = "It is your turn. Reply with your next action."


class Message(NamedTuple):
    """One thing a player is told: sender (GAME or a player id), the fact, and our wording of it."""

    sender: int
    kind: str
    data: tuple
    text: str


class StepResult(NamedTuple):
    """Outcome of one step: `rewards` is a {player: reward} dict once `done`, else None.

    `info["valid"]` says whether the game accepted the action; `info["reason"]` explains the end.
    """

    done: bool
    rewards: dict[int, float] | None
    info: dict[str, Any]


def to_int(digits: str) -> int:
    """Parse a run of digits as int() does, leading zeros included; a run of more than 18 significant
    digits becomes 10**18 (beyond any move) instead of a slow or refused conversion.

    `\\d` and int() take the decimal digits of every script ("٠", "０"), so those are turned into
    ASCII first: a leading zero in another script is a zero too.
    """
    if not digits.isascii():
        digits = "".join(str(unicodedata.decimal(c)) for c in digits)
    digits = digits.lstrip("0") or "0"
    return int(digits) if len(digits) <= 18 else 10**18


class Env:
    """A two-player, turn-based text game (players 0 and 1).

    Args:
        error_allowance: invalid moves a player may retry before losing (reference default 1;
            once used up, the offender gets -1 and the other player 0).
        max_turns: end the game as a draw after this many counted turns (None: no limit).  Games
            whose reference gives the limit its own outcome document that in their class.
        observation_style: "full_history" (every message in order) or "first_last" (rules, the
            latest message, then a prompt); the default is per game.
    """

    env_id = ""  # the registry id; `make` sets it on the instance
    default_observation_style = "full_history"
    turn_limit_is_draw = True  # False where `_play` applies `max_turns` itself

    def __init__(self, *, error_allowance: int = 1, max_turns: int | None = None,
                 observation_style: str | None = None):
        if not isinstance(error_allowance, int) or error_allowance < 0:
            raise ValueError(f"error_allowance must be an int >= 0, got {error_allowance!r}")
        style = observation_style or self.default_observation_style
        if style not in OBSERVATION_STYLES:
            raise ValueError(f"observation_style must be one of {OBSERVATION_STYLES}, got {style!r}")
        self.error_allowance = error_allowance
        if max_turns is not None and (not isinstance(max_turns, int) or max_turns < 1):
            raise ValueError(f"max_turns must be None or an int >= 1, got {max_turns!r}")
        self.max_turns = max_turns
        self.observation_style = style
        self.done = True  # nothing to play before reset()
        self.rewards: dict[int, float] | None = None

    # ---- public protocol -------------------------------------------------------------------

    def reset(self, seed: int | None = None, *, chance: Mapping[str, Sequence] | None = None) -> None:
        """Start a new game.

        Randomness comes only from a generator seeded here.  `chance` forces the next chance
        outcomes of each kind, in order (the kinds are documented by each game), e.g. to replay a
        recorded game; outcomes not given are drawn from the generator.
        """
        self.seed = seed
        self._rng = np.random.default_rng(seed)
        self._forced = {kind: deque(values) for kind, values in (chance or {}).items()}
        self._log: tuple[list[Message], list[Message]] = ([], [])
        self._player = 0
        self.turn = 0
        self.error_count = 0
        self.done = False
        self.rewards = None
        self.reason = ""
        self._setup()

    def current_player(self) -> int:
        return self._player

    def legal_actions(self, player: int | None = None) -> list[str]:
        """Canonical action strings the player to move may submit now ([] for anyone else)."""
        if self.done or (player is not None and player != self._player):
            return []
        return self._legal()

    def step(self, action: str) -> StepResult:
        """Submit the current player's action text (decorated forms are accepted as in the reference)."""
        if self.done:
            raise RuntimeError(f"{self._name()}: no game in play (over, or never started); call reset(seed)")
        self._valid = True
        self._play(self._player, str(action))
        if (self.turn_limit_is_draw and not self.done and self.max_turns is not None
                and self.turn >= self.max_turns):
            self._draw(f"The turn limit of {self.max_turns} was reached.")
        info: dict[str, Any] = {"valid": self._valid}
        if self.done:
            info["reason"] = self.reason
        return StepResult(self.done, self.rewards if self.done else None, info)

    def end(self, rewards: Mapping[int, float], reason: str) -> StepResult:
        """End the game from outside the rules (trainer-side invalid move, truncation) and tell both."""
        if self.done:
            raise RuntimeError("the game is already over")
        self._tell("ended", (dict(rewards),), f"The game is over: {reason}")
        self._finish(dict(rewards), reason)
        return StepResult(True, self.rewards, {"valid": False, "reason": reason})

    def observation(self, player: int | None = None) -> str:
        """What `player` (default: the one to move) has been told, rendered in the chosen style."""
        log = self._messages_of(player)
        if self.observation_style == "full_history":
            return "\n".join(_line(m) for m in log)
        parts = [log[0].text]
        if len(log) > 1:
            parts.append(_line(log[-1]))
        parts.append(_FIRST_LAST_PROMPT)
        return "\n\n".join(parts)

    def messages(self, player: int) -> list[Message]:
        """Every message `player` has received, in order (a copy)."""
        return list(self._messages_of(player))

    def state(self) -> dict[str, Any]:
        """A plain snapshot of the game (for tests, logging and scripted opponents)."""
        self._messages_of(None)  # a game to describe
        return {"current_player": self._player, "turn": self.turn, "error_count": self.error_count,
                "done": self.done, "rewards": self.rewards, **self._state()}

    def role_name(self, player: int) -> str:
        """Name of a seat, e.g. for per-role statistics."""
        return f"Player {player}"

    def _name(self) -> str:
        return self.env_id or type(self).__name__

    def _messages_of(self, player) -> list[Message]:
        """`player`'s message log (None: the one to move's); a clear error before reset() or for a seat
        that is not 0 or 1."""
        if not hasattr(self, "_log"):
            raise RuntimeError(f"{self._name()}: no game yet; call reset(seed) first")
        player = self._player if player is None else player
        if player not in (0, 1) or isinstance(player, bool):
            raise ValueError(f"{self._name()}: player must be 0 or 1, got {player!r}")
        return self._log[player]

    # ---- for subclasses --------------------------------------------------------------------

    def _setup(self) -> None:
        raise NotImplementedError

    def _legal(self) -> list[str]:
        raise NotImplementedError

    def _play(self, player: int, action: str) -> None:
        raise NotImplementedError

    def _state(self) -> dict[str, Any]:
        raise NotImplementedError

    def _chance(self, kind: str, draw: Callable[[np.random.Generator], Any]) -> Any:
        """The next chance outcome of `kind`: the next forced one if any, else `draw(rng)`."""
        forced = self._forced.get(kind)
        return forced.popleft() if forced else draw(self._rng)

    def _tell(self, kind: str, data: tuple, text: str, to: int | None = None, sender: int = GAME) -> None:
        msg = Message(sender, kind, data, text)
        if to is None:
            self._log[0].append(msg)
            self._log[1].append(msg)
        else:
            self._log[to].append(msg)

    def _echo(self, player: int, action: str) -> None:
        """Show both players the action text as submitted."""
        self._tell("action", (action,), action, sender=player)

    def _advance(self, player: int, *, turn: bool = True, reset_errors: bool = True) -> None:
        """Hand the move to `player`, counting a turn and clearing the error count (as the reference does)."""
        if turn:
            self.turn += 1
        if reset_errors:
            self.error_count = 0
        self._player = player

    def _invalid(self, player: int, code: str, why: str) -> None:
        """An invalid move: a retry while the allowance lasts, else the offender loses (-1, other 0)."""
        self._valid = False
        if self.error_count < self.error_allowance:
            self.error_count += 1
            self._tell("invalid", (player, code), f"Player {player} made an invalid move: {why} Please try again.")
        else:
            self._tell("forfeit", (player, code), f"Player {player} made an invalid move and loses the game: {why}")
            self._finish({player: -1, 1 - player: 0}, f"Player {player} made an invalid move: {why}")

    def _win(self, winner: int, why: str) -> None:
        self._tell("win", (winner,), f"Game over: Player {winner} wins. {why}")
        self._finish({winner: 1, 1 - winner: -1}, why)

    def _draw(self, why: str) -> None:
        self._tell("draw", (), f"Game over: it is a draw. {why}")
        self._finish({0: 0, 1: 0}, why)

    def _finish(self, rewards: dict[int, float], reason: str) -> None:
        """End the game. A reward that is no finite number (a wrapped game's NaN) is refused: it
        would count as a draw and make RAE's baseline NaN for every later game."""
        if not all(np.isfinite(rewards[p]) for p in (0, 1)):
            raise ValueError(f"{type(self).__name__} ended with rewards {dict(rewards)}: each must be a finite number")
        self.done = True
        self.rewards = {0: rewards[0], 1: rewards[1]}
        self.reason = reason


def _line(msg: Message) -> str:
    return msg.text if msg.sender == GAME else f"[Player {msg.sender}] {msg.text}"
