"""Every evaluated game as one JSON line, so a rate in a report can be traced back to the games.

A line holds the game's id, seed, seats, rewards, end reason, the outcome for each LLM seat, every
move (observation, raw response, extracted action, valid) and, for LLM moves, the token counts and
finish reason of the sampler.  Token ids and log-probs are left out: they are large and the text
already says what was played.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, Sequence

from spiral_jax.eval.games import outcome
from spiral_jax.paths import run_path
from spiral_jax.rollout import PlayedGame


def game_record(game: PlayedGame, llm_policies: Sequence[str] = ("model",)) -> dict:
    """A JSON-ready dict for one game; `llm_policies` are the seats whose outcome is reported."""
    rec = game.record
    model_turns, llm = iter(game.model_turns), {t.policy for t in game.model_turns}
    moves = []
    for turn in rec.turns:
        move = {"player": turn.player, "policy": game.seats[turn.player], "observation": turn.observation,
                "response": turn.response, "action": turn.action, "valid": turn.valid}
        if game.seats[turn.player] in llm:
            mt = next(model_turns, None)
            if mt is not None:
                move.update(prompt_tokens=len(mt.prompt_ids), response_tokens=len(mt.response_ids),
                            finish_reason=mt.finish_reason)
        moves.append(move)
    return {
        "game": rec.game, "env_id": rec.env_id, "seed": rec.seed, "seats": list(game.seats),
        "rewards": {str(k): v for k, v in (rec.rewards or {}).items()}, "reason": rec.reason,
        "truncated": rec.truncated,
        "outcomes": {str(s): outcome(game, s) for s in (0, 1) if game.seats[s] in llm_policies},
        "turns": moves,
    }


def write_transcripts(path, games: Iterable[PlayedGame], llm_policies: Sequence[str] = ("model",),
                      extra: dict | None = None) -> Path:
    """Write one line per game (with `extra` fields, e.g. the sampling settings, on every line)."""
    path = run_path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for game in games:
            f.write(json.dumps({**(extra or {}), **game_record(game, llm_policies)}) + "\n")
    return path


def read_transcripts(path) -> list[dict]:
    with run_path(path).open() as f:
        return [json.loads(line) for line in f if line.strip()]
