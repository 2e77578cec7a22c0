"""The model's CPU specialisations, behind one seam.

The decoder (`transformer.py`) is written for accelerators. Where XLA:CPU runs another layout of the
same product much faster, or where `cpu_kernels`' compiled kernels are built, the decoder makes one
call into this module instead: `dense` for every projection and the unembedding, and
`kernel_attention` for a decode step's attention. Each computes what the accelerator path does, to
float rounding (tests/models/test_dense.py, tests/models/test_cpu_kernels.py and the sampler tests).
What each is worth: docs/performance.md (`python bench/sampler.py`).
"""
from __future__ import annotations

import contextlib
import contextvars

import jax
import jax.numpy as jnp
import numpy as np

from spiral_jax.models import cpu_kernels

WEIGHT_MAJOR_ROWS = 64  # products with at most this many rows put the weight first (see dense)
MATVEC_GROUPS = 4  # a one-row product splits its weight's out rows into this many groups (see dense)


_COMPILING_FOR = contextvars.ContextVar("spiral_jax_compiling_for", default=None)


def platform() -> str:
    """The platform (cpu, gpu, tpu) the program being traced is for: the one `compiling_for` names,
    else JAX's default backend."""
    return _COMPILING_FOR.get() or jax.default_backend()


@contextlib.contextmanager
def compiling_for(target: str):
    """Trace programs for `target`'s platform whatever this process's default backend is.

    Ahead-of-time compilation (`spiral_jax.aot`) builds TPU and GPU programs in a process whose
    backend is the CPU; without this they would take the CPU layouts and kernels, which the devices
    they are compiled for never run.
    """
    token = _COMPILING_FOR.set(target)
    try:
        yield
    finally:
        _COMPILING_FOR.reset(token)


def layouts() -> bool:
    """Whether the model takes the CPU paths of this module (also read by `sampling.logits` and the
    sampler). Read at trace time and only here, so that tests run the accelerator paths on a CPU too."""
    return platform() == "cpu"


def dense(x: jax.Array, w: jax.Array, n_in: int = 1, weight_major: bool | None = None,
          preferred_element_type=None, local: bool = True) -> jax.Array:
    """`transformer.dense` laid out for XLA:CPU: x [..., *in] times w [*out, *in] -> [..., *out].

    The product runs as one 2-D matmul of [out, in] and [rows, in]: given several out or in axes (the
    attention projections, [heads, head_dim, embed]), XLA:CPU would otherwise copy those weights into a
    transposed layout on every many-row call.

    weight_major computes the product as w . x^T (out axes leading), then transposes the small result:
    XLA's CPU dot runs a few rows (a decode step) much faster that way. The barrier keeps XLA from
    folding the transpose back into the product. By default it is used for products of at most
    WEIGHT_MAJOR_ROWS rows; the unembedding uses it at any row count.

    A single row (batch-1 decode) is a matrix-vector product, which XLA:CPU runs on one thread; split
    into groups of the weight's out rows as a batch axis, it uses every core.

    With 16, 32, 48 or 64 f32 rows (a decode step's batch), the weight-major product runs in
    `cpu_kernels`' matmul kernel where it is built. local=False (a mesh: the kernel has no sharding
    rule) keeps XLA's dot.
    """
    lead = x.ndim - n_in
    out_shape, rows = w.shape[:w.ndim - n_in], x.shape[:lead]
    n_rows, size_in = int(np.prod(rows)), int(np.prod(x.shape[lead:]))
    x, w = x.reshape(*rows, size_in), w.reshape(-1, size_in)
    contract = (((x.ndim - 1,), (1,)), ((), ()))
    if weight_major is None:
        weight_major = n_rows <= WEIGHT_MAJOR_ROWS
    if not weight_major:
        y = jax.lax.dot_general(x, w, contract, preferred_element_type=preferred_element_type)
        return y.reshape(*rows, *out_shape)
    if local and _kernel_rows(n_rows) and x.dtype == w.dtype == jnp.float32:
        y = cpu_kernels.weight_major_matmul(w, x.reshape(n_rows, -1)).reshape(-1, *rows)
    elif n_rows == 1 and w.shape[0] % MATVEC_GROUPS == 0:
        groups = w.reshape(MATVEC_GROUPS, -1, size_in)
        vector = jnp.broadcast_to(x.reshape(1, 1, size_in), (MATVEC_GROUPS, 1, size_in))
        y = jax.lax.dot_general(groups, vector, (((2,), (2,)), ((0,), (0,))),
                                preferred_element_type=preferred_element_type).reshape(-1, *rows)
    else:
        y = jax.lax.dot_general(w, x, (((1,), (x.ndim - 1,)), ((), ())),
                                preferred_element_type=preferred_element_type)
    y = jax.lax.optimization_barrier(y).transpose(*range(1, y.ndim), 0)  # [out, *rows] -> [*rows, out]
    return y.reshape(*rows, *out_shape)


def _kernel_rows(n_rows: int) -> bool:
    """Whether a weight-major product of n_rows rows goes to the kernel: it works in tiles of 16 rows,
    and at fewer (or a part tile) XLA's dot is as fast or faster."""
    return n_rows % 16 == 0 and n_rows <= WEIGHT_MAJOR_ROWS and cpu_kernels.available()


def kernel_attention_fits(q, k_cache, local: bool) -> bool:
    """Whether a decode step's attention can run in `kernel_attention`: one f32 query per row, an f32
    cache, on a single CPU device (the kernel has no sharding rule)."""
    return (q.shape[1] == 1 and local and layouts() and q.dtype == k_cache.dtype == jnp.float32
            and q.shape[-1] % 8 == 0 and cpu_kernels.available())


def kernel_attention(q, k_cache, v_cache, layer, allowed, masked: float):
    """A decode step's attention in `cpu_kernels`' kernel, over layer `layer` of the whole cache [layers,
    B, KV, slots, hd] with allowed [B, window]: q [B,1,H,hd] -> [B,1,H,hd]. It reads the layer's keys
    and values in place, where XLA:CPU first copies the layer's window out of the cache."""
    return cpu_kernels.decode_attention(q[:, 0], k_cache, v_cache, layer, allowed,
                                        scale=q.shape[-1] ** -0.5, masked=masked)[:, None]
