"""Preset: the paper's Kuhn recipe (spiral_kuhn_qwen3_4b.py) with Qwen3-1.7B-Base on one 80 GB GPU
(NVIDIA H100 or A100 80 GB).

Qwen3-4B does not fit one 80 GB card: its fp32 parameters and AdamW moments alone are 45 GiB of the
56 GiB the planner counts (75%, JAX's default preallocation), before gradients and activations.
Qwen3-1.7B is the largest Qwen3 that does, at the paper's lengths and sizes otherwise: 128 samples a
step, 2 PPO epochs, bf16 compute, remat. Micro-batch 2 rows of 6144 slots (2048 prompt + 4096 new
tokens). Rollout and evaluation run the continuous schedule, a decode engine of 16 slots
(rollout.max_in_flight) for each batch of 32 games (rollout.games_per_batch): at the paper's lengths
less than half the decode steps and bytes per token of 32-game sampler calls (docs/performance.md).
On one GPU the layers run unrolled (model.scan_layers off): XLA:GPU then adds each layer's
gradients to the accumulator as the backward makes them, instead of holding a whole micro-batch's,
and reads each layer's weights in place. Remat keeps the MLP's gate and up projections from the
forward (model.remat_saves), which spares half the products remat would run again; the memory
that frees pays for them (docs/performance.md).
`spiral-jax plan` prints the memory (docs/memory.md has the table).

    spiral-jax plan  --config configs/kuhn_qwen3_1p7b_1xh100.py --hardware 1xH100
    spiral-jax train --config configs/kuhn_qwen3_1p7b_1xh100.py --config.model.path=/ckpt/Qwen3-1.7B-Base
"""
from spiral_jax.config import config_from_file
from spiral_jax.models.shapes import QWEN3


def get_config():
    c = config_from_file("spiral_kuhn_qwen3_4b.py", relative_to=__file__)
    c.out_dir = "runs/kuhn_qwen3_1p7b_1xh100"
    c.model.path = "/path/to/Qwen3-1.7B-Base"
    c.model.random.update(**QWEN3["1.7b"])  # the shape, used only when model.path is empty
    c.model.update(scan_layers=False, remat_saves=("mlp",))
    c.mesh.update(data=1, fsdp=1, tensor=1)
    c.optim.micro_batch_size = 2
    c.rollout.update(games_per_batch=32, schedule="continuous", max_in_flight=16)
    return c
