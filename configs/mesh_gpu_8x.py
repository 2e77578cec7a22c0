"""Mesh preset: the paper's Kuhn run (spiral_kuhn_qwen3_4b.py) on one host with 8 GPUs (e.g. 8x H100
80 GB, the paper's setup). Install with `pip install -e '.[cuda]'`.

Mesh: fsdp 2 x tensor 4 for training (all 8 GPUs); sampling splits the weights over tensor 4 and keeps
its own copy of them. Micro-batch 8 rows (4 per GPU) of 6144 slots; rollout and evaluation play 64
games per sampler call. Needs 8 devices (on fewer, the planner suggests a mesh); on several such hosts
add --config.mesh.fsdp=-1. kuhn_qwen3_4b_8xh100.py (tensor 8, no second copy) needs less memory.
`spiral-jax plan` prints the memory per GPU (docs/memory.md has the table).

    spiral-jax plan  --config configs/mesh_gpu_8x.py --hardware 8xH100
    spiral-jax train --config configs/mesh_gpu_8x.py --config.model.path=/ckpt/Qwen3-4B-Base
"""
from spiral_jax.config import config_from_file


def get_config():
    c = config_from_file("spiral_kuhn_qwen3_4b.py", relative_to=__file__)
    c.mesh.update(data=1, fsdp=2, tensor=4)
    c.rollout.games_per_batch = 64
    c.optim.micro_batch_size = 8
    return c
