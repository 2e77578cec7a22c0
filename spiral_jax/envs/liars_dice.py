"""LiarsDice-v1: bid on the dice under all cups, or call the last bid (evaluation game)."""
from __future__ import annotations

import re

from spiral_jax.envs.base import Env, to_int

_CALL = re.compile(r"\[call\]", re.IGNORECASE)
# The reference's `\[bid\s*:?\s*(\d+)...` with the second `\s*` bound to the colon: it matches the same
# strings, and a long run of whitespace after "[bid" is not split between two `\s*` in every possible
# way, which takes time quadratic in the run's length.
_BID = re.compile(r"\[bid\s*(?::\s*)?(\d+)[,\s]+(\d+)\]", re.IGNORECASE)


class LiarsDice(Env):
    """Two-player Liar's Dice, each starting with `num_dice` dice (no wild ones).

    `[Bid: q, f]` claims at least q dice show face f; it must raise the current bid (more dice, or
    the same number of a higher face) and q may not exceed the dice in play.  `[Call]` (checked
    first) reveals how many dice show the bid face: fewer than bid and the bidder loses a die,
    otherwise the caller does.  The loser of a die starts the next round with fresh dice; a player
    without dice loses the game.

    Chance kind "dice": one roll for a round, a tuple with the dice of each player still in play.
    """

    def __init__(self, *, num_dice: int = 5, **kwargs):
        if num_dice < 1:
            raise ValueError("num_dice must be >= 1")
        super().__init__(**kwargs)
        self.num_dice = num_dice

    def _setup(self) -> None:
        self._left = [self.num_dice, self.num_dice]
        self._dice = [list(d) for d in self._chance("dice", self._roll)]
        self._bid = (0, 0)
        self._bidder: int | None = None
        for p in (0, 1):
            self._tell("rules", (p, tuple(self._dice[p]), self._left[1 - p]), self._rules(p), to=p)

    def _roll(self, rng) -> tuple[tuple[int, ...], ...]:
        return tuple(tuple(int(v) for v in rng.integers(1, 7, size=n)) for n in self._left if n > 0)

    def _legal(self) -> list[str]:
        quantity, face = self._bid
        bids = [f"[Bid: {q}, {f}]" for q in range(max(quantity, 1), sum(self._left) + 1)
                for f in range(1, 7) if q > quantity or f > face]
        return bids + ["[Call]"] if self._bidder is not None else bids

    def _play(self, player: int, action: str) -> None:
        self._echo(player, action)
        if _CALL.search(action):
            self._call(player)
            return
        match = _BID.search(action)
        if match is None:
            self._invalid(player, "format", "Bid like [Bid: 3, 4] (three dice showing 4) or [Call].")
            return
        quantity, face = to_int(match.group(1)), to_int(match.group(2))
        problem = self._bid_problem(quantity, face)
        if problem:
            self._invalid(player, *problem)
            return
        self._bid, self._bidder = (quantity, face), player
        self._tell("bid", (player, quantity, face), f"Player {player} bids {quantity} x {face}.")
        self._advance(1 - player)
        self._tell("turn", (quantity, face),
                   f"Your turn, Player {1 - player}. The bid is {quantity} x {face}: raise it or [Call].",
                   to=1 - player)

    def _bid_problem(self, quantity: int, face: int) -> tuple[str, str] | None:
        old_quantity, old_face = self._bid
        if quantity <= 0:
            return "bad_quantity", "A bid needs at least one die."
        if not 1 <= face <= 6:
            return "bad_face", "Faces go from 1 to 6."
        if quantity < old_quantity:
            return "lower_quantity", f"You cannot bid fewer than {old_quantity} dice."
        if quantity == old_quantity and face < old_face:
            return "lower_face", f"With {quantity} dice the face must be above {old_face}."
        if (quantity, face) == self._bid:
            return "same_bid", "That is the current bid; raise it."
        if quantity > sum(self._left):
            return "too_many", f"Only {sum(self._left)} dice are in play."
        return None

    def _call(self, player: int) -> None:
        if self._bidder is None:
            self._invalid(player, "no_bid", "There is no bid to call yet.")
            return
        quantity, face = self._bid
        count = sum(d.count(face) for d, n in zip(self._dice, self._left) if n > 0)
        loser = self._bidder if count < quantity else player
        self._tell("call", (player, face, count, quantity, loser),
                   f"Player {player} calls. There are {count} dice showing {face} against a bid of "
                   f"{quantity}, so Player {loser} loses a die.")
        self._left[loser] -= 1
        if self._left[loser] == 0:
            self._tell("eliminated", (loser,), f"Player {loser} has no dice left.")
            self._win(1 - loser, f"Player {1 - loser} is the last with dice.")
            return
        self._bid, self._bidder = (0, 0), None
        rolled = iter(self._chance("dice", self._roll))
        self._dice = [list(next(rolled)) if n > 0 else [] for n in self._left]
        for p in (0, 1):
            self._tell("dice", (tuple(self._dice[p]), tuple(self._left)),
                       f"New round. Your dice: {', '.join(map(str, self._dice[p]))}. Dice in play: "
                       f"Player 0 has {self._left[0]}, Player 1 has {self._left[1]}.", to=p)
        self._advance(loser, turn=False)
        self._tell("round_start", (loser,), f"Player {loser} opens the new round.")

    def _rules(self, player: int) -> str:
        dice = ", ".join(map(str, self._dice[player]))
        return (
            f"Liar's Dice. You are Player {player}. Your hidden dice: {dice}. "
            f"Player {1 - player} has {self._left[1 - player]} hidden dice.\n"
            "On your turn either bid, e.g. [Bid: 3, 4] claims that at least three dice in play "
            "(yours and your opponent's) show a 4, or [Call] the last bid. A bid must be higher "
            "than the last one: more dice, or as many dice with a higher face.\n"
            "After a call the dice showing the bid face are counted: if there are fewer than bid, "
            "the bidder loses a die; otherwise the caller loses one. Everyone then rolls again.\n"
            "A player with no dice left loses. There is no bid yet."
        )

    def _state(self) -> dict:
        return {"dice": [list(d) for d in self._dice], "remaining": list(self._left),
                "bid": list(self._bid), "last_bidder": self._bidder}
