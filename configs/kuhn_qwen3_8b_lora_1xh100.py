"""Preset: the paper's Kuhn recipe (spiral_kuhn_qwen3_4b.py) on Qwen3-8B-Base with LoRA, on one 80 GB
GPU (H100 or A100 80 GB; an H200 takes it with room to spare).

Full fine-tuning of Qwen3-8B needs about 130 GB of fp32 weights, AdamW moments and gradients. LoRA
freezes the weights in bf16 (15 GiB) and trains rank-32 adapters on every attention and MLP
projection; the sampler reads the adapters merged into a second bf16 copy. The rest is the paper's
recipe: 128 samples a step, up to 4096 new tokens, 2 PPO epochs, remat; micro-batches of 1 row of
6144 slots, 16 games at a time through a decode engine of 16 slots (the continuous schedule: a
game's next move takes a slot as soon as one is free). The layers run unrolled (model.scan_layers
off: XLA:GPU reads each layer's weights in place rather than copying them out of a stack), and remat
keeps the MLP's gate and up projections from the forward (model.remat_saves), which spares two
thirds of the products it would run again; one row a micro-batch makes the room for them
(docs/performance.md).
The learning rate is LoRA's usual order (1e-5): a starting point, not tuned. `spiral-jax plan`
prints the memory (docs/memory.md).

    spiral-jax plan  --config configs/kuhn_qwen3_8b_lora_1xh100.py --hardware 1xH100
    spiral-jax train --config configs/kuhn_qwen3_8b_lora_1xh100.py --config.model.path=/ckpt/Qwen3-8B-Base
"""
from spiral_jax.config import config_from_file
from spiral_jax.models.shapes import QWEN3


def get_config():
    c = config_from_file("spiral_kuhn_qwen3_4b.py", relative_to=__file__)
    c.out_dir = "runs/kuhn_qwen3_8b_lora_1xh100"
    c.model.path = "/path/to/Qwen3-8B-Base"
    c.model.random.update(**QWEN3["8b"])  # the shape, used only when model.path is empty
    c.model.lora.update(rank=32, alpha=64.0)
    c.optim.learning_rate = 1e-5
    c.model.update(scan_layers=False, remat_saves=("mlp",))
    c.mesh.update(data=1, fsdp=1, tensor=1)
    c.optim.micro_batch_size = 1
    c.rollout.update(games_per_batch=16, schedule="continuous", max_in_flight=16)
    return c
