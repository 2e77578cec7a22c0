"""SimpleTak-v0: connect two opposite edges of a 4x4 board (evaluation game).

TextArena 0.6.4, which SPIRAL's evaluation ran, decides a win with a search that misses some
connections, and `win_check="reference"` (the default) reproduces it, so that evaluation games end
where the paper's did. Its depth-first search starts from each stone in reading order, enters every
stone once over the whole search, and carries along each path only the edges that path itself has
touched: a win is one path that touches two opposite edges. A chain can join them without any one
path doing so (a full row that the search enters from a stone in the row above, then runs along in
both directions from there), and the game then goes on. `win_check="chain"` makes any chain that
touches two opposite edges a win, as the rules text says.
"""
from __future__ import annotations

from spiral_jax.envs.placement import SYMBOLS, PlacementGame

WIN_CHECKS = ("reference", "chain")
_TOP, _BOTTOM, _LEFT, _RIGHT = 1, 2, 4, 8


def _edges(cell: int, n: int) -> int:
    """The board edges `cell` lies on, as bits."""
    r, k = divmod(cell, n)
    return (_TOP if r == 0 else 0) | (_BOTTOM if r == n - 1 else 0) | (_LEFT if k == 0 else 0) | (
        _RIGHT if k == n - 1 else 0)


def _spans(edges: int) -> bool:
    return edges & (_TOP | _BOTTOM) == _TOP | _BOTTOM or edges & (_LEFT | _RIGHT) == _LEFT | _RIGHT


def _neighbours(cell: int, n: int) -> list[int]:
    """Right, down, left, up: the order the reference's search tries them in."""
    r, k = divmod(cell, n)
    return [c for c, ok in ((cell + 1, k < n - 1), (cell + n, r < n - 1), (cell - 1, k > 0), (cell - n, r > 0)) if ok]


def joins_edges(cells: list[str], n: int, cell: int, symbol: str) -> bool:
    """Whether the chain of `symbol` stones through `cell` touches two opposite edges."""
    seen, stack, edges = {cell}, [cell], 0
    while stack:
        c = stack.pop()
        edges |= _edges(c, n)
        for nb in _neighbours(c, n):
            if nb not in seen and cells[nb] == symbol:
                seen.add(nb)
                stack.append(nb)
    return _spans(edges)


def reference_search_wins(cells: list[str], n: int, symbol: str) -> bool:
    """Whether TextArena 0.6.4's search finds a win for `symbol` on the board (see the module docstring)."""
    visited: set[int] = set()
    for start in range(n * n):
        if cells[start] != symbol or start in visited:
            continue
        visited.add(start)
        if _spans(_edges(start, n)):
            return True
        # The search's path, a stone an entry: the edges the path has touched up to it, and the
        # neighbours it has still to try.
        path = [(_edges(start, n), iter(_neighbours(start, n)))]
        while path:
            edges, untried = path[-1]
            step = next((c for c in untried if cells[c] == symbol and c not in visited), None)
            if step is None:
                path.pop()
                continue
            visited.add(step)
            reached = edges | _edges(step, n)
            if _spans(reached):
                return True
            path.append((reached, iter(_neighbours(step, n))))
    return False


class SimpleTak(PlacementGame):
    """Stones connect orthogonally; a chain touching top and bottom, or left and right, wins (as the
    reference's search finds it, under the default `win_check`; see the module docstring).

    A full board without a win is a draw.  No randomness.
    """

    def __init__(self, *, board_size: int = 4, win_check: str = "reference", **kwargs):
        if board_size < 2:
            raise ValueError("board_size must be >= 2")
        if win_check not in WIN_CHECKS:
            raise ValueError(f"win_check={win_check!r}: use one of {WIN_CHECKS}")
        super().__init__(**kwargs)
        self.size, self.win_check = board_size, win_check

    def wins_with(self, cells: list[str], cell: int, symbol: str) -> bool:
        """Whether `symbol` has won on the board `cells` (row by row) once its stone is on `cell`."""
        if self.win_check == "reference":
            return reference_search_wins(cells, self.size, symbol)
        return joins_edges(cells, self.size, cell, symbol)

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
        return self.wins_with(self._cells, cell, symbol)

    def _win_reason(self, player: int) -> str:
        return f"Player {player} connected two opposite edges."
