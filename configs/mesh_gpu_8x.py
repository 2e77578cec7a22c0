"""Mesh preset: the paper's Kuhn run on one host with 8 GPUs (e.g. 8x H100 80GB, the paper's setup).

Same split as the TPU preset (fsdp 2 x tensor 4): ~8 GB of training state and ~4 GB of sampling
weights per GPU leave room for 64 games in flight (KV cache ~7 GB per GPU in bf16). Estimates from
the shapes, not measurements. Install with `pip install -e '.[cuda]'`.

    spiral-jax train --config configs/mesh_gpu_8x.py --config.model.path=/ckpt/Qwen3-4B-Base
"""
from spiral_jax.config import config_from_file


def get_config():
    c = config_from_file("spiral_kuhn_qwen3_4b.py", relative_to=__file__)
    c.mesh.update(data=1, fsdp=2, tensor=4)
    c.rollout.games_per_batch = 64
    c.optim.micro_batch_size = 16
    return c
