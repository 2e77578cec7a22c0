"""Preset: the paper's Kuhn run (spiral_kuhn_qwen3_4b.py) on one host with 8x H100 80 GB.

JAX preallocates 75% of each GPU by default, so the planner plans for 60 GB (55.9 GiB) per GPU. Qwen3-4B
is split 8 ways over `tensor` and not over fsdp, so the train and sample layouts agree and the sampler
reads the train state (no second copy). Numbers from the memory planner, per GPU (GiB): parameters 1.87
+ Adam 3.75 + gradients 3.75 + gathered weights 0.32 + activations of an 8-row micro-batch of 6144 slots
23.67 = 33.35 in the train step; 64 games in one sampler call: KV cache 6.75 + prefill 9.82 = 22.20.
Peak 33.35 of 55.9 GiB (60%, the train step). Evaluation keeps the paper config's 128 games (512 in the
final one) and plays them 64 at a time (rollout.games_per_batch), so its sampler call is the rollout's:
more evaluation games cost time, not memory.

    spiral-jax plan  --config configs/kuhn_qwen3_4b_8xh100.py --hardware 8xH100
    spiral-jax train --config configs/kuhn_qwen3_4b_8xh100.py --config.model.path=/ckpt/Qwen3-4B-Base
"""
from spiral_jax.config import config_from_file


def get_config():
    c = config_from_file("spiral_kuhn_qwen3_4b.py", relative_to=__file__)
    c.mesh.update(data=1, fsdp=1, tensor=8)
    c.optim.micro_batch_size = 8
    c.rollout.games_per_batch = 64
    return c
