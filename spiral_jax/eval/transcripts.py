"""Every evaluated game as one JSON line, so a rate in a report can be traced back to the games.

A line holds the game's id, seed, seats, rewards, end reason, the outcome for each LLM seat, every
move (observation, raw response, extracted action, valid) and, for LLM moves, the token counts and
finish reason of the sampler.  Token ids and log-probs are left out: they are large and the text
already says what was played.
"""
from __future__ import annotations

import json
import os
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


class TranscriptError(ValueError):
    """A transcripts file, or a game in it, that cannot be read as an evaluation writes them."""


def read_transcripts(path, warn=None) -> list[dict]:
    """Every game in a transcripts file. A last line cut off (a run stopped while writing it) is left
    out, said to `warn` when given; any other line that is not a JSON object is a TranscriptError."""
    games = []
    with run_path(path).open("rb") as f:
        for n, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                game = json.loads(raw.decode("utf-8"))
            except ValueError as e:  # not JSON, or not UTF-8
                if not raw.endswith(b"\n"):
                    if warn is not None:
                        warn(f"line {n} is cut off (a run stopped while writing it) and is left out")
                    break
                raise TranscriptError(f"line {n} is not JSON text ({getattr(e, 'msg', None) or e})") from None
            if not isinstance(game, dict):
                raise TranscriptError(f"line {n} is not a JSON object (a game)")
            games.append(game)
    return games


def _shown(turns: Sequence[dict]) -> list[str]:
    """What to show of each move's observation: a player's first in full, its later ones without the
    lines that all of its observations start with (the game's rules)."""
    heads = {}
    for player in {t["player"] for t in turns}:
        seen = [t["observation"] for t in turns if t["player"] == player]
        head = os.path.commonprefix(seen) if len(seen) > 1 else ""
        heads[player] = head[:head.rfind("\n") + 1]
    first, out = set(), []
    for t in turns:
        cut = len(heads[t["player"]]) if t["player"] in first else 0
        first.add(t["player"])
        out.append(t["observation"][cut:].strip())
    return out


def to_markdown(lines: Sequence[dict], games: int = 3) -> str:
    """The first `games` transcripts as readable markdown: seats and result, then every move with what
    the player saw (`_shown`), its response and the action read from it."""
    out = []
    for i, line in enumerate(lines[:games], 1):
        try:
            out += _game_markdown(line)
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as e:  # not as write_transcripts writes
            raise TranscriptError(f"game {i} is not a transcript as an evaluation writes it "
                                  f"({type(e).__name__}: {e})") from None
    return "\n".join(out)


def _game_markdown(line: dict) -> list[str]:
    seats = line["seats"]
    outcome_text = ", ".join(f"seat {s} ({seats[int(s)]}) {o}" for s, o in line["outcomes"].items())
    out = [f"### {line['env_id']}, seed {line['seed']}: {' vs '.join(seats)}\n\n"
           f"Outcome: {outcome_text}; rewards {line['rewards']} ({line['reason']})\n"]
    for t, seen in zip(line["turns"], _shown(line["turns"])):
        out.append(f"player {t['player']} ({t['policy']}) sees\n\n```\n{seen}\n```\n\nand answers "
                   f"`{t['response'].strip()[:200]}` -> {t['action'] or '(no move)'}"
                   f"{'' if t['valid'] else ' (invalid)'}\n")
    return out
