"""The CPU kernels for decode steps (`cpu_kernels`): built here; the matmul exact to float rounding
against float64, differentiable, used by `dense` where it should be; the attention equal to the model's
XLA form of it; and a failed build falls back to XLA."""
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spiral_jax.models import cpu, cpu_kernels
from spiral_jax.models.transformer import attention
from spiral_jax.models.transformer import MASKED, dense


def test_kernel_builds_on_this_machine():
    """CI has a C++ compiler: the kernels must build, or every decode step silently takes the slow path."""
    assert cpu_kernels.available()


# (out rows N, contraction K, batch rows B): N not a multiple of the 6-row tile or of a thread's chunk,
# B below, at and between the 8- and 16-column groups, K over several contraction blocks and not a
# multiple of a cache line.
SHAPES = [(1, 1, 1), (7, 3, 1), (13, 5, 8), (100, 37, 9), (250, 256, 16), (97, 300, 24), (1000, 1000, 32),
          (6, 129, 33), (300, 64, 64)]


@pytest.mark.parametrize("n,k,b", SHAPES)
def test_kernel_matches_float64(n, k, b):
    rng = np.random.default_rng(n * 1000 + k + b)
    w = rng.standard_normal((n, k)).astype(np.float32)
    x = rng.standard_normal((b, k)).astype(np.float32)
    got = np.asarray(jax.jit(cpu_kernels.weight_major_matmul)(w, x))
    want = w.astype(np.float64) @ x.astype(np.float64).T
    assert got.shape == (n, b)
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-6 * np.sqrt(k) * np.abs(want).max())


def test_kernel_gradients_equal_xla_dot():
    kw, kx, kg = jax.random.split(jax.random.key(1), 3)
    w, x, g = jax.random.normal(kw, (50, 40)), jax.random.normal(kx, (16, 40)), jax.random.normal(kg, (50, 16))
    loss = lambda f: lambda w, x: jnp.sum(f(w, x) * g)  # noqa: E731
    got = jax.grad(loss(cpu_kernels.weight_major_matmul), argnums=(0, 1))(w, x)
    want = jax.grad(loss(lambda w, x: jnp.dot(w, x.T, precision="highest")), argnums=(0, 1))(w, x)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def _uses_kernel(rows: int, local: bool = True) -> bool:
    x, w = jnp.ones((rows, 32)), jnp.ones((48, 32))
    return "ffi_call" in str(jax.make_jaxpr(lambda x, w: dense(x, w, local=local))(x, w))


def test_dense_uses_the_kernel_for_whole_16_row_tiles_only(layouts):
    """On CPU, 16-64 rows in whole tiles of 16 go to the kernel; not under a mesh (local=False), not
    with the accelerator layouts, and not at other row counts, where XLA's dot is as fast."""
    cpu = layouts == "cpu"
    assert [_uses_kernel(r) for r in (16, 32, 64)] == [cpu] * 3
    assert not any(_uses_kernel(r) for r in (1, 8, 24, 128))
    assert not _uses_kernel(32, local=False)
    x, w = jax.random.normal(jax.random.key(2), (32, 32)), jax.random.normal(jax.random.key(3), (48, 32))
    np.testing.assert_allclose(dense(x, w), dense(x, w, local=False), rtol=1e-5, atol=1e-5)


def test_failed_build_falls_back_to_xla_with_a_warning(tmp_path):
    """No compiler: a warning naming the fix, and dense still computes the product (through XLA)."""
    code = ("import jax.numpy as jnp; from spiral_jax.models import cpu_kernels; "
            "from spiral_jax.models.transformer import dense; "
            "assert not cpu_kernels.available(); "
            "print(float(dense(jnp.ones((32, 8)), jnp.ones((48, 8))).sum()))")
    env = dict(os.environ, CXX=str(tmp_path / "no-such-compiler"), SPIRAL_JAX_KERNEL_CACHE=str(tmp_path / "cache"),
               JAX_PLATFORMS="cpu")
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert float(result.stdout.split()[-1]) == 32 * 48 * 8
    assert "CPU kernels could not be built" in result.stderr and "CXX" in result.stderr


# (rows, cache slots, attended window, KV heads, query group, head_dim): windows below, at and between
# whole 8-slot vectors, head_dim 8 to 128 (whole and part 4-vector blocks), groups of 1 to 7.
ATTENTION_SHAPES = [(1, 16, 16, 1, 1, 8), (3, 40, 17, 8, 2, 128), (32, 128, 128, 2, 4, 32), (2, 9, 5, 2, 7, 40),
                    (4, 64, 33, 4, 3, 64)]


@pytest.mark.parametrize("rows,slots,window,kv,group,hd", ATTENTION_SHAPES)
def test_decode_attention_equals_xla(rows, slots, window, kv, group, hd):
    """The kernel against the model's XLA decode attention over the same cache slice, every layer (the
    layer index traced), with masked slots, and a row with none allowed (uniform over its window)."""
    rng = np.random.default_rng(rows * 100 + window)
    layers = 3
    k = rng.standard_normal((layers, rows, kv, slots, hd)).astype(np.float32)
    v = rng.standard_normal((layers, rows, kv, slots, hd)).astype(np.float32)
    q = 2 * rng.standard_normal((rows, kv * group, hd)).astype(np.float32)
    allowed = rng.random((rows, window)) < 0.6
    allowed[:, 0] = True
    allowed[-1] = rows == 1  # the last row: nothing allowed (unless it is the only one)
    kernel = jax.jit(lambda q, k, v, layer, allowed: cpu_kernels.decode_attention(
        q, k, v, layer, allowed, scale=hd ** -0.5, masked=MASKED))
    for layer in range(layers):
        got = np.asarray(kernel(q, k, v, layer, allowed))
        # The query sits at the window's last slot, so `attention` allows exactly `allowed`.
        args = (q[:, None], k[layer, :, :, :window], v[layer, :, :, :window], np.full((rows, 1), window - 1), allowed)
        want = np.asarray(attention(*args))[:, 0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        for platform in ("tpu", "gpu"):  # the accelerators' forms: queries first, on a GPU reductions
            with cpu.compiling_for(platform):
                np.testing.assert_allclose(np.asarray(attention(*args))[:, 0], want, rtol=1e-5, atol=1e-5)
