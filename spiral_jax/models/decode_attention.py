"""A decode step's attention on TPU: a Pallas kernel that reads one layer's keys and values in place.

In a scanned layer loop, XLA's TPU compiler gives a decode step's attention each layer's key and value
window as a copy out of the stacked cache [layers, B, KV, slots, hd] (docs/performance.md): for
Qwen3-4B at 32 rows, as many bytes again as the cache itself, written and read every step. This kernel
takes the whole stacked cache and the layer index as a scalar-prefetch operand, so each block of slots
comes by DMA straight from where the cache holds it. It also skips the blocks past each row's own slot:
no query sees them, so their keys and values are never read.

The softmax runs online over blocks of slots (one grid step a row and block, all of a device's KV
heads at once), in fp32 like the XLA path; the value product takes the unnormalised probabilities in
the cache's dtype and divides once at the end.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from spiral_jax.models import fused_attention
from spiral_jax.sharding import Rules

_BLOCK_BYTES = 2 << 20  # a block of keys (or values) of all a device's KV heads: about 2 MiB in VMEM
_MIN_BLOCK = 128  # slots: the lanes of the mask's blocks, whose minor axis is the slots


def block_slots(window: int, kv_heads: int, head_dim: int, itemsize: int) -> int | None:
    """Slots per block for a window of `window` slots: the largest power of two of at least _MIN_BLOCK
    that divides the window and keeps a block of keys within _BLOCK_BYTES; None if there is none."""
    most = max(_BLOCK_BYTES // (kv_heads * head_dim * itemsize), _MIN_BLOCK)
    block = 1 << (most.bit_length() - 1)
    while block >= _MIN_BLOCK:
        if window % block == 0:
            return block
        block //= 2
    return None


def _kernel(layer_ref, last_block_ref, q_ref, k_ref, v_ref, mask_ref, o_ref, m_ref, l_ref, acc_ref, *,
            scale: float, masked: float):
    row, block = pl.program_id(0), pl.program_id(1)
    # 16-bit products at the default precision: Mosaic refuses others, whatever JAX's default is.
    precision = None if k_ref.dtype == jnp.float32 else jax.lax.Precision.DEFAULT

    @pl.when(block == 0)
    def _start():
        m_ref[...] = jnp.full(m_ref.shape, masked, jnp.float32)
        l_ref[...] = jnp.zeros(l_ref.shape, jnp.float32)
        acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

    @pl.when(block <= last_block_ref[row])
    def _accumulate():
        seen = mask_ref[...] != 0  # [1, block]
        group = q_ref.shape[0] // k_ref.shape[0]
        for head in range(k_ref.shape[0]):  # each KV head: its [G, hd] queries against [block, hd] keys
            q = q_ref[head * group:(head + 1) * group]
            scores = jax.lax.dot_general(q, k_ref[head], (((1,), (1,)), ((), ())), precision=precision,
                                         preferred_element_type=jnp.float32) * scale
            scores = jnp.where(seen, scores, masked)
            m_old = m_ref[head]
            m_new = jnp.maximum(m_old, jnp.max(scores, axis=1, keepdims=True))
            rescale = jnp.exp(m_old - m_new)
            p = jnp.exp(scores - m_new)
            l_ref[head] = rescale * l_ref[head] + jnp.sum(p, axis=1, keepdims=True)
            acc_ref[head] = rescale * acc_ref[head] + jax.lax.dot_general(
                p.astype(v_ref.dtype), v_ref[head], (((1,), (0,)), ((), ())), precision=precision,
                preferred_element_type=jnp.float32)
            m_ref[head] = m_new

    @pl.when(block == pl.num_programs(1) - 1)
    def _finish():
        group = q_ref.shape[0] // k_ref.shape[0]
        for head in range(k_ref.shape[0]):
            o_ref[head * group:(head + 1) * group] = (acc_ref[head] / l_ref[head]).astype(o_ref.dtype)


def decode_attention(q, k_cache, v_cache, layer, allowed, q_slots, masked: float, interpret: bool = False):
    """One query per row over layer `layer` of the stacked cache, on one device's shard.

    q [B, 1, H, hd]; k_cache, v_cache [layers, B, KV, slots, hd]; layer: an int32 scalar (traced in a
    scanned loop); allowed [B, W]: which of the first W slots each row's query sees (W a multiple of
    `block_slots`); q_slots [B]: each row's query slot (no later slot is allowed); masked: the score of
    a slot not seen. Returns [B, 1, H, hd]. interpret: run in Pallas' interpreter (tests on CPU).
    """
    b, _, h, hd = q.shape
    kv, window = k_cache.shape[2], allowed.shape[1]
    block = block_slots(window, kv, hd, k_cache.dtype.itemsize)
    n_blocks = window // block
    mask = allowed.astype(jnp.int32)[:, None, :]  # [B, 1, W]
    last_block = jnp.clip(q_slots.astype(jnp.int32) // block, 0, n_blocks - 1)

    def slots(row, blk, last_block_ref):  # blocks past the row's last are not fetched again
        return jnp.minimum(blk, last_block_ref[row])

    cache_spec = pl.BlockSpec((None, None, kv, block, hd),
                              lambda row, blk, layer_ref, lb: (layer_ref[0], row, 0, slots(row, blk, lb), 0))
    # Query head j*G + g reads KV head j, as in `transformer.attention`.
    per_row = pl.BlockSpec((None, None, h, hd), lambda row, blk, *_: (row, 0, 0, 0))
    grid = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=2, grid=(b, n_blocks),
        in_specs=[per_row, cache_spec, cache_spec,
                  pl.BlockSpec((None, 1, block), lambda row, blk, _, lb: (row, 0, slots(row, blk, lb)))],
        out_specs=per_row,
        scratch_shapes=[pltpu.VMEM((kv, h // kv, 1), jnp.float32), pltpu.VMEM((kv, h // kv, 1), jnp.float32),
                        pltpu.VMEM((kv, h // kv, hd), jnp.float32)])
    return pl.pallas_call(
        functools.partial(_kernel, scale=hd ** -0.5, masked=masked), grid_spec=grid,
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary")),
        interpret=interpret,
    )(jnp.reshape(layer, (1,)).astype(jnp.int32), last_block, q, k_cache, v_cache, mask)


def on_tpu(implementation: str, rules: Rules | None, cache_axes, q, k_cache, v_cache, layer, allowed, q_slots,
           masked: float):
    """`decode_attention` where it applies, else None (the caller then runs the XLA path): a decode
    step (one query a row) in a program for TPUs whose attention `implementation` resolves to Pallas
    ("auto" or "splash"), heads of a multiple of 128 lanes (every Qwen and Llama checkpoint), a window
    cut into whole blocks, and shards that line up.

    On a mesh the kernel runs on each device's shard (rows over data x fsdp, heads over tensor; the
    cache's logical axes are `cache_axes`): a Pallas kernel has no partitioning rule of its own.
    allowed [B, T=1, W] and q_slots [T] or [B, T] are as `transformer._allowed` takes and makes them.
    """
    window = allowed.shape[-1]
    platform = fused_attention.platform(rules)
    if (fused_attention.resolve(implementation, platform, q.dtype, q.shape[-1]) != "splash" or platform != "tpu"
            or q.shape[1] != 1 or q.shape[-1] % 128
            or block_slots(window, k_cache.shape[2], q.shape[-1], k_cache.dtype.itemsize) is None):
        return None
    allowed, q_slots = allowed[:, 0], jnp.broadcast_to(q_slots[..., -1], (q.shape[0],))
    fn = functools.partial(decode_attention, masked=masked)
    if rules is None:
        return fn(q, k_cache, v_cache, layer, allowed, q_slots)
    q_spec = rules.spec(("batch", "seq", "heads", "head_dim"), q.shape)
    cache_spec = rules.spec(cache_axes, k_cache.shape)
    if (q_spec[0], q_spec[2]) != (cache_spec[1], cache_spec[2]) or any(cache_spec[i] for i in (0, 3, 4)):
        return None
    rows = jax.sharding.PartitionSpec(q_spec[0])
    return jax.shard_map(fn, mesh=rules.mesh, out_specs=q_spec, check_vma=False,
                         in_specs=(q_spec, cache_spec, cache_spec, jax.sharding.PartitionSpec(),
                                   jax.sharding.PartitionSpec(q_spec[0], None), rows),
                         )(q, k_cache, v_cache, layer, allowed, q_slots)
