"""Self-play RL on one hand of Kuhn poker, from a format-only start, on a laptop CPU.

The tiny Qwen3-architecture model of configs/tiny_tictactoe.py plays KuhnPokerChips-v0: one
textbook hand (J < Q < K, player 0 opens) whose reward is the chips won, the unit Kuhn
exploitability is measured in. The bootstrap imitates the `hashed` teacher: a random move
distribution per observation, no strategy, but one that makes the model read its card and the
betting (see docs/learning.md for why uniform random targets do not). Then self-play REINFORCE with
RAE, both seats one policy. The exact exploitability of the model's policy is read at step 0, every
`eval_every` steps and at the end (out_dir/summary.json, TensorBoard eval/kuhn/*).
"""
from spiral_jax.config import config_from_file


def get_config():
    c = config_from_file("tiny_tictactoe.py", relative_to=__file__)
    c.out_dir = "runs/tiny_kuhn"
    c.games.update(env_ids=("KuhnPokerChips-v0",), weights=(1.0,))
    c.rollout.update(games_per_batch=64, samples_per_step=128, selection="exact", max_new_tokens=8)
    c.optim.update(learning_rate=3e-4, normaliser="token_mean", micro_batch_size=64)
    c.train.update(steps=200, eval_every=20, checkpoint_every=50)
    c.eval.update(games=64, final_games=400, max_new_tokens=8, opponents=("random", "scripted"),
                  kuhn_samples=0)
    c.bootstrap.update(enabled=True, teacher="hashed", hash_uniform=0.2, steps=1200, batch_size=16,
                       learning_rate=3e-3, warmup_steps=50, explore=0.5)
    return c
