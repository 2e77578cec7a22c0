"""What a Pig policy does, read from evaluation transcripts of PigDiceState-v1: how often the model
rolls at each range of points at stake, and how many decisions a game takes. A sound Pig player
rolls at a small stake and holds at a large one; a stake-blind one rolls at the same rate throughout.

    python scripts/pig_policy.py runs/tiny_pig/eval/step0/PigDiceState-v1_vs_random.jsonl \\
        runs/tiny_pig/eval/step100/PigDiceState-v1_vs_random.jsonl

`--simulate` plays simple policies on the env instead, for scale: against the random player, and
stake-blind ones (roll with a fixed probability) against each other, both seats alike.
"""
from __future__ import annotations

import json
import re
import sys
from collections import Counter

import numpy as np

from spiral_jax.envs import RandomOpponent, make

STAKE = re.compile(r"Points at stake this turn: (\d+)\.")
BUCKETS = ((0, 0, "0"), (1, 9, "1-9"), (10, 19, "10-19"), (20, 10**9, "20+"))


def bucket(stake: int) -> str:
    return next(name for low, high, name in BUCKETS if low <= stake <= high)


def read(path: str) -> tuple[Counter, Counter, int, int]:
    """(rolls per bucket, decisions per bucket, the model's invalid moves, games)."""
    rolls, decisions, invalid, games = Counter(), Counter(), 0, 0
    for line in open(path):
        game = json.loads(line)
        games += 1
        for turn in game["turns"]:
            if turn.get("policy") != "model":
                continue
            match = STAKE.search(turn["observation"])
            if match is None:
                raise SystemExit(f"{path}: no 'Points at stake' line in a prompt; this script reads "
                                 f"PigDiceState-v1 transcripts")
            if not turn["valid"]:
                invalid += 1
                continue
            b = bucket(int(match.group(1)))
            decisions[b] += 1
            rolls[b] += turn["action"] == "[roll]"
    return rolls, decisions, invalid, games


def play(policies, rng: np.random.Generator, games: int) -> float:
    """Win rate of policies[0] (a function (env, rng) -> action) against policies[1], seats alternating."""
    wins = 0
    for g in range(games):
        env = make("PigDice-v1")
        env.reset(int(rng.integers(1 << 31)))
        seat = g % 2
        while not env.done:
            mover = policies[0] if env.current_player() == seat else policies[1]
            env.step(mover(env, rng))
        wins += env.rewards[seat] > 0
    return wins / games


def roll_with(p: float):
    return lambda env, rng: "[roll]" if rng.random() < p else "[hold]"


def hold_at(k: int):
    return lambda env, rng: "[roll]" if env.state()["turn_total"] < k else "[hold]"


def simulate(games: int = 4000) -> None:
    rng = np.random.default_rng(0)
    random = RandomOpponent(0)
    uniform = lambda env, _: random.act(env)  # noqa: E731
    print(f"against the random player, {games} games each (win rate):")
    policies = [("random (roll with p=0.5)", uniform),
                *((f"roll with p={p}", roll_with(p)) for p in (0.7, 0.8, 0.9, 0.95)),
                *((f"hold at {k}", hold_at(k)) for k in (10, 15, 20))]
    for name, policy in policies:
        print(f"  {name}: {play([policy, uniform], rng, games):.3f}")
    qs = (0.7, 0.8, 0.85, 0.9, 0.95)
    print(f"stake-blind p (rows) against stake-blind q (columns), {games // 2} games each (win rate):")
    print("  p \\ q " + " ".join(f"{q:>6}" for q in qs))
    for p in qs:
        rates = (play([roll_with(p), roll_with(q)], rng, games // 2) for q in qs)
        print(f"  {p:<6} " + " ".join(f"{r:6.3f}" for r in rates))


def main(paths: list[str]) -> int:
    if paths == ["--simulate"]:
        simulate()
        return 0
    if not paths:
        print(__doc__)
        return 2
    print("| transcript | " + " | ".join(f"P(roll), stake {name}" for *_, name in BUCKETS)
          + " | model decisions per game | invalid moves |")
    print("|---" * (len(BUCKETS) + 3) + "|")
    for path in paths:
        rolls, decisions, invalid, games = read(path)
        cells = [f"{rolls[name] / decisions[name]:.2f} ({decisions[name]})" if decisions[name] else "-"
                 for *_, name in BUCKETS]
        print(f"| {path} | " + " | ".join(cells) + f" | {sum(decisions.values()) / games:.1f} | {invalid} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
