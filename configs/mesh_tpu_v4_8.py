"""Mesh preset: the paper's Kuhn run on an 8-chip TPU slice (v4-8: 32 GiB HBM per chip; v5p-8 too).

Training shards weights over fsdp x tensor (all 8 chips): Qwen3-4B's fp32 weights, fp32 gradients and
Adam moments are 4 x 16 GB = 64 GB, 8 GB per chip. Sampling shards weights over tensor (4 chips:
4 GB per chip) and the KV cache over the batch (data x fsdp) and KV heads (tensor): at 32 games in
flight x (2048 + 4096) slots in bf16, 36 layers x 8 KV heads x 128 x 2 x 2 bytes = 147 KB per slot,
about 29 GB in all, 3.6 GB per chip. These are estimates from the shapes, not measurements.

    spiral-jax train --config configs/mesh_tpu_v4_8.py --config.model.path=/ckpt/Qwen3-4B-Base
"""
from spiral_jax.config import config_from_file


def get_config():
    c = config_from_file("spiral_kuhn_qwen3_4b.py", relative_to=__file__)
    c.mesh.update(data=1, fsdp=2, tensor=4)
    c.rollout.games_per_batch = 32
    c.optim.micro_batch_size = 8
    return c
