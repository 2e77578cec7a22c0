"""The decoder: one function for training, prefill, decode and scoring.

`decoder` runs the layer stack over a block of tokens. Without a cache the block attends to itself
(training, scoring); with a `KVCache` the block's keys and values are written into the cache at
`cache_start` and the block attends over the whole cache (prefill, then one token per decode step).
In both cases a query at slot s sees keys at slots <= s whose `kv_mask` is set, which is what makes
left padding work. RMSNorm, RoPE angles, softmax and logits are computed in fp32.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from spiral_jax.models import cpu_kernels
from spiral_jax.models.config import ModelConfig
from spiral_jax.sharding import Rules, constrain

ACT = ("batch", "seq", "act_embed")
CACHE_AXES = ("layers", "batch", "seq", "kv_heads", "head_dim")
_WEIGHT_MAJOR_ROWS = 64  # on CPU, products with at most this many rows put the weight first (see dense)
_MATVEC_GROUPS = 4  # on CPU, a one-row product splits its weight's out rows into this many groups (see dense)
_MASKED = -0.7 * float(np.finfo(np.float32).max)  # finite, so fully masked (padding) rows stay NaN-free


def cpu_layouts() -> bool:
    """Whether to lay the products out for XLA:CPU (`dense`, decode attention, `unembed`, and the
    vocabulary-major sampling in `sampling.logits`). Read at trace time and only here, so that tests
    run the accelerator layouts on a CPU too."""
    return jax.default_backend() == "cpu"


class KVCache(NamedTuple):
    """Keys and values of every layer: [layers, batch, slots, kv_heads, head_dim]."""

    k: jax.Array
    v: jax.Array

    @classmethod
    def zeros(cls, cfg: ModelConfig, batch: int, slots: int, dtype=None) -> "KVCache":
        shape = (cfg.num_layers, batch, slots, cfg.num_kv_heads, cfg.head_dim)
        dtype = dtype or cfg.compute_dtype
        return cls(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype))


def rope_inv_freq(cfg: ModelConfig) -> np.ndarray:
    """Inverse RoPE frequencies in float32, with Llama 3 scaling when configured."""
    exponent = np.arange(0, cfg.head_dim, 2, dtype=np.int64).astype(np.float32) / cfg.head_dim
    inv_freq = (1.0 / (np.float32(cfg.rope_theta) ** exponent)).astype(np.float32)
    s = cfg.rope_scaling
    if s is None:
        return inv_freq
    old_len = s.original_max_position_embeddings
    low_wavelen, high_wavelen = old_len / s.low_freq_factor, old_len / s.high_freq_factor
    wavelen = 2 * np.pi / inv_freq
    scaled = np.where(wavelen > low_wavelen, inv_freq / s.factor, inv_freq)
    smooth = (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return np.where(medium, smoothed, scaled).astype(np.float32)


def apply_rope(x: jax.Array, positions: jax.Array, inv_freq: np.ndarray) -> jax.Array:
    """Rotate-half RoPE on x [B, T, N, hd] at integer positions [B, T]."""
    angles = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq)  # [B, T, hd/2]
    cos = jnp.cos(jnp.concatenate([angles, angles], -1))[:, :, None, :]
    sin = jnp.sin(jnp.concatenate([angles, angles], -1))[:, :, None, :]
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], -1)
    return (x * cos.astype(x.dtype) + rotated * sin.astype(x.dtype)).astype(x.dtype)


def dense(x: jax.Array, w: jax.Array, n_in: int = 1, weight_major: bool | None = None,
          preferred_element_type=None, local: bool = True) -> jax.Array:
    """x [..., *in] times an out-major weight w [*out, *in] -> [..., *out].

    On CPU the product runs as one 2-D matmul of [out, in] and [rows, in]: given several out or in axes
    (the attention projections, [heads, head_dim, embed]), XLA:CPU would otherwise copy those weights
    into a transposed layout on every many-row call.

    weight_major computes the product as w . x^T (out axes leading), then transposes the small result:
    XLA's CPU dot runs a few rows (a decode step) much faster that way. The barrier keeps XLA from
    folding the transpose back into the product. By default it is used on CPU for products of at most
    64 rows.

    A single row (batch-1 decode) is a matrix-vector product, which XLA:CPU runs on one thread; split
    into groups of the weight's out rows as a batch axis, it uses every core.

    With 16, 32, 48 or 64 f32 rows (a decode step's batch), the weight-major product runs in
    `cpu_kernels`' matmul kernel where it is built. local=False (a mesh: the kernel has no sharding
    rule) keeps XLA's dot. What each of these is worth: docs/performance.md (`python bench/sampler.py`).
    """
    lead = x.ndim - n_in
    out_shape, rows = w.shape[:w.ndim - n_in], x.shape[:lead]
    n_rows, cpu = int(np.prod(rows)), cpu_layouts()
    if weight_major is None:
        weight_major = cpu and n_rows <= _WEIGHT_MAJOR_ROWS
    if cpu:
        size_in = int(np.prod(x.shape[lead:]))
        x, w, n_in = x.reshape(*rows, size_in), w.reshape(-1, size_in), 1
    x_in, w_in = tuple(range(x.ndim - n_in, x.ndim)), tuple(range(w.ndim - n_in, w.ndim))
    if not weight_major:
        y = jax.lax.dot_general(x, w, ((x_in, w_in), ((), ())), preferred_element_type=preferred_element_type)
    else:
        if cpu and local and _kernel_rows(n_rows) and x.dtype == w.dtype == jnp.float32:
            y = cpu_kernels.weight_major_matmul(w, x.reshape(n_rows, -1)).reshape(-1, *rows)
        elif cpu and n_rows == 1 and w.shape[0] % _MATVEC_GROUPS == 0:
            groups = w.reshape(_MATVEC_GROUPS, -1, size_in)
            vector = jnp.broadcast_to(x.reshape(1, 1, size_in), (_MATVEC_GROUPS, 1, size_in))
            y = jax.lax.dot_general(groups, vector, (((2,), (2,)), ((0,), (0,))),
                                    preferred_element_type=preferred_element_type).reshape(-1, *rows)
        else:
            y = jax.lax.dot_general(w, x, ((w_in, x_in), ((), ())), preferred_element_type=preferred_element_type)
        n_out = y.ndim - len(rows)  # y is [*out, *rows]
        y = jax.lax.optimization_barrier(y).transpose(*range(n_out, y.ndim), *range(n_out))
    return y.reshape(*rows, *out_shape)


def _kernel_rows(n_rows: int) -> bool:
    """Whether a weight-major product of n_rows rows goes to the CPU kernel: it works in tiles of 16
    rows, and at fewer (or a part tile) XLA's dot is as fast or faster."""
    return n_rows % 16 == 0 and n_rows <= _WEIGHT_MAJOR_ROWS and cpu_kernels.available()


def rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    xf = x.astype(jnp.float32)
    xf = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    return (weight.astype(jnp.float32) * xf.astype(x.dtype).astype(jnp.float32)).astype(x.dtype)


def _allowed(kv_mask, q_slots):
    """Which key slots each query may attend: real tokens (kv_mask [B, S]) at or before the query's own
    slot (q_slots [T], or [B, T] when rows sit at different slots) -> [B, T, S]."""
    q_slots = q_slots if q_slots.ndim == 2 else q_slots[None]
    return kv_mask[:, None, :] & (jnp.arange(kv_mask.shape[1])[None, None, :] <= q_slots[:, :, None])


def attention(q, k, v, q_slots, kv_mask):
    """GQA attention. q [B,T,H,hd]; k, v [B,S,KV,hd]; q_slots [T] or [B,T]; kv_mask [B,S] -> [B,T,H,hd].

    Heads are moved in front of the sequence axes so both products are plain batched matmuls
    (measurably faster on CPU than the equivalent einsum with interleaved batch axes).
    """
    b, t, h, hd = q.shape
    kv, g = k.shape[2], h // k.shape[2]
    if t == 1 and cpu_layouts():
        return _decode_attention(q, k, v, _allowed(kv_mask, q_slots)[:, 0])
    qh = q.reshape(b, t, kv, g, hd).transpose(0, 2, 3, 1, 4).reshape(b, kv, g * t, hd)
    kh, vh = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)  # [B, KV, S, hd]
    scores = jnp.matmul(qh, kh.swapaxes(-1, -2), preferred_element_type=jnp.float32)
    scores = scores.reshape(b, kv, g, t, -1) * (hd ** -0.5)
    scores = jnp.where(_allowed(kv_mask, q_slots)[:, None, None], scores, _MASKED)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype).reshape(b, kv, g * t, -1)
    out = jnp.matmul(probs, vh).reshape(b, kv, g, t, hd)
    return out.transpose(0, 3, 1, 2, 4).reshape(b, t, h, hd)


def _decode_attention(q, k, v, allowed):
    """Attention of one query per row over the cache, reading the cache in place: [B,1,H,hd]. XLA's form,
    for CPUs where `cpu_kernels`' decode attention is not built (or the cache is not f32).

    The scores are one matmul per row of every cached key (all KV heads) against every query head,
    [S*KV, hd] x [hd, H], of which each query group's own KV head is kept by a strided slice. That
    computes KV times the needed products, but needs no transposed copy of the cache and runs as one
    large matmul, faster on CPU than the batched form. The slice fuses into the softmax (selecting
    with an identity-matrix product would cost a copy and a dot per layer). CPU only: on accelerators the
    batched matmul is fine, and merging the KV axis into the sequence would get in the way of splitting
    KV heads over a tensor-parallel mesh.
    """
    b, _, h, hd = q.shape
    kv = k.shape[2]
    every = jnp.einsum("bnd,bhd->bnh", k.reshape(b, -1, hd), q.reshape(b, h, hd),
                       preferred_element_type=jnp.float32).reshape(b, -1, kv * kv, h // kv)
    # every[b, s, i * kv + j] pairs KV head i with query group j: keep i == j, a stride of kv + 1.
    scores = every[:, :, ::kv + 1] * (hd ** -0.5)
    scores = jnp.where(allowed[:, :, None, None], scores, _MASKED)  # [B,S,KV,G]
    probs = jax.nn.softmax(scores, axis=1).astype(v.dtype)
    return jnp.einsum("bskg,bskd->bkgd", probs, v).reshape(b, 1, h, hd)


def _kernel_attention(q, cache: KVCache, rules: Rules | None) -> bool:
    """Whether a decode step's attention runs in `cpu_kernels`' kernel: one f32 query per row, an f32
    cache, on a single CPU device (the kernel has no sharding rule). It reads the layer's keys and values
    in place, where XLA:CPU first copies them out of the cache, the values twice (docs/performance.md)."""
    return (q.shape[1] == 1 and rules is None and cpu_layouts() and q.dtype == cache.k.dtype == jnp.float32
            and q.shape[-1] % 8 == 0 and cpu_kernels.available())


def _cache_write(cache: KVCache, layer, k, v, cache_start, row_slots) -> KVCache:
    """Write a block's keys and values [B, T, KV, hd] into the layer's cache: at `cache_start` for all
    rows, or at each row's own `row_slots` [B, T] (consecutive per row).

    Per-row blocks of one token (decode) are scattered; slots past the cache's end are dropped. Longer
    ones (prefill) are written row by row in place, which XLA:CPU runs far faster than a scatter (one
    update at a time) or a gather and select over the row; their slots must lie inside the cache.
    """
    k, v = k.astype(cache.k.dtype), v.astype(cache.v.dtype)
    if row_slots is None:
        start = (layer, 0, cache_start, 0, 0)
        return KVCache(jax.lax.dynamic_update_slice(cache.k, k[None], start),
                       jax.lax.dynamic_update_slice(cache.v, v[None], start))
    if k.shape[1] == 1:
        rows = jnp.arange(k.shape[0])[:, None]
        return KVCache(cache.k.at[layer, rows, row_slots].set(k, mode="drop"),
                       cache.v.at[layer, rows, row_slots].set(v, mode="drop"))

    def write(i, c: KVCache) -> KVCache:
        start = (layer, i, row_slots[i, 0], 0, 0)
        return KVCache(jax.lax.dynamic_update_slice(c.k, k[i][None, None], start),
                       jax.lax.dynamic_update_slice(c.v, v[i][None, None], start))

    return jax.lax.fori_loop(0, k.shape[0], write, cache)


def _block(cfg: ModelConfig, rules: Rules | None, inv_freq, x, p, layer, positions, kv_mask, cache,
           cache_start, kv_len, last_only):
    """One pre-norm decoder layer. Returns the new residual stream and (possibly updated) cache.

    last_only: after writing the block's keys and values to the cache, carry on with its last position
    only (the residual stream comes back [B, 1, D]).
    """
    dt = x.dtype
    w = lambda name: p[name].astype(dt)  # noqa: E731
    dense_ = functools.partial(dense, local=rules is None)
    h = rms_norm(x, p["attn_norm"], cfg.rms_norm_eps)
    q, k, v = dense_(h, w("q")), dense_(h, w("k")), dense_(h, w("v"))
    if cfg.qkv_bias:
        q, k, v = q + w("q_bias"), k + w("k_bias"), v + w("v_bias")
    if cfg.qk_norm:
        q = rms_norm(q, p["q_norm"], cfg.rms_norm_eps)
        k = rms_norm(k, p["k_norm"], cfg.rms_norm_eps)
    q, k = apply_rope(q, positions, inv_freq), apply_rope(k, positions, inv_freq)
    per_row = jnp.ndim(cache_start) == 1
    q_slots = (cache_start[:, None] if per_row else cache_start) + jnp.arange(x.shape[1])
    if cache is None:
        out = attention(q, k, v, q_slots, kv_mask)
    else:
        cache = _cache_write(cache, layer, k, v, cache_start, q_slots if per_row else None)
        # Slots past the block hold no keys yet, so attention reads the filled prefix only where its
        # length is static: the caller's kv_len, or the block's end when its place is known at trace
        # time (prefill). A 2k prompt in a 6k cache then scores 2k keys, not 6k.
        seen = kv_len or (cache_start + x.shape[1] if isinstance(cache_start, int) else cache.k.shape[2])
        if last_only:
            q, x, q_slots = q[:, -1:], x[:, -1:], q_slots[..., -1:]
        if _kernel_attention(q, cache, rules):
            out = cpu_kernels.decode_attention(q[:, 0], cache.k, cache.v, layer,
                                               _allowed(kv_mask[:, :seen], q_slots)[:, 0],
                                               scale=q.shape[-1] ** -0.5, masked=_MASKED)[:, None]
        else:
            out = attention(q, cache.k[layer, :, :seen].astype(dt), cache.v[layer, :, :seen].astype(dt),
                            q_slots, kv_mask[:, :seen])
    attn = dense_(out, w("o"), n_in=2)
    if cfg.o_bias:
        attn = attn + w("o_bias")
    x = constrain(x + attn, rules, ACT)
    h = rms_norm(x, p["mlp_norm"], cfg.rms_norm_eps)
    mlp = jax.nn.silu(dense_(h, w("gate"))) * dense_(h, w("up"))
    x = constrain(x + dense_(mlp, w("down")), rules, ACT)
    return x, cache


def decoder(params, cfg: ModelConfig, tokens, positions, kv_mask, cache: KVCache | None = None,
            cache_start=0, rules: Rules | None = None, kv_len: int | None = None, last_only: bool = False):
    """Run the layer stack on `tokens` [B, T]; returns (final-normed hidden [B, T, D], cache).

    positions [B, T]: RoPE positions. kv_mask [B, S]: which key slots hold real tokens, where S = T
    without a cache and S = cache slots with one (the caller marks the new block's slots too).
    cache_start (with a cache): the slot of the block's first token, one for all rows, or a [B] array
    of per-row slots (the decode engine's rows each sit at their own length).
    kv_len (static, with a cache): attend over the first kv_len slots only; no later slot may hold a key.
    last_only (with a cache; a prefill that needs the next token only): the hidden state may come back
    for the last position alone, [B, 1, D]. With a per-layer list, the last layer then runs its
    attention output, o-projection and MLP for that position only, after caching every position's keys
    and values: a quarter of a 4-layer model's prefill. A scanned stack runs every layer alike and
    returns all positions.
    """
    dt = jnp.dtype(cfg.compute_dtype)
    # Gather from a table whole along embed (vocab may stay split): gathering rows of an
    # fsdp-split table would make XLA rematerialise the whole table on every device.
    embed = constrain(params["embed"], rules, ("vocab", None))
    x = jnp.take(embed, tokens, axis=0).astype(dt)
    x = constrain(x, rules, ACT)
    kv_mask = kv_mask.astype(bool)
    inv_freq = rope_inv_freq(cfg)

    def block(x, p, layer, cache, last_only):
        return _block(cfg, rules, inv_freq, x, p, layer, positions, kv_mask, cache, cache_start, kv_len,
                      last_only)

    if cfg.remat:
        block = jax.checkpoint(block, static_argnums=(4,))
    if cfg.scan_layers:
        def step(carry, xs):
            x, cache = carry
            p, layer = xs
            return block(x, p, layer, cache, False), None

        (x, cache), _ = jax.lax.scan(step, (x, cache), (params["layers"], jnp.arange(cfg.num_layers)))
    else:
        for layer, p in enumerate(params["layers"]):
            x, cache = block(x, p, layer, cache, last_only and layer == cfg.num_layers - 1)
    return rms_norm(x, params["final_norm"], cfg.rms_norm_eps), cache


def unembed_table(params, cfg: ModelConfig) -> jax.Array:
    """The output embedding, [V, D]: the input embedding when they are tied."""
    return params["embed"] if cfg.tie_word_embeddings else params["lm_head"]


def unembed(params, cfg: ModelConfig, hidden: jax.Array, table_t: jax.Array | None = None,
            local: bool = True) -> jax.Array:
    """fp32 logits from final hidden states [..., D] -> [..., V].

    table_t: the table transposed, [D, V], if the caller keeps such a copy (the sampler does, for
    one-row decoding on CPU); it is multiplied instead of the [V, D] table. local: see `dense`.
    """
    if table_t is not None:
        return jnp.dot(hidden, table_t.astype(hidden.dtype), preferred_element_type=jnp.float32)
    table = unembed_table(params, cfg)
    # With the [V, D] table, on CPU the vocabulary leads the product at any row count: XLA:CPU runs
    # that form faster for prefill and decode shapes alike.
    return dense(hidden, table.astype(hidden.dtype), weight_major=cpu_layouts(),
                 preferred_element_type=jnp.float32, local=local)


def positions_from_mask(attention_mask: jax.Array) -> jax.Array:
    """RoPE positions for a left-padded batch: 0 at each row's first real token."""
    return jnp.maximum(jnp.cumsum(attention_mask.astype(jnp.int32), axis=-1) - 1, 0)


def forward(params, cfg: ModelConfig, input_ids, attention_mask=None, positions=None,
            rules: Rules | None = None) -> jax.Array:
    """fp32 logits [B, T, V] for a (possibly left-padded) batch, without a cache."""
    if attention_mask is None:
        attention_mask = jnp.ones(input_ids.shape, bool)
    if positions is None:
        positions = positions_from_mask(attention_mask)
    hidden, _ = decoder(params, cfg, input_ids, positions, attention_mask, rules=rules)
    return unembed(params, cfg, hidden, local=rules is None)
