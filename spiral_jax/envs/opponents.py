"""Scripted opponents: `act(env)` returns a legal action string for the player to move.

Random-legal for every game; exact minimax for TicTacToe; the Nash family for Kuhn poker (played
per round); optimal play for Nim; simple heuristics for the rest.  They read `env.state()` but only
what the player to move is allowed to know.  `scripted_opponent(env_id)` picks the strongest.
"""
from __future__ import annotations

from collections import deque
from functools import lru_cache
from typing import Protocol

import numpy as np

from spiral_jax.envs.base import Env
from spiral_jax.envs.connect_four import DISCS, drop_row, four_in_line
from spiral_jax.envs.exploitability import nash_policy
from spiral_jax.envs.negotiation import RESOURCES, VALUES
from spiral_jax.envs.placement import SYMBOLS
from spiral_jax.envs.tictactoe import LINES


class Opponent(Protocol):
    def act(self, env: Env) -> str: ...


class RandomOpponent:
    """Uniformly random among `env.legal_actions()`."""

    def __init__(self, seed: int | None = None):
        self._rng = np.random.default_rng(seed)

    def act(self, env: Env) -> str:
        legal = env.legal_actions()
        if not legal:
            raise ValueError(f"the random opponent needs a game that lists its legal moves, and {env.env_id} "
                             f"does not (TextArena games judge free-text moves themselves); play it against "
                             f"the model itself ('self') or a model folder")
        return legal[int(self._rng.integers(len(legal)))]


class TicTacToeMinimax:
    """Exact minimax: wins as fast as possible, loses as late as possible.

    Ties are broken at random, or, with `prefer` (an order of cells), by taking the first tied cell in
    that order: a deterministic player, which is far easier to imitate than a random choice among
    equally good moves (see rl/bootstrap.py).
    """

    def __init__(self, seed: int | None = None, prefer: tuple[int, ...] | None = None):
        self._rng = np.random.default_rng(seed)
        self._prefer = prefer

    def act(self, env: Env) -> str:
        board = "".join(c or "." for row in env.state()["board"] for c in row)
        me = SYMBOLS[env.current_player()]
        scores = {i: _move_score(board, i, me) for i, c in enumerate(board) if c == "."}
        best = max(scores.values())
        choices = [i for i, s in scores.items() if s == best]
        if self._prefer is not None:
            return f"[{min(choices, key=self._prefer.index)}]"
        return f"[{choices[int(self._rng.integers(len(choices)))]}]"


def _move_score(board: str, cell: int, me: str) -> int:
    after = board[:cell] + me + board[cell + 1:]
    free = board.count(".")
    if any(cell in line and all(after[i] == me for i in line) for line in LINES):
        return free  # sooner wins leave more free cells
    return 0 if free == 1 else -best_score(after, "X" if me == "O" else "O")


@lru_cache(maxsize=None)
def best_score(board: str, me: str) -> int:
    """The value of a TicTacToe position for `me` to move under perfect play: above 0 a win (the sooner,
    the higher), 0 a draw, below 0 a loss."""
    return max(_move_score(board, i, me) for i, c in enumerate(board) if c == ".")


class KuhnNashOpponent:
    """Plays a one-round Kuhn Nash equilibrium (parameter alpha in [0, 1/3]) in every round."""

    def __init__(self, alpha: float = 1 / 6, seed: int | None = None):
        self.policy = nash_policy(alpha)
        self._rng = np.random.default_rng(seed)

    def act(self, env: Env) -> str:
        passive, aggressive = env.legal_actions()  # [check, bet] or [fold, call]
        return aggressive if self._rng.random() < self.policy[env.info_set(env.current_player())] else passive


class NimOptimal:
    """Moves to a position with nim-sum 0 when possible, else takes one object from the largest pile."""

    def act(self, env: Env) -> str:
        piles = env.state()["piles"]
        nim_sum = 0
        for n in piles:
            nim_sum ^= n
        for i, n in enumerate(piles):
            if nim_sum and n ^ nim_sum < n:
                return f"[{i} {n - (n ^ nim_sum)}]"
        return f"[{piles.index(max(piles))} 1]"


class PigHoldAt:
    """Rolls until the turn total reaches `threshold` (or would win), then holds."""

    def __init__(self, threshold: int = 20):
        self.threshold = threshold

    def act(self, env: Env) -> str:
        state, player = env.state(), env.current_player()
        total = state["turn_total"]
        if total >= self.threshold or state["scores"][player] + total >= env.winning_score:
            return "[hold]"
        return "[roll]"


class LiarsDiceHeuristic:
    """Counts own dice plus the expected share of the opponent's; calls bids above that, else
    makes the smallest raise on its most common face."""

    def act(self, env: Env) -> str:
        state, player = env.state(), env.current_player()
        mine, theirs = state["dice"][player], state["remaining"][1 - player]
        quantity, face = state["bid"]

        def expected(f: int) -> float:
            return mine.count(f) + theirs / 6

        if state["last_bidder"] is not None and quantity > expected(face) + 0.5:
            return "[Call]"
        best = max(range(1, 7), key=lambda f: (mine.count(f), f))
        raise_to = max(quantity + (best <= face), 1)
        if raise_to > sum(state["remaining"]) or (state["last_bidder"] is not None
                                                 and raise_to > expected(best) + 0.5):
            return "[Call]" if state["last_bidder"] is not None else f"[Bid: 1, {best}]"
        return f"[Bid: {raise_to}, {best}]"


class ConnectFourHeuristic:
    """Wins if it can, blocks an immediate win, avoids giving one, prefers central columns."""

    def act(self, env: Env) -> str:
        grid = [list(row) for row in env.state()["board"]]
        me, them = DISCS[env.current_player()], DISCS[1 - env.current_player()]
        cols = sorted((c for c in range(len(grid[0])) if grid[0][c] == "."),
                      key=lambda c: abs(c - (len(grid[0]) - 1) / 2))
        for disc in (me, them):  # win, else block
            for c in cols:
                if _drop_wins(grid, c, disc):
                    return f"[col {c}]"
        safe = [c for c in cols if not _gives_win(grid, c, me, them)]
        return f"[col {(safe or cols)[0]}]"


def _drop_wins(grid: list[list[str]], col: int, disc: str) -> bool:
    row = drop_row(grid, col)
    grid[row][col] = disc
    wins = four_in_line(grid, row, col)
    grid[row][col] = "."
    return wins


def _gives_win(grid: list[list[str]], col: int, me: str, them: str) -> bool:
    row = drop_row(grid, col)
    if row == 0:
        return False
    grid[row][col] = me
    gives = _drop_wins(grid, col, them)
    grid[row][col] = "."
    return gives


class TakHeuristic:
    """Wins if it can, blocks an immediate win, else plays where its own shortest connection
    shrinks most relative to the opponent's."""

    def act(self, env: Env) -> str:
        n = env.size
        cells = [c for row in env.state()["board"] for c in row]
        me, them = SYMBOLS[env.current_player()], SYMBOLS[1 - env.current_player()]
        free = [i for i, c in enumerate(cells) if not c]
        for symbol in (me, them):
            for i in free:
                cells[i] = symbol
                wins = env.wins_with(cells, i, symbol)
                cells[i] = ""
                if wins:
                    return f"[{i}]"

        def score(i: int) -> int:
            cells[i] = me
            s = _distance(cells, n, me) - _distance(cells, n, them)
            cells[i] = ""
            return s

        return f"[{min(free, key=score)}]"


def _distance(cells: list[str], n: int, symbol: str) -> int:
    """Fewest free cells `symbol` still needs to join two opposite edges (0-1 BFS)."""
    best = n * n + 1
    for starts, is_goal in (([k for k in range(n)], lambda c: c // n == n - 1),
                            ([r * n for r in range(n)], lambda c: c % n == n - 1)):
        dist = {}
        queue = deque()
        for c in starts:
            if cells[c] in ("", symbol):
                d = 0 if cells[c] == symbol else 1
                if d < dist.get(c, n * n + 1):
                    dist[c] = d
                    (queue.appendleft if d == 0 else queue.append)(c)
        while queue:
            c = queue.popleft()
            if is_goal(c):
                best = min(best, dist[c])
                continue
            r, k = divmod(c, n)
            for nb, ok in ((c - n, r > 0), (c + n, r < n - 1), (c - 1, k > 0), (c + 1, k < n - 1)):
                if ok and cells[nb] in ("", symbol):
                    d = dist[c] + (cells[nb] != symbol)
                    if d < dist.get(nb, n * n + 1):
                        dist[nb] = d
                        (queue.appendleft if cells[nb] == symbol else queue.append)(nb)
    return best


_STEPS = {"[up]": (0, 1), "[down]": (0, -1), "[left]": (-1, 0), "[right]": (1, 0)}


class SnakeHeuristic:
    """Heads for the nearest apple along moves that neither leave the grid nor hit a body,
    keeping away from the other head when it can."""

    def act(self, env: Env) -> str:
        state, player = env.state(), env.current_player()
        body, other = [tuple(c) for c in state["snakes"][player]], [tuple(c) for c in state["snakes"][1 - player]]
        blocked = set(body[:-1]) | set(other[:-1])
        (x, y), (ox, oy) = body[0], other[0]
        apples = [tuple(a) for a in state["apples"]]

        def rank(move: str) -> tuple:
            dx, dy = _STEPS[move]
            nx, ny = x + dx, y + dy
            unsafe = not (0 <= nx < env.width and 0 <= ny < env.height) or (nx, ny) in blocked
            near_head = abs(nx - ox) + abs(ny - oy) <= 1
            to_apple = min((abs(nx - ax) + abs(ny - ay) for ax, ay in apples), default=0)
            return unsafe, near_head, to_apple

        return min(_STEPS, key=rank)


class NegotiationHeuristic:
    """Only trades when it gets more items than it gives (that is what wins): accepts such
    offers, denies others, and offers 1 of its cheaper resource for `offer_cap` of the other."""

    def act(self, env: Env) -> str:
        state, player = env.state(), env.current_player()
        offer, held = state["offer"], state["resources"][player]
        if offer is not None and offer["to"] == player:
            gets = sum(q for _, q in offer["offered"])
            gives = sum(q for _, q in offer["requested"])
            if gets > gives and "[Accept]" in env.legal_actions():
                return "[Accept]"
            return "[Deny]"
        give, get = sorted(RESOURCES, key=lambda r: VALUES[player][r])
        if held[give] == 0:
            give, get = get, give
        if held[give] == 0 or env.offer_cap < 2:
            return "[Pass]"
        return f"[Offer: 1 {give} -> {env.offer_cap} {get}]"


_SCRIPTED = {
    "TicTacToe-v0": TicTacToeMinimax,
    "KuhnPoker-v1": lambda seed: KuhnNashOpponent(seed=seed),
    "KuhnPoker-v2": lambda seed: KuhnNashOpponent(seed=seed),
    "KuhnPokerChips-v0": lambda seed: KuhnNashOpponent(seed=seed),
    "SimpleNegotiation-v1": lambda seed: NegotiationHeuristic(),
    "PigDice-v1": lambda seed: PigHoldAt(),
    "PigDiceState-v1": lambda seed: PigHoldAt(),
    "LiarsDice-v1": lambda seed: LiarsDiceHeuristic(),
    "Snake-v0": lambda seed: SnakeHeuristic(),
    "ConnectFour-v0": lambda seed: ConnectFourHeuristic(),
    "Nim-v0": lambda seed: NimOptimal(),
    "SimpleTak-v0": lambda seed: TakHeuristic(),
}


def scripted_opponent(env_id: str, seed: int | None = None) -> Opponent:
    """The strongest scripted opponent for a native env id."""
    if env_id not in _SCRIPTED:
        raise ValueError(f"no scripted opponent for {env_id!r}; available: {', '.join(_SCRIPTED)}")
    return _SCRIPTED[env_id](seed)
