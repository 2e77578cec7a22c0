"""Preset: the paper's Kuhn run (spiral_kuhn_qwen3_4b.py) on one host with 8x H100 80 GB.

Mesh: tensor 8 (data 1, fsdp 1). Qwen3-4B split 8 ways over `tensor`, not over fsdp: the train and
sample layouts agree, so the sampler reads the train state (no second copy of the weights). Micro-
batch 8 rows of 6144 slots (2048 prompt + 4096 new tokens). Rollout and evaluation run the
continuous schedule: a decode engine of 32 slots (rollout.max_in_flight) plays each batch of 64
games (rollout.games_per_batch): at the paper's lengths less than half the decode steps, and less
than half the bytes read per token, of 64-game sampler calls (docs/performance.md); more evaluation
games cost time, not memory. The layers run unrolled (model.scan_layers off: XLA:GPU adds each
layer's gradients to the accumulator as the backward makes them and reads the weights in place), and
remat keeps the q/k/v and the MLP's gate and up projections from the forward (model.remat_saves): a
sixth fewer products a step, in memory the split weights leave free (docs/performance.md).
`spiral-jax plan` prints the memory per chip (docs/memory.md has the table).

    spiral-jax plan  --config configs/kuhn_qwen3_4b_8xh100.py --hardware 8xH100
    spiral-jax train --config configs/kuhn_qwen3_4b_8xh100.py --config.model.path=/ckpt/Qwen3-4B-Base
"""
from spiral_jax.config import config_from_file


def get_config():
    c = config_from_file("spiral_kuhn_qwen3_4b.py", relative_to=__file__)
    c.model.update(scan_layers=False, remat_saves=("qkv", "mlp"))
    c.mesh.update(data=1, fsdp=1, tensor=8)
    c.optim.micro_batch_size = 8
    c.rollout.update(games_per_batch=64, schedule="continuous", max_in_flight=32)
    return c
