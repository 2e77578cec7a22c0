"""A decode step's cache write and attention on TPU: Pallas kernels that leave the cache where it lies.
Which kernels a program takes, TPU's or the GPU's (`decode_attention_gpu`), is decided here (`kernel`).

In a scanned layer loop, XLA's TPU compiler gives a decode step's attention each layer's key and value
window as a copy out of the stacked cache [layers, B, KV, slots, hd] (docs/performance.md): for
Qwen3-4B at 32 rows, as many bytes again as the cache itself, written and read every step. And where
each row writes its token at a slot of its own (the decode engine), XLA scatters into a cache laid
out with heads and slots swapped, converted at every call's start and end.

`decode_attention` takes the whole stacked cache and the layer index as a scalar-prefetch operand, so
each block of slots comes by DMA straight from where the cache holds it. It also skips the blocks
past each row's own slot: no query sees them, so their keys and values are never read. The softmax
runs online over blocks of slots (one grid step a row and block, all of a device's KV heads at
once), in fp32 like the XLA path; the value product takes the unnormalised probabilities in the
cache's dtype and divides once at the end.

`write_rows` writes each row's new key and value at the row's own slot with one DMA each, into the
cache it updates in place (the output aliases it). Both keep the cache in its default layout.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from spiral_jax.models import decode_attention_gpu as gpu, fused_attention
from spiral_jax.sharding import Rules

P = jax.sharding.PartitionSpec

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


def decode_attention(q, k_cache, v_cache, layer, allowed, last_slots, masked: float, interpret: bool = False):
    """One query per row over layer `layer` of the stacked cache, on one device's shard.

    q [B, 1, H, hd]; k_cache, v_cache [layers, B, KV, slots, hd]; layer: an int32 scalar (traced in a
    scanned loop); allowed [B, W]: which of the first W slots each row's query sees (W a multiple of
    `block_slots`); last_slots [B]: the last slot each row sees (no later block is read); masked: the
    score of a slot not seen. Returns [B, 1, H, hd]. interpret: run in Pallas' interpreter (tests on CPU).
    """
    b, _, h, hd = q.shape
    kv, window = k_cache.shape[2], allowed.shape[1]
    block = block_slots(window, kv, hd, k_cache.dtype.itemsize)
    n_blocks = window // block
    mask = allowed.astype(jnp.int32)[:, None, :]  # [B, 1, W]
    last_block = jnp.clip(last_slots.astype(jnp.int32) // block, 0, n_blocks - 1)

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


_WRITE_ROWS = 32  # rows a grid step of `write_rows` updates: their tiles are staged in VMEM


def _write_kernel(layer_ref, slots_ref, k_new, v_new, k_in, v_in, k_out, v_out, k_tiles, v_tiles, sems):
    del k_in, v_in  # the same buffers as k_out, v_out
    layer, n_slots, tile = layer_ref[0], k_out.shape[3], k_tiles.shape[2]
    first = pl.program_id(0) * k_new.shape[0]  # this grid step's rows

    def dma(row, to_cache: bool):
        start = pl.multiple_of(jax.lax.div(slots_ref[first + row], tile) * tile, tile)  # slots are >= 0
        pairs = ((k_out, k_tiles, sems.at[0]), (v_out, v_tiles, sems.at[1]))
        for cache, tiles, sem in pairs:
            src, dst = cache.at[layer, first + row, :, pl.ds(start, tile)], tiles.at[row]
            yield pltpu.make_async_copy(*((dst, src) if to_cache else (src, dst)), sem)

    def update(row):
        here = jax.lax.broadcasted_iota(jnp.int32, k_tiles.shape[1:], 1) == jax.lax.rem(slots_ref[first + row], tile)
        k_tiles[row] = jnp.where(here, k_new[row], k_tiles[row])
        v_tiles[row] = jnp.where(here, v_new[row], v_tiles[row])

    def each_row(fn):
        def body(row, _):
            @pl.when(slots_ref[first + row] < n_slots)  # slots past the cache's end are dropped
            def _():
                fn(row)

        jax.lax.fori_loop(0, k_new.shape[0], body, None)

    # Every row's reads in flight at once, then its writes: a cache tile (of `tile` slots) is what a
    # DMA moves, so each row's tile comes into VMEM, takes the new slot there, and goes back.
    each_row(lambda row: [copy.start() for copy in dma(row, False)])
    each_row(lambda row: [copy.wait() for copy in dma(row, False)])
    each_row(update)
    each_row(lambda row: [copy.start() for copy in dma(row, True)])
    each_row(lambda row: [copy.wait() for copy in dma(row, True)])


def _cache_tile(itemsize: int) -> int:
    """Slots in one tile of the cache as the TPU lays it out in memory: 8 rows of 32-bit words."""
    return 8 * max(4 // itemsize, 1)


def write_rows(k_cache, v_cache, layer, k, v, slots, interpret: bool = False):
    """The caches [layers, B, KV, S, hd] with each row's k, v [B, KV, hd] written at layer `layer` and
    the row's own slot in slots [B] (those >= S are dropped), on one device's shard, in place (the
    outputs alias the caches). S must be a multiple of `_cache_tile`."""
    b, kv, hd = k.shape
    tile = _cache_tile(k_cache.dtype.itemsize)
    rows = next(n for n in range(min(b, _WRITE_ROWS), 0, -1) if b % n == 0)
    hbm = pl.BlockSpec(memory_space=pl.ANY)
    new = pl.BlockSpec((rows, kv, 1, hd), lambda step, *_: (step, 0, 0, 0))
    grid = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=2, grid=(b // rows,), in_specs=[new, new, hbm, hbm], out_specs=[hbm, hbm],
        scratch_shapes=[pltpu.VMEM((rows, kv, tile, hd), k_cache.dtype), pltpu.VMEM((rows, kv, tile, hd), v_cache.dtype),
                        pltpu.SemaphoreType.DMA((2,))])
    return tuple(pl.pallas_call(
        _write_kernel, grid_spec=grid, out_shape=[jax.ShapeDtypeStruct(k_cache.shape, k_cache.dtype)] * 2,
        input_output_aliases={4: 0, 5: 1}, interpret=interpret,
        compiler_params=pltpu.CompilerParams(dimension_semantics=("arbitrary",)),
    )(jnp.reshape(layer, (1,)).astype(jnp.int32), slots.astype(jnp.int32), k.astype(k_cache.dtype)[:, :, None],
      v.astype(v_cache.dtype)[:, :, None], k_cache, v_cache))


def kernel(cfg, rules: Rules | None, dtype, head_dim: int, group: int) -> str | None:
    """Which Pallas kernels a program's decode steps take, by `cfg.decode_attention`: "tpu" (this
    module's) on TPUs where it is "pallas", or "auto" with `cfg.attention` resolving to Pallas ("auto",
    "splash"), for heads of a multiple of 128 lanes (every Qwen and Llama checkpoint); "gpu"
    (`decode_attention_gpu`) on NVIDIA GPUs where it is "pallas" and the kernel takes the heads;
    else None, XLA's attention. "auto" keeps XLA's on a GPU: the kernel is not yet timed against it
    there (bench/decode_attention.py)."""
    platform, choice = fused_attention.platform(rules), cfg.decode_attention
    if choice == "xla":
        return None
    if platform == "tpu" and head_dim % 128 == 0 and (
            choice == "pallas" or fused_attention.resolve(cfg.attention, platform, dtype, head_dim) == "splash"):
        return "tpu"
    if platform == "gpu" and choice == "pallas" and gpu.available() and gpu.supports(head_dim, group, dtype):
        return "gpu"
    return None


def _cache_spec(rules: Rules, cache_axes, k_cache):
    """How the cache splits over the mesh (rows over data x fsdp, KV heads over tensor; its logical axes
    are `cache_axes`), or None where its layers, slots or head_dim split, which the kernels do not take.
    On a mesh the kernels run on each device's shard: a Pallas kernel has no partitioning rule."""
    spec = rules.spec(cache_axes, k_cache.shape)
    return None if any(spec[i] for i in (0, 3, 4)) else spec


def attend(cfg, rules: Rules | None, cache_axes, q, k_cache, v_cache, layer, allowed, masked: float):
    """A Pallas kernel's decode attention where one applies (`kernel`, one query a row; on TPU a window
    of whole blocks; query and KV heads split alike), else None: the caller then runs the XLA path.
    allowed [B, 1, W] is as `transformer._allowed` makes it. Each row reads up to the last slot it
    sees, so a row that sees only its first slot (a finished one, whose output nobody reads) reads
    one block."""
    which = kernel(cfg, rules, k_cache.dtype, q.shape[-1], q.shape[2] // k_cache.shape[2])
    if which is None or q.shape[1] != 1 or (which == "tpu" and block_slots(
            allowed.shape[-1], k_cache.shape[2], q.shape[-1], k_cache.dtype.itemsize) is None):
        return None
    allowed = allowed[:, 0]
    last_seen = jnp.max(jnp.where(allowed, jnp.arange(allowed.shape[1]), 0), axis=1)
    fn = functools.partial(decode_attention if which == "tpu" else gpu.decode_attention, masked=masked)
    if rules is None:
        return fn(q, k_cache, v_cache, layer, allowed, last_seen)
    cache = _cache_spec(rules, cache_axes, k_cache)
    q_spec = rules.spec(("batch", "seq", "heads", "head_dim"), q.shape)
    if cache is None or (q_spec[0], q_spec[2]) != (cache[1], cache[2]):
        return None
    return jax.shard_map(fn, mesh=rules.mesh, out_specs=q_spec, check_vma=False,
                         in_specs=(q_spec, cache, cache, P(), P(cache[1], None), P(cache[1])),
                         )(q, k_cache, v_cache, layer, allowed, last_seen)


def write(cfg, rules: Rules | None, cache_axes, k_cache, v_cache, layer, k, v, slots):
    """`write_rows` where the TPU kernels apply (`kernel`) and the slots are whole tiles, else None: the
    caller then scatters (XLA:GPU scatters in place)."""
    if kernel(cfg, rules, k.dtype, k.shape[-1], 1) != "tpu" or k_cache.shape[3] % _cache_tile(k_cache.dtype.itemsize):
        return None
    if rules is None:
        return write_rows(k_cache, v_cache, layer, k, v, slots)
    cache = _cache_spec(rules, cache_axes, k_cache)
    if cache is None:
        return None
    new = P(cache[1], cache[2], None)
    return jax.shard_map(write_rows, mesh=rules.mesh, out_specs=(cache, cache), check_vma=False,
                         in_specs=(cache, cache, P(), new, new, P(cache[1])))(k_cache, v_cache, layer, k, v, slots)
