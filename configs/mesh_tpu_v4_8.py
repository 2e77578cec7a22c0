"""Mesh preset: the paper's Kuhn run (spiral_kuhn_qwen3_4b.py) on a Cloud TPU v4-8: 4 chips x 32 GiB
HBM (the name counts TensorCores, two per chip; JAX sees 4 devices).

Mesh: tensor 4 (data 1, fsdp 1): training and sampling both split Qwen3-4B's weights 4 ways over
`tensor`, so the layouts agree and the sampler reads the train state (no second copy). Micro-batch 4
rows of 6144 slots; rollout and evaluation play 16 games per sampler call. The same sizing as
kuhn_qwen3_4b_v4_8.py. On an 8-chip slice, --config.mesh.fsdp=-1 gives fsdp 2, which needs
--config.optim.micro_batch_size=2 (a multiple of data x fsdp); v5e chips (16 GB) need tensor 8
(kuhn_qwen3_4b_v5e_8.py). `spiral-jax plan` prints the memory per chip (docs/memory.md).

    spiral-jax plan  --config configs/mesh_tpu_v4_8.py --hardware v4-8
    spiral-jax train --config configs/mesh_tpu_v4_8.py --config.model.path=/ckpt/Qwen3-4B-Base
"""
from spiral_jax.config import config_from_file


def get_config():
    c = config_from_file("spiral_kuhn_qwen3_4b.py", relative_to=__file__)
    c.mesh.update(data=1, fsdp=1, tensor=4)
    c.rollout.games_per_batch = 16
    c.optim.micro_batch_size = 4
    return c
