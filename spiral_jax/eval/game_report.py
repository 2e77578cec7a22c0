"""Game evaluation runs: a model against named opponents on any games, both seats, every game kept.

One run plays `n_games` per (game, opponent) with the model in each seat for half of them, and
writes per (game, opponent) a JSONL transcript, plus `games.json` (rates with 95% Wilson intervals,
overall and per seat, mean game length and response tokens) and `games.md`, under the sampling
settings it records in both; transcripts of matchups no report in the folder lists any more (an
earlier run's against other opponents) are removed.  Opponents: "random", "scripted" (the game's
strongest script), "self" (the same weights in the other seat) or any name given weights in
`opponent_params` (another checkpoint or model folder, loaded by the caller).  The transfer report is
the same run on SPIRAL's out-of-distribution games.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Mapping, Sequence

from tqdm import tqdm

from spiral_jax.distributed import is_leader
from spiral_jax.eval.games import OUTCOMES, GameStats, evaluate
from spiral_jax.eval.transcripts import write_transcripts
from spiral_jax.paths import run_path, transcript_path
from spiral_jax.policies import SCRIPTED, kind

TRANSFER_GAMES = ("Snake-v0", "PigDice-v1", "ConnectFour-v0", "Nim-v0", "LiarsDice-v1", "SimpleTak-v0")


def evaluate_games(rollout, params, env_ids: Sequence[str], opponents: Sequence[str], n_games: int,
                   seed: int, out_dir=None, opponent_params: Mapping[str, object] | None = None,
                   settings: dict | None = None, on_games=None) -> dict[tuple[str, str], GameStats]:
    """Stats per (game, opponent), every matchup played from the same `seed` (the same deals for
    every opponent); a JSONL transcript per matchup in `out_dir` when it is given (by the leader).
    `on_games(env_id, opponent, games)` sees each matchup's played games."""
    if n_games < 2 or n_games % 2:
        raise ValueError(f"n_games must be even and >= 2 (both seats equally), got {n_games}")
    extra = dict(opponent_params or {})
    results = {}
    pairs = [(env_id, opponent) for env_id in env_ids for opponent in opponents]
    bar = tqdm(pairs, desc="eval", unit="matchup", dynamic_ncols=True, leave=False, disable=not is_leader())
    for env_id, opponent in bar:
        bar.set_postfix_str(f"{env_id} vs {opponent}, {n_games} games")
        weights = params if opponent == "self" else extra.get(opponent)
        api = rollout.api_player(opponent) if kind(opponent) == "api" else None
        failed = api.failures if api else 0
        stats, games = evaluate(rollout, params, env_id, opponent, n_games, seed, weights)
        if api:  # moves the API did not answer (each one an invalid move of that player)
            stats = dataclasses.replace(stats, api_failures=api.failures - failed)
        results[env_id, opponent] = stats
        if out_dir is not None and is_leader():
            llm = ("model", opponent) if weights is not None else ("model",)
            write_transcripts(transcript_path(run_path(out_dir), env_id, opponent),
                              games, llm, extra={"settings": settings or {}})
        if on_games is not None:
            on_games(env_id, opponent, games)
    return results


def _rates(stats: GameStats, seat: int | None) -> dict:
    return {w: {"rate": stats.rate(w, seat), "ci95": list(stats.interval(w, seat))} for w in OUTCOMES}


def to_json(results: Mapping[tuple[str, str], GameStats], settings: dict | None = None) -> dict:
    rows = []
    for (env_id, opponent), s in results.items():
        rows.append({"env_id": env_id, "opponent": opponent, "games": s.games, "counts": s.counts,
                     "overall": _rates(s, None), "seat0": _rates(s, 0), "seat1": _rates(s, 1),
                     "mean_game_length": s.mean_turns, "mean_response_tokens": s.mean_response_tokens,
                     "truncated_responses": s.truncated_responses, "summary": s.summary(),
                     **({"api_failures": s.api_failures} if s.api_failures is not None else {})})
    return {"settings": settings or {}, "results": rows}


def to_markdown(results: Mapping[tuple[str, str], GameStats], settings: dict | None = None,
                title: str = "Game evaluation") -> str:
    """A table per seat (overall, seat 0, seat 1) with intervals, lengths, and the settings."""
    head = ("| game | opponent | seat | games | win [95% CI] | draw | loss | invalid | turns | resp. tokens |\n"
            "|---|---|---|---|---|---|---|---|---|---|")
    lines = [f"## {title}", "", head]
    for (env_id, opponent), s in results.items():
        for seat, label in ((None, "both"), (0, "0"), (1, "1")):
            counts = s.counts if seat is None else s.seat_counts[seat]
            cells = []
            for w in OUTCOMES:
                lo, hi = s.interval(w, seat)
                cells.append(f"{100 * s.rate(w, seat):.1f}% [{100 * lo:.1f}, {100 * hi:.1f}]")
            tail = f"{s.mean_turns:.1f} | {s.mean_response_tokens:.0f}" if seat is None else " | "
            lines.append(f"| {env_id} | {opponent} | {label} | {sum(counts.values())} | "
                         + " | ".join(cells) + f" | {tail} |")
    lines += ["", "invalid = lost by an invalid move (no box, illegal move, cut at the token limit); "
              "every game counts."]
    lines += [f"{opponent} on {env_id}: {s.api_failures} moves got no usable reply from the API; each is that "
              f"player's invalid move, so the rates against it overstate the model." for (env_id, opponent), s
              in results.items() if s.api_failures]
    lines += [settings_line(settings), ""]
    return "\n".join(lines)


def settings_line(settings: dict | None) -> str:
    """The closing line of a markdown report: the settings its numbers were read under."""
    return f"Settings: {json.dumps(settings or {})}"


def write_report(results: Mapping[tuple[str, str], GameStats], out_dir, settings: dict | None = None,
                 name: str = "games", title: str = "Game evaluation", writer=None, step: int = 0) -> Path:
    """`<name>.json` and `<name>.md` in `out_dir`; scalars to a `MetricsWriter` when given."""
    out_dir = run_path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{name}.json").write_text(json.dumps(to_json(results, settings), indent=1))
    (out_dir / f"{name}.md").write_text(to_markdown(results, settings, title))
    for path in _stale_transcripts(out_dir):
        path.unlink()
    if writer is not None:
        for (env_id, opponent), s in results.items():
            writer.scalars(step, s.scalars(f"{name}/{env_id}/{opponent}"))
        writer.flush()
    return out_dir / f"{name}.md"


def _stale_transcripts(out_dir) -> list:
    """The `<game>_vs_<opponent>.jsonl` files in `out_dir` of matchups no report there lists: an
    earlier evaluation's, whose report was replaced by one against other opponents or games."""
    listed = set()
    for report in out_dir.glob("*.json"):
        try:
            rows = json.loads(report.read_text()).get("results", [])
            listed |= {transcript_path(out_dir, r["env_id"], r["opponent"]).name for r in rows}
        except (ValueError, AttributeError, TypeError, KeyError):
            continue  # not a game report (results.json of benchmarks, a user's file)
    return [path for path in out_dir.glob("*_vs_*.jsonl") if path.name not in listed]


def transfer_report(rollout, params, out_dir, n_games: int, seed: int,
                    opponents: Sequence[str] = SCRIPTED, settings: dict | None = None,
                    games: Sequence[str] = TRANSFER_GAMES) -> dict[tuple[str, str], GameStats]:
    """The out-of-distribution games in one run, written as `transfer.json` / `transfer.md`."""
    results = evaluate_games(rollout, params, games, opponents, n_games, seed, out_dir, settings=settings)
    if is_leader():  # every host has the results; one writes them
        write_report(results, out_dir, settings, name="transfer", title="Transfer to unseen games")
    return results
