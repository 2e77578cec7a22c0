"""Preset: the paper's Kuhn run (spiral_kuhn_qwen3_4b.py) on a Cloud TPU v5e-8 (v5litepod-8): 8 chips
x 16 GB HBM.

The tightest of the presets. Qwen3-4B is split 8 ways over `tensor` and not over fsdp, so the train
and sample layouts agree and the sampler reads the train state (no second copy of the weights).
Numbers from the memory planner, per chip (GiB): parameters 1.87 + Adam 3.75 + gradients 3.75 +
gathered weights 0.32 + activations of one 6144-slot row (2048 prompt + 4096 new tokens) 3.00 =
12.69 in the train step; 8 games in one sampler call: KV cache 0.84 + prefill 1.23 = 7.69. Peak
12.69 of 14.9 GiB (85%, the train step); 16 games would be 9.76 in sampling, still under it. Evaluation
keeps the paper config's 128 games (512 in the final one) and plays them 8 at a time
(rollout.games_per_batch), so its sampler call is the rollout's: more games cost time, not memory.
If it runs out of memory, --config.rollout.max_new_tokens=3072 with
--config.rollout.max_prompt_len=1024 makes rows of 4096 slots (train step 11.31, 76%).

    spiral-jax plan  --config configs/kuhn_qwen3_4b_v5e_8.py --hardware v5e-8
    spiral-jax train --config configs/kuhn_qwen3_4b_v5e_8.py --config.model.path=/ckpt/Qwen3-4B-Base
"""
from spiral_jax.config import config_from_file


def get_config():
    c = config_from_file("spiral_kuhn_qwen3_4b.py", relative_to=__file__)
    c.mesh.update(data=1, fsdp=1, tensor=8)
    c.optim.micro_batch_size = 1
    c.rollout.games_per_batch = 8
    return c
