"""The hand-over from trainer to sampler: the same parameters, moved to the SAMPLE layout.

The trainer keeps its parameters on the TRAIN layout (weights over fsdp x tensor); the sampler wants
them on the SAMPLE layout (weights over tensor only, replicated across the batch axes, so decoding
needs no weight all-gathers). Where the two layouts differ, one jitted copy per step moves them; where
they agree (no mesh, or fsdp size 1) the sampler reads the train state's arrays directly.
"""
from __future__ import annotations

import jax

from spiral_jax.models import ModelConfig, param_shardings
from spiral_jax.sharding import Rules


def make_reshard(cfg: ModelConfig, mesh, src: str = "train", dst: str = "sample"):
    """params on the `src` layout -> the same values on the `dst` layout (the input is kept)."""
    if mesh is None:
        return lambda params: params
    src_sh = param_shardings(cfg, Rules.create(mesh, src))
    dst_sh = param_shardings(cfg, Rules.create(mesh, dst))
    same = all(a.is_equivalent_to(b, len(b.spec)) for a, b in
               zip(jax.tree.leaves(src_sh), jax.tree.leaves(dst_sh)))
    if same:
        return lambda params: params
    return jax.jit(lambda params: params, in_shardings=(src_sh,), out_shardings=dst_sh)
