"""The fitted part of the estimate: XLA's temporary buffers while a program runs.

Activations, weights all-gathered for compute and the prefill's transients exist only inside compiled
programs, so they are a model: counts of buffers of each size per layer, fitted to XLA:CPU's buffer
assignment (tests/test_plan.py checks them against the compiled programs). TPU and GPU compilers fuse
more, so there the model errs high. The arrays the programs take and return are not modelled: their
bytes come from the real code (`plan.arrays`).
"""
from __future__ import annotations

import jax.numpy as jnp

from spiral_jax.hardware import Hardware
from spiral_jax.models import ModelConfig, param_specs
from spiral_jax.models.fused_attention import resolve as resolve_attention
from spiral_jax.models.transformer import query_chunk
from spiral_jax.plan.arrays import kv_cache_bytes, logprob_row_bytes, sampler_row_bytes, train_row_bytes
from spiral_jax.plan.sizes import MeshShape, Workload, shard_elements
from spiral_jax.rl.train_step import TrainConfig
from spiral_jax.sampling import batch_bucket, cache_slots
from spiral_jax.sampling.buckets import insert_rows
from spiral_jax.sharding import Rules


def _split(n: int, ways: int) -> int:
    """Per-device size of a dimension the rules split `ways` ways (replicated when it does not divide)."""
    return n // ways if n % ways == 0 else n


def _layer_elements(cfg: ModelConfig, rules: Rules) -> int:
    """Elements of one layer's weights split over tensor only (what an all-gather over fsdp yields)."""
    layers = param_specs(cfg.replace(scan_layers=False))["layers"][0]
    return sum(shard_elements(rules, s.axes, s.shape) for s in layers.values())


def fused(cfg: ModelConfig, hw: Hardware) -> bool:
    """Whether training, scoring and prefill attention run a fused kernel on this hardware (then no
    [rows, heads, T, T] scores exist; `models.fused_attention`)."""
    return resolve_attention(cfg.attention, hw.platform, cfg.compute_dtype, cfg.head_dim) != "xla"


def _train_shapes(cfg: ModelConfig, w: Workload, mesh: MeshShape, fused_attention: bool):
    """Per-device sizes of one micro-batch: rows, slots, and the element counts of the residual
    stream, q/k/v, the MLP's hidden, one layer's attention scores (0 when fused) and a vocab shard."""
    t, dp = mesh.tensor, mesh.batch_shards
    b = w.micro_batch // dp if w.micro_batch % dp == 0 else w.micro_batch
    T, D, hd = w.train_len, cfg.hidden_size, cfg.head_dim
    heads, kv = _split(cfg.num_heads, t), _split(cfg.num_kv_heads, t)
    scores = 0 if fused_attention else b * heads * T * T * 4  # fp32 attention scores of one layer
    return b, T, b * T * D, b * T * (heads + 2 * kv) * hd, b * T * _split(cfg.intermediate_size, t), scores, \
        _split(cfg.vocab_size, t)


def activations(cfg: ModelConfig, tc: TrainConfig, w: Workload, mesh: MeshShape, fused_attention: bool = False,
                platform: str = "cpu") -> int:
    """Activation bytes per device at the peak of one micro-batch's forward + backward pass."""
    cb = jnp.dtype(cfg.compute_dtype).itemsize
    b, T, act, qkv, mlp, scores, v = _train_shapes(cfg, w, mesh, fused_attention)
    mask = 0 if fused_attention else b * T * T  # the XLA path's boolean [T, T] mask per row
    # Saved for the backward pass: with remat each layer's input; without, every residual of the
    # layer (norm outputs, q/k/v before and after RoPE, fp32 probabilities and their cast, the mask,
    # the MLP's gate/up/activation/product).
    # What remat_saves names is kept as well: q/k/v ("qkv"), the MLP's gate and up ("mlp").
    kept = qkv * ("qkv" in cfg.remat_saves) + 2 * mlp * ("mlp" in cfg.remat_saves)
    per_layer = (act + kept) * cb if cfg.remat else (6 * act * cb + 3 * qkv * cb + 2 * scores + mask + 5 * mlp * cb)
    saved = cfg.num_layers * per_layer
    # The backward of one layer, recomputed: the fp32 probabilities stay alive through it, next to
    # their gradients, the MLP's gate/up/activation/product and their gradients, and a few
    # [b, T, D] and q/k/v-sized buffers. (Counts fitted to XLA:CPU's buffer assignment; the TPU
    # compiler keeps two [T, T] buffers where XLA:CPU keeps three.)
    layer = (2 if platform == "tpu" else 3) * scores + 7.5 * mlp * cb + 3 * act * cb + 2 * qkv * cb
    # The loss head, before the layers' backward: fp32 logits of one chunk, softmax, their gradient.
    head = 3.5 * b * w.chunk * v * 4 + 3 * act * cb
    # The packed batch and its micro-batch split, and the per-slot outputs of the device's rows.
    rows = mesh.rows(w.samples)
    batch = 2 * rows * w.row_bytes + rows * train_row_bytes(cfg, tc, w.row)
    return int(saved + max(layer, head) + batch)


def logprob_pass(cfg: ModelConfig, tc: TrainConfig, w: Workload, mesh: MeshShape, fused_attention: bool = False) -> int:
    """Bytes per device of PPO's old-log-prob pass beyond the parameters: the batch and the forward of
    one micro-batch, no gradients (one layer's scores and probabilities, q/k/v, the MLP's hidden;
    or one chunk's logits), and the log-probs it returns (twice: mapped over the micro-batches, then
    masked)."""
    cb = jnp.dtype(cfg.compute_dtype).itemsize
    b, T, act, qkv, mlp, scores, v = _train_shapes(cfg, w, mesh, fused_attention)
    mask = 0 if fused_attention else b * T * T
    layer = 2 * scores + mask + 2 * qkv * cb + 3 * mlp * cb + 2 * act * cb
    head = 3 * b * w.chunk * v * 4 + act * cb
    rows = mesh.rows(w.samples)
    return int(rows * w.row_bytes + max(layer, head) + 2 * rows * logprob_row_bytes(cfg, tc, w.row))


def weights_in_flight(cfg: ModelConfig, mesh: MeshShape) -> int:
    """Weights gathered over fsdp (and cast to the compute dtype) while the step runs, and their
    gradients before the reduce-scatter: the embedding table, and one layer plus the next."""
    cb = jnp.dtype(cfg.compute_dtype).itemsize
    gathered, cast = mesh.fsdp > 1, cb != 4
    table = _split(cfg.vocab_size, mesh.tensor) * cfg.hidden_size
    if cfg.lora_rank:  # frozen weights, in the compute dtype already: gathered only, and no gradients
        return int((table + 2 * _layer_elements(cfg.base(), mesh.rules("sample"))) * cb * gathered)
    embed = table * (4 * gathered + cb * (gathered or cast) + 4 * (2 if gathered else 1))
    layer = _layer_elements(cfg, mesh.rules("sample")) * (cb * (gathered or cast) + 4 * gathered)
    return int(embed + 2 * layer)


def micro_batch_gradients(cfg: ModelConfig, mesh: MeshShape, hw: Hardware, params: int) -> int:
    """fp32 gradients of one micro-batch, held beside the accumulator (`params` bytes) they are added
    to. All of them, except where XLA:GPU runs a per-layer list (scan_layers off): it adds each
    layer's gradients to the accumulator as the backward produces them, so only the embedding
    table's and about two layers' exist at once (`spiral-jax plan --compile` shows it)."""
    if hw.platform != "gpu" or cfg.scan_layers or cfg.lora_rank:
        return params
    table = _split(cfg.vocab_size, mesh.tensor) * cfg.hidden_size // mesh.fsdp
    return int(4 * (table + 2 * _layer_elements(cfg, mesh.rules("train"))))


def sampling(cfg: ModelConfig, w: Workload, mesh: MeshShape, games: int, new_tokens: int,
             fused_attention: bool = False) -> tuple[int, int]:
    """(KV cache, prefill transients) per device for one generate call over `games` prompts, or with
    the continuous schedule (`Workload.continuous`) for a decode engine of `games` slots: its largest
    transients are an insert's (`insert_rows` prompts of the longest bucket), those rows' prompts
    prefilled in place into their rows of the cache, attending by XLA's attention (the rows start at
    slots of their own, which the fused kernels do not take) over a layer's whole cache of those
    rows, gathered, in chunks of queries (`query_chunk`)."""
    cb = jnp.dtype(cfg.compute_dtype).itemsize
    dp = mesh.batch_shards
    batch = batch_bucket(games, dp)
    slots = cache_slots(w.prompt_len, new_tokens)
    cache = kv_cache_bytes(cfg, mesh, batch, slots)
    b, plen, t = batch // dp, w.prompt_len, mesh.tensor
    heads, kv = _split(cfg.num_heads, t), _split(cfg.num_kv_heads, t)
    if w.continuous:
        rows = _split(insert_rows(batch), dp)  # prompts of `plen` tokens, over the whole cache
        scores = rows * heads * query_chunk(plen, slots, rows, heads) * slots * 4
        windows, b = 2 * rows * kv * slots * cfg.head_dim * cb, rows
    else:  # the prefill attends over the prompt only
        scores, windows = 0 if fused_attention else b * heads * query_chunk(plen, plen, b, heads) * plen * 4, 0
    attention = 2 * scores + 2 * b * plen * (heads + 2 * kv) * cfg.head_dim * cb
    mlp = 3 * b * plen * _split(cfg.intermediate_size, t) * cb
    # One layer's share of the cache, the last position's fp32 logits, and what the call returns.
    rest = (2 * b * plen * cfg.hidden_size * cb + cache // cfg.num_layers + 2 * b * _split(cfg.vocab_size, t) * 4
            + batch * sampler_row_bytes(cfg, w.lora_merged, plen, slots) + windows)
    return int(cache), int(max(attention, mlp) + rest)
