"""A decode step's attention on NVIDIA GPUs: a Pallas (Triton) kernel that reads each row's filled cache only.

XLA's GPU attention for one query a row reads every row of a call over the whole attention window: in
the decode engine, whose rows sit at different lengths, the window is the longest row's, so a short
row reads as many keys and values as the longest one, and an idle slot as many as a busy one
(docs/performance.md). This kernel stops each row at the last slot it sees: its own query slot, or
for a finished row, whose output nobody reads, the first (the sampler and the engine mask it so).

The grid is (row, KV head, split): each program takes one KV head's query group (padded to the 16
rows a Triton product needs) over one split of the window's slots, in blocks of `_BLOCK` slots, and
runs an online softmax in fp32 over the blocks up to the last slot the row sees; no later slot is
loaded. Splits give a batch-1 step enough programs to fill the GPU; XLA joins their partial results
(each split's unnormalised output, running maximum and sum) afterwards. The kernel takes the whole
stacked cache [layers, rows, KV, slots, head_dim] and the layer index, so no layer's window is
copied out of it.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

_BLOCK = 64  # slots a loop step loads: 16 KiB of bf16 keys at head_dim 128, twice that with the values
_PROGRAMS = 256  # fewest programs a call aims for (splits of the window x rows x KV heads): ~2 per SM
_SPLIT_SLOTS = 1024  # most slots one program walks: a long row's work spreads over several programs
_MIN_ROWS = 16  # a Triton product's fewest rows: the query group is padded to this


def available() -> bool:
    """Whether this JAX has Pallas' Triton backend (the kernel's lowering). JAX deprecates it in
    favour of Mosaic GPU; where it is gone, decode steps keep XLA's attention."""
    try:
        from jax.experimental.pallas import triton  # noqa: F401
    except ImportError:
        return False
    return True


def supports(head_dim: int, group: int, dtype) -> bool:
    """Whether the kernel takes these heads: a power-of-two head_dim of at least 16 (Triton's block
    shapes; every Qwen and Llama has 64 or 128), query groups of at most 64 heads, a bf16, fp16 or fp32
    cache."""
    return (head_dim >= 16 and head_dim & (head_dim - 1) == 0 and group <= 64
            and jnp.dtype(dtype) in (jnp.bfloat16, jnp.float16, jnp.float32))


def _splits(rows: int, kv_heads: int, window: int, split_slots: int) -> tuple[int, int]:
    """(splits, slots per split) for a window: at least `_PROGRAMS` programs where the window has the
    blocks for them, at most about `split_slots` slots each, whole blocks, none of them empty.

    A decode engine's rows sit at different lengths, and the kernel's time is its longest program's:
    bounding a program's slots spreads a long row over many programs, while those of a short row's
    splits past its end return at once."""
    blocks = -(-window // _BLOCK)
    wanted = max(-(-_PROGRAMS // (rows * kv_heads)), -(-window // max(split_slots, _BLOCK)))
    per_split = -(-blocks // min(wanted, blocks))
    return -(-blocks // per_split), per_split * _BLOCK


def _kernel(layer_ref, stop_ref, q_ref, k_ref, v_ref, mask_ref, o_ref, m_ref, l_ref, *, chunk: int,
            scale: float, masked: float):
    from jax.experimental.pallas import triton as plgpu

    row, head, split = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    layer, start = layer_ref[0], split * chunk
    stop = jnp.minimum(start + chunk, stop_ref[row])  # this split's slots before the row's end
    q = q_ref[...]  # [rows of the padded group, head_dim]
    # fp32 caches (parity runs) multiply in full fp32, not TF32; 16-bit ones at the inputs' precision.
    dot = functools.partial(plgpu.dot, precision=jax.lax.Precision.HIGHEST if q.dtype == jnp.float32 else None)

    def step(i, carry):
        m, l, acc = carry
        first = start + i * _BLOCK
        inside = first + jnp.arange(_BLOCK) < stop
        slots = pl.ds(first, _BLOCK)
        k = plgpu.load(k_ref.at[layer, row, head, slots, :], mask=inside[:, None], other=0)
        v = plgpu.load(v_ref.at[layer, row, head, slots, :], mask=inside[:, None], other=0)
        seen = plgpu.load(mask_ref.at[row, slots], mask=inside, other=0) != 0
        scores = dot(q, k, trans_b=True).astype(jnp.float32) * scale
        scores = jnp.where(seen[None, :], scores, masked)
        m_new = jnp.maximum(m, jnp.max(scores, axis=1))
        rescale = jnp.exp(m - m_new)
        p = jnp.exp(scores - m_new[:, None])
        acc = rescale[:, None] * acc + dot(p.astype(v.dtype), v).astype(jnp.float32)
        return m_new, rescale * l + jnp.sum(p, axis=1), acc

    n, hd = q.shape
    init = (jnp.full((n,), masked, jnp.float32), jnp.zeros((n,), jnp.float32), jnp.zeros((n, hd), jnp.float32))
    m, l, acc = jax.lax.fori_loop(0, jnp.maximum(pl.cdiv(stop - start, _BLOCK), 0), step, init)
    o_ref[...], m_ref[...], l_ref[...] = acc, m, l


def decode_attention(q, k_cache, v_cache, layer, allowed, last_slots, masked: float, interpret: bool = False,
                     split_slots: int | None = None):
    """One query per row over layer `layer` of the stacked cache, on one device's shard.

    q [B, 1, H, hd]; k_cache, v_cache [layers, B, KV, slots, hd]; layer: an int32 scalar; allowed
    [B, W]: which of the first W slots each row's query sees; last_slots [B]: the last slot each row
    sees (no later slot is read); masked: the score of a slot not seen. Returns [B, 1, H, hd].
    interpret: run in Pallas' interpreter (tests on CPU). split_slots: the most slots a program walks
    (`_splits`; None: `_SPLIT_SLOTS`).
    """
    from jax.experimental.pallas import triton as plgpu

    b, _, h, hd = q.shape
    kv, window = k_cache.shape[2], allowed.shape[1]
    group = h // kv
    rows = max(_MIN_ROWS, 1 << (group - 1).bit_length())
    # Query head j*G + g reads KV head j, as in `transformer.attention`.
    q_rows = jnp.pad(q.reshape(b, kv, group, hd), ((0, 0), (0, 0), (0, rows - group), (0, 0)))
    splits, chunk = _splits(b, kv, window, split_slots or _SPLIT_SLOTS)
    stop = jnp.minimum(last_slots.astype(jnp.int32) + 1, window)
    whole = pl.BlockSpec(memory_space=pl.ANY)  # the kernel indexes these itself
    own = lambda *block: pl.BlockSpec((None, None, None, *block), lambda r, j, s: (r, j, s) + (0,) * len(block))  # noqa: E731
    part = lambda *tail: jax.ShapeDtypeStruct((b, kv, splits, *tail), jnp.float32)  # noqa: E731
    out, top, total = pl.pallas_call(
        functools.partial(_kernel, chunk=chunk, scale=hd ** -0.5, masked=masked),
        grid=(b, kv, splits),
        in_specs=[whole, whole, pl.BlockSpec((None, None, rows, hd), lambda r, j, s: (r, j, 0, 0)), whole, whole,
                  whole],
        out_specs=[own(rows, hd), own(rows), own(rows)],
        out_shape=[part(rows, hd), part(rows), part(rows)],
        compiler_params=plgpu.CompilerParams(num_warps=4, num_stages=2),
        interpret=interpret,
    )(jnp.reshape(layer, (1,)).astype(jnp.int32), stop, q_rows, k_cache, v_cache, allowed.astype(jnp.int8))
    # Join the splits: each one's output and sum rescaled to the row's overall maximum. A split wholly
    # past the row's end keeps `masked` as its maximum and drops out (a weight of exp(-huge) = 0).
    weight = jnp.exp(top - jnp.max(top, axis=2, keepdims=True))
    joined = jnp.sum(weight[..., None] * out, axis=2) / jnp.sum(weight * total, axis=2)[..., None]
    return joined[:, :, :group].reshape(b, 1, h, hd).astype(q.dtype)
