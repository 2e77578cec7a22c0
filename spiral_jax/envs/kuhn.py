"""Kuhn poker: KuhnPoker-v1 (SPIRAL's 5-round variant, with its quirks) and KuhnPoker-v2 (standard).

Deck J < Q < K.  Each round both players ante, each gets one private card, and the opener (who
alternates between rounds) acts first: check -> (check: showdown | bet -> (fold | call: showdown));
bet -> (fold | call: showdown).  The action is the first `[check|bet|call|fold]` in the text, in any
case, and must be legal at the current node.

The reference game (SPIRAL's KuhnPoker-v1) has two quirks the paper's numbers came from; they are
flags whose defaults reproduce it:

* `fixed_pot=True`: bets and calls add no chips, so every round is worth exactly +-1 ante.
* `outcome="last_round"`: the winner of the final round wins the game (+1/-1) whatever the chip
  totals.  `outcome="chips"` makes the chip leader win (equal chips: draw).

`outcome="chip_reward"` pays each player its net chips instead of +-1: with one round
(KuhnPokerChips-v0) a turn's reward is exactly the quantity exploitability is measured in, and a
hand won after a bet and a call is worth twice one won on the antes.

Also as in the reference: the round-ending action does not count as a turn and does not clear the
error count; the next round is dealt at once (the reference deals it lazily, but tells the players
the same things in the same order).
"""
from __future__ import annotations

import re

from spiral_jax.envs.base import Env

CARDS = "JQK"
_MOVE = re.compile(r"\[(check|bet|call|fold)\]", re.IGNORECASE)
# Moves allowed after a betting history (c = check, b = bet), in the reference's order.
_NODE_MOVES = {"": ("check", "bet"), "c": ("check", "bet"), "b": ("fold", "call"), "cb": ("fold", "call")}
_OUTCOMES = ("last_round", "chips", "chip_reward")


class KuhnPoker(Env):
    """Multi-round Kuhn poker.

    Args:
        rounds: rounds per game.
        ante: chips each player puts in at the start of a round (bets and calls are 1 chip).
        fixed_pot: reference quirk, see the module docstring.
        outcome: "last_round" (reference quirk), "chips" (the chip leader wins) or "chip_reward"
            (each player's reward is its net chips).
        first_opener: who opens round 1 (the reference: player 1).

    Chance kind "deal": (card of player 0, card of player 1), cards 0=J, 1=Q, 2=K; one per round.
    """

    def __init__(self, *, rounds: int = 5, ante: int = 1, fixed_pot: bool = True,
                 outcome: str = "last_round", first_opener: int = 1, **kwargs):
        if rounds < 1 or ante < 1 or first_opener not in (0, 1) or outcome not in _OUTCOMES:
            raise ValueError(f"bad KuhnPoker settings: rounds={rounds}, ante={ante}, "
                             f"first_opener={first_opener}, outcome={outcome!r} (one of {_OUTCOMES})")
        super().__init__(**kwargs)
        self.rounds, self.ante, self.fixed_pot = rounds, ante, fixed_pot
        self.outcome, self.first_opener = outcome, first_opener

    def info_set(self, player: int) -> str:
        """The player's current information set: card then betting history, e.g. "Qcb"."""
        return CARDS[self._cards[player]] + self._history

    def _setup(self) -> None:
        self._deck = [0, 1, 2]
        self._chips = [0, 0]
        self._round = 0
        self._opener = 1 - self.first_opener
        for p in (0, 1):
            self._tell("rules", (p,), self._rules(p), to=p)
        self._start_round()

    def _start_round(self) -> None:
        self._cards = self._chance("deal", self._shuffle_deal)
        self._pot = 2 * self.ante
        self._chips[0] -= self.ante
        self._chips[1] -= self.ante
        self._round += 1
        self._history = ""
        self._opener = 1 - self._opener
        self._advance(self._opener, turn=False, reset_errors=False)
        for p in (0, 1):
            self._tell("round", (self._round, self.rounds, self._cards[p]),
                       f"Round {self._round} of {self.rounds}. Your card is {CARDS[self._cards[p]]}.", to=p)
        self._offer_moves(self._opener)

    def _shuffle_deal(self, rng) -> tuple[int, int]:
        rng.shuffle(self._deck)  # in place: the card order carries over, as in the reference
        return self._deck[0], self._deck[1]

    def _offer_moves(self, player: int) -> None:
        moves = self._legal()
        self._tell("actions", tuple(moves), f"Your options: {', '.join(moves)}.", to=player)

    def _legal(self) -> list[str]:
        return [f"[{m}]" for m in _NODE_MOVES[self._history]]

    def _play(self, player: int, action: str) -> None:
        self._echo(player, action)
        match = _MOVE.search(action.strip())
        if match is None:
            self._invalid(player, "format", "Answer with one of [check], [bet], [call] or [fold].")
            return
        move = match.group(1).lower()
        allowed = _NODE_MOVES[self._history]
        if move not in allowed:
            self._invalid(player, "illegal", f"Right now you may only {' or '.join(f'[{m}]' for m in allowed)}.")
            return
        if not self.fixed_pot and move in ("bet", "call"):
            self._chips[player] -= 1
            self._pot += 1
        if move == "fold":
            self._tell("fold", (player,), f"Player {player} folds.")
            self._end_round(1 - player)
        elif move == "call" or self._history == "c" and move == "check":
            c0, c1 = self._cards
            self._tell("showdown", (c0, c1), f"Showdown: Player 0 holds {CARDS[c0]}, Player 1 holds {CARDS[c1]}.")
            winner = 0 if c0 > c1 else 1
            self._tell("round_won", (winner, self._pot), f"Player {winner} wins the pot of {self._pot} chips.")
            self._end_round(winner)
        else:
            self._history += move[0]
            self._offer_moves(1 - player)
            self._advance(1 - player)

    def _end_round(self, winner: int) -> None:
        self._chips[winner] += self._pot
        if self._round < self.rounds:
            self._start_round()
        elif self.outcome == "last_round":
            self._win(winner, f"Player {winner} won the final round.")
        elif self.outcome == "chip_reward":
            self._tell("chips", tuple(self._chips), f"Game over: Player 0 has {self._chips[0]:+d} chips, "
                       f"Player 1 has {self._chips[1]:+d}.")
            self._finish({0: self._chips[0], 1: self._chips[1]}, f"Net chips {self._chips[0]:+d} / {self._chips[1]:+d}.")
        elif self._chips[0] == self._chips[1]:
            self._draw(f"Both players have {self._chips[0]} chips after {self.rounds} rounds.")
        else:
            leader = 0 if self._chips[0] > self._chips[1] else 1
            self._win(leader, f"Player {leader} has more chips after {self.rounds} rounds.")

    def _rules(self, player: int) -> str:
        # Like the reference, the text states the chip rule even under its `last_round` quirk.
        tie = " Equal chips make a draw." if self.outcome == "chips" else ""
        goal = ("Your reward is the number of chips you win or lose." if self.outcome == "chip_reward"
                else f"The player with more chips after the last round wins.{tie}")
        return (
            f"Kuhn poker, {self.rounds} round(s). You are Player {player}.\n"
            "The deck has three cards: J < Q < K. Every round each player puts in an ante of "
            f"{self.ante} chip(s) and gets one secret card; the opener alternates between rounds.\n"
            "Moves: [check] passes when nobody has bet; [bet] puts 1 more chip in when nobody has "
            "bet; [call] matches a bet; [fold] gives up the round.\n"
            "After check-check or a call, the higher card takes the pot; a fold hands the pot to "
            f"the other player.\n{goal}"
        )

    def _state(self) -> dict:
        return {"round": self._round, "cards": list(self._cards), "chips": list(self._chips),
                "pot": self._pot, "history": self._history, "opener": self._opener}
