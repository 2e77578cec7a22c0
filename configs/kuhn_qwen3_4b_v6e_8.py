"""Preset: the paper's Kuhn run (spiral_kuhn_qwen3_4b.py) on a Cloud TPU v6e-8 (8 chips x 32 GB HBM).

Mesh: tensor 8 (data 1, fsdp 1). Qwen3-4B split 8 ways over `tensor`, not over fsdp: the train and
sample layouts agree, so the sampler reads the train state (no second copy of the weights). Micro-
batch 8 rows of 6144 slots (2048 prompt + 4096 new tokens). Rollout and evaluation run the
continuous schedule: a decode engine of 16 slots (rollout.max_in_flight) plays each batch of 32
games (rollout.games_per_batch), in less than half the decode steps of 32-game sampler calls and,
with the Pallas decode kernel reading each row's filled cache only, about a third of the bytes per
token (docs/performance.md); more evaluation games cost time, not memory. `spiral-jax plan` prints
the memory per chip (docs/memory.md has the table).

    spiral-jax plan  --config configs/kuhn_qwen3_4b_v6e_8.py --hardware v6e-8
    spiral-jax train --config configs/kuhn_qwen3_4b_v6e_8.py --config.model.path=/ckpt/Qwen3-4B-Base
"""
from spiral_jax.config import config_from_file


def get_config():
    c = config_from_file("spiral_kuhn_qwen3_4b.py", relative_to=__file__)
    c.mesh.update(data=1, fsdp=1, tensor=8)
    c.optim.micro_batch_size = 8
    c.rollout.update(games_per_batch=32, schedule="continuous", max_in_flight=16)
    return c
