"""Preset: the paper's Kuhn run (spiral_kuhn_qwen3_4b.py) on a Cloud TPU v5p-8: 4 chips x 95 GB HBM.

A v5p-8 is 4 chips (JAX sees 4 devices). Qwen3-4B is split 4 ways over `tensor` and not over fsdp, so
the train and sample layouts agree and the sampler reads the train state (no second copy). Numbers from
the memory planner, per chip (GiB): parameters 3.75 + Adam 7.49 + gradients 7.49 + gathered weights 0.64
+ activations of an 8-row micro-batch of 6144 slots 38.14 = 57.51 in the train step; 32 games in one
sampler call: KV cache 6.75 + prefill 9.20 = 27.19. Peak 57.51 of 88.5 GiB (65%, the train step); 64
games would be 43.14 in sampling, still under it. Evaluation keeps the paper config's 128 games (512 in
the final one) and plays them 32 at a time (rollout.games_per_batch), so its sampler call is the
rollout's: more games cost time, not memory.

    spiral-jax plan  --config configs/kuhn_qwen3_4b_v5p_8.py --hardware v5p-8
    spiral-jax train --config configs/kuhn_qwen3_4b_v5p_8.py --config.model.path=/ckpt/Qwen3-4B-Base
"""
from spiral_jax.config import config_from_file


def get_config():
    c = config_from_file("spiral_kuhn_qwen3_4b.py", relative_to=__file__)
    c.mesh.update(data=1, fsdp=1, tensor=4)
    c.optim.micro_batch_size = 8
    c.rollout.games_per_batch = 32
    return c
