"""Mesh preset: the paper's Kuhn run (spiral_kuhn_qwen3_4b.py) on a Cloud TPU v4-8: 4 chips x 32 GiB
HBM.

A v4-8 is 4 chips (its name counts TensorCores, two per chip) and JAX sees 4 devices, one per chip. The
mesh is tensor 4 (data 1, fsdp 1): training and sampling both split Qwen3-4B's weights 4 ways over
`tensor`, so the layouts agree and the sampler reads the train state (no second copy). Numbers from the
memory planner (`spiral-jax plan --config configs/mesh_tpu_v4_8.py --hardware v4-8`), per chip (GiB):
parameters 3.75 + Adam 7.49 + gradients 7.49 + gathered weights 0.64 + activations of a 1-row
micro-batch of 6144 slots (2048 prompt + 4096 new tokens) 4.81 = 24.18 in the train step; 16 games per
sampler call: KV cache 3.38 + prefill 4.60 = 19.21. Peak 24.18 of 32 GiB (76%, the train step). Rollout
and the paper's 128-game evaluations (512 final) play 16 games at a time (rollout.games_per_batch). The
old fsdp 2 x tensor 4 needs 8 devices; fsdp 2 x tensor 2 (2-row micro-batch) would be 37.73 (118%). Same
sizing as kuhn_qwen3_4b_v4_8.py.

With `--config.mesh.fsdp=-1` on other slices: a v5p-8 (4 chips x 95 GB) gets the same mesh, peak
24.18 of 88.5 (27%; kuhn_qwen3_4b_v5p_8.py uses it better); an 8-chip slice gets fsdp 2, which needs
--config.optim.micro_batch_size=2 (a multiple of data x fsdp): v6e-8 19.45 of 29.8 (65%). A v5e
(16 GB chips) needs tensor 8: kuhn_qwen3_4b_v5e_8.py.

    spiral-jax plan  --config configs/mesh_tpu_v4_8.py --hardware v4-8
    spiral-jax train --config configs/mesh_tpu_v4_8.py --config.model.path=/ckpt/Qwen3-4B-Base
"""
from spiral_jax.config import config_from_file


def get_config():
    c = config_from_file("spiral_kuhn_qwen3_4b.py", relative_to=__file__)
    c.mesh.update(data=1, fsdp=1, tensor=4)
    c.rollout.games_per_batch = 16
    c.optim.micro_batch_size = 1
    return c
