"""The paper's Kuhn Poker run: Qwen3-4B-Base, self-play with RAE, PPO-form learner (2 epochs).

Numbers from the SPIRAL paper and its reference code (spiral-rl/spiral on Oat): 128 turn samples per
step, ~400 steps, lr 1e-6 constant (no warm-up), Adam(0.9, 0.95, eps 1e-8), no weight decay, global
norm clip 1.0, up to 4096 new tokens at temperature 1.0 (top-p 1, no top-k), PPO with 2 epochs and
clip 0.2 (the first epoch is exactly REINFORCE), per-sequence loss sum divided by 4096 then averaged,
invalid move -1.5 / +0.5, 50-turn limit, RAE decay 0.95 with baselines per shard of 2 games a step
(the memory of the reference's 8 actors with their own baselines, whatever games_per_batch a hardware
preset picks), bf16 compute, gradient checkpointing.
Evaluation every 16 steps at temperature 0.6, top-p 0.95, on Kuhn poker and TicTacToe (as the reference
does online), against the random and scripted players. The reference evaluates 16 games online and
512 offline; here 128 every 16 steps (tighter intervals for the curves) and 512 at the end.

    spiral-jax train --config configs/spiral_kuhn_qwen3_4b.py --config.model.path=/ckpt/Qwen3-4B-Base
"""
from spiral_jax.config import base_config


def get_config():
    c = base_config()
    c.out_dir = "runs/spiral_kuhn_qwen3_4b"
    c.model.update(path="/path/to/Qwen3-4B-Base", compute_dtype="bfloat16", scan_layers=True, remat=True)
    # Qwen3-4B's architecture, used only when model.path is empty (random weights, e.g. for tests).
    c.model.random.update(model_type="qwen3", vocab_size=151936, hidden_size=2560, intermediate_size=9728,
                          num_layers=36, num_heads=32, num_kv_heads=8, head_dim=128,
                          tie_word_embeddings=True, max_position_embeddings=40960, rope_theta=1000000.0)
    c.games.update(env_ids=("KuhnPoker-v1",), weights=(1.0,), invalid_rewards=(-1.5, 0.5), max_turns=50)
    c.rollout.update(mode="self_play", games_per_batch=64, samples_per_step=128, selection="exact",
                     max_new_tokens=4096, temperature=1.0, top_p=1.0, top_k=0, max_prompt_len=2048)
    c.optim.update(learning_rate=1e-6, epochs=2, clip=0.2, normaliser="constant",
                   normaliser_constant=4096.0, micro_batch_size=8)
    c.rae.update(enabled=True, decay=0.95, games_per_shard=2)
    c.train.update(steps=400, eval_every=16, checkpoint_every=16)
    c.eval.update(env_ids=("KuhnPoker-v1", "TicTacToe-v0"), games=128, final_games=512, temperature=0.6,
                  top_p=0.95, max_new_tokens=4096, opponents=("random", "scripted"))
    return c
