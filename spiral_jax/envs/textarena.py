"""Optional adapter: run any registered TextArena env through our protocol.

Needs the `textarena` extra (`pip install spiral-jax[textarena]`), imported only when an adapter is
built: `make("textarena:TruthAndDeception-v0")` or `TextArenaEnv("TruthAndDeception-v0")`.  The
messages are TextArena's own text.  TextArena has no action lists, so `legal_actions()` is empty:
play it with `apply_action(..., mode="env")` (the env's own parser and rules decide).
"""
from __future__ import annotations

import importlib
from typing import Any

from spiral_jax.envs.base import Env, Message


def import_textarena():
    """The textarena module, or an ImportError saying how to install it."""
    try:
        return importlib.import_module("textarena")
    except ImportError as err:
        raise ImportError("the TextArena adapter needs the optional dependency: "
                          "pip install spiral-jax[textarena]") from err


class TextArenaEnv(Env):
    """A two-player TextArena env behind the `Env` protocol; `ta_kwargs` go to `textarena.make`.

    Chance events cannot be injected; the seed is passed to TextArena's own reset.  An action is
    reported invalid when TextArena raised its error count or ended the game for an invalid move.
    """

    def __init__(self, ta_env_id: str, *, error_allowance: int = 1,
                 observation_style: str | None = None, **ta_kwargs: Any):
        super().__init__(error_allowance=error_allowance, observation_style=observation_style)
        self._textarena = import_textarena()
        registry = getattr(getattr(getattr(self._textarena, "envs", None), "registration", None),
                           "ENV_REGISTRY", None)
        if registry is not None and ta_env_id not in registry:
            import difflib

            close = difflib.get_close_matches(ta_env_id, list(registry), n=3)
            raise ValueError(f"unknown TextArena env id {ta_env_id!r}"
                             + (f"; did you mean {', '.join(close)}?" if close else
                                "; textarena.envs.registration.ENV_REGISTRY lists the ids"))
        self.ta_env_id, self._ta_kwargs = ta_env_id, ta_kwargs
        self.env_id = f"textarena:{ta_env_id}"

    def _setup(self) -> None:
        if self._forced:
            raise ValueError("TextArena envs do not support injected chance events")
        env = self._textarena.make(self.ta_env_id, **self._ta_kwargs)
        while hasattr(env, "env"):  # drop TextArena's observation wrappers: we render observations
            env = env.env
        env.reset(num_players=2, seed=self.seed)
        env.state.error_allowance = self.error_allowance
        self._ta = env
        self._collect()

    def _collect(self) -> None:
        """Move TextArena's pending messages into our logs and mirror its turn bookkeeping."""
        state = self._ta.state
        player, entries = self._ta.get_observation()  # lets envs that deal lazily do so
        pending = {player: list(entries)}
        for pid in (0, 1):
            if pid != player:
                pending[pid] = list(state.observations[pid])
                state.observations[pid].clear()
        for pid in (0, 1):
            for entry in pending[pid]:
                text = str(entry[1])
                self._log[pid].append(Message(int(entry[0]), "text", (text,), text))
        self._player, self.turn, self.error_count = state.current_player_id, state.turn, state.error_count

    def _legal(self) -> list[str]:
        return []

    def _play(self, player: int, action: str) -> None:
        state = self._ta.state
        errors_before = state.error_count
        done, info = self._ta.step(action)
        # TextArena 0.6 reports the reason in the step's info; 0.7 in state.game_info[player], with
        # an `invalid_move` flag when an invalid move ended the game.
        mine = (getattr(state, "game_info", None) or {}).get(player) or {}
        reason = str((info or {}).get("reason") or mine.get("reason", ""))
        self._valid = not (state.error_count > errors_before or mine.get("invalid_move")
                           or (done and "invalid" in reason.lower()))
        if done:
            closed = self._ta.close()
            rewards = closed[0] if isinstance(closed, tuple) else closed
            self._finish({int(k): v for k, v in rewards.items()}, reason)
        self._collect()

    def _state(self) -> dict:
        return {"game_state": self._ta.state.game_state}
