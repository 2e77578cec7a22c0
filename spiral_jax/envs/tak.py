"""SimpleTak-v0: connect two opposite edges of a 4x4 board (evaluation game)."""
from __future__ import annotations

from spiral_jax.envs.placement import SYMBOLS, PlacementGame


def joins_edges(cells: list[str], n: int, cell: int, symbol: str) -> bool:
    """Whether the chain of `symbol` stones through `cell` touches two opposite edges."""
    seen, stack = {cell}, [cell]
    top = bottom = left = right = False
    while stack:
        c = stack.pop()
        r, k = divmod(c, n)
        top |= r == 0
        bottom |= r == n - 1
        left |= k == 0
        right |= k == n - 1
        for nb, ok in ((c - n, r > 0), (c + n, r < n - 1), (c - 1, k > 0), (c + 1, k < n - 1)):
            if ok and nb not in seen and cells[nb] == symbol:
                seen.add(nb)
                stack.append(nb)
    return (top and bottom) or (left and right)


class SimpleTak(PlacementGame):
    """Stones connect orthogonally; a chain touching top and bottom, or left and right, wins.

    A full board without such a chain is a draw.  No randomness.
    """

    def __init__(self, *, board_size: int = 4, **kwargs):
        if board_size < 2:
            raise ValueError("board_size must be >= 2")
        super().__init__(**kwargs)
        self.size = board_size

    def _rules(self, player: int) -> str:
        n = self.size
        return (
            f"SimpleTak on a {n}x{n} board. You are Player {player} and place '{SYMBOLS[player]}'; "
            f"your opponent places '{SYMBOLS[1 - player]}'.\n"
            f"Cells are numbered 0-{n * n - 1}, left to right and top to bottom. On your turn, put a "
            "stone on a free cell by writing its number in square brackets, e.g. [5].\n"
            "Stones connect up, down, left and right. You win as soon as one chain of your stones "
            "touches two opposite edges (top and bottom, or left and right)."
        )

    def _wins(self, cell: int, symbol: str) -> bool:
        return joins_edges(self._cells, self.size, cell, symbol)

    def _win_reason(self, player: int) -> str:
        return f"Player {player} connected two opposite edges."
