"""Nim-v0: remove objects from piles 3, 4, 5; whoever takes the last object wins (evaluation game)."""
from __future__ import annotations

import re

from spiral_jax.envs.base import Env, to_int

_MOVE = re.compile(r"\[\s*(\d+)\s+(\d+)\s*\]")


class Nim(Env):
    """Normal-play Nim.  An action `[pile count]` removes `count` >= 1 objects from one pile.

    The piles are shown to both players after every step, valid or not.  No randomness.
    """

    default_observation_style = "first_last"

    def __init__(self, *, piles: tuple[int, ...] = (3, 4, 5), **kwargs):
        if not piles or any(not isinstance(n, int) or n < 1 for n in piles):
            raise ValueError(f"piles must be positive ints, got {piles!r}")
        super().__init__(**kwargs)
        self.initial_piles = tuple(piles)

    def _setup(self) -> None:
        self._piles = list(self.initial_piles)
        for p in (0, 1):
            self._tell("rules", (p, tuple(self._piles)), self._rules(p), to=p)

    def _legal(self) -> list[str]:
        return [f"[{i} {k}]" for i, n in enumerate(self._piles) for k in range(1, n + 1)]

    def _play(self, player: int, action: str) -> None:
        self._echo(player, action)
        moved = False
        match = _MOVE.search(action.strip())
        if match is None:
            self._invalid(player, "format", "Write the pile and the count in square brackets, e.g. [0 2].")
        else:
            pile, count = to_int(match.group(1)), to_int(match.group(2))
            if pile >= len(self._piles):
                self._invalid(player, "pile_range", f"There is no pile {pile}.")
            elif count == 0:
                self._invalid(player, "zero", "You must remove at least one object.")
            elif count > self._piles[pile]:
                self._invalid(player, "too_many", f"Pile {pile} has only {self._piles[pile]} left.")
            else:
                self._piles[pile] -= count
                self._tell("remove", (player, count, pile), f"Player {player} took {count} from pile {pile}.")
                moved = True
        self._tell("piles", (tuple(self._piles),), f"Piles now:\n{self._render()}")
        if not any(self._piles):
            self._win(player, f"Player {player} took the last object.")
        elif moved:
            self._advance(1 - player)

    def _render(self) -> str:
        return "\n".join(f"pile {i}: {n}" for i, n in enumerate(self._piles))

    def _rules(self, player: int) -> str:
        return (
            f"Nim. You are Player {player}. There are {len(self._piles)} piles of objects.\n"
            "On your turn, remove one or more objects from a single pile by writing the pile number "
            "and how many to take in square brackets, e.g. [1 3] takes 3 objects from pile 1.\n"
            "The player who takes the last object wins.\n"
            f"Starting piles:\n{self._render()}"
        )

    def _state(self) -> dict:
        return {"piles": list(self._piles)}
