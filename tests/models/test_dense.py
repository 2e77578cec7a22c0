"""`dense`, the one product behind every projection: the same result in every layout it picks, on the
accelerator path and in each of the CPU layouts (`cpu.dense`)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spiral_jax.models import cpu
from spiral_jax.models.transformer import dense

# (row shape, weight shape, n_in): one row (batch-1 decode, grouped on CPU), a few rows (decode,
# weight first on CPU), many rows (prefill, training); several out axes (q) and in axes (o); an out
# size that the matrix-vector groups do not divide.
CASES = [((), (6, 8, 32), 1), ((1,), (48, 32), 1), ((1, 1), (32, 6, 8), 2), ((1, 1), (30, 32), 1),
         ((3,), (6, 8, 32), 1), ((2, 5), (32, 6, 8), 2), ((70,), (48, 32), 1)]


def _einsum_case(rows, w_shape, n_in):
    kx, kw = jax.random.split(jax.random.key(0))
    in_shape = w_shape[len(w_shape) - n_in:]
    x = jax.random.normal(kx, rows + in_shape)
    w = jax.random.normal(kw, w_shape)
    letters = "abcdefgh"
    r, o, i = letters[:len(rows)], letters[3:3 + len(w_shape) - n_in], letters[6:6 + n_in]
    return x, w, jnp.einsum(f"{r}{i},{o}{i}->{r}{o}", x, w, precision=jax.lax.Precision.HIGHEST)


@pytest.mark.parametrize("rows,w_shape,n_in", CASES)
def test_dense_equals_einsum(rows, w_shape, n_in, layouts):
    x, w, want = _einsum_case(rows, w_shape, n_in)
    got = jax.jit(lambda x, w: dense(x, w, n_in))(x, w)
    assert got.shape == rows + w_shape[:len(w_shape) - n_in]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rows,w_shape,n_in", CASES)
@pytest.mark.parametrize("weight_major", [None, True, False])
def test_cpu_dense_equals_einsum(rows, w_shape, n_in, weight_major):
    x, w, want = _einsum_case(rows, w_shape, n_in)
    got = jax.jit(lambda x, w: cpu.dense(x, w, n_in, weight_major))(x, w)
    assert got.shape == rows + w_shape[:len(w_shape) - n_in]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def _dot_batch_dims(x, w):
    """The batch dimensions of each product in dense(x, w)'s program."""
    jaxpr = jax.make_jaxpr(lambda x, w: dense(x, w))(x, w).jaxpr
    return [e.params["dimension_numbers"][1][0] for e in jaxpr.eqns if e.primitive.name == "dot_general"]


def test_one_row_product_is_grouped_on_cpu(layouts):
    """On CPU a one-row product becomes a batched matrix-vector product over groups of out rows."""
    w = jnp.ones((48, 32))
    assert _dot_batch_dims(jnp.ones((1, 1, 32)), w) == ([(0,)] if layouts == "cpu" else [()])
    assert _dot_batch_dims(jnp.ones((2, 32)), w) == [()]
    assert _dot_batch_dims(jnp.ones((1, 32)), jnp.ones((30, 32))) == [()]  # 30 rows: no even groups


def test_programs_compiled_for_an_accelerator_take_its_layouts():
    """Ahead-of-time compilation traces for the target's platform, not this CPU's (`cpu.compiling_for`)."""
    x, w = jnp.ones((1, 1, 32)), jnp.ones((48, 32))
    assert cpu.platform() == "cpu" and _dot_batch_dims(x, w) == [(0,)]
    with cpu.compiling_for("tpu"):
        assert cpu.platform() == "tpu" and not cpu.layouts() and _dot_batch_dims(x, w) == [()]
    assert cpu.layouts() and _dot_batch_dims(x, w) == [(0,)]
