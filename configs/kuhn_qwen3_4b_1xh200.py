"""Preset: the paper's Kuhn run (spiral_kuhn_qwen3_4b.py) on one NVIDIA H200 (141 GB).

One device: no mesh to choose, the sampler reads the train state. Micro-batch 2 rows of 6144 slots
(2048 prompt + 4096 new tokens). Rollout and evaluation run the continuous schedule: a decode engine
of 16 slots (rollout.max_in_flight) plays each batch of 32 games (rollout.games_per_batch), a game's
next move taking the first slot that frees. At the paper's lengths that decodes the same tokens in
less than half the steps, and reads less than half the bytes per token, of 32-game sampler calls run
each to its longest row (docs/performance.md); more evaluation games cost time, not memory.
Everything else is the paper's: 128 samples a step, 2 PPO epochs, bf16 compute, remat. On one GPU
the layers run unrolled (model.scan_layers off): XLA:GPU then adds each layer's gradients to the
accumulator as the backward makes them, instead of holding a whole micro-batch's, and reads each
layer's weights in place. Remat keeps the MLP's gate and up projections from the forward
(model.remat_saves), which spares half the products remat would run again; the memory that frees
pays for them (docs/performance.md).
The planner counts 75% of the card (JAX's default preallocation); `spiral-jax plan` prints the
memory (docs/memory.md has the table).

    spiral-jax plan  --config configs/kuhn_qwen3_4b_1xh200.py --hardware 1xH200
    spiral-jax train --config configs/kuhn_qwen3_4b_1xh200.py --config.model.path=/ckpt/Qwen3-4B-Base
"""
from spiral_jax.config import config_from_file


def get_config():
    c = config_from_file("spiral_kuhn_qwen3_4b.py", relative_to=__file__)
    c.out_dir = "runs/kuhn_qwen3_4b_1xh200"
    c.model.update(scan_layers=False, remat_saves=("mlp",))
    c.mesh.update(data=1, fsdp=1, tensor=1)
    c.optim.micro_batch_size = 2
    c.rollout.update(games_per_batch=32, schedule="continuous", max_in_flight=16)
    return c
