"""The embedded default: a tiny Qwen3-architecture model learns TicTacToe by self-play on a laptop CPU.

Nothing is downloaded: the model is randomly initialised and the tokenizer is the small BPE the
project ships (scripts/build_tiny_tokenizer.py). A short bootstrap first teaches the answer format
by imitating the `hashed` teacher: legal moves drawn from a random distribution per board, which
carries no strategy but makes the model read the board (docs/learning.md says why uniform random
targets do not). Then self-play RL with RAE (the SPIRAL recipe, REINFORCE form; one policy, both
seats) does the rest. The random and minimax opponents are for evaluation only: at step 0, every
`eval_every` steps and at the end (out_dir/summary.json holds step 0 and final side by side).
Sizes are chosen to finish within 15 minutes on 2 CPU cores, install included (docs/learning.md).

`--config.bootstrap.teacher=scripted` imitates the minimax player instead: that is imitation, not
self-play RL, and its numbers must be reported as such.
"""
from spiral_jax.config import base_config


def get_config():
    c = base_config()
    c.out_dir = "runs/tiny_tictactoe"
    c.model.random.update(model_type="qwen3", vocab_size=2048, hidden_size=64, intermediate_size=256,
                          num_layers=4, num_heads=4, num_kv_heads=2, head_dim=16,
                          tie_word_embeddings=True, max_position_embeddings=512, rope_theta=10000.0)
    c.model.remat = False  # tiny activations; recomputing them only costs time
    c.tokenizer.path = "embedded"
    c.games.env_ids = ("TicTacToe-v0",)
    c.games.weights = (1.0,)
    c.rollout.update(mode="self_play", games_per_batch=64, samples_per_step=128, max_new_tokens=8,
                     max_prompt_len=256)
    # Two PPO epochs per batch with clip 0.2, as the reference trains (docs/learning.md compares one
    # and two epochs over seeds). Micro-batches of 16 rows (bootstrap and RL) keep a layer's
    # activations in the CPU's cache: the same gradient in less time than whole batches
    # (docs/performance.md).
    c.optim.update(learning_rate=3e-4, normaliser="token_mean", micro_batch_size=16, epochs=2, clip=0.2)
    c.train.update(steps=100, eval_every=25, checkpoint_every=25)
    c.eval.update(games=64, final_games=200, max_new_tokens=8, opponents=("random", "scripted"))
    c.bootstrap.update(enabled=True, teacher="hashed", hash_uniform=0.5, steps=1500, batch_size=64,
                       learning_rate=3e-3, warmup_steps=50, explore=0.5)
    return c
