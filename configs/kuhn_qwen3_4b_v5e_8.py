"""Preset: the paper's Kuhn run (spiral_kuhn_qwen3_4b.py) on a Cloud TPU v5e-8 (v5litepod-8: 8 chips x
16 GB HBM).

Mesh: tensor 8 (data 1, fsdp 1). Qwen3-4B split 8 ways over `tensor`, not over fsdp: the train and
sample layouts agree, so the sampler reads the train state (no second copy of the weights). The
tightest preset: if it runs out of memory, --config.rollout.max_prompt_len=1024
--config.rollout.max_new_tokens=3072 shortens rows. Micro-batch 2 rows of 6144 slots (2048 prompt +
4096 new tokens); rollout and evaluation play 8 games at a time (rollout.games_per_batch) through a
decode engine of 8 slots (the continuous schedule: a game's next move takes a slot as soon as one
is free, where a sampler call would wait for its longest response; docs/performance.md), so more
evaluation games cost time, not memory. `spiral-jax plan` prints the memory per chip
(docs/memory.md has the table).

    spiral-jax plan  --config configs/kuhn_qwen3_4b_v5e_8.py --hardware v5e-8
    spiral-jax train --config configs/kuhn_qwen3_4b_v5e_8.py --config.model.path=/ckpt/Qwen3-4B-Base
"""
from spiral_jax.config import config_from_file


def get_config():
    c = config_from_file("spiral_kuhn_qwen3_4b.py", relative_to=__file__)
    c.mesh.update(data=1, fsdp=1, tensor=8)
    c.optim.micro_batch_size = 2
    c.rollout.update(games_per_batch=8, schedule="continuous", max_in_flight=8)
    return c
