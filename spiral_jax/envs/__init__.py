"""SPIRAL's games as pure-Python envs (no JAX here): the env protocol and registry, the
trainer-side action rules, a batch runner, scripted opponents and Kuhn poker exploitability.

    from spiral_jax.envs import make, apply_action
    env = make("KuhnPoker-v1")
    env.reset(seed=0)
    prompt = env.observation()            # what the player to move has been told
    env.legal_actions()                   # e.g. ['[check]', '[bet]']
    result = apply_action(env, response)  # \\boxed{} extraction + strict matching
"""
from spiral_jax.envs.actions import (EVAL_INVALID_REWARDS, TRAIN_INVALID_REWARDS, apply_action,
                                     extract_action)
from spiral_jax.envs.base import GAME, Env, Message, StepResult
from spiral_jax.envs.batch import BatchRunner, GameRecord, Request, Turn
from spiral_jax.envs.exploitability import (INFO_SETS, KuhnExploitability, kuhn_exploitability,
                                            nash_policy)
from spiral_jax.envs.opponents import (ConnectFourHeuristic, KuhnNashOpponent, LiarsDiceHeuristic,
                                       NegotiationHeuristic, NimOptimal, Opponent, PigHoldAt,
                                       RandomOpponent, SnakeHeuristic, TakHeuristic,
                                       TicTacToeMinimax, scripted_opponent)
from spiral_jax.envs.registry import make, registered_ids

__all__ = [
    "EVAL_INVALID_REWARDS", "GAME", "INFO_SETS", "TRAIN_INVALID_REWARDS", "BatchRunner",
    "ConnectFourHeuristic", "Env", "GameRecord", "KuhnExploitability", "KuhnNashOpponent",
    "LiarsDiceHeuristic", "Message", "NegotiationHeuristic", "NimOptimal", "Opponent", "PigHoldAt",
    "RandomOpponent", "Request", "SnakeHeuristic", "StepResult", "TakHeuristic", "TicTacToeMinimax",
    "Turn", "apply_action", "extract_action", "kuhn_exploitability", "make", "nash_policy",
    "registered_ids", "scripted_opponent",
]
