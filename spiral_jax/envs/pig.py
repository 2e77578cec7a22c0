"""PigDice-v1: roll to build a turn total, hold to bank it; first to 50 wins (evaluation game)."""
from __future__ import annotations

import re

from spiral_jax.envs.base import Env

_MOVE = re.compile(r"\[(roll|hold|r|h)\]", re.IGNORECASE)
_MOVES = ["[roll]", "[hold]"]


class PigDice(Env):
    """Pig.  `[roll]`/`[r]`: a 2-6 adds to the turn total, a 1 loses it and ends the turn.
    `[hold]`/`[h]`: bank the turn total and end the turn.  Reaching `winning_score` wins.

    `max_turns` counts player turns (not rolls), as in the reference: when it is reached, the
    higher score wins (equal scores: draw).  Every roll or hold counts as an env `turn`; the error
    count is cleared only when the turn passes to the other player.

    In the "first_last" observation style a prompt shows only the rules and the latest message, so
    there the move request also states the scores and the points at stake: a short prompt that
    still holds everything the decision depends on.

    Chance kind "roll": the die value (1-6) of each roll.
    """

    turn_limit_is_draw = False

    def __init__(self, *, winning_score: int = 50, max_turns: int = 50, **kwargs):
        if winning_score < 1:
            raise ValueError("winning_score must be >= 1")
        super().__init__(max_turns=max_turns, **kwargs)
        self.winning_score = winning_score

    def _setup(self) -> None:
        self._scores = [0, 0]
        self._total = 0
        self._turns = 0  # completed player turns
        for p in (0, 1):
            self._tell("rules", (p, self.winning_score), self._rules(p), to=p)
        self._announce_turn(0)

    def _legal(self) -> list[str]:
        return list(_MOVES)

    def _play(self, player: int, action: str) -> None:
        self._echo(player, action)
        match = _MOVE.search(action.strip())
        if match is None:
            self._invalid(player, "format", "Answer [roll] or [hold] (or [r] / [h]).")
            return
        if match.group(1).lower() in ("roll", "r"):
            value = self._chance("roll", lambda rng: int(rng.integers(1, 7)))
            self._tell("roll", (player, value), f"Player {player} rolled a {value}.")
            if value == 1:
                self._tell("bust", (player,), f"Player {player} rolled a 1 and loses this turn's points.")
                self._end_turn(player)
            else:
                self._total += value
                self._tell("turn_total", (self._total,), f"Points at stake this turn: {self._total}.")
                self._ask(player)
        else:
            self._scores[player] += self._total
            self._tell("hold", (player, self._total, self._scores[player]),
                       f"Player {player} banked {self._total}, for a score of {self._scores[player]}.")
            self._end_turn(player)
        if not self.done:
            self.turn += 1

    def _end_turn(self, player: int) -> None:
        scores = self._scores
        if self.max_turns is not None and self._turns + 1 >= self.max_turns:
            self._by_score(f"The limit of {self.max_turns} turns was reached with scores {scores[0]}-{scores[1]}.")
            return
        if max(scores) >= self.winning_score:
            self._by_score(f"Score {max(scores)} reached the target of {self.winning_score}.")
            return
        self._turns += 1
        self._total = 0
        self._advance(1 - player, turn=False)
        self._announce_turn(1 - player)

    def _by_score(self, why: str) -> None:
        a, b = self._scores
        if a == b:
            self._draw(why)
        else:
            self._win(0 if a > b else 1, why)

    def _announce_turn(self, player: int) -> None:
        a, b = self._scores
        self._tell("turn", (player, a, b), f"Player {player} to play. Scores: Player 0 {a}, Player 1 {b}.")
        self._ask(player)

    def _ask(self, player: int) -> None:
        text = "Your move: [roll] or [hold]."
        if self.observation_style == "first_last":
            mine, theirs = self._scores[player], self._scores[1 - player]
            text = (f"Your score: {mine}. Your opponent's score: {theirs}. Points at stake this turn: "
                    f"{self._total}.\n{text}")
        self._tell("actions", tuple(_MOVES), text, to=player)

    def _rules(self, player: int) -> str:
        return (
            f"Pig dice. You are Player {player}; Player 0 starts.\n"
            "On your turn, [roll] the die as often as you like: a 2-6 is added to your points at "
            "stake this turn, but a 1 wipes them out and ends your turn. [hold] banks the points "
            "at stake into your score and ends your turn.\n"
            f"The first to a score of {self.winning_score} wins."
        )

    def _state(self) -> dict:
        return {"scores": list(self._scores), "turn_total": self._total, "turn_count": self._turns}
