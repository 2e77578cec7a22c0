"""What a training step logs about the trained policy's games and samples, per game and role: mean
reward, advantage statistics, response lengths, and why moves were invalid.

Self-play users read these to tell learning from collapse: a role whose reward drifts while its
advantages shrink to zero has stopped learning; responses that grow to the token limit show up as
"cut_at_token_limit" long before the win rate moves.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Iterator, Sequence

import numpy as np

from spiral_jax.envs import Turn
from spiral_jax.rl.samples import TurnSample
from spiral_jax.rollout import ModelTurn, PlayedGame

INVALID_KINDS = ("no_box", "illegal_move", "cut_at_token_limit", "prompt_too_long")


def invalid_kind(turn: Turn, model_turn: ModelTurn) -> str | None:
    """Why an LLM move was invalid (one of INVALID_KINDS), or None for a valid move."""
    if model_turn.finish_reason == "prompt_too_long":
        return "prompt_too_long"
    if model_turn.finish_reason == "length":
        return "cut_at_token_limit"
    if turn.valid:
        return None
    return "illegal_move" if turn.action else "no_box"


def policy_turns(game: PlayedGame, policy: str) -> Iterator[tuple[Turn, ModelTurn]]:
    """The game's moves made by `policy`, each with its LLM record (a player's moves in order)."""
    queues = {p: [t for t in game.model_turns if t.player == p and t.policy == policy] for p in (0, 1)}
    for turn in game.record.turns:
        if game.seats[turn.player] == policy and queues[turn.player]:
            yield turn, queues[turn.player].pop(0)


def step_metrics(games: Sequence[PlayedGame], samples: Sequence[TurnSample], policy: str = "model") -> dict:
    """{"rollout/<game>/role<p>/<name>": value, "rollout/invalid/<kind>": share of the policy's moves}, and
    the policy's valid-move share and mean response length in characters: its moves only, not those of
    a fixed opponent or a pool snapshot."""
    rewards, lengths = defaultdict(list), defaultdict(list)
    kinds, moves, valid, chars = defaultdict(int), 0, 0, 0
    for game in games:
        for p in (0, 1):
            if game.seats[p] == policy:
                rewards[game.record.env_id, p].append(game.record.rewards[p])
        for turn, model_turn in policy_turns(game, policy):
            moves, valid, chars = moves + 1, valid + turn.valid, chars + len(turn.response)
            lengths[game.record.env_id, model_turn.player].append(len(model_turn.response_ids))
            kind = invalid_kind(turn, model_turn)
            if kind:
                kinds[kind] += 1
    advantages = defaultdict(list)
    for s in samples:
        advantages[s.game_id, int(s.role)].append(s.advantage)
    out = {}
    for (env_id, role), values in sorted(rewards.items()):
        prefix = f"rollout/{env_id}/role{role}"
        out[f"{prefix}/reward"] = float(np.mean(values))
        if advantages.get((env_id, role)):
            a = np.asarray(advantages[env_id, role])
            out.update({f"{prefix}/advantage_mean": float(a.mean()), f"{prefix}/advantage_std": float(a.std())})
        if lengths.get((env_id, role)):
            n = np.asarray(lengths[env_id, role])
            out.update({f"{prefix}/response_tokens_p50": float(np.percentile(n, 50)),
                        f"{prefix}/response_tokens_p95": float(np.percentile(n, 95)),
                        f"{prefix}/response_tokens_max": float(n.max())})
    out.update({f"rollout/invalid/{k}": kinds[k] / max(moves, 1) for k in INVALID_KINDS})
    out.update({"rollout/valid_action_rate": valid / max(moves, 1), "rollout/response_chars": chars / max(moves, 1)})
    return out
