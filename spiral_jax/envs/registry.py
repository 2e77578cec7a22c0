"""Env ids -> game classes and their settings; `make` builds an env from an id."""
from __future__ import annotations

import inspect
import numbers
from typing import Any

from spiral_jax.envs.base import Env
from spiral_jax.envs.connect_four import ConnectFour
from spiral_jax.envs.kuhn import KuhnPoker
from spiral_jax.envs.liars_dice import LiarsDice
from spiral_jax.envs.negotiation import SimpleNegotiation
from spiral_jax.envs.nim import Nim
from spiral_jax.envs.pig import PigDice
from spiral_jax.envs.snake import Snake
from spiral_jax.envs.tak import SimpleTak
from spiral_jax.envs.tictactoe import TicTacToe

TEXTARENA_PREFIX = "textarena:"

_REGISTRY: dict[str, tuple[type[Env], dict[str, Any]]] = {
    # SPIRAL's training games
    "TicTacToe-v0": (TicTacToe, {}),
    "KuhnPoker-v1": (KuhnPoker, {}),
    "KuhnPoker-v2": (KuhnPoker, {"fixed_pot": False, "outcome": "chips", "first_opener": 0}),
    # one textbook hand, rewarded in chips: what Kuhn exploitability measures (tiny_kuhn trains on it)
    "KuhnPokerChips-v0": (KuhnPoker, {"rounds": 1, "fixed_pot": False, "outcome": "chip_reward",
                                      "first_opener": 0}),
    "SimpleNegotiation-v1": (SimpleNegotiation, {}),
    # PigDice-v1 with short prompts, the rules then the scores and the points at stake (the main job)
    "PigDiceState-v1": (PigDice, {"observation_style": "first_last"}),
    # evaluation (out-of-distribution) games
    "PigDice-v1": (PigDice, {}),
    "LiarsDice-v1": (LiarsDice, {}),
    "Snake-v0": (Snake, {}),
    "ConnectFour-v0": (ConnectFour, {}),
    "Nim-v0": (Nim, {}),
    "SimpleTak-v0": (SimpleTak, {}),
}


def registered_ids() -> list[str]:
    """The native env ids (any TextArena id also works as "textarena:<id>", see `make`)."""
    return list(_REGISTRY)


def make(env_id: str, **overrides: Any) -> Env:
    """Build a fresh env (call `reset(seed)` before playing).

    `overrides` replace the registered settings, e.g. `make("KuhnPoker-v2", rounds=1)` or
    `make("TicTacToe-v0", error_allowance=0, observation_style="full_history")`.  An id of the form
    "textarena:<id>" wraps that TextArena env (needs `pip install spiral-jax[textarena]`).
    """
    if not isinstance(env_id, str):
        raise TypeError(f"env_id must be a string such as 'KuhnPoker-v1', got {env_id!r}")
    if env_id.startswith(TEXTARENA_PREFIX):
        from spiral_jax.envs.textarena import TextArenaEnv

        return TextArenaEnv(env_id[len(TEXTARENA_PREFIX):], **overrides)
    if env_id not in _REGISTRY:
        raise ValueError(f"unknown env id {env_id!r}; known ids: {', '.join(_REGISTRY)} "
                         f"(or '{TEXTARENA_PREFIX}<TextArena id>')")
    cls, settings = _REGISTRY[env_id]
    accepted = _keyword_params(cls)
    unknown = sorted(set(overrides) - set(accepted))
    if unknown:
        raise ValueError(f"{env_id} has no setting(s) {', '.join(unknown)}; "
                         f"it accepts: {', '.join(sorted(accepted))}")
    _check_kinds(env_id, {**accepted, **settings}, overrides)
    # A NumPy integer (a count read from an array) plays as the Python int it holds.
    overrides = {k: int(v) if isinstance(v, numbers.Integral) and not isinstance(v, bool) else v
                 for k, v in overrides.items()}
    env = cls(**{**settings, **overrides})
    env.env_id = env_id
    return env


def _keyword_params(cls: type) -> dict[str, Any]:
    """The keyword-only settings of `cls` and its bases, each with its default."""
    params: dict[str, Any] = {}
    for klass in reversed(cls.__mro__):
        if "__init__" in vars(klass) and klass is not object:
            params.update({p.name: p.default for p in inspect.signature(klass.__init__).parameters.values()
                           if p.kind is p.KEYWORD_ONLY})
    return params


def _check_kinds(env_id: str, defaults: dict[str, Any], overrides: dict[str, Any]) -> None:
    """Raise a TypeError for an override of another kind than the setting's default (`defaults`: the
    registered settings over the constructor's): the games compare and count with them, so rounds=2.5
    or "5", fixed_pot="no" (true) or a bool for a count would play a game nobody asked for or fail deep
    inside it."""
    for name, value in overrides.items():
        default = defaults[name]
        if value is None and _keyword_params(Env).get(name, 0) is None:  # max_turns=None: no limit
            continue
        if isinstance(default, bool):
            ok, kind = isinstance(value, bool), "True or False"
        elif isinstance(default, int):
            ok, kind = isinstance(value, numbers.Integral) and not isinstance(value, bool), "an int"
        elif isinstance(default, (str, tuple)):
            ok, kind = isinstance(value, (type(default), list) if isinstance(default, tuple) else str), (
                "a tuple" if isinstance(default, tuple) else "a string")
        else:  # None: the game checks it
            continue
        if not ok:
            raise TypeError(f"{env_id}: {name} must be {kind} like its default {default!r}, got {value!r}")
