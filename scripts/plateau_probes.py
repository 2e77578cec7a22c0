"""Probes of where TicTacToe self-play plateaus: `spiral-jax train` with one change the library does
not offer as a setting. docs/learning.md ("Four attempts at the plateau") reports what each measured.

    python scripts/plateau_probes.py PROBE train --config configs/tiny_tictactoe.py [--config.a.b=v ...]

PROBE is one of:

* line_teacher: the hashed bootstrap teacher, with each cell's weight seeded by the marks on the lines
  through that cell (as the mover sees them) instead of by the whole board. Its preferences are still
  pseudo-random, so it carries no strategy, but imitating it requires reading lines.
* random_openings: a game id `TicTacToeRandomOpenings-v0`, TicTacToe opened by 0, 1 or 2 uniformly
  random moves (not trained on), for the training games: self-play from varied positions. Evaluate
  on the plain game: `--config.games.env_ids="('TicTacToeRandomOpenings-v0',)"
  --config.eval.env_ids="('TicTacToe-v0',)"`.

The KL penalty to the policy at the start of RL is a setting: `--config.optim.kl_coef=0.1`.
"""
from __future__ import annotations

import hashlib
import sys

import numpy as np

from spiral_jax.envs import registry
from spiral_jax.envs.tictactoe import LINES, TicTacToe
from spiral_jax.rl import bootstrap


def _line_context(cells: list[str], cell: int, mine: str) -> tuple:
    """(own marks, other marks) on each line through `cell`, sorted: what the cell's lines hold."""
    pairs = []
    for line in LINES:
        if cell in line:
            others = [cells[i] for i in line if i != cell]
            pairs.append((sum(c == mine for c in others), sum(bool(c) and c != mine for c in others)))
    return tuple(sorted(pairs))


def line_distribution(self, env) -> np.ndarray:
    """HashedRandomPlayer.distribution with one Exp(1) weight per cell, seeded by the cell's lines
    (normalised Exp(1) weights are Dirichlet(1), as in the whole-board teacher)."""
    legal = env.legal_actions()
    mine = "OX"[env.current_player()]
    weights = []
    for action in legal:
        text = f"{self._seed}|{_line_context(env._cells, int(action[1:-1]), mine)}".encode()
        key = int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little")
        weights.append(np.random.default_rng(key).exponential())
    weights = np.asarray(weights) / np.sum(weights)
    return self._uniform / len(legal) + (1 - self._uniform) * weights


class TicTacToeRandomOpenings(TicTacToe):
    """TicTacToe whose first 0-2 moves (as many, uniformly) are random legal moves made by the env."""

    def _setup(self) -> None:
        super()._setup()
        for _ in range(int(self._rng.integers(3))):
            legal = self._legal()
            self._play(self._player, legal[int(self._rng.integers(len(legal)))])


PROBES = ("line_teacher", "random_openings")


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[1] not in PROBES:
        print(__doc__)
        return 2
    if argv[1] == "line_teacher":
        bootstrap.HashedRandomPlayer.distribution = line_distribution
    else:
        registry._REGISTRY["TicTacToeRandomOpenings-v0"] = (TicTacToeRandomOpenings, {})
    from spiral_jax.cli import main as cli_main

    return cli_main([argv[0]] + argv[2:])


if __name__ == "__main__":
    sys.exit(main(sys.argv))
