"""`dense`, the one product behind every projection: the same result in every layout it picks, on the
accelerator path and in each of the CPU layouts (`cpu.dense`)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spiral_jax.models import cpu
from spiral_jax.models import ModelConfig
from spiral_jax.models.transformer import dense, unembed

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


def _dot_operand_dtypes(fn, *args) -> list[tuple[str, ...]]:
    """The operand dtypes of every dot_general `fn` traces to."""
    return [tuple(str(v.aval.dtype) for v in e.invars) for e in jax.make_jaxpr(fn)(*args).eqns
            if e.primitive.name == "dot_general"]


def test_the_logits_backward_runs_in_the_compute_dtype(layouts):
    """fp32 logits from bf16 operands, and a backward of bf16 products: JAX's own transpose multiplies
    the fp32 cotangent by a bf16 operand, which XLA runs as an fp32 product. In fp32 it is autodiff's
    gradient."""
    params = {"embed": jax.random.normal(jax.random.key(1), (40, 16))}
    cfg = ModelConfig(model_type="qwen3", vocab_size=40, hidden_size=16, intermediate_size=32, num_layers=1, num_heads=2,
                      num_kv_heads=1, head_dim=8, tie_word_embeddings=True)
    hidden = jax.random.normal(jax.random.key(2), (3, 5, 16))
    cotangent = jax.random.normal(jax.random.key(3), (3, 5, 40))

    def grads(hidden, params, fn):
        return jax.grad(lambda h, p: jnp.sum(fn(p, h) * cotangent), argnums=(0, 1))(hidden, params)

    def autodiff(p, h):  # the same product, differentiated by JAX
        table = p["embed"].astype(h.dtype)
        return jnp.einsum("btd,vd->btv", h, table, preferred_element_type=jnp.float32)

    ours = lambda p, h: unembed(p, cfg, h)  # noqa: E731
    got, want = grads(hidden, params, ours), grads(hidden, params, autodiff)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5), got, want)

    h16 = hidden.astype(jnp.bfloat16)
    assert ("float32", "bfloat16") in _dot_operand_dtypes(lambda h, p: grads(h, p, autodiff), h16, params)
    assert all("float32" not in dtypes for dtypes in _dot_operand_dtypes(lambda h, p: grads(h, p, ours), h16, params))
    d_hidden, d_params = grads(h16, params, ours)
    assert d_hidden.dtype == jnp.bfloat16 and d_params["embed"].dtype == jnp.float32
    np.testing.assert_allclose(d_hidden.astype(jnp.float32), want[0], rtol=0.05, atol=0.05 * np.abs(want[0]).max())
    np.testing.assert_allclose(d_params["embed"], want[1]["embed"], rtol=0.05, atol=0.05 * np.abs(want[1]["embed"]).max())
