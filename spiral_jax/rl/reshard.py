"""The hand-over from trainer to sampler: the same parameters, moved to the SAMPLE layout.

The trainer keeps its parameters on the TRAIN layout (weights over fsdp x tensor); the sampler wants
them on the SAMPLE layout (weights over tensor only, replicated across the batch axes, so decoding
needs no weight all-gathers). Where the two layouts differ, one jitted copy per step moves them; where
they agree (no mesh, or fsdp size 1) the sampler reads the train state's arrays directly.

With LoRA (`make_policy`) the sampler decodes either with merged weights (W + scale * B A), folded
once per step: the same programs as full fine-tuning, at the cost of one compute-dtype copy of the
weights; or with the frozen weights and the adapters as they are, applied in its forward: no copy,
two thin products more per projection and token (docs/performance.md has both measured).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from spiral_jax.models import ModelConfig, cpu, lora, param_shardings, transformer
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


def split_frozen(cfg: ModelConfig, params, mesh):
    """Full parameters -> (frozen weights, trained tree). With LoRA the weights are frozen and held in
    the compute dtype (no fp32 master copy: nothing updates them) and the adapters are trained;
    without, nothing is frozen (None) and everything is trained."""
    if not cfg.lora_rank:
        return None, params
    frozen, adapters = lora.split(params)
    dtype = jnp.dtype(cfg.compute_dtype)
    rules = Rules.create(mesh, "train")
    shardings = None if rules is None else lora.split(param_shardings(cfg, rules))[0]
    cast = jax.jit(lambda t: jax.tree.map(lambda x: x.astype(dtype), t), out_shardings=shardings, donate_argnums=0)
    return cast(frozen), adapters


def sample_config(cfg: ModelConfig, merged: bool) -> ModelConfig:
    """The model the sampler runs: without adapters when they are merged into the weights. Merged for
    a GPU, the layers are a per-layer list: XLA:GPU copies each layer out of a stack every step of a
    scanned decode loop, and the merge writes a fresh copy anyway, so it writes it per layer."""
    if not merged or not cfg.lora_rank:
        return cfg
    return cfg.base().replace(scan_layers=cfg.scan_layers and cpu.platform() != "gpu")


def make_policy(cfg: ModelConfig, mesh, merged: bool = True):
    """(trained, frozen) -> the policy's full parameters of `sample_config(cfg, merged)` on the TRAIN
    layout. With LoRA: the adapters folded into the weights (in the compute dtype), or (not merged)
    the weights and adapters side by side; without LoRA, the trained tree itself."""
    if not cfg.lora_rank:
        return lambda trained, frozen: trained
    if not merged:
        return lambda trained, frozen: lora.join(frozen, trained)
    rules, target = Rules.create(mesh, "train"), sample_config(cfg, merged)
    shardings = None if rules is None else param_shardings(target, rules)
    dtype = jnp.dtype(cfg.compute_dtype)

    def policy(trained, frozen):
        full = lora.merge(lora.join(frozen, trained), cfg, dtype)
        return transformer.compute_weights(full, target, unstack=not target.scan_layers)
    return jax.jit(policy, out_shardings=shardings)
