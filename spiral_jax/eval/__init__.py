"""Evaluation: games against fixed opponents with confidence intervals, transfer to unseen games,
Kuhn exploitability of the model's policy, cross-play ratings, and math / reasoning benchmarks."""
from spiral_jax.eval.benchmarks import (BENCHMARKS, BenchmarkResult, Item, load_items,
                                        model_generate_fn, run_benchmark, write_results)
from spiral_jax.eval.crossplay import CrossPlay, Ratings, cross_play, heatmap, rate, rollout_play
from spiral_jax.eval.game_report import TRANSFER_GAMES, evaluate_games, transfer_report, write_report
from spiral_jax.eval.games import GameStats, evaluate, summarize, wilson_interval
from spiral_jax.eval.kuhn_policy import (KuhnPolicyEstimate, estimate_by_sampling, estimate_exact,
                                         info_set_prompts, model_prob_fn, model_sample_fn)
from spiral_jax.eval.math_grader import grade_choice, grade_math, is_equivalent, last_boxed
from spiral_jax.eval.transcripts import read_transcripts, write_transcripts

__all__ = [
    "BENCHMARKS", "TRANSFER_GAMES", "BenchmarkResult", "CrossPlay", "GameStats", "Item",
    "KuhnPolicyEstimate", "Ratings", "cross_play", "estimate_by_sampling", "estimate_exact",
    "evaluate", "evaluate_games", "grade_choice", "grade_math", "heatmap", "info_set_prompts",
    "is_equivalent", "last_boxed", "load_items", "model_generate_fn", "model_prob_fn",
    "model_sample_fn", "rate", "read_transcripts", "rollout_play", "run_benchmark", "summarize",
    "transfer_report", "wilson_interval", "write_report", "write_results", "write_transcripts",
]
