"""TicTacToe-v0: three in a row on a 3x3 board (SPIRAL training game)."""
from __future__ import annotations

from spiral_jax.envs.placement import SYMBOLS, PlacementGame

# The 8 lines through the board, by cell index.
LINES = ((0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6))


class TicTacToe(PlacementGame):
    """Player 0 ('O') moves first; three in a row wins (+1/-1), a full board is a draw.  No randomness."""

    size = 3

    def _rules(self, player: int) -> str:
        return (
            f"TicTacToe. You are Player {player} and place '{SYMBOLS[player]}'; "
            f"your opponent places '{SYMBOLS[1 - player]}'.\n"
            "Cells are numbered 0-8, left to right and top to bottom. On your turn, claim a free cell "
            "by writing its number in square brackets, e.g. [4] for the centre.\n"
            "Get three of your marks in a row, column or diagonal to win. A full board without a "
            "line is a draw."
        )

    def _wins(self, cell: int, symbol: str) -> bool:
        cells = self._cells
        return any(cell in line and all(cells[i] == symbol for i in line) for line in LINES)

    def _win_reason(self, player: int) -> str:
        return f"Player {player} completed a line of three."
