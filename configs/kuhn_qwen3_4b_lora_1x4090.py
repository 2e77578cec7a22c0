"""Preset: the paper's Kuhn recipe (spiral_kuhn_qwen3_4b.py) on Qwen3-4B-Base with LoRA, on one 24 GB
GPU (an RTX 4090; any card of 24 GB or more).

Full fine-tuning of Qwen3-4B needs fp32 weights, AdamW moments and gradients: 64 GB before the
first activation. LoRA freezes the weights in bf16 (7.5 GiB) and trains rank-32 adapters on every
attention and MLP projection (about 33M parameters, with their Adam state under 0.5 GiB); the sampler
applies the adapters in its forward (model.lora.sample="adapters"): a merged bf16 copy would not fit
beside the frozen one. The layers run unrolled (model.scan_layers off): a decode step's products then
read each layer's frozen weights in place, where out of a stack XLA:GPU copied them every step, and
the step moves about its memory floor rather than 2.7 times it (docs/performance.md). The rest is
the paper's recipe: 128 samples a step, up to 4096 new tokens, 2 PPO epochs, remat, micro-batches of
one row of 6144 slots, 4 games at a time through a decode engine of 4 slots (the continuous
schedule: a game's next move takes a slot as soon as one is free). The learning rate is LoRA's usual
order (1e-5), not the full fine-tune's 1e-6: a starting point, not tuned. `spiral-jax plan` prints
the memory (docs/memory.md).

    spiral-jax plan  --config configs/kuhn_qwen3_4b_lora_1x4090.py --hardware 1x4090
    spiral-jax train --config configs/kuhn_qwen3_4b_lora_1x4090.py --config.model.path=/ckpt/Qwen3-4B-Base
    spiral-jax export --config configs/kuhn_qwen3_4b_lora_1x4090.py --out adapter/ --adapter   # PEFT folder
"""
from spiral_jax.config import config_from_file


def get_config():
    c = config_from_file("spiral_kuhn_qwen3_4b.py", relative_to=__file__)
    c.out_dir = "runs/kuhn_qwen3_4b_lora_1x4090"
    c.model.lora.update(rank=32, alpha=64.0, sample="adapters")
    c.model.scan_layers = False
    c.optim.learning_rate = 1e-5
    c.mesh.update(data=1, fsdp=1, tensor=1)
    c.optim.micro_batch_size = 1
    c.rollout.update(games_per_batch=4, schedule="continuous", max_in_flight=4)
    return c
