"""Env throughput in pure Python on one core: BatchRunner steps/s per game, and a mixed batch.

Each step is a full trainer turn: render the prompt, list the legal actions, extract the action
from a boxed response, check it strictly, step the game and record the turn.  Responses are
random legal moves wrapped as "... \\boxed{move}", answered for every pending game at once.

    python bench/envs.py [--games 64] [--steps 20000]
"""
from __future__ import annotations

import argparse
import random
import time

from spiral_jax.envs import BatchRunner, make, registered_ids


def run(env_ids: list[str], games: int, steps: int) -> tuple[float, int]:
    """Steps per second of a BatchRunner over `games` slots cycling through `env_ids`."""
    runner = BatchRunner([make(env_ids[i % len(env_ids)]) for i in range(games)], seed=0)
    pick, done, finished = random.Random(0), 0, 0
    start = time.perf_counter()
    while done < steps:
        answers = {r.game: f"Let me think. \\boxed{{{pick.choice(r.legal_actions)}}}" for r in runner.pending()}
        finished += len(runner.submit(answers))
        done += len(answers)
    return done / (time.perf_counter() - start), finished


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--games", type=int, default=64, help="games in flight")
    parser.add_argument("--steps", type=int, default=20_000, help="steps to time per row")
    args = parser.parse_args()
    print(f"BatchRunner, {args.games} games in flight, pure Python, one core")
    print(f"{'env':24s} {'steps/s':>10s} {'games done':>11s}")
    for env_id in registered_ids():
        rate, finished = run([env_id], args.games, args.steps)
        print(f"{env_id:24s} {rate:10,.0f} {finished:11d}")
    rate, finished = run(["TicTacToe-v0", "KuhnPoker-v1", "SimpleNegotiation-v1"], args.games, args.steps)
    print(f"{'SPIRAL training mix':24s} {rate:10,.0f} {finished:11d}")


if __name__ == "__main__":
    main()
