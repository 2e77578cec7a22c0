"""Evaluation: games against fixed opponents with confidence intervals."""
from spiral_jax.eval.games import GameStats, evaluate, summarize, wilson_interval

__all__ = ["GameStats", "evaluate", "summarize", "wilson_interval"]
