"""Cross-play between a set of players (checkpoints, model folders or scripts): every pair, both seats.

Reports the score matrix (win = 1, draw = 1/2, loss or invalid = 0, from the row player's side),
Bradley-Terry strengths (maximum likelihood, Newton's method), the same on the Elo scale, and the
residual: observed minus BT-predicted score.  One strength per player can only express a transitive
order, so a large residual (and any cycle a > b > c > a of majority wins) means the players'
relation is non-transitive, as with rock-paper-scissors.
"""
from __future__ import annotations

import dataclasses
import io
import itertools
from typing import Callable, Sequence

import numpy as np
from tqdm import tqdm

from spiral_jax.eval.games import outcome
from spiral_jax.paths import run_path

# play(first, second, n) -> n outcomes ("win"/"draw"/"loss"/"invalid") for the player in seat 0.
PlayFn = Callable[[str, str, int], Sequence[str]]
_SCORE = {"win": 1.0, "draw": 0.5, "loss": 0.0, "invalid": 0.0}


@dataclasses.dataclass
class CrossPlay:
    """score[i, j]: points of player i against j (both seats); games[i, j]: games they played."""

    names: list[str]
    score: np.ndarray
    games: np.ndarray
    seat_score: np.ndarray  # [2, n, n]: points of i against j with i in seat 0 / seat 1

    @property
    def win_rate(self) -> np.ndarray:
        """Score share of the row player (NaN on the diagonal and for unplayed pairs)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.games > 0, self.score / np.maximum(self.games, 1), np.nan)


def cross_play(names: Sequence[str], play: PlayFn, games_per_pair: int) -> CrossPlay:
    """Every unordered pair plays `games_per_pair` games, half with each player in seat 0."""
    if games_per_pair < 2 or games_per_pair % 2:
        raise ValueError(f"games_per_pair must be even and >= 2 (both seats), got {games_per_pair}")
    if len(set(names)) < 2 or len(set(names)) < len(names):
        raise ValueError(f"cross-play needs two or more players, each named once; got {list(names)}")
    n = len(names)
    score, games, seat_score = np.zeros((n, n)), np.zeros((n, n)), np.zeros((2, n, n))
    pairs = [(first, second) for i, j in itertools.combinations(range(n), 2) for first, second in ((i, j), (j, i))]
    for first, second in tqdm(pairs, desc="cross-play", unit="pairing", dynamic_ncols=True, leave=False):
        outcomes = list(play(names[first], names[second], games_per_pair // 2))
        if len(outcomes) != games_per_pair // 2:
            raise ValueError(f"play returned {len(outcomes)} outcomes, expected {games_per_pair // 2}")
        pts = sum(_SCORE[o] for o in outcomes)
        score[first, second] += pts
        score[second, first] += len(outcomes) - pts
        seat_score[0, first, second] += pts
        seat_score[1, second, first] += len(outcomes) - pts
        games[first, second] += len(outcomes)
        games[second, first] += len(outcomes)
    return CrossPlay(list(names), score, games, seat_score)


def bradley_terry(score: np.ndarray, games: np.ndarray, prior: float = 0.5, iters: int = 200,
                  tol: float = 1e-10) -> np.ndarray:
    """Strengths p (geometric mean 1) maximising sum_ij score_ij log(p_i / (p_i + p_j)).

    Newton's method on log p with a backtracking line search (the log-likelihood is concave): it
    converges in a few dozen steps however far apart the players are, where a fixed-point (MM)
    update slows to a crawl.
    `prior` adds that many virtual wins and losses of every player against every other it met, so an
    unbeaten player has a finite strength.  Raises where the data do not determine the strengths:
    with one player no one ever scored against (unbeaten at prior 0), or two groups of players that
    never met, the fit would drift without end or compare the groups on an arbitrary scale.
    """
    played = games > 0
    s = score + prior * played
    if not _strongly_connected(s > 0):
        raise ValueError("Bradley-Terry strengths are not determined by these games: some players never scored "
                         "against the rest (unbeaten or winless with prior=0, or groups that never met); play "
                         "every pair and use prior > 0")
    n = games + 2 * prior * played
    loglik = lambda t: -np.sum(s * np.logaddexp(0.0, t[None, :] - t[:, None]))  # noqa: E731
    theta = np.zeros(len(score))
    for _ in range(iters):
        q = 1.0 / (1.0 + np.exp(theta[None, :] - theta[:, None]))  # P(i beats j)
        grad = s.sum(1) - (n * q).sum(1)
        w = n * q * q.T
        step = np.linalg.lstsq(np.diag(w.sum(1)) - w, grad, rcond=None)[0]  # the Hessian is minus this Laplacian
        t, before = 1.0, loglik(theta)
        while loglik(theta + t * step) < before and t > 1e-12:
            t /= 2
        theta = theta + t * step
        theta -= theta.mean()
        if np.max(np.abs(t * step)) < tol:
            break
    return np.exp(theta)


def _strongly_connected(scored: np.ndarray) -> bool:
    """Whether every player reaches every other along scored[i, j] (i took points from j)."""
    reach = scored | np.eye(len(scored), dtype=bool)
    for _ in range(len(scored).bit_length()):  # paths of up to 2**k steps after k squarings
        reach = reach | (reach.astype(np.int64) @ reach.astype(np.int64) > 0)
    return bool(reach.all())


def elo(strengths: np.ndarray, base: float = 1000.0) -> np.ndarray:
    """The Elo scale: 400 points = 10:1 odds; the mean rating is `base`."""
    r = 400 * np.log10(strengths)
    return r - r.mean() + base


def predicted(strengths: np.ndarray) -> np.ndarray:
    """BT expected score of the row player against the column player."""
    return strengths[:, None] / (strengths[:, None] + strengths[None, :])


@dataclasses.dataclass
class Ratings:
    names: list[str]
    strength: np.ndarray
    elo: np.ndarray
    residual: np.ndarray  # observed minus predicted score share (NaN where unplayed)
    residual_rms: float   # over played pairs, weighted by games
    cycles: list[tuple[tuple[str, str, str], float]]  # (a, b, c) with a > b > c > a; min margin


def rate(result: CrossPlay, prior: float = 0.5) -> Ratings:
    """Bradley-Terry / Elo ratings and the residual that shows what a single rating cannot."""
    p = bradley_terry(result.score, result.games, prior)
    residual = result.win_rate - predicted(p)
    played = result.games > 0
    rms = float(np.sqrt(np.sum(result.games[played] * residual[played] ** 2) / result.games[played].sum())
                ) if played.any() else 0.0
    rates, cycles = result.win_rate, []
    for a, b, c in itertools.combinations(range(len(result.names)), 3):
        for x, y, z in ((a, b, c), (a, c, b)):  # the two orientations of the triangle
            margins = [rates[x, y], rates[y, z], rates[z, x]]
            if all(m > 0.5 for m in margins if not np.isnan(m)) and not any(np.isnan(margins)):
                cycles.append(((result.names[x], result.names[y], result.names[z]), min(margins) - 0.5))
    cycles.sort(key=lambda c: -c[1])
    return Ratings(list(result.names), p, elo(p), residual, rms, cycles)


def markdown(result: CrossPlay, ratings: Ratings) -> str:
    """The score matrix (row player's share) and the ratings as markdown tables."""
    names, rates = result.names, result.win_rate
    lines = ["| row vs column | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for i, name in enumerate(names):
        cells = ["-" if np.isnan(r) else f"{r:.2f}" for r in rates[i]]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "| player | Elo | BT strength |", "|---|---|---|"]
    for i in np.argsort(-ratings.elo):
        lines.append(f"| {names[i]} | {ratings.elo[i]:.0f} | {ratings.strength[i]:.3f} |")
    lines += ["", f"Residual (observed - BT predicted score), RMS over games: {ratings.residual_rms:.3f}."]
    if ratings.cycles:
        (a, b, c), m = ratings.cycles[0]
        lines.append(f"Non-transitive: {len(ratings.cycles)} cycle(s), strongest {a} > {b} > {c} > {a} "
                     f"(every margin >= {m:.2f} above 1/2).")
    return "\n".join(lines) + "\n"


def heatmap(result: CrossPlay, path, title: str = "cross-play score (row vs column)"):
    """Save the score matrix as a PNG at `path`, a local path or a URI such as gs://b/x.png (needs
    matplotlib, the `eval` extra)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise ImportError("the cross-play heatmap needs matplotlib: pip install 'spiral-jax[eval]'") from e
    n = len(result.names)
    fig, ax = plt.subplots(figsize=(1.2 * n + 2, 1.0 * n + 1.5))
    im = ax.imshow(result.win_rate, vmin=0, vmax=1, cmap="RdBu")
    ax.set_xticks(range(n), result.names, rotation=45, ha="right")
    ax.set_yticks(range(n), result.names)
    for i, j in itertools.product(range(n), range(n)):
        if result.games[i, j] > 0:
            ax.text(j, i, f"{result.win_rate[i, j]:.2f}", ha="center", va="center", fontsize=8)
    fig.colorbar(im, ax=ax)
    ax.set_title(title)
    fig.tight_layout()
    png = io.BytesIO()  # matplotlib writes local files only; the bytes go through run_path (gs:// too)
    fig.savefig(png, format="png", dpi=100)
    plt.close(fig)
    run_path(path).write_bytes(png.getvalue())
    return path


def rollout_play(rollout, params: dict, env_id: str, seed: int = 0) -> PlayFn:
    """A `PlayFn` over LLM policies (names in `params`) and scripted ones ('random', 'scripted'),
    played by a `Rollout`; a different seed for every call."""
    calls = itertools.count()

    def play(first: str, second: str, n: int) -> list[str]:
        pools = {k: params[k] for k in (first, second) if k in params}
        games = rollout.play([env_id] * n, [(first, second)] * n, pools, seed * 1009 + next(calls))
        return [outcome(g, 0) for g in games]
    return play
