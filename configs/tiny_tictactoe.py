"""The embedded default: a tiny Qwen3-architecture model learns TicTacToe on a laptop CPU.

Nothing is downloaded: the model is randomly initialised and the tokenizer is the small BPE the
project ships (scripts/build_tiny_tokenizer.py). A short, clearly labelled bootstrap stage first
teaches the answer format by imitating the scripted minimax player; then self-play RL with RAE
(the SPIRAL recipe, REINFORCE form) takes over, evaluated against the random and minimax opponents.
Sizes are chosen to finish within 15 minutes on 2 CPU cores, install included (measured: see README).
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
    c.rollout.update(games_per_batch=64, samples_per_step=128, max_new_tokens=12, max_prompt_len=256)
    c.optim.update(learning_rate=1e-4, normaliser="token_mean", micro_batch_size=64)
    c.train.update(steps=30, eval_every=10, checkpoint_every=10)
    c.eval.update(games=64, final_games=200, max_new_tokens=12, opponents=("random", "scripted"))
    c.bootstrap.update(enabled=True, steps=6000, batch_size=16, learning_rate=3e-3, warmup_steps=50)
    return c
