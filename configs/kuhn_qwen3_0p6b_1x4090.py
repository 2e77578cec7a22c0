"""Preset: the paper's Kuhn recipe (spiral_kuhn_qwen3_4b.py) with Qwen3-0.6B-Base on one 24-48 GB
GPU (planned for the smallest, an RTX 4090 with 24 GB; L40S and RTX A6000 have 48 GB).

Qwen3-1.7B does not fit 48 GB: with one row a micro-batch and 8 games a call its train step needs
35 GiB, above the 30 GiB the planner allows there (75% usable, JAX's default preallocation, less
10% headroom); its fp32 parameters and AdamW moments alone are 19 GiB.
Qwen3-0.6B does, at the paper's lengths and sizes otherwise: 128 samples a step, 2 PPO epochs, bf16
compute, remat. On 24 GB that takes micro-batches of 1 row of 6144 slots (2048 prompt + 4096 new
tokens) and 8 games at a time (rollout.games_per_batch) through a decode engine of 8 slots (the
continuous schedule: a game's next move takes a slot as soon as one is free; docs/performance.md):
more micro-batches and more decode calls per step, the same update. On a 48 GB card the planner
fits micro-batch 4 and 16 games at a time: add --config.optim.micro_batch_size=4
--config.rollout.games_per_batch=16 --config.rollout.max_in_flight=16.
On one GPU the layers run unrolled (model.scan_layers off): XLA:GPU then adds each layer's
gradients to the accumulator as the backward makes them, instead of holding a whole micro-batch's,
and reads each layer's weights in place. Remat keeps the MLP's gate and up projections from the
forward (model.remat_saves), which spares half the products remat would run again; the memory
that frees pays for them (docs/performance.md).
`spiral-jax plan` prints the memory (docs/memory.md has the table).

    spiral-jax plan  --config configs/kuhn_qwen3_0p6b_1x4090.py --hardware 1x4090
    spiral-jax train --config configs/kuhn_qwen3_0p6b_1x4090.py --config.model.path=/ckpt/Qwen3-0.6B-Base
"""
from spiral_jax.config import config_from_file
from spiral_jax.models.shapes import QWEN3


def get_config():
    c = config_from_file("spiral_kuhn_qwen3_4b.py", relative_to=__file__)
    c.out_dir = "runs/kuhn_qwen3_0p6b_1x4090"
    c.model.path = "/path/to/Qwen3-0.6B-Base"
    c.model.random.update(**QWEN3["0.6b"])  # the shape, used only when model.path is empty
    c.model.update(scan_layers=False, remat_saves=("mlp",))
    c.mesh.update(data=1, fsdp=1, tensor=1)
    c.optim.micro_batch_size = 1
    c.rollout.update(games_per_batch=8, schedule="continuous", max_in_flight=8)
    return c
