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
from jax.ad_checkpoint import checkpoint_name

from spiral_jax.models import cpu, decode_attention
from spiral_jax.models.config import ModelConfig
from spiral_jax.models.fused_attention import fused_attention
from spiral_jax.models.params import check_params
from spiral_jax.sharding import Rules, constrain

ACT = ("batch", "seq", "act_embed")
CACHE_AXES = ("layers", "batch", "kv_heads", "seq", "head_dim")
MASKED = -0.7 * float(np.finfo(np.float32).max)  # finite, so fully masked (padding) rows stay NaN-free
Q_AXES = ("batch", "seq", "heads", "head_dim")
SCORE_BYTES = 2**28  # the most fp32 attention scores per device a block over a cache holds at once


class KVCache(NamedTuple):
    """Keys and values of every layer: [layers, batch, kv_heads, slots, head_dim].

    Heads before slots: a decode step's attention is then one product of each head's cached keys and
    values as they lie. With slots before heads, GPU compilers give the decode loops the cache in
    another layout than prefill writes, and copy it whole after every prefill."""

    k: jax.Array
    v: jax.Array

    @classmethod
    def zeros(cls, cfg: ModelConfig, batch: int, slots: int, dtype=None) -> "KVCache":
        shape = (cfg.num_layers, batch, cfg.num_kv_heads, slots, cfg.head_dim)
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


def dense(x: jax.Array, w: jax.Array, n_in: int = 1, preferred_element_type=None,
          local: bool = True) -> jax.Array:
    """x [..., *in] times an out-major weight w [*out, *in] -> [..., *out]: every projection.

    On CPU the product takes the layouts XLA:CPU runs fastest (`cpu.dense`). local=False: the operands
    are sharded over a mesh (the CPU kernels have no sharding rule).
    """
    if cpu.layouts():
        return cpu.dense(x, w, n_in, preferred_element_type=preferred_element_type, local=local)
    x_in, w_in = tuple(range(x.ndim - n_in, x.ndim)), tuple(range(w.ndim - n_in, w.ndim))
    return jax.lax.dot_general(x, w, ((x_in, w_in), ((), ())), preferred_element_type=preferred_element_type)


def rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    xf = x.astype(jnp.float32)
    xf = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    return (weight.astype(jnp.float32) * xf.astype(x.dtype).astype(jnp.float32)).astype(x.dtype)


def _allowed(kv_mask, q_slots):
    """Which key slots each query may attend: real tokens at or before the query's own slot (q_slots
    [T], or [B, T] when rows sit at different slots) -> [B, T, S].

    kv_mask [B, S]: bool, which slots hold real tokens; or, for a block that attends to itself from
    slot 0 (S = T), int segment ids (0: padding), and then a query sees its own segment's keys only."""
    q_slots = q_slots if q_slots.ndim == 2 else q_slots[None]
    causal = jnp.arange(kv_mask.shape[1])[None, None, :] <= q_slots[:, :, None]
    if kv_mask.dtype == jnp.bool_:
        return kv_mask[:, None, :] & causal
    keys = kv_mask[:, None, :]
    return (keys > 0) & (keys == kv_mask[:, :, None]) & causal


def attention(q, k, v, q_slots, kv_mask):
    """GQA attention. q [B,T,H,hd]; k, v [B,KV,S,hd] (heads first, as the cache holds them); q_slots [T]
    or [B,T]; kv_mask [B,S] (see `_allowed`) -> [B,T,H,hd].

    Both products are plain batched matmuls over (row, KV head), the softmax over the keys, the minor
    axis. For one query per row (a decode step) on CPU the keys lead the score product instead, which
    XLA:CPU runs faster (docs/performance.md); XLA:GPU fuses the minor-axis softmax into one kernel.
    For one query per row on a GPU both products are a product and a sum, over head_dim for the scores
    and over the slots for the values: XLA:GPU's gemm kernels may take a layer's window of the stacked
    cache only as a copy, made every step, where a reduction reads the keys and values in place.
    """
    b, t, h, hd = q.shape
    kv, g = k.shape[1], h // k.shape[1]
    qh = q.reshape(b, t, kv, g, hd).transpose(0, 2, 3, 1, 4).reshape(b, kv, g * t, hd)
    if t == 1 and cpu.layouts():
        scores = jnp.einsum("bksd,bkgd->bksg", k, qh, preferred_element_type=jnp.float32) * (hd ** -0.5)
        scores = jnp.where(_allowed(kv_mask, q_slots)[:, 0, None, :, None], scores, MASKED)
        probs = jax.nn.softmax(scores, axis=2).astype(v.dtype)
        return jnp.einsum("bksg,bksd->bkgd", probs, v).reshape(b, 1, h, hd)
    reduce = t == 1 and cpu.platform() == "gpu"
    if reduce:
        scores = jnp.sum(qh[:, :, :, None].astype(jnp.float32) * k[:, :, None].astype(jnp.float32), axis=-1)
    else:
        scores = jnp.matmul(qh, k.swapaxes(-1, -2), preferred_element_type=jnp.float32)
    scores = scores.reshape(b, kv, g, t, -1) * (hd ** -0.5)
    scores = jnp.where(_allowed(kv_mask, q_slots)[:, None, None], scores, MASKED)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype).reshape(b, kv, g * t, -1)
    if reduce:
        out = jnp.sum(probs[..., None].astype(jnp.float32) * v[:, :, None].astype(jnp.float32), axis=3)
        out = out.astype(v.dtype).reshape(b, kv, g, t, hd)
    else:
        out = jnp.matmul(probs, v).reshape(b, kv, g, t, hd)
    return out.transpose(0, 3, 1, 2, 4).reshape(b, t, h, hd)


def query_chunk(tokens: int, keys: int, rows: int, heads: int) -> int:
    """How many of a block's `tokens` queries attend at once over `keys` cached slots (rows and heads
    per device): the block halved until one chunk's fp32 scores fit SCORE_BYTES. A decode engine's
    insert of 2k-token prompts into 8 slots of Qwen3-4B would otherwise hold 6 GiB of scores."""
    chunk = tokens
    while chunk % 2 == 0 and chunk > 16 and rows * heads * chunk * keys * 4 > SCORE_BYTES:
        chunk //= 2
    return chunk


def _attention_in_chunks(rules: Rules | None, q, k, v, q_slots, kv_mask):
    """`attention` of a block over a cache's window, its queries in `query_chunk`s, one after another.

    Each chunk's output replaces its queries in one buffer, the loop's carry. A loop that stacked its
    outputs (`lax.map`) would start from a buffer of zeros, and in an unrolled layer stack XLA makes
    every layer's such buffer at once, at the program's start: 36 x 64 MiB for Qwen3-4B's insert of
    4 prompts of 2048 tokens (docs/memory.md)."""
    b, t, h, hd = q.shape
    local = q.shape if rules is None else rules.sharding(Q_AXES, q.shape).shard_shape(q.shape)
    chunk = query_chunk(t, k.shape[2], local[0], local[2])
    if chunk == t:
        return attention(q, k, v, q_slots, kv_mask)
    q_slots = jnp.broadcast_to(q_slots, (b, t))

    def one(i, qo):
        start = i * chunk
        qs = jax.lax.dynamic_slice_in_dim(qo, start, chunk, axis=1)
        out = attention(qs, k, v, jax.lax.dynamic_slice_in_dim(q_slots, start, chunk, axis=1), kv_mask)
        return jax.lax.dynamic_update_slice_in_dim(qo, out.astype(qo.dtype), start, axis=1)

    return jax.lax.fori_loop(0, t // chunk, one, q)


def _cache_write(cfg: ModelConfig, rules: Rules | None, cache: KVCache, layer, k, v, cache_start,
                 row_slots, cache_rows) -> KVCache:
    """Write a block's keys and values [B, T, KV, hd] into the layer's cache [layers, rows, KV, slots, hd]:
    at `cache_start` for all rows, or at each row's own `row_slots` [B, T] (consecutive per row), into
    cache row `cache_rows[i]` [B] for block row i (None: row i).

    Per-row blocks of one token (decode) are scattered, or on TPU written by `decode_attention.write`
    (XLA's TPU scatter takes the cache in another layout); slots past the cache's end are dropped. Longer
    ones (prefill) are written row by row in place, which XLA:CPU runs far faster than a scatter (one
    update at a time) or a gather and select over the row; their slots past the cache's end are
    dropped too (a bucketed block's padding after a long reused prefix).
    """
    rows = jnp.arange(k.shape[0]) if cache_rows is None else cache_rows
    if k.shape[1] == 1 and row_slots is not None:
        if cache_rows is None:
            written = decode_attention.write(cfg, rules, CACHE_AXES, cache.k, cache.v, layer, k[:, 0],
                                             v[:, 0], row_slots[:, 0])
            if written is not None:
                return KVCache(*written)
        slots = row_slots[:, 0]
        return KVCache(cache.k.at[layer, rows, :, slots].set(k[:, 0].astype(cache.k.dtype), mode="drop"),
                       cache.v.at[layer, rows, :, slots].set(v[:, 0].astype(cache.v.dtype), mode="drop"))
    k, v = (x.swapaxes(1, 2).astype(c.dtype) for x, c in ((k, cache.k), (v, cache.v)))  # [B, KV, T, hd]
    if row_slots is None:
        start = (layer, 0, 0, cache_start, 0)
        return KVCache(jax.lax.dynamic_update_slice(cache.k, k[None], start),
                       jax.lax.dynamic_update_slice(cache.v, v[None], start))

    t, slots = k.shape[2], cache.k.shape[3]

    def write(i, c: KVCache) -> KVCache:
        # A padded block that would run past the cache's end (its padding would; the row's tokens fit) is
        # written as the t slots that end the cache: the block moved up by `shift`, and the slots before
        # the row's start left as they were.
        fits = jnp.minimum(row_slots[i, 0], slots - t)
        shift, at = row_slots[i, 0] - fits, (layer, rows[i], 0, fits, 0)

        def put(full, new):
            old = jax.lax.dynamic_slice(full, at, (1, 1, *new.shape))[0, 0]
            new = jnp.where(jnp.arange(t)[:, None] < shift, old, jnp.roll(new, shift, axis=1))
            return jax.lax.dynamic_update_slice(full, new[None, None], at)

        return KVCache(put(c.k, k[i]), put(c.v, v[i]))

    return jax.lax.fori_loop(0, k.shape[0], write, cache)


def _block(cfg: ModelConfig, rules: Rules | None, inv_freq, x, p, layer, positions, kv_mask, segments, cache,
           cache_start, cache_rows, kv_len, last_only):
    """One pre-norm decoder layer. Returns the new residual stream and (possibly updated) cache.

    last_only: after writing the block's keys and values to the cache, carry on with its last position
    only (the residual stream comes back [B, 1, D]).
    """
    dt = x.dtype
    w = lambda name: p[name].astype(dt)  # noqa: E731
    dense_ = functools.partial(dense, local=rules is None)

    def proj(name, h, n_in=1):
        """h times the weight `name`, plus its LoRA adapters' low-rank product where the layer has them."""
        out = dense_(h, w(name), n_in=n_in)
        if f"{name}_lora_a" in p:
            # A sampler's products are small enough for XLA's dot merger to join the adapter's first
            # product with the frozen one over a concatenation of their weights: a copy of the frozen
            # weight every step. Behind a barrier the adapter's input is a value of its own.
            h_low = h if cache is None else jax.lax.optimization_barrier(h)
            low = dense_(dense_(h_low, w(f"{name}_lora_a"), n_in=n_in), w(f"{name}_lora_b"))
            out = out + jnp.asarray(cfg.lora_scale, dt) * low
        return out

    h = rms_norm(x, p["attn_norm"], cfg.rms_norm_eps)
    q, k, v = (checkpoint_name(proj(name, h), "qkv") for name in "qkv")
    if cfg.qkv_bias:
        q, k, v = q + w("q_bias"), k + w("k_bias"), v + w("v_bias")
    if cfg.qk_norm:
        q = rms_norm(q, p["q_norm"], cfg.rms_norm_eps)
        k = rms_norm(k, p["k_norm"], cfg.rms_norm_eps)
    q, k = apply_rope(q, positions, inv_freq), apply_rope(k, positions, inv_freq)
    per_row = jnp.ndim(cache_start) == 1
    q_slots = (cache_start[:, None] if per_row else cache_start) + jnp.arange(x.shape[1])
    # A block that attends only to itself from slot 0 (training, scoring, a prefill into an empty
    # cache) may run a fused kernel (`fused_attention`); everything else takes the XLA path.
    from_start = cache is None or (isinstance(cache_start, int) and cache_start == 0 and kv_len is None)
    fused = fused_attention(cfg.attention, rules, q, k, v, kv_mask[:, :x.shape[1]], segments) if from_start else None
    if cache is None:
        out = attention(q, k.swapaxes(1, 2), v.swapaxes(1, 2), q_slots, kv_mask) if fused is None else fused
    else:
        cache = _cache_write(cfg, rules, cache, layer, k, v, cache_start, q_slots if per_row else None, cache_rows)
        # Slots past the block hold no keys yet, so attention reads the filled prefix only where its
        # length is static: the caller's kv_len, or the block's end when its place is known at trace
        # time (prefill). A 2k prompt in a 6k cache then scores 2k keys, not 6k.
        seen = kv_len or (cache_start + x.shape[1] if isinstance(cache_start, int) else cache.k.shape[3])
        if last_only:
            q, x, q_slots = q[:, -1:], x[:, -1:], q_slots[..., -1:]
            fused = None if fused is None else fused[:, -1:]
        if fused is not None:
            out = fused
        elif cache_rows is None and cpu.kernel_attention_fits(q, cache.k, local=rules is None):
            out = cpu.kernel_attention(q, cache.k, cache.v, layer, _allowed(kv_mask[:, :seen], q_slots)[:, 0],
                                       MASKED)
        else:
            out = None
            if cache_rows is None:  # the kernels read the block's own rows of the cache
                out = decode_attention.attend(cfg, rules, CACHE_AXES, q, cache.k, cache.v, layer,
                                              _allowed(kv_mask[:, :seen], q_slots), MASKED)
            if out is None:  # the layer's window of the block's rows
                window = lambda c: (c[layer, :, :, :seen] if cache_rows is None  # noqa: E731
                                    else c[layer, cache_rows, :, :seen]).astype(dt)
                out = _attention_in_chunks(rules, q, window(cache.k), window(cache.v), q_slots, kv_mask[:, :seen])
    attn = proj("o", out, n_in=2)
    if cfg.o_bias:
        attn = attn + w("o_bias")
    x = constrain(x + attn, rules, ACT)
    h = rms_norm(x, p["mlp_norm"], cfg.rms_norm_eps)
    mlp = jax.nn.silu(checkpoint_name(proj("gate", h), "mlp")) * checkpoint_name(proj("up", h), "mlp")
    x = constrain(x + proj("down", mlp), rules, ACT)
    return x, cache


@jax.custom_vjp
def _layer_backward(weights, x):
    """The identity on one layer's weights and its input. In the backward, the layer's weight gradients
    and the gradient for the layer below pass one optimization barrier together, so the layer below's
    backward cannot begin before this layer's weight-gradient products have run.

    Without it, XLA's GPU scheduler (the latency-hiding one, the default from jax 0.11 on) may move
    every unrolled layer's weight-gradient products to the end of the backward, and each layer's
    activation gradients then wait in memory for them (docs/performance.md). A scanned stack needs
    none: each step of its loop ends with its layer's gradients. Taking the weights in the compute
    dtype keeps the barrier on the products' own outputs, so their cast to fp32 still fuses into the
    gradient accumulation."""
    return weights, x


def _layer_backward_fwd(weights, x):
    return (weights, x), None


def _layer_backward_bwd(_, grads):
    return jax.lax.optimization_barrier(grads)


_layer_backward.defvjp(_layer_backward_fwd, _layer_backward_bwd)


def _cast_weights(tree, dt):
    """Every weight of `tree` in dtype dt but the norms, which `rms_norm` scales in fp32."""
    def cast(path, x):
        return x if str(getattr(path[-1], "key", "")).endswith("norm") else x.astype(dt)

    return jax.tree_util.tree_map_with_path(cast, tree)


def _per_layer(stack, num_layers: int) -> list:
    """A stacked layer tree as a per-layer list of trees, each a slice of the stack."""
    return [jax.tree.map(lambda a: a[i], stack) for i in range(num_layers)]


def decoder(params, cfg: ModelConfig, tokens, positions, kv_mask, cache: KVCache | None = None,
            cache_start=0, rules: Rules | None = None, kv_len: int | None = None, last_only: bool = False,
            cache_rows: jax.Array | None = None, segments: int = 1):
    """Run the layer stack on `tokens` [B, T]; returns (final-normed hidden [B, T, D], cache). The
    layers run as the parameters hold them: stacked (scan_layers) under `lax.scan`, a per-layer list
    unrolled. A decode step (one token a row, with a cache) on a GPU runs a stack unrolled too, each
    layer a static slice of it: in a scanned loop XLA:GPU copies every layer's weights and its key and
    value windows out of their stacks before the products, every step, where its products read static
    slices in place (from two rows up; a one-row product still takes its weights as a copy). A prefill
    stays scanned: its copies come once a call, and unrolling it would only lengthen the compile.

    positions [B, T]: RoPE positions. kv_mask [B, S]: which key slots hold real tokens, where S = T
    without a cache and S = cache slots with one (the caller marks the new block's slots too). Without
    a cache it may hold int segment ids instead (0: padding; packed training rows, right-padded, the
    first segment from slot 0): a query then attends within its own segment only, and `segments`
    (static) is the most a row holds.
    cache_start (with a cache): the slot of the block's first token, one for all rows, or a [B] array
    of per-row slots (the decode engine's rows each sit at their own length).
    cache_rows (with per-row slots): [B] the cache row each block row writes and attends over, for a
    block of fewer rows than the cache (an engine's insert prefills a few of its slots in place); the
    block's kv_mask then spans the cache's slots. None: block row i is cache row i.
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
    segmented = cache is None and jnp.issubdtype(kv_mask.dtype, jnp.integer)
    kv_mask = kv_mask.astype(jnp.int32 if segmented else bool)
    inv_freq = rope_inv_freq(cfg)

    layers = params["layers"]
    if isinstance(layers, dict) and cache is not None and tokens.shape[1] == 1 and cpu.platform() == "gpu":
        layers = _per_layer(layers, cfg.num_layers)
    # Unrolled layers that may be differentiated run their backward a layer at a time (`_layer_backward`).
    in_order = cache is None and not isinstance(layers, dict)

    def block(x, p, layer, cache, last_only):
        if in_order:
            p, x = _layer_backward(_cast_weights(p, dt), x)
        return _block(cfg, rules, inv_freq, x, p, layer, positions, kv_mask, segments, cache, cache_start,
                      cache_rows, kv_len, last_only)

    if cfg.remat:
        keep = jax.checkpoint_policies.save_only_these_names(*cfg.remat_saves) if cfg.remat_saves else None
        block = jax.checkpoint(block, static_argnums=(4,), policy=keep)
    if isinstance(layers, dict):  # stacked (scan_layers), else a per-layer list
        def step(carry, xs):
            x, cache = carry
            p, layer = xs
            return block(x, p, layer, cache, False), None

        (x, cache), _ = jax.lax.scan(step, (x, cache), (layers, jnp.arange(cfg.num_layers)))
    else:
        for layer, p in enumerate(layers):
            x, cache = block(x, p, layer, cache, last_only and layer == cfg.num_layers - 1)
    return rms_norm(x, params["final_norm"], cfg.rms_norm_eps), cache


def compute_weights(params, cfg: ModelConfig, unstack: bool = False):
    """The parameters as the decoder's products read them: every weight but the norms in the compute
    dtype (the norms stay as they are: `rms_norm` scales in fp32).

    The decoder casts each weight where it uses it, so a program that runs it again and again without
    gradients (the sampler's decode loop) casts them once up front with this instead. Otherwise, where
    the compiler does not hoist the casts out of the loop itself (XLA:GPU does not), every decode step
    reads the fp32 weights: twice the bytes of bf16 ones, and decoding is bound by reading weights. The
    tokens are the same either way.

    unstack: stacked layers (scan_layers) come back as a per-layer list, which `decoder` runs
    unrolled and XLA:GPU's products read in place at any row count, one row included.
    """
    if unstack and isinstance(params["layers"], dict):
        params = dict(params, layers=_per_layer(params["layers"], cfg.num_layers))
    return _cast_weights(params, jnp.dtype(cfg.compute_dtype))


def decode_weights(params, cfg: ModelConfig):
    """`compute_weights` for a decode loop. Traced for a GPU, stacked layers whose every weight is cast
    (copied) anyway come back per layer as well: the split is that same copy, and per-layer arrays
    spare a one-row decode step its copies out of the stack (`decoder`) and compile to fewer kernels.
    Elsewhere, or where the cast copies only part of a stack (frozen bf16 weights beside LoRA
    adapters), the layers stay stacked: splitting them would be a second copy of the weights."""
    unstack = cpu.platform() == "gpu" and casts_weights(params, cfg, every=True)
    return compute_weights(params, cfg, unstack=unstack)


def casts_weights(params, cfg: ModelConfig, every: bool = False) -> bool:
    """Whether `compute_weights` changes the dtype of any weight (fp32 weights, bf16 compute); every: of
    every weight of the layers, so that the cast copies the whole layer stack anyway."""
    tree = params["layers"] if every else params
    cast = jax.eval_shape(functools.partial(compute_weights, cfg=cfg), tree)
    changed = [a.dtype != b.dtype for a, b in zip(jax.tree.leaves(tree), jax.tree.leaves(cast))
               if b.dtype == jnp.dtype(cfg.compute_dtype)]  # the norms keep their own dtype
    return bool(changed) and (all(changed) if every else any(changed))


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
    table = unembed_table(params, cfg).astype(hidden.dtype)
    if cpu.layouts():  # the vocabulary leads the product at any row count: faster for prefill and decode
        product = functools.partial(cpu.dense, weight_major=True, local=local)
    else:
        product = dense
    return _fp32_logits(product, hidden, table)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _fp32_logits(product, hidden, table):
    """`product(hidden, table)` accumulated into fp32 logits, with a backward pass in the operands'
    dtype. JAX's own transpose multiplies the fp32 cotangent by the bf16 operands cast to fp32, an
    fp32 product the size of the forward's twice per chunk of logits (and an fp32 copy of the table),
    which tensor cores run at a fraction of bf16's rate. Here the cotangent is cast to the compute
    dtype first, as every other layer's backward runs; in fp32 compute nothing changes."""
    return product(hidden, table, preferred_element_type=jnp.float32)


def _fp32_logits_fwd(product, hidden, table):
    return product(hidden, table, preferred_element_type=jnp.float32), (hidden, table)


def _fp32_logits_bwd(product, residuals, g):
    hidden, table = residuals
    _, pullback = jax.vjp(product, hidden, table)
    return pullback(g.astype(hidden.dtype))


_fp32_logits.defvjp(_fp32_logits_fwd, _fp32_logits_bwd)


def positions_from_mask(attention_mask: jax.Array) -> jax.Array:
    """RoPE positions for a left-padded batch: 0 at each row's first real token."""
    return jnp.maximum(jnp.cumsum(attention_mask.astype(jnp.int32), axis=-1) - 1, 0)


def forward(params, cfg: ModelConfig, input_ids, attention_mask=None, positions=None,
            rules: Rules | None = None) -> jax.Array:
    """fp32 logits [B, T, V] for a (possibly left-padded) batch, without a cache."""
    input_ids = jnp.asarray(input_ids)
    check_inputs(params, cfg, input_ids, attention_mask, positions)
    if attention_mask is None:
        attention_mask = jnp.ones(input_ids.shape, bool)
    if positions is None:
        positions = positions_from_mask(attention_mask)
    hidden, _ = decoder(params, cfg, input_ids, positions, attention_mask, rules=rules)
    return unembed(params, cfg, hidden, local=rules is None)


def check_inputs(params, cfg: ModelConfig, input_ids: jax.Array, attention_mask=None, positions=None) -> None:
    """Raise a TypeError or ValueError for inputs `forward` would misread: arguments out of order, ids
    that are no [batch, length] ints, a mask or positions of another shape, parameters of another
    model (`check_params`), and, outside a trace, ids past the vocabulary, which JAX's gather would
    wrap (negative) or turn into NaN logits instead of an error. Shapes only under jit: it costs
    nothing there."""
    if not isinstance(cfg, ModelConfig):
        raise TypeError(f"cfg is a {type(cfg).__name__}, not a ModelConfig; the order is forward(params, cfg, "
                        f"input_ids, ...)")
    if input_ids.ndim != 2 or input_ids.size == 0 or not jnp.issubdtype(input_ids.dtype, jnp.integer):
        raise TypeError(f"input_ids must be a non-empty [batch, length] array of int token ids, got "
                        f"{input_ids.dtype} of shape {input_ids.shape} (one sequence: ids[None])")
    for name, x in (("attention_mask", attention_mask), ("positions", positions)):
        if x is not None and np.shape(x) != input_ids.shape:
            raise ValueError(f"{name} has shape {np.shape(x)}, input_ids {input_ids.shape}: give one value "
                             f"per token")
    check_params(cfg, params)
    if not isinstance(input_ids, jax.core.Tracer) and input_ids.is_fully_addressable:  # this host holds them all
        ids = np.asarray(input_ids)
        if ids.min() < 0 or ids.max() >= cfg.vocab_size:
            bad = ids.min() if ids.min() < 0 else ids.max()
            raise ValueError(f"input_ids hold token id {bad}, outside the model's vocabulary [0, "
                             f"{cfg.vocab_size}); check that the tokenizer belongs to this model")
