"""Game outcomes from one policy's point of view, with 95% confidence intervals.

Every game counts: a game the policy lost by an invalid move (no box, an illegal move, a response cut
at the token limit) is an `invalid`, never dropped.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Mapping, Sequence

import numpy as np

from spiral_jax.rollout import PlayedGame, Rollout

OUTCOMES = ("win", "draw", "loss", "invalid")


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion (well behaved at 0 and n)."""
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def outcome(game: PlayedGame, seat: int) -> str:
    """"invalid" where `seat`'s invalid move ended the game (a retry cut off by the turn limit did not:
    that game is a draw), else "win", "loss" or "draw" by the rewards."""
    rec = game.record
    last = rec.turns[-1] if rec.turns else None
    if last is not None and not last.valid and last.player == seat and not rec.truncated:
        return "invalid"
    mine, theirs = rec.rewards[seat], rec.rewards[1 - seat]
    return "win" if mine > theirs else "loss" if mine < theirs else "draw"


@dataclasses.dataclass
class GameStats:
    """Counts per outcome, overall and per seat, plus lengths."""

    games: int
    counts: dict[str, int]
    seat_counts: dict[int, dict[str, int]]
    mean_turns: float
    mean_response_tokens: float
    truncated_responses: float  # share of the policy's responses cut at the token limit
    api_failures: int | None = None  # against an API player: the requests it did not answer

    def rate(self, what: str, seat: int | None = None) -> float:
        counts = self.counts if seat is None else self.seat_counts[seat]
        n = sum(counts.values())
        return counts[what] / n if n else 0.0

    def interval(self, what: str, seat: int | None = None) -> tuple[float, float]:
        counts = self.counts if seat is None else self.seat_counts[seat]
        return wilson_interval(counts[what], sum(counts.values()))

    def scalars(self, prefix: str) -> dict[str, float]:
        """Rates only where the policy played (a seat it never took has no rate, not 0)."""
        out = {f"{prefix}/{w}_rate": self.rate(w) for w in OUTCOMES if sum(self.counts.values())}
        for seat, counts in self.seat_counts.items():
            if sum(counts.values()):
                out.update({f"{prefix}/seat{seat}/{w}_rate": self.rate(w, seat) for w in OUTCOMES})
        out.update({f"{prefix}/games": self.games, f"{prefix}/game_length": self.mean_turns,
                    f"{prefix}/response_tokens": self.mean_response_tokens,
                    f"{prefix}/truncated_responses": self.truncated_responses})
        if self.api_failures is not None:
            out[f"{prefix}/api_failures"] = self.api_failures
        return out

    def summary(self) -> dict:
        """Machine-readable rates, each with its 95% interval (summary.json)."""
        return {"games": self.games, **{w: round(self.rate(w), 4) for w in OUTCOMES},
                **{f"{w}_ci": [round(x, 4) for x in self.interval(w)] for w in OUTCOMES}}

    def row(self, name: str) -> str:
        return table_row(name, {"games": self.games, **{w: self.rate(w) for w in OUTCOMES},
                                **{f"{w}_ci": self.interval(w) for w in OUTCOMES}})


TABLE_HEADER = ("| opponent | games | win [95% CI] | draw | loss | invalid |\n"
                "|---|---|---|---|---|---|")


def table_row(name: str, summary: Mapping) -> str:
    """A row of TABLE_HEADER from a `GameStats.summary()` (as summary.json keeps it); an outcome without
    its interval (a summary.json that kept the win rate's alone) shows its rate alone."""
    cells = [f"{100 * summary[w]:5.1f}%" + (f" [{100 * summary[f'{w}_ci'][0]:4.1f}, {100 * summary[f'{w}_ci'][1]:5.1f}]"
                                            if f"{w}_ci" in summary else "") for w in OUTCOMES]
    return f"| {name} | {summary['games']} | " + " | ".join(cells) + " |"


def summarize(games: Sequence[PlayedGame], policy: str = "model") -> GameStats:
    counts = {w: 0 for w in OUTCOMES}
    seat_counts = {0: {w: 0 for w in OUTCOMES}, 1: {w: 0 for w in OUTCOMES}}
    lengths, tokens, cut = [], [], []
    for game in games:
        for seat in (0, 1):
            if game.seats[seat] != policy:
                continue
            o = outcome(game, seat)
            counts[o] += 1
            seat_counts[seat][o] += 1
        lengths.append(len(game.record.turns))
        for t in game.model_turns:
            if t.policy == policy:
                tokens.append(len(t.response_ids))
                cut.append(t.finish_reason == "length")
    mean = lambda xs: float(np.mean(xs)) if xs else 0.0  # noqa: E731
    return GameStats(len(games), counts, seat_counts, mean(lengths), mean(tokens), mean(cut))


def evaluate(rollout: Rollout, params, env_id: str, opponent: str, n_games: int, seed: int,
             opponent_params=None) -> tuple[GameStats, list[PlayedGame]]:
    """`n_games` of the model against `opponent`, the model in each seat for half of them."""
    seats = [("model", opponent) if g % 2 == 0 else (opponent, "model") for g in range(n_games)]
    pools = {"model": params}
    if opponent_params is not None:
        pools[opponent] = opponent_params
    games = rollout.play([env_id] * n_games, seats, pools, seed)
    return summarize(games), games
