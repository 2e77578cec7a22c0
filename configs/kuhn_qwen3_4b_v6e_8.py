"""Preset: the paper's Kuhn run (spiral_kuhn_qwen3_4b.py) on a Cloud TPU v6e-8: 8 chips x 32 GB HBM.

Qwen3-4B is split 8 ways over `tensor` and not over fsdp, so the train and sample layouts agree and the
sampler reads the train state (no second copy). Numbers from the memory planner, per chip (GiB):
parameters 1.87 + Adam 3.75 + gradients 3.75 + gathered weights 0.32 + activations of a 4-row
micro-batch of 6144 slots 11.86 = 21.55 in the train step; 32 games in one sampler call: KV cache 3.38 +
prefill 4.91 = 13.91. Peak 21.55 of 29.8 GiB (72%, the train step). Evaluation keeps the paper config's
128 games (512 in the final one) and plays them 32 at a time (rollout.games_per_batch), so its sampler
call is the rollout's: more evaluation games cost time, not memory.

    spiral-jax plan  --config configs/kuhn_qwen3_4b_v6e_8.py --hardware v6e-8
    spiral-jax train --config configs/kuhn_qwen3_4b_v6e_8.py --config.model.path=/ckpt/Qwen3-4B-Base
"""
from spiral_jax.config import config_from_file


def get_config():
    c = config_from_file("spiral_kuhn_qwen3_4b.py", relative_to=__file__)
    c.mesh.update(data=1, fsdp=1, tensor=8)
    c.optim.micro_batch_size = 4
    c.rollout.games_per_batch = 32
    return c
