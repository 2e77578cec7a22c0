"""ConnectFour-v0: drop discs into a 6x7 grid, four in a line wins (evaluation game)."""
from __future__ import annotations

import re

from spiral_jax.envs.base import Env, to_int

DISCS = ("X", "O")  # player 0, player 1
_COLUMN = re.compile(r"\[(?:col\s*)?(\d+)\]", re.IGNORECASE)


def parse_column(text: str) -> int | None:
    """The column chosen in `text`, as the reference reads it.

    The reference takes the *last* `[col n]` / `[n]` on the first line that contains one.
    """
    matches = list(_COLUMN.finditer(text))
    if not matches:
        return None
    line_end = text.find("\n", matches[0].start())
    on_line = [m for m in matches if line_end < 0 or m.start() < line_end]
    return to_int(on_line[-1].group(1))


def four_in_line(grid: list[list[str]], row: int, col: int) -> bool:
    """Whether the disc at (row, col) is part of four in a row, column or diagonal."""
    disc, rows, cols = grid[row][col], len(grid), len(grid[0])
    for dr, dc in ((0, 1), (1, 0), (1, 1), (1, -1)):
        count = 1
        for sign in (1, -1):
            r, c = row + sign * dr, col + sign * dc
            while 0 <= r < rows and 0 <= c < cols and grid[r][c] == disc:
                count += 1
                r, c = r + sign * dr, c + sign * dc
        if count >= 4:
            return True
    return False


def drop_row(grid: list[list[str]], col: int) -> int:
    """The row a disc dropped into `col` lands on (the column must not be full)."""
    return max(r for r in range(len(grid)) if grid[r][col] == ".")


class ConnectFour(Env):
    """Player 0 drops 'X', player 1 drops 'O'; four in a row, column or diagonal wins.

    A full grid is a draw.  The grid is shown at the start and after every valid move that does
    not end the game.  No randomness.
    """

    default_observation_style = "first_last"

    def __init__(self, *, num_rows: int = 6, num_cols: int = 7, **kwargs):
        if num_rows < 1 or num_cols < 1 or (num_rows < 4 and num_cols < 4):
            raise ValueError(f"the grid needs at least 1 row and column and 4 of either, got {num_rows} rows and "
                             f"{num_cols} columns")
        super().__init__(**kwargs)
        self.num_rows, self.num_cols = num_rows, num_cols

    def _setup(self) -> None:
        self._grid = [["."] * self.num_cols for _ in range(self.num_rows)]
        for p in (0, 1):
            self._tell("rules", (p, self._rows()), self._rules(p), to=p)

    def _legal(self) -> list[str]:
        return [f"[col {c}]" for c in range(self.num_cols) if self._grid[0][c] == "."]

    def _play(self, player: int, action: str) -> None:
        self._echo(player, action)
        col = parse_column(action)
        if col is None:
            self._invalid(player, "format", "Name a column in square brackets, e.g. [col 3].")
        elif col >= self.num_cols:
            self._invalid(player, "out_of_bounds", f"Column {col} does not exist (0-{self.num_cols - 1}).")
        elif self._grid[0][col] != ".":
            self._invalid(player, "full", f"Column {col} is full.")
        else:
            row = drop_row(self._grid, col)
            self._grid[row][col] = DISCS[player]
            if four_in_line(self._grid, row, col):
                self._win(player, f"Player {player} connected four.")
            elif all(c != "." for c in self._grid[0]):
                self._draw("The grid is full.")
            else:
                self._tell("board", (self._rows(),), f"The grid now:\n{self._render()}")
                self._advance(1 - player)

    def _rows(self) -> tuple[str, ...]:
        return tuple("".join(row) for row in self._grid)

    def _render(self) -> str:
        header = " ".join(str(c) for c in range(self.num_cols))
        return "\n".join([header] + [" ".join(row) for row in self._grid])

    def _rules(self, player: int) -> str:
        return (
            f"Connect Four on a grid of {self.num_rows} rows and {self.num_cols} columns. You are "
            f"Player {player} and drop '{DISCS[player]}' discs; your opponent drops '{DISCS[1 - player]}'.\n"
            f"On your turn, choose a column 0-{self.num_cols - 1} that is not full, written like "
            "[col 3]; your disc falls to the lowest free row of that column.\n"
            "Line up four of your discs in a row, column or diagonal to win. A full grid is a draw.\n"
            f"Empty grid ('.' is free, columns numbered on top):\n{self._render()}"
        )

    def _state(self) -> dict:
        return {"board": [list(row) for row in self._grid]}
