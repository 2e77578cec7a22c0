"""SPIRAL's trainer-side action rules: pull the move out of a model response, then apply it.

These sit on top of the games: the env never sees the model's reasoning, only the extracted move.
"""
from __future__ import annotations

import re
from typing import Sequence

from spiral_jax.envs.base import Env, StepResult

TRAIN_INVALID_REWARDS = (-1.5, 0.5)  # (offender, other player) during SPIRAL training
EVAL_INVALID_REWARDS = (-1.0, 1.0)  # during evaluation
MODES = ("strict", "env")

_BOX_COMMANDS = ("\\boxed", "\\fbox")
_INNER_BOXED = re.compile(r"\\boxed\{([^}]*)\}")
_SPACE = re.compile(r"\s+")


def extract_action(response: str) -> str:
    """The action in a model response, by SPIRAL's rules.  Never raises; always returns a string.

    Take the content of the last brace-matched `\\boxed{...}` (or `\\fbox{...}`), unwrapping a
    `\\text{...}` around it; with no complete box, use the whole response, stripped.  Turn any
    remaining `\\boxed{x}` into `[x]`; wrap a result without brackets and of at most 5 words as
    `[x]`; collapse whitespace.  An empty response gives "".
    """
    text = str(response)
    if not text:
        return ""
    action = _last_box(text)
    if action is None:
        action = text.strip()
    elif action.startswith("\\text{") and action.endswith("}"):
        action = action[len("\\text{"):-1]
    # A box closes at a "}", so none starts after the last one: leaving that tail out keeps text full
    # of unclosed boxes from costing time quadratic in its length.
    closed = action.rfind("}") + 1
    action = _INNER_BOXED.sub(r"[\1]", action[:closed]) + action[closed:]
    if "[" not in action and "]" not in action and len(action.split()) <= 5:
        action = f"[{action}]"
    return _SPACE.sub(" ", action).strip()


def _last_box(text: str) -> str | None:
    """Content of the last `\\boxed{...}` (else the last `\\fbox{...}`), or None if absent/unclosed."""
    for command in _BOX_COMMANDS:
        start = text.rfind(command)
        if start >= 0:
            break
    else:
        return None
    open_at = start + len(command)
    if text[open_at:open_at + 1] != "{":
        return None
    depth = 0
    for i in range(open_at, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[open_at + 1:i]
    return None


def apply_action(env: Env, response: str, mode: str = "strict",
                 invalid_rewards: Sequence[float] = TRAIN_INVALID_REWARDS) -> StepResult:
    """Play a model response for the player to move, under the trainer-side rules.

    mode "strict" (SPIRAL): the extracted action must equal one of `env.legal_actions()` exactly
    (case-sensitive); otherwise the move is invalid and the game ends at once with
    `invalid_rewards` = (offender, other player).  mode "env": the extracted action goes to the
    env, whose own parser and rules (its `error_allowance`, -1/0 on forfeit) decide, as in the
    reference envs; use it for games without a finite action list, such as TextArena ones.
    `info` gets "action" (the extracted string) next to "valid".  Never raises on any response.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    action = extract_action(response)
    if mode == "strict" and action not in env.legal_actions():
        player = env.current_player()
        result = env.end({player: invalid_rewards[0], 1 - player: invalid_rewards[1]},
                         f"Player {player} made an invalid move.")
    else:
        result = env.step(action)
    result.info["action"] = action
    return result
