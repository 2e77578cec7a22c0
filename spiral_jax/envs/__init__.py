"""SPIRAL's games as pure-Python envs (no JAX here), with the trainer-side action rules,
a batch runner, scripted opponents and Kuhn poker exploitability.

    from spiral_jax.envs import make
    env = make("KuhnPoker-v1")
    env.reset(seed=0)
    env.observation(env.current_player()), env.legal_actions()
    env.step("[bet]")
"""
from spiral_jax.envs.actions import (EVAL_INVALID_REWARDS, TRAIN_INVALID_REWARDS, apply_action,
                                     extract_action)
from spiral_jax.envs.base import GAME, Env, Message, StepResult
from spiral_jax.envs.batch import BatchRunner, GameRecord, Request, Turn
from spiral_jax.envs.registry import make, registered_ids

__all__ = [
    "EVAL_INVALID_REWARDS", "GAME", "TRAIN_INVALID_REWARDS", "BatchRunner", "Env", "GameRecord",
    "Message", "Request", "StepResult", "Turn", "apply_action", "extract_action", "make",
    "registered_ids",
]
