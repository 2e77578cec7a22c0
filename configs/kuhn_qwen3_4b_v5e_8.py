"""Preset: the paper's Kuhn run (spiral_kuhn_qwen3_4b.py) on a Cloud TPU v5e-8 (v5litepod-8): 8 chips
x 16 GB HBM.

Not the paper's lengths: at 2048 prompt + 4096 new tokens a training row is 8192 slots, and the
planner finds no mesh where even one such row fits next to Qwen3-4B's fp32 weights, Adam state and
gradients (9.4 GiB per chip): 14.4 GiB at best, 97% of the 14.9 usable. Here prompts are capped at
1024 tokens (Kuhn prompts are under ~500) and responses at 3072, so rows are 4096 slots; the loss
normaliser stays 4096.
Qwen3-4B is split 8 ways over `tensor` (no fsdp: train and sample layouts agree, no second copy).
Numbers from the memory planner, per chip (GiB): parameters 1.87 + Adam 3.75 + gradients 3.75 +
gathered weights 0.32 + activations of one row 1.63 = 11.31 in the train step; 16 games in one
sampler call: KV cache 1.41 + prefill 2.75 = 9.77. Peak 11.31 of 14.9 GiB (76%). Evaluation plays
all its games in one sampler call, so eval.games and eval.final_games are 16 (paper config: 128 / 512).

    spiral-jax plan  --config configs/kuhn_qwen3_4b_v5e_8.py --hardware v5e-8
    spiral-jax train --config configs/kuhn_qwen3_4b_v5e_8.py --config.model.path=/ckpt/Qwen3-4B-Base
"""
from spiral_jax.config import config_from_file


def get_config():
    c = config_from_file("spiral_kuhn_qwen3_4b.py", relative_to=__file__)
    c.mesh.update(data=1, fsdp=1, tensor=8)
    c.optim.micro_batch_size = 1
    c.rollout.games_per_batch = 16
    c.eval.update(games=16, final_games=16)  # evaluation plays all its games in one sampler call
    c.rollout.update(max_prompt_len=1024, max_new_tokens=3072)
    c.eval.max_new_tokens = 3072
    return c
