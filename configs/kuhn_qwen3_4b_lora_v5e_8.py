"""Preset: the paper's Kuhn recipe (spiral_kuhn_qwen3_4b.py) on Qwen3-4B-Base with LoRA, on a Cloud TPU
v5e-8 (v5litepod-8: 8 chips x 16 GB HBM).

The full fine-tune on this slice (kuhn_qwen3_4b_v5e_8.py) spends most of each chip on fp32
weights, AdamW moments and gradients, so it takes micro-batches of 2 rows and 8 games per sampler
call. With LoRA (rank 32 on every attention and MLP projection, alpha 64) the weights are frozen in
bf16 and only the adapters carry optimiser state, which frees room for micro-batches of 8 rows and
32 games per call, which a decode engine of 16 slots plays (the continuous schedule,
rollout.max_in_flight: fewer decode steps and bytes per token than 32-game sampler calls;
docs/performance.md). Mesh: tensor 8, as the full fine-tune. The learning rate is LoRA's usual order
(1e-5): a starting point, not tuned. `spiral-jax plan --compile` checks it with the TPU compiler.

    spiral-jax plan  --config configs/kuhn_qwen3_4b_lora_v5e_8.py --hardware v5e-8 --compile
    spiral-jax train --config configs/kuhn_qwen3_4b_lora_v5e_8.py --config.model.path=/ckpt/Qwen3-4B-Base
"""
from spiral_jax.config import config_from_file


def get_config():
    c = config_from_file("spiral_kuhn_qwen3_4b.py", relative_to=__file__)
    c.out_dir = "runs/kuhn_qwen3_4b_lora_v5e_8"
    c.model.lora.update(rank=32, alpha=64.0)
    c.optim.learning_rate = 1e-5
    c.mesh.update(data=1, fsdp=1, tensor=8)
    c.optim.micro_batch_size = 8
    c.rollout.update(games_per_batch=32, schedule="continuous", max_in_flight=16)
    return c
