"""Optional adapter: run any registered TextArena env through our protocol.

Needs the `textarena` extra (`pip install spiral-jax[textarena]`), imported only when an adapter is
built: `make("textarena:TruthAndDeception-v0")` or `TextArenaEnv("TruthAndDeception-v0")`.  The
messages are TextArena's own text.  TextArena has no action lists, so `legal_actions()` is empty:
play it with `apply_action(..., mode="env")` (the env's own parser and rules decide).
"""
from __future__ import annotations

import contextlib
import importlib
import random
from typing import Any, Iterator

import numpy as np

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
    reported invalid when TextArena raised its error count or ended the game for an invalid move, or
    when TextArena's code raised an exception on it (see `_failed`).

    TextArena's games draw from the process-wide generators (Python's `random`, which its reset
    re-seeds, and some from numpy's `np.random`).  Each adapter keeps its own state of both, seeded
    from the game's seed, and swaps it in only while TextArena code runs (`_own_random`): a game's
    chance events depend only on its seed and moves, not on the other games stepped beside it, and
    the caller's generators are left as they were.
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
        seed = None if self.seed is None else self.seed % (1 << 32)  # np.random accepts 32 bits
        self._random_state = (random.Random(seed).getstate(), np.random.RandomState(seed).get_state())
        with self._own_random():
            env = self._textarena.make(self.ta_env_id, **self._ta_kwargs)
            while hasattr(env, "env"):  # drop TextArena's observation wrappers: we render observations
                env = env.env
            env.reset(num_players=2, seed=self.seed)
            env.state.error_allowance = self.error_allowance
            self._ta = env
            self._collect()

    @contextlib.contextmanager
    def _own_random(self) -> Iterator[None]:
        """Run the block with this game's state of Python's and numpy's global generators, keep the
        state it leaves, and give the caller back its own."""
        caller = random.getstate(), np.random.get_state()
        random.setstate(self._random_state[0])
        np.random.set_state(self._random_state[1])
        try:
            yield
        finally:
            self._random_state = random.getstate(), np.random.get_state()
            random.setstate(caller[0])
            np.random.set_state(caller[1])

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
        with self._own_random():
            self._play_ta(player, action)

    def _play_ta(self, player: int, action: str) -> None:
        state = self._ta.state
        errors_before = state.error_count
        try:
            done, info = self._ta.step(action)
        except Exception as err:  # noqa: BLE001 (whatever the text, a move must not raise)
            self._failed(player, err)
            return
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

    def _failed(self, player: int, err: Exception) -> None:
        """A move TextArena's code raised on (e.g. int() of a number of more than 4,300 digits, in its
        TicTacToe, SimpleTak or Othello): an invalid move under our allowance (once it is used up, the
        offender gets -1 and the other player 0, as in the native games), counted in TextArena's error
        count too, so that its later invalid moves are judged against the same allowance."""
        self._collect()
        self._invalid(player, "error", f"The game could not read the move ({type(err).__name__}: {str(err)[:200]}).")
        self._ta.state.error_count = self.error_count

    def _state(self) -> dict:
        return {"game_state": self._ta.state.game_state}
