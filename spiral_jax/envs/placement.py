"""Shared engine of the cell-placement games (TicTacToe, SimpleTak).

Players alternate putting a stone on an empty numbered cell of an n x n board: player 0 plays 'O',
player 1 plays 'X'.  The action is the first `[n]` in the text (spaces inside the brackets allowed).
After every step, valid or not, both players are shown the board and the free cells.
"""
from __future__ import annotations

import re

from spiral_jax.envs.base import Env, to_int

SYMBOLS = ("O", "X")
_CELL = re.compile(r"\[\s*(\d+)\s*\]")


class PlacementGame(Env):
    """Subclasses set `size`, write `_rules` and `_wins`, and name the draw."""

    default_observation_style = "first_last"
    size = 3

    def _setup(self) -> None:
        self._cells = [""] * (self.size * self.size)
        for p in (0, 1):
            self._tell("rules", (p,), self._rules(p), to=p)
        self._show_board()

    def _legal(self) -> list[str]:
        return [f"[{i}]" for i, c in enumerate(self._cells) if not c]

    def _play(self, player: int, action: str) -> None:
        self._echo(player, action)
        match = _CELL.search(action)
        if match is None:
            self._invalid(player, "format", "Write the cell number in square brackets, e.g. [4].")
        else:
            cell = to_int(match.group(1))
            if cell >= len(self._cells):
                self._invalid(player, "range", f"There is no cell {cell}; cells are 0-{len(self._cells) - 1}.")
            elif self._cells[cell]:
                self._invalid(player, "occupied", f"Cell {cell} is already taken.")
            else:
                self._cells[cell] = SYMBOLS[player]
                if self._wins(cell, SYMBOLS[player]):
                    self._win(player, self._win_reason(player))
                elif all(self._cells):
                    self._draw("The board is full.")
                else:
                    self._advance(1 - player)
        self._show_board()

    def _show_board(self) -> None:
        free = tuple(i for i, c in enumerate(self._cells) if not c)
        moves = ", ".join(f"[{i}]" for i in free) or "none"
        self._tell("board", (tuple(self._cells), free),
                   f"Board (free cells show their numbers):\n{self._render()}\nFree cells: {moves}")

    def _render(self) -> str:
        n = self.size
        width = len(str(n * n - 1))
        rows = []
        for r in range(n):
            row = self._cells[r * n:(r + 1) * n]
            rows.append(" ".join((c or str(r * n + i)).rjust(width) for i, c in enumerate(row)))
        return "\n".join(rows)

    def _state(self) -> dict:
        n = self.size
        return {"board": [self._cells[r * n:(r + 1) * n] for r in range(n)]}

    def _rules(self, player: int) -> str:
        raise NotImplementedError

    def _wins(self, cell: int, symbol: str) -> bool:
        raise NotImplementedError

    def _win_reason(self, player: int) -> str:
        raise NotImplementedError
