"""Every weight declared once: shape, logical axes, initialiser and its Hugging Face tensor name.

The parameter tree is a plain dict:

    {"embed": [V, D], "final_norm": [D], "lm_head": [V, D] (untied only),
     "layers": list of per-layer dicts, or one dict of arrays stacked on a leading [L] axis}

Per layer: attn_norm [D], q [H, hd, D], k/v [KV, hd, D], o [D, H, hd], optional q/k/v biases [H|KV, hd],
o_bias [D], q_norm/k_norm [hd], mlp_norm [D], gate/up [F, D], down [D, F].

Linear weights are [out, in] as in HF checkpoints (and PyTorch), with the head axis split out, so the
mapping is at most "split one axis into (heads, head_dim)". That is all `hf_slice` needs to read any
shard of any weight straight from a safetensors slice. Out-major weights are also what XLA's CPU dot
wants when a decode step multiplies them by a few rows (see `cpu.dense`); training is
indifferent to the orientation.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from spiral_jax.models.config import ModelConfig, float_dtype
from spiral_jax.sharding import Rules


PARAM_LAYOUT = "out_major"  # recorded in checkpoints; older ones stored linear weights [in, out]


@dataclasses.dataclass(frozen=True)
class ParamSpec:
    shape: tuple[int, ...]
    axes: tuple[str | None, ...]
    hf_name: str  # "{i}" is the layer index for per-layer weights
    init: str  # "normal", "ones", "zeros", or "lora_a" (uniform in +-1/sqrt(fan-in), as PEFT starts A)
    split_axis: int | None = None  # this axis and the next are one axis in HF


def _layer_specs(cfg: ModelConfig) -> dict[str, ParamSpec]:
    d, f, h, kv, hd = (cfg.hidden_size, cfg.intermediate_size, cfg.num_heads, cfg.num_kv_heads,
                       cfg.head_dim)
    p = "model.layers.{i}."
    specs = {
        "attn_norm": ParamSpec((d,), ("act_embed",), p + "input_layernorm.weight", "ones"),
        "q": ParamSpec((h, hd, d), ("heads", "head_dim", "embed"), p + "self_attn.q_proj.weight",
                       "normal", 0),
        "k": ParamSpec((kv, hd, d), ("kv_heads", "head_dim", "embed"), p + "self_attn.k_proj.weight",
                       "normal", 0),
        "v": ParamSpec((kv, hd, d), ("kv_heads", "head_dim", "embed"), p + "self_attn.v_proj.weight",
                       "normal", 0),
        "o": ParamSpec((d, h, hd), ("embed", "heads", "head_dim"), p + "self_attn.o_proj.weight",
                       "normal", 1),
        "mlp_norm": ParamSpec((d,), ("act_embed",), p + "post_attention_layernorm.weight", "ones"),
        "gate": ParamSpec((f, d), ("mlp", "embed"), p + "mlp.gate_proj.weight", "normal"),
        "up": ParamSpec((f, d), ("mlp", "embed"), p + "mlp.up_proj.weight", "normal"),
        "down": ParamSpec((d, f), ("embed", "mlp"), p + "mlp.down_proj.weight", "normal"),
    }
    if cfg.qkv_bias:
        for name, n, axis in (("q", h, "heads"), ("k", kv, "kv_heads"), ("v", kv, "kv_heads")):
            specs[f"{name}_bias"] = ParamSpec((n, hd), (axis, "head_dim"),
                                              p + f"self_attn.{name}_proj.bias", "zeros", 0)
    if cfg.o_bias:
        specs["o_bias"] = ParamSpec((d,), ("act_embed",), p + "self_attn.o_proj.bias", "zeros")
    if cfg.qk_norm:
        specs["q_norm"] = ParamSpec((hd,), ("head_dim",), p + "self_attn.q_norm.weight", "ones")
        specs["k_norm"] = ParamSpec((hd,), ("head_dim",), p + "self_attn.k_norm.weight", "ones")
    for target in cfg.lora_targets if cfg.lora_rank else ():
        specs.update(_adapter_specs(target, specs[target], cfg.lora_rank))
    return specs


def _adapter_specs(target: str, w: ParamSpec, rank: int) -> dict[str, ParamSpec]:
    """LoRA's A [rank, *in] and B [*out, rank] beside the weight w [*out, *in] (the o projection takes
    two in axes, heads x head_dim; the others one), named as PEFT names them. The rank axis is never
    sharded; the others are sharded as the weight's."""
    n_in = 2 if target == "o" else 1
    peft = "base_model.model." + w.hf_name.removesuffix(".weight")
    a = ParamSpec((rank, *w.shape[-n_in:]), (None, *w.axes[-n_in:]), peft + ".lora_A.weight", "lora_a",
                  1 if n_in == 2 else None)
    b = ParamSpec((*w.shape[:-n_in], rank), (*w.axes[:-n_in], None), peft + ".lora_B.weight", "zeros",
                  w.split_axis if w.split_axis == 0 else None)
    return {f"{target}_lora_a": a, f"{target}_lora_b": b}


def param_specs(cfg: ModelConfig) -> dict:
    """The ParamSpec tree, with the same structure as the parameter tree."""
    d, v = cfg.hidden_size, cfg.vocab_size
    tree = {
        "embed": ParamSpec((v, d), ("vocab", "embed"), "model.embed_tokens.weight", "normal"),
        "final_norm": ParamSpec((d,), ("act_embed",), "model.norm.weight", "ones"),
    }
    if not cfg.tie_word_embeddings:
        tree["lm_head"] = ParamSpec((v, d), ("vocab", "embed"), "lm_head.weight", "normal")
    layer = _layer_specs(cfg)
    if cfg.scan_layers:
        tree["layers"] = {k: dataclasses.replace(s, shape=(cfg.num_layers, *s.shape),
                                                 axes=("layers", *s.axes),
                                                 split_axis=None if s.split_axis is None else s.split_axis + 1)
                          for k, s in layer.items()}
    else:
        tree["layers"] = [{k: dataclasses.replace(s, hf_name=s.hf_name.replace("{i}", str(i)))
                           for k, s in layer.items()} for i in range(cfg.num_layers)]
    return tree


def is_spec(x) -> bool:
    return isinstance(x, ParamSpec)


def map_specs(fn: Callable[[ParamSpec], object], cfg: ModelConfig):
    return jax.tree.map(fn, param_specs(cfg), is_leaf=is_spec)


def param_shardings(cfg: ModelConfig, rules: Rules | None):
    """NamedSharding per parameter (None without a mesh)."""
    if rules is None:
        return map_specs(lambda s: None, cfg)
    return map_specs(lambda s: rules.sharding(s.axes, s.shape), cfg)


def abstract_params(cfg: ModelConfig, dtype=jnp.float32, rules: Rules | None = None):
    """ShapeDtypeStructs (with shardings) of the parameter tree, without allocating anything."""
    return map_specs(lambda s: jax.ShapeDtypeStruct(
        s.shape, dtype, sharding=None if rules is None else rules.sharding(s.axes, s.shape)), cfg)


def layout_config(cfg: ModelConfig, params) -> ModelConfig:
    """`cfg` with scan_layers as `params` hold their layers: stacked (a dict) or a per-layer list. The
    decoder runs both, and `transformer.decode_weights` splits a stack for decoding on GPU."""
    layers = params.get("layers") if isinstance(params, dict) else None
    if isinstance(layers, (list, dict)) and isinstance(layers, list) == cfg.scan_layers:
        return cfg.replace(scan_layers=not cfg.scan_layers)
    return cfg


def check_params(cfg: ModelConfig, params) -> None:
    """Raise a ValueError naming the first parameter whose presence or shape does not fit `cfg`.

    Without this check a parameter tree of another model size can run without any error: the decoder
    loops over whatever layers it is given and the KV cache clamps out-of-range layer indices.
    The layers may be stacked or a per-layer list whatever `cfg.scan_layers` says (`layout_config`).
    """
    cfg = layout_config(cfg, params)
    expected = {jax.tree_util.keystr(k): s.shape for k, s in jax.tree_util.tree_leaves_with_path(
        param_specs(cfg), is_leaf=is_spec)}
    got = {jax.tree_util.keystr(k): tuple(np.shape(x)) for k, x in jax.tree_util.tree_leaves_with_path(params)}
    hint = ("the parameters do not belong to this model config; load both from the same checkpoint "
            "(spiral_jax.models.load_pretrained returns the pair)")
    for name, shape in expected.items():
        if name not in got:
            raise ValueError(f"parameter {name} (shape {shape}) is missing: {hint}")
        if got[name] != shape:
            raise ValueError(f"parameter {name} has shape {got[name]}, the config expects {shape}: {hint}")
    for name in got:
        if name not in expected:
            raise ValueError(f"parameter {name} is not part of this model: {hint}")


def _init(s: ParamSpec, key, dtype, std: float):
    if s.init == "normal":
        return std * jax.random.normal(key, s.shape, dtype)
    if s.init == "lora_a":
        fan_in = int(np.prod(s.shape[-2:] if s.split_axis is not None else s.shape[-1:]))
        return jax.random.uniform(key, s.shape, dtype, -fan_in ** -0.5, fan_in ** -0.5)
    return (jnp.ones if s.init == "ones" else jnp.zeros)(s.shape, dtype)


def init_from_specs(specs, rng: jax.Array, shardings=None, dtype=jnp.float32, std: float = 0.02):
    """Random arrays for a tree of ParamSpecs (normal(0, std) matrices, unit norms, zero biases),
    built in `shardings` (a matching tree, or None)."""
    leaves, treedef = jax.tree.flatten(specs, is_leaf=is_spec)

    def build(key):
        return jax.tree.unflatten(treedef, [_init(s, k, dtype, std)
                                            for k, s in zip(jax.random.split(key, len(leaves)), leaves)])

    return jax.jit(build, out_shardings=shardings)(rng)


def init_params(cfg: ModelConfig, rng: jax.Array, mesh=None, dtype=jnp.float32, rules: str = "train",
                std: float = 0.02):
    """Random parameters (normal(0, std) matrices, unit norms, zero biases) built in their shardings."""
    if not isinstance(cfg, ModelConfig):
        raise TypeError(f"cfg is a {type(cfg).__name__}, not a ModelConfig; the order is init_params(cfg, rng)")
    if not (isinstance(rng, jax.Array) and (jax.dtypes.issubdtype(rng.dtype, jax.dtypes.prng_key) and rng.ndim == 0
                                             or rng.dtype == jnp.uint32 and rng.shape == (2,))):
        raise TypeError(f"rng must be one JAX random key, e.g. jax.random.key(0), got {rng!r}")
    dtype = float_dtype("dtype", dtype)
    if not std >= 0:
        raise ValueError(f"std must be a number >= 0, got {std}")
    shard_rules = Rules.create(mesh, rules)
    return init_from_specs(param_specs(cfg), rng, param_shardings(cfg, shard_rules) if shard_rules else None,
                           dtype, std)


def layer_spec(spec: ParamSpec, layer: int) -> ParamSpec:
    """The per-layer spec (concrete HF name, no leading layer axis) of a stacked-layer spec."""
    stacked = spec.axes[0] == "layers"
    return dataclasses.replace(
        spec, hf_name=spec.hf_name.replace("{i}", str(layer)),
        shape=spec.shape[1:] if stacked else spec.shape, axes=spec.axes[1:] if stacked else spec.axes,
        split_axis=spec.split_axis - 1 if stacked and spec.split_axis is not None else spec.split_axis)


def hf_shape(spec: ParamSpec) -> tuple[int, ...]:
    """Shape of the HF tensor behind an (unstacked) spec."""
    shape = list(spec.shape)
    if spec.split_axis is not None:
        a = spec.split_axis
        shape[a:a + 2] = [shape[a] * shape[a + 1]]
    return tuple(shape)


def hf_slice(spec: ParamSpec, read: Callable[[str, tuple[slice, ...]], np.ndarray],
             index: tuple[slice, ...]) -> np.ndarray:
    """Our array's `index` slice of an (unstacked) spec, read as `read(hf_name, hf_index)`."""
    shape, split = spec.shape, spec.split_axis
    index = tuple(slice(*sl.indices(n)[:2]) for sl, n in zip(index, shape))
    merged, out_shape = [], []  # our axes -> axes of the HF tensor
    i = 0
    while i < len(shape):
        sl = index[i]
        if i == split:
            inner = shape[i + 1]
            if index[i + 1] != slice(0, inner):
                raise ValueError(f"{spec.hf_name}: head_dim must not be sharded")
            merged.append(slice(sl.start * inner, sl.stop * inner))
            out_shape += [sl.stop - sl.start, inner]
            i += 2
        else:
            merged.append(sl)
            out_shape.append(sl.stop - sl.start)
            i += 1
    return read(spec.hf_name, tuple(merged)).reshape(out_shape)


def hf_tensor(spec: ParamSpec, ours: np.ndarray) -> np.ndarray:
    """Inverse of hf_slice for a whole (unstacked) array: our layout -> the HF tensor."""
    return np.ascontiguousarray(ours.reshape(hf_shape(spec)))
