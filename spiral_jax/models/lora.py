"""LoRA: low-rank adapters trained beside frozen weights.

A target projection W [*out, *in] gets A [rank, *in] and B [*out, rank] (params.py declares them with
the weights, with their logical axes and their PEFT names); the layer computes

    W x + (alpha / rank) * B (A x)

B starts at zero, so training starts from the base model exactly. The adapters sit in each layer's
dict next to the weights ("q_lora_a", "q_lora_b", ...): the decoder applies them wherever it finds
them, so one forward serves training, scoring and sampling.

The trainer holds two trees: the frozen base (no adapters, in the compute dtype, no optimiser state,
no gradients) and the adapters (trained, fp32). `join` puts them together for the forward;
`merge` folds the adapters into the weights (W + scale * B A) for a model with no adapters at all:
what the sampler decodes with and what a merged export writes.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from spiral_jax.models.config import ModelConfig
from spiral_jax.models.params import init_from_specs, param_shardings, param_specs
from spiral_jax.sharding import Rules

_MARK = "_lora_"


def _is_adapter(name: str) -> bool:
    return _MARK in name


def _layers(tree) -> list:
    layers = tree["layers"]
    return [layers] if isinstance(layers, dict) else layers


def split(tree) -> tuple[dict, dict]:
    """A parameter (or spec, or sharding) tree -> (base: everything else, adapters: the LoRA leaves,
    as {"layers": [...]} in the tree's layer structure)."""
    def part(layer, keep):
        return {k: v for k, v in layer.items() if _is_adapter(k) == keep}

    stacked = isinstance(tree["layers"], dict)
    base = {k: v for k, v in tree.items() if k != "layers"}
    base["layers"] = part(tree["layers"], False) if stacked else [part(p, False) for p in tree["layers"]]
    adapters = {"layers": part(tree["layers"], True) if stacked else [part(p, True) for p in tree["layers"]]}
    return base, adapters


def join(base: dict, adapters: dict) -> dict:
    """The inverse of `split`: each layer's weights and adapters in one dict."""
    if isinstance(base["layers"], dict):
        layers = {**base["layers"], **adapters["layers"]}
    else:
        layers = [{**p, **a} for p, a in zip(base["layers"], adapters["layers"])]
    return {**base, "layers": layers}


def adapter_specs(cfg: ModelConfig) -> dict:
    return split(param_specs(cfg))[1]


def adapter_shardings(cfg: ModelConfig, rules: Rules | None):
    return split(param_shardings(cfg, rules))[1]


def init_adapters(cfg: ModelConfig, rng: jax.Array, mesh=None, rules: str = "train") -> dict:
    """Fresh adapters (A random, B zero) in their shardings, fp32."""
    shard_rules = Rules.create(mesh, rules)
    return init_from_specs(adapter_specs(cfg), rng, adapter_shardings(cfg, shard_rules) if shard_rules else None)


def merge(params: dict, cfg: ModelConfig, dtype=None) -> dict:
    """Weights with the adapters folded in (W + scale * B A), no adapters left: a parameter tree of
    `cfg.base()`. dtype: of the merged tree (default: each weight's own)."""
    base, adapters = split(params)
    scale = cfg.lora_scale
    stacked = isinstance(base["layers"], dict)
    out = []
    for p, a in zip(_layers(base), _layers(adapters)):
        layer = dict(p)
        for target in cfg.lora_targets:
            b_, a_ = a[f"{target}_lora_b"].astype(jnp.float32), a[f"{target}_lora_a"].astype(jnp.float32)
            delta = (jax.vmap(lambda x, y: jnp.tensordot(x, y, 1)) if stacked else
                     lambda x, y: jnp.tensordot(x, y, 1))(b_, a_)
            layer[target] = (p[target].astype(jnp.float32) + scale * delta).astype(p[target].dtype)
        out.append(layer)
    merged = {**base, "layers": out[0] if stacked else out}
    return merged if dtype is None else jax.tree.map(lambda x: x.astype(dtype), merged)
