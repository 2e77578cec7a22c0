"""The main job: a tiny Qwen3-architecture model learns Pig dice by self-play on a laptop CPU.

Nothing is downloaded: the model is randomly initialised and the tokenizer is the small BPE the
project ships (scripts/build_tiny_tokenizer.py). A short bootstrap teaches the answer format by
imitating the `hashed` teacher (a random legal move from a distribution fixed per observation: no
strategy). Then self-play RL with RAE (the SPIRAL recipe, REINFORCE form; one policy, both seats)
does the rest. The random and scripted (hold at 20) players only evaluate: at step 0, every
`eval_every` steps and at the end (out_dir/summary.json holds step 0 and final side by side).

Why Pig (docs/learning.md, "Why the main job plays Pig"): its two moves are always legal, so no game
is lost to an illegal move, and every turn is a decision that counts, so a step's games carry many
deciding moments. `PigDiceState-v1` is PigDice-v1 with short prompts (the rules, then the scores and
the points at stake), and games run to the game's own limit of 50 turns per player rather than
SPIRAL's cap of 50 moves, which a game of Pig, with a move per roll, outlasts.

The policy RL learns is a mixed strategy (roll with some probability), so it is evaluated at the
temperature it was trained and sampled at, 1.0; top-p 0.95 still cuts the stray tokens of the tail.
Sizes are chosen to finish within 15 minutes on 2 CPU cores, install included (docs/learning.md).
"""
from spiral_jax.config import config_from_file


def get_config():
    """configs/tiny_tictactoe.py's model, optimiser and schedule, on Pig."""
    c = config_from_file("tiny_tictactoe.py", relative_to=__file__)
    c.out_dir = "runs/tiny_pig"
    c.games.update(env_ids=("PigDiceState-v1",), weights=(1.0,), max_turns=400)
    c.rollout.update(games_per_batch=16)  # a game of Pig runs to dozens of moves: fewer games a step
    c.eval.temperature = 1.0
    # The format is learnt within 100 steps; longer imitation at this rate only waits for an Adam
    # spike (docs/learning.md).
    c.bootstrap.steps = 100
    return c
