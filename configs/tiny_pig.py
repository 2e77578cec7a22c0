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
from spiral_jax.config import base_config


def get_config():
    c = base_config()
    c.out_dir = "runs/tiny_pig"
    c.model.random.update(model_type="qwen3", vocab_size=2048, hidden_size=64, intermediate_size=256,
                          num_layers=4, num_heads=4, num_kv_heads=2, head_dim=16,
                          tie_word_embeddings=True, max_position_embeddings=512, rope_theta=10000.0)
    c.model.remat = False  # tiny activations; recomputing them only costs time
    c.tokenizer.path = "embedded"
    c.games.update(env_ids=("PigDiceState-v1",), weights=(1.0,), max_turns=400)
    c.rollout.update(mode="self_play", games_per_batch=16, samples_per_step=128, max_new_tokens=8,
                     max_prompt_len=256)
    # Two PPO epochs per batch with clip 0.2, as the reference trains; micro-batches of 16 rows keep a
    # layer's activations in the CPU's cache (docs/performance.md).
    c.optim.update(learning_rate=3e-4, normaliser="token_mean", micro_batch_size=16, epochs=2, clip=0.2)
    c.train.update(steps=100, eval_every=25, checkpoint_every=25)
    c.eval.update(games=64, final_games=200, max_new_tokens=8, opponents=("random", "scripted"),
                  temperature=1.0)
    # The format is learnt within 100 steps; longer imitation at this rate only waits for an Adam
    # spike (docs/learning.md).
    c.bootstrap.update(enabled=True, teacher="hashed", hash_uniform=0.5, steps=100, batch_size=64,
                       learning_rate=3e-3, warmup_steps=50, explore=0.5)
    return c
