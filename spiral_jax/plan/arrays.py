"""The bytes of the arrays a run allocates, per device: shapes and dtypes from the code that allocates
them, never copied here.

Each tree comes from the project's own function, evaluated abstractly (`jax.eval_shape`, or the
outputs of the sampler's lowered program): the parameters the trainer holds (`abstract_params`,
`rl.reshard.split_frozen` and `make_policy` for LoRA), optax's state, the KV cache (`KVCache.zeros`),
and the per-slot outputs of a generate call, of the train step's gradient pass (`loss_and_grads`) and
of the old-log-prob pass (`make_compute_logprobs`). Those outputs grow with the rows, so they are
evaluated on one or two rows and scaled by the caller, and on the model cut to one layer (`_shallow`).
Every result is cached per model and shape, so `suggest`'s search evaluates each program once.
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import optax

from spiral_jax.models import ModelConfig, abstract_params, cpu, lora, param_specs
from spiral_jax.models.params import is_spec
from spiral_jax.models.transformer import CACHE_AXES, KVCache
from spiral_jax.plan.sizes import MeshShape, shard_elements
from spiral_jax.rl.reshard import make_policy, sample_config, split_frozen
from spiral_jax.rl.samples import Batch
from spiral_jax.rl.train_step import TrainConfig, loss_and_grads, make_compute_logprobs, make_optimizer
from spiral_jax.sampling import Sampler, SamplingParams


def _bytes(x) -> int:
    return x.size * x.dtype.itemsize


def _shard_bytes(rules, axes, x) -> int:
    """Bytes of one device's shard of abstract array `x` with these logical axes."""
    return shard_elements(rules, axes, x.shape) * x.dtype.itemsize


def _per_row(tree, rows: int) -> int:
    """Bytes per row of the abstract outputs of a program run on `rows` rows (each leads with them)."""
    leaves = jax.tree.leaves(tree)
    assert all(x.shape[:1] == (rows,) for x in leaves), [x.shape for x in leaves]
    return sum(_bytes(x) for x in leaves) // rows


def _shallow(cfg: ModelConfig) -> ModelConfig:
    """The model cut to one layer, for the per-row outputs of a program: they do not depend on its
    depth, and one layer traces in a fraction of the time of 36 unrolled ones."""
    return cfg.replace(num_layers=1)


def _trees(cfg: ModelConfig) -> tuple:
    """(trained, frozen, merged) abstract trees, as the trainer holds them: the fp32 parameters of
    `abstract_params` (the dtype the run's initialisation and loading give), split by `split_frozen`
    (with LoRA: the adapters trained, the weights frozen in the compute dtype; without: nothing
    frozen), and the merged copy `make_policy` folds for the sampler (None without LoRA), laid out as
    `sample_config` says for the platform traced for."""
    return _platform_trees(cfg, cpu.platform())


@functools.lru_cache(maxsize=32)
def _platform_trees(cfg: ModelConfig, platform: str) -> tuple:
    frozen, trained = jax.eval_shape(lambda p: split_frozen(cfg, p, None), abstract_params(cfg))
    merged = jax.eval_shape(make_policy(cfg, None), trained, frozen) if cfg.lora_rank else None
    return trained, frozen, merged


def _specs(cfg: ModelConfig) -> tuple:
    """(trained, frozen) ParamSpec trees, laid out like `_trees`."""
    specs = param_specs(cfg)
    return (lora.split(specs)[1], lora.split(specs)[0]) if cfg.lora_rank else (specs, None)


def _tree_bytes(specs, tree, rules) -> int:
    """Bytes per device of abstract `tree`, whose leaves are placed like the parameters in `specs`."""
    return int(sum(jax.tree.leaves(jax.tree.map(lambda s, x: _shard_bytes(rules, s.axes, x), specs, tree,
                                                is_leaf=is_spec))))


@functools.lru_cache(maxsize=256)
def param_bytes(cfg: ModelConfig, mesh: MeshShape, kind: str) -> int:
    """The trained parameters (fp32 masters; with LoRA the adapters alone) per device on the `kind`
    layout."""
    return _tree_bytes(_specs(cfg)[0], _trees(cfg)[0], mesh.rules(kind))


@functools.lru_cache(maxsize=256)
def frozen_bytes(cfg: ModelConfig, mesh: MeshShape, kind: str = "train") -> int:
    """LoRA's frozen weights per device on the `kind` layout (0 without LoRA)."""
    return _tree_bytes(_specs(cfg)[1], _trees(cfg)[1], mesh.rules(kind)) if cfg.lora_rank else 0


@functools.lru_cache(maxsize=256)
def merged_bytes(cfg: ModelConfig, mesh: MeshShape) -> int:
    """LoRA's merged weights, the copy the sampler reads, per device on the sample layout (0 without LoRA)."""
    if not cfg.lora_rank:
        return 0
    return _tree_bytes(param_specs(sample_config(cfg, True)), _trees(cfg)[2], mesh.rules("sample"))


@functools.lru_cache(maxsize=256)
def same_layout(cfg: ModelConfig, mesh: MeshShape) -> bool:
    """Whether train and sample layouts agree (then `make_reshard` hands over the arrays themselves)."""
    train, sample = mesh.rules("train"), mesh.rules("sample")
    return all(train.spec(s.axes, s.shape) == sample.spec(s.axes, s.shape)
               for s in jax.tree.leaves(param_specs(cfg), is_leaf=is_spec))


@functools.lru_cache(maxsize=256)
def optimizer_bytes(cfg: ModelConfig, tc: TrainConfig, mesh: MeshShape) -> int:
    """optax state of `make_optimizer` per device: param-like leaves sharded like their parameter,
    the rest (step counts) replicated. Dtypes from jax.eval_shape, so a bf16 moment would count half."""
    opt = make_optimizer(tc)
    trained, rules = _trees(cfg)[0], mesh.rules("train")
    sizes = jax.tree.map(lambda s: shard_elements(rules, s.axes, s.shape), _specs(cfg)[0], is_leaf=is_spec)
    sizes = optax.tree_map_params(opt, lambda leaf, n: n * leaf.dtype.itemsize, jax.eval_shape(opt.init, trained),
                                  sizes, transform_non_params=_bytes)
    return int(sum(jax.tree.leaves(sizes)))


@functools.lru_cache(maxsize=256)
def kv_cache_bytes(cfg: ModelConfig, mesh: MeshShape, batch: int, slots: int) -> int:
    """The KV cache of one generate call over `batch` rows of `slots` slots, per device on the sample
    layout: `KVCache.zeros`, as the sampler's program makes it."""
    rules = mesh.rules("sample")
    cache = jax.eval_shape(lambda: KVCache.zeros(cfg, batch, slots))
    return sum(_shard_bytes(rules, CACHE_AXES, x) for x in cache)


@functools.lru_cache(maxsize=64)
def _sampler_row_bytes(cfg: ModelConfig, prompt_len: int, slots: int) -> int:
    sampler = Sampler(cfg, max_prompt_len=prompt_len, max_cache_len=slots)
    prompts = [[0] * prompt_len] * 2  # two: for one row on a CPU the sampler first transposes real weights
    lowered = sampler.lower(abstract_params(sampler.cfg), prompts, SamplingParams(slots - prompt_len))
    return _per_row(lowered.out_info, len(prompts))


def sampler_row_bytes(cfg: ModelConfig, merged: bool, prompt_len: int, slots: int) -> int:
    """What a generate call returns per row (new tokens, their log-probs and raw log-probs, the length):
    the outputs of the sampler's own program, lowered here for the model it decodes with (through
    XLA's attention: the outputs are the same with any kernel, and a TPU's is not lowered on a CPU)."""
    decoding = sample_config(cfg, merged).replace(remat=False, attention="xla")
    return _sampler_row_bytes(_shallow(decoding), prompt_len, slots)


def _whole(tc: TrainConfig) -> TrainConfig:
    return dataclasses.replace(tc, micro_batch_size=None)  # one row is one micro-batch


@functools.lru_cache(maxsize=64)
def train_row_bytes(cfg: ModelConfig, tc: TrainConfig, row: Batch) -> int:
    """The per-slot outputs of the train step's gradient pass for one packed `row`: the log-probs,
    entropies and clip flags `loss_and_grads` returns beside the gradients."""
    cfg = _shallow(cfg)
    trained, frozen, _ = _trees(cfg)
    _, _, aux = jax.eval_shape(lambda p, b, f: loss_and_grads(p, b, cfg, _whole(tc), None, f), trained, row, frozen)
    return _per_row(aux, 1)


@functools.lru_cache(maxsize=64)
def logprob_row_bytes(cfg: ModelConfig, tc: TrainConfig, row: Batch) -> int:
    """The log-probs the old-log-prob pass (`make_compute_logprobs`) returns for one packed `row`."""
    cfg = _shallow(cfg)
    trained, frozen, _ = _trees(cfg)
    compute = make_compute_logprobs(cfg, _whole(tc))
    return _per_row(jax.eval_shape(compute, trained, row, *(() if frozen is None else (frozen,))), 1)
