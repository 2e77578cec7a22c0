"""Mesh preset: the paper's Kuhn run (spiral_kuhn_qwen3_4b.py) on one host with 8 GPUs (e.g. 8x H100
80 GB, the paper's setup). Install with `pip install -e '.[cuda]'`.

Training shards weights over fsdp 2 x tensor 4 (all 8 GPUs), sampling over tensor 4 (its own copy of the
weights). Numbers from the memory planner (`spiral-jax plan --config configs/mesh_gpu_8x.py --hardware
8xH100`, which plans 75% of each GPU, JAX's default preallocation: 55.9 GiB), per GPU (GiB): parameters
1.87 + Adam 3.75 + sampler's copy 3.75 + gradients 3.75 + gathered weights 1.55 + activations of an
8-row micro-batch (4 rows per GPU) of 6144 slots 19.07 = 33.74 in the train step; 64 games per sampler
call: KV cache 6.75 + prefill 9.20 = 25.32. Peak 33.74 of 55.9 (60%, the train step). Rollout and the
paper's 128-game evaluations (512 final) play 64 games at a time (rollout.games_per_batch). A 16-row
micro-batch (this preset's old value) would be 52.78 (94%, above the planner's 90% limit). Needs 8
devices: on fewer, the planner warns and suggests a mesh. kuhn_qwen3_4b_8xh100.py (tensor 8, no second
copy) peaks at 33.35.

With `--config.mesh.fsdp=-1` on 2 such hosts (16 GPUs, planned as one mesh: fsdp 4 x tensor 4):
train step 19.52, sampling 14.53, peak 35% (the train step).

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
