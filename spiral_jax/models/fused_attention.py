"""Fused attention for blocks that attend to themselves: training, scoring, and a prefill into an
empty cache. The kernels never build the [rows, heads, T, T] score matrix, the largest buffer of a
long-row train step.

- "splash": Pallas splash attention on TPU (`jax.experimental.pallas.ops.tpu.splash_attention`).
- "cudnn": cuDNN flash attention on NVIDIA GPUs (`jax.nn.dot_product_attention`).
- "xla": the decoder's own `transformer.attention`, which every CPU run uses.
- "auto" (the default): splash on TPU, cudnn on GPU (bf16/fp16 compute), xla elsewhere, by the
  platform of the mesh's devices (without a mesh, `cpu.platform()`: JAX's default backend, or the
  platform a program is compiled for ahead of time).

The decoder's rule is that a query at slot s sees the keys at slots <= s whose kv_mask is set. For a
block that starts at slot 0 that is causal attention within segments, with segment id = kv_mask (a
bool mask, or the segment ids of packed training rows, 0 on padding): a real query sees exactly the
real keys of its segment at or before it, and a padding query sees padding keys (at least itself),
so no row is ever fully masked. Splash takes those segment ids as they are. cuDNN takes per-row
lengths instead. A row of one segment (left-padded prompts, right-padded training rows: real tokens
contiguous) is first rotated to the row's start; RoPE has already been applied, so the rotation
changes nothing but where its tokens sit. Rows of several segments take cuDNN's packed layout: each
segment's start and length, and the kernel runs each segment as its own causal sequence.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from spiral_jax.models import cpu
from spiral_jax.sharding import Rules

IMPLEMENTATIONS = ("auto", "xla", "splash", "cudnn")
_BLOCKS = (512, 256, 128)  # splash tile sizes tried, largest first; rows are padded to a multiple of 128


def resolve(implementation: str, platform: str, dtype, head_dim: int) -> str:
    """The kernel `implementation` stands for on `platform` (tpu, gpu, cpu) at compute `dtype`.

    "auto" picks a kernel only where it is known to compile: cuDNN's flash attention takes 16-bit
    inputs only (fp32 GPU runs, the parity tests, stay on XLA); splash's Mosaic kernels compile for
    the 128-wide heads of every Qwen and Llama checkpoint and for fp32, but refuse bf16 at 64."""
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"model.attention={implementation!r}; use one of {', '.join(IMPLEMENTATIONS)}")
    if implementation != "auto":
        return implementation
    if platform == "tpu" and (head_dim % 128 == 0 or jnp.dtype(dtype).itemsize == 4):
        return "splash"
    if platform in ("gpu", "cuda") and jnp.dtype(dtype).itemsize == 2:
        return "cudnn"
    return "xla"


def platform(rules: Rules | None) -> str:
    """The platform a program runs on: its mesh's devices', else `cpu.platform()`."""
    return rules.mesh.devices.flat[0].platform if rules is not None else cpu.platform()


def _per_device(fn, rules: Rules | None, q, k, v, kv_mask):
    """Run fn(q, k, v, kv_mask) on each device's shard (rows over data x fsdp, heads over tensor):
    Pallas and cuDNN kernels have no partitioning rule of their own. None when the heads do not split
    alike (then each device's query heads would not line up with its key/value heads)."""
    if rules is None:
        return fn(q, k, v, kv_mask)
    q_spec = rules.spec(("batch", "seq", "heads", "head_dim"), q.shape)
    kv_spec = rules.spec(("batch", "seq", "kv_heads", "head_dim"), k.shape)
    if q_spec[2] != kv_spec[2] or q_spec[0] != kv_spec[0]:
        return None
    mask_spec = jax.sharding.PartitionSpec(q_spec[0], None)
    return jax.shard_map(fn, mesh=rules.mesh, in_specs=(q_spec, kv_spec, kv_spec, mask_spec), out_specs=q_spec,
                         check_vma=False)(q, k, v, kv_mask)


def _block_size(length: int) -> int:
    return next(b for b in _BLOCKS if length % b == 0)


@functools.lru_cache(maxsize=64)
def _splash_kernel(group: int, length: int, interpret: bool):
    """A splash kernel for `group` query heads sharing one key/value head over `length` slots.

    Built with its mask tables as concrete arrays, even when first asked for inside a trace (a scanned
    layer's): the cached kernel outlives that trace, and later programs reuse it."""
    from jax.experimental.pallas.ops.tpu import splash_attention as splash

    block = _block_size(length)
    sizes = splash.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block, block_q_dkv=block,
                              block_kv_dkv=block, block_kv_dkv_compute=block, block_q_dq=block,
                              block_kv_dq=block)
    mask = splash.MultiHeadMask([splash.CausalMask((length, length))] * group)
    with jax.ensure_compile_time_eval():
        return splash.make_splash_mqa_single_device(mask, block_sizes=sizes, interpret=interpret)


def splash_attention(q, k, v, kv_mask, interpret: bool = False):
    """q [B,T,H,hd]; k, v [B,T,KV,hd]; kv_mask [B,T] -> [B,T,H,hd], on one device's shard.

    interpret: run the Pallas kernel in its interpreter (any backend; for tests on CPU)."""
    from jax.experimental.pallas.ops.tpu.splash_attention import SegmentIds

    b, t, h, hd = q.shape
    kv = k.shape[2]
    pad = -t % _BLOCKS[-1]  # slots past the end: segment 0, after every query, so never seen by a real one
    segments = jnp.pad(kv_mask.astype(jnp.int32), ((0, 0), (0, pad)))
    widen = lambda x: jnp.pad(x, ((0, 0), (0, pad), (0, 0), (0, 0)))  # noqa: E731
    qh = widen(q * jnp.asarray(hd ** -0.5, q.dtype)).reshape(b, t + pad, kv, h // kv, hd).transpose(0, 2, 3, 1, 4)
    kh, vh = (widen(x).transpose(0, 2, 1, 3) for x in (k, v))  # [B, KV, T, hd]
    kernel = _splash_kernel(h // kv, t + pad, interpret)
    per_head = jax.vmap(kernel, in_axes=(0, 0, 0, None))  # over key/value heads
    out = jax.vmap(per_head)(qh, kh, vh, SegmentIds(q=segments, kv=segments))  # [B, KV, G, T, hd]
    return out.transpose(0, 3, 1, 2, 4).reshape(b, t + pad, h, hd)[:, :t]


def _rotate(x, shift):
    """Roll each row of x [B, T, ...] left by shift [B] slots."""
    idx = (jnp.arange(x.shape[1])[None, :] + shift[:, None]) % x.shape[1]
    return jnp.take_along_axis(x, idx.reshape(*idx.shape, *([1] * (x.ndim - 2))), axis=1)


def segment_bounds(segment_ids, segments: int):
    """(starts, lengths), each [B, segments]: where each row's segments 1 .. `segments` begin and how
    many slots they hold, -1 where a row holds fewer (cuDNN's packed layout). Segments are contiguous."""
    member = segment_ids[:, None, :] == jnp.arange(1, segments + 1, dtype=segment_ids.dtype)[None, :, None]
    lengths = jnp.sum(member, axis=-1, dtype=jnp.int32)
    starts = jnp.argmax(member, axis=-1).astype(jnp.int32)
    return jnp.where(lengths > 0, starts, -1), jnp.where(lengths > 0, lengths, -1)


def cudnn_attention(q, k, v, kv_mask, segments: int = 1, implementation: str = "cudnn"):
    """q [B,T,H,hd]; k, v [B,T,KV,hd]; kv_mask [B,T]: a bool mask or segment ids, each segment's slots
    contiguous, at most `segments` a row -> [B,T,H,hd], 0 on padding.

    The kernel takes each row's real slots from slot 0 on. Segment ids mark right-padded rows (the
    train step's), which already start there; rows of a bool mask may be left-padded (a prefill's
    prompts), so each is rolled to start at slot 0 and back. The roll is a gather of q, k, v and the
    output in every layer, and a scatter of each in the backward, so rows that need none skip it.

    The kernel's inputs are zeroed past the real slots, which leaves their gradients 0 there whatever
    the kernel's backward writes to slots outside every sequence (they would reach the projections'
    weight gradients).

    implementation="xla" runs jax's reference path with the same lengths (for tests on CPU; one
    segment a row only: the packed layout is cuDNN's alone)."""
    if segments > 1:
        return _cudnn_packed(q, k, v, kv_mask, segments)
    mask = kv_mask.astype(bool)
    lengths = jnp.sum(mask, axis=1).astype(jnp.int32)
    if jnp.issubdtype(kv_mask.dtype, jnp.integer):  # right-padded rows
        to_front = to_place = lambda x: x  # noqa: E731
    else:
        start = jnp.argmax(mask, axis=1).astype(jnp.int32)  # the row's first real slot
        to_front, to_place = (lambda x: _rotate(x, start)), (lambda x: _rotate(x, -start))
    real = (jnp.arange(q.shape[1])[None, :] < lengths[:, None])[..., None, None]
    rows = lambda x: jnp.where(real, to_front(x), 0)  # noqa: E731
    out = jax.nn.dot_product_attention(rows(q), rows(k), rows(v), is_causal=True, query_seq_lengths=lengths,
                                       key_value_seq_lengths=lengths, implementation=implementation)
    return to_place(jnp.where(real, out, 0).astype(q.dtype))  # padding rows: 0


@functools.cache
def packed_keys_strided_by_kv_heads() -> bool:
    """Whether JAX turns the packed layout's key offsets into element offsets with the key/value head
    count. Releases before jax 0.11.1 use the query head count for both, so under grouped-query
    attention each segment after a row's first reads keys from the wrong place, with no error. Asked
    of JAX's own offset arithmetic on a two-segment row of 2 query heads over 1 key/value head; False
    where that cannot be asked (the repeated heads are right either way)."""
    try:
        from jax._src.cudnn.fused_attention_stablehlo import _fix_seqlen_offsets

        try:
            host = jax.devices("cpu")[0]
        except RuntimeError:  # JAX_PLATFORMS without cpu: the default device answers as well
            host = None
        # Evaluated now, also when first asked while a program is traced.
        with jax.ensure_compile_time_eval(), jax.default_device(host):
            lengths, offsets = jnp.array([[2, 2]]), jnp.array([[0, 2, -1]])
            q, k = jnp.zeros((1, 4, 2, 1)), jnp.zeros((1, 4, 1, 1))
            kv_offsets = _fix_seqlen_offsets(lengths, lengths, offsets, offsets, q, k)[3]
            return int(kv_offsets[0, 1]) == 2  # the second segment: 2 tokens of 1 head x 1 wide in
    except Exception:
        return False


def _cudnn_packed(q, k, v, segment_ids, segments: int):
    """cuDNN flash attention over rows of several segments, each its own causal sequence. JAX exposes
    the packed layout (per-segment offsets and lengths) only below `jax.nn`; it needs a Hopper GPU.
    Where JAX strides the key offsets by the query heads (`packed_keys_strided_by_kv_heads`), k and v
    go in with one head per query head, the layout in which that stride is right."""
    from jax._src.cudnn.fused_attention_stablehlo import MaskType, dot_product_attention

    starts, lengths = segment_bounds(segment_ids, segments)
    offsets = jnp.pad(starts, ((0, 0), (0, 1)), constant_values=-1)  # [B, segments + 1], as cuDNN takes them
    real = (segment_ids > 0)[..., None, None]
    q, k, v = (jnp.where(real, x, 0) for x in (q, k, v))
    if k.shape[2] != q.shape[2] and not packed_keys_strided_by_kv_heads():
        k, v = (jnp.repeat(x, q.shape[2] // x.shape[2], axis=2) for x in (k, v))
    out = dot_product_attention(q, k, v, q_seqlen=lengths, kv_seqlen=lengths, q_offsets=offsets, kv_offsets=offsets,
                                scale=q.shape[-1] ** -0.5, mask_type=MaskType.PADDING_CAUSAL)
    return jnp.where(real, out, 0).astype(q.dtype)


def fused_attention(implementation: str, rules: Rules | None, q, k, v, kv_mask, segments: int = 1):
    """Self-attention of a block from slot 0 by the `resolve`d kernel; None where that is "xla" or
    the kernel cannot take this sharding (the caller then runs the XLA path). kv_mask: a bool mask,
    or segment ids of at most `segments` a row."""
    kernel = {"splash": splash_attention, "cudnn": functools.partial(cudnn_attention, segments=segments)}.get(
        resolve(implementation, platform(rules), q.dtype, q.shape[-1]))
    if kernel is None:
        return None
    return _per_device(kernel, rules, q, k, v, kv_mask)
