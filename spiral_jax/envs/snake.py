"""Snake-v0: two snakes on a 5x5 grid with 2 apples, moving simultaneously (evaluation game)."""
from __future__ import annotations

import re
from collections import deque

from spiral_jax.envs.base import Env

# Checked in this order, anywhere in the text (the reference's priority).
_DIRECTIONS = (
    (re.compile(r"\[(up|w)\]", re.IGNORECASE), (0, 1)),
    (re.compile(r"\[(down|s)\]", re.IGNORECASE), (0, -1)),
    (re.compile(r"\[(left|a)\]", re.IGNORECASE), (-1, 0)),
    (re.compile(r"\[(right|d)\]", re.IGNORECASE), (1, 0)),
)
_MOVES = ["[up]", "[down]", "[left]", "[right]"]


class Snake(Env):
    """Players submit moves in turn (0 then 1); a round is applied once both have moved, and its
    moves are not shown to the other player.  Cells are (x, y) with y = 0 the bottom row.

    A snake dies leaving the grid, meeting the other head-on (same cell or swapping cells) or
    entering a body cell that stays occupied; eating an apple grows it, scores a point and spawns
    a new apple.  The last snake alive wins; if both die together it is a draw.  `max_turns`
    counts submitted moves: once it is reached, the higher score wins (the reference then
    declares both winners on equal scores; here that is a draw, keeping the game zero-sum).

    Chance kind "cell": each free cell drawn, in order: the two snake starts, the apples, then
    every respawned apple.
    """

    default_observation_style = "first_last"
    turn_limit_is_draw = False

    def __init__(self, *, width: int = 5, height: int = 5, num_apples: int = 2, max_turns: int = 40,
                 **kwargs):
        if width < 1 or height < 1 or num_apples < 0 or width * height < num_apples + 2:
            raise ValueError(f"a {width}x{height} grid with {num_apples} apples: the sizes must be >= 1, the "
                             f"apples >= 0, and the grid must hold two snakes and the apples")
        super().__init__(max_turns=max_turns, **kwargs)
        self.width, self.height, self.num_apples = width, height, num_apples

    def _setup(self) -> None:
        self._bodies: list[deque] = [deque(), deque()]
        self._alive = [True, True]
        self._apples: list[tuple[int, int]] = []
        for p in (0, 1):
            self._bodies[p].append(self._free_cell())
        for _ in range(self.num_apples):
            cell = self._free_cell()
            if cell is None:
                break
            self._apples.append(cell)
        self._scores = [0, 0]
        self._death_turn: dict[int, int] = {}
        self._pending: list[tuple[int, int] | None] = [None, None]
        for p in (0, 1):
            self._tell("rules", (p,), self._rules(p), to=p)
        self._show_board()

    def _free_cell(self) -> tuple[int, int] | None:
        def draw(rng):
            taken = set(self._apples).union(*(b for b, alive in zip(self._bodies, self._alive) if alive))
            free = [(x, y) for y in range(self.height) for x in range(self.width) if (x, y) not in taken]
            return free[int(rng.integers(len(free)))] if free else None
        cell = self._chance("cell", draw)
        return None if cell is None else tuple(cell)

    def _legal(self) -> list[str]:
        return list(_MOVES)

    def _play(self, player: int, action: str) -> None:
        move = next((step for pattern, step in _DIRECTIONS if pattern.search(action)), None)
        if move is None:
            self._invalid(player, "format", "Move with [up], [down], [left] or [right] (or [w], [s], [a], [d]).")
            return
        self._pending[player] = move
        if None not in self._pending:  # both snakes are alive while the game goes on
            self._move_snakes()
            self._pending = [None, None]
        if self.done:
            return
        self._advance(1 - player, turn=False)
        if self.max_turns is not None and self.turn >= self.max_turns:
            self._turn_limit()
        if not self.done:
            self.turn += 1

    def _turn_limit(self) -> None:
        a, b = self._scores
        why = f"The limit of {self.max_turns} moves was reached with scores {a}-{b}."
        if a == b:
            self._draw(why)
        else:
            self._win(0 if a > b else 1, why)

    def _move_snakes(self) -> None:
        """Apply both pending moves at once (collision rules in the reference's order)."""
        bodies, apples = self._bodies, self._apples
        living = [p for p in (0, 1) if self._alive[p]]
        old_heads = {p: bodies[p][0] for p in living}
        wanted = {}
        for p in living:
            (x, y), (dx, dy) = bodies[p][0], self._pending[p]
            wanted[p] = (x + dx, y + dy)
        for p, (x, y) in list(wanted.items()):
            if not (0 <= x < self.width and 0 <= y < self.height):
                self._kill(p, wanted)
        heads = list(wanted.values())
        for p, cell in list(wanted.items()):
            if heads.count(cell) > 1:
                self._kill(p, wanted)
        if len(wanted) == 2 and wanted[0] == old_heads[1] and wanted[1] == old_heads[0]:
            self._kill(0, wanted)
            self._kill(1, wanted)
        grows = {p: wanted[p] in apples for p in wanted}
        occupied = set()
        for p in (0, 1):
            if self._alive[p]:
                keep = len(bodies[p]) if grows.get(p) else len(bodies[p]) - 1  # the tail moves on
                occupied.update(list(bodies[p])[:keep])
        for p, cell in list(wanted.items()):
            if cell in occupied:
                self._kill(p, wanted)
        for p, cell in wanted.items():
            bodies[p].appendleft(cell)
            if cell in apples:
                apples.remove(cell)
                self._scores[p] += 1
                new_apple = self._free_cell()
                if new_apple is not None:
                    apples.append(new_apple)
            else:
                bodies[p].pop()
        living = [p for p in (0, 1) if self._alive[p]]
        if not living:
            self._draw("Both snakes died at the same time.")
            return
        if len(living) == 1:
            self._win(living[0], f"Player {living[0]} survived the other snake.")
        self._show_board()

    def _kill(self, player: int, wanted: dict) -> None:
        self._alive[player] = False
        self._death_turn[player] = self.turn
        wanted.pop(player, None)

    def _grid(self) -> tuple[str, ...]:
        grid = [["."] * self.width for _ in range(self.height)]
        for x, y in self._apples:
            grid[y][x] = "A"
        for p in (0, 1):
            if self._alive[p]:
                for i, (x, y) in enumerate(self._bodies[p]):
                    grid[y][x] = str(p) if i == 0 else "#"
        return tuple("".join(row) for row in reversed(grid))

    def _show_board(self) -> None:
        grid = self._grid()
        self._tell("board", (grid,),
                   "The grid (top row first; 0/1 = heads, # = bodies, A = apples):\n"
                   + "\n".join(" ".join(row) for row in grid))

    def _rules(self, player: int) -> str:
        return (
            f"Snake for two on a {self.width}x{self.height} grid with {self.num_apples} apples. "
            f"You steer snake {player}.\n"
            "Each round both snakes move one cell at the same time; send [up], [down], [left] or "
            "[right] (or [w], [s], [a], [d]). Your move is hidden from the other player.\n"
            "A snake dies if it leaves the grid, hits a body, or meets the other snake head-on. "
            "Eating an apple makes your snake longer and scores a point.\n"
            f"Outlive the other snake to win; after {self.max_turns} moves the higher score wins."
        )

    def _state(self) -> dict:
        return {"snakes": [[list(c) for c in b] for b in self._bodies], "alive": list(self._alive),
                "apples": [list(a) for a in self._apples], "scores": list(self._scores),
                "death_turn": dict(self._death_turn), "pending": [m is not None for m in self._pending]}
