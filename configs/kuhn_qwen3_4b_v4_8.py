"""Preset: the paper's Kuhn run (spiral_kuhn_qwen3_4b.py) on a Cloud TPU v4-8: 4 chips x 32 GiB HBM.

A v4-8 is 4 chips (JAX sees 4 devices). Qwen3-4B is split 4 ways over `tensor` and not over fsdp, so the
train and sample layouts agree and the sampler reads the train state (no second copy of the weights).
Numbers from the memory planner, per chip (GiB): parameters 3.75 + Adam 7.49 + gradients 7.49 + gathered
weights 0.64 + activations of one 6144-slot row (2048 prompt + 4096 new tokens) 4.81 = 24.18 in the
train step; 16 games in one sampler call: KV cache 3.38 + prefill 4.60 = 19.21. Peak 24.18 of 32 GiB
(76%, the train step); a 2-row micro-batch would be 28.95 (90%, above the planner's limit), 32 games
27.19 in sampling (85%). Evaluation keeps the paper config's 128 games (512 in the final one) and plays
them 16 at a time (rollout.games_per_batch), so its sampler call is the rollout's: more games cost time,
not memory.

    spiral-jax plan  --config configs/kuhn_qwen3_4b_v4_8.py --hardware v4-8
    spiral-jax train --config configs/kuhn_qwen3_4b_v4_8.py --config.model.path=/ckpt/Qwen3-4B-Base
"""
from spiral_jax.config import config_from_file


def get_config():
    c = config_from_file("spiral_kuhn_qwen3_4b.py", relative_to=__file__)
    c.mesh.update(data=1, fsdp=1, tensor=4)
    c.optim.micro_batch_size = 1
    c.rollout.games_per_batch = 16
    return c
