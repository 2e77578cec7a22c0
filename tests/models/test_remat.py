"""What a rematerialised layer keeps from its forward (`ModelConfig.remat_saves`)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spiral_jax.models import ModelConfig, decoder, init_params, lora

LAYERS = 2


def _config(**runtime) -> ModelConfig:
    return ModelConfig(model_type="qwen3", vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=LAYERS,
                       num_heads=4, num_kv_heads=2, head_dim=8, **runtime)


def _loss(cfg: ModelConfig):
    tokens = jax.random.randint(jax.random.key(1), (2, 12), 0, cfg.vocab_size)
    mask = jnp.ones((2, 12), bool)
    positions = jnp.broadcast_to(jnp.arange(12), (2, 12))
    return lambda params: jnp.sum(decoder(params, cfg, tokens, positions, mask)[0] ** 2)


def _flops(cfg: ModelConfig, params) -> float:
    """FLOPs of the compiled gradient (a scanned stack's body counted once)."""
    return jax.jit(jax.grad(_loss(cfg))).lower(params).compile().cost_analysis()["flops"]


@pytest.mark.parametrize("scan_layers", [False, True])
def test_what_remat_keeps_spares_its_products_and_changes_no_gradient(scan_layers):
    """Keeping the MLP's gate and up spares remat their products, and q/k/v theirs; the gradients are
    those of the full recompute and of no remat at all."""
    cfg = _config(scan_layers=scan_layers)
    params = init_params(cfg, jax.random.key(0))
    variants = {saves: cfg.replace(remat_saves=saves) for saves in ((), ("mlp",), ("qkv",))}
    want = jax.grad(_loss(cfg.replace(remat=False)))(params)
    for c in variants.values():
        got = jax.grad(_loss(c))(params)
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), got, want)
    tokens, d, f = 2 * 12, cfg.hidden_size, cfg.intermediate_size
    products = {"mlp": 2 * (2 * tokens * d * f),
                "qkv": 2 * tokens * d * (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim}
    layers = 1 if scan_layers else LAYERS  # a scanned stack's body is counted once
    full = _flops(variants[()], params)
    for name, spared in products.items():
        assert 0.85 <= (full - _flops(variants[(name,)], params)) / (layers * spared) <= 1.05, name


def test_a_lora_layer_keeps_its_projections_with_their_adapters():
    """With LoRA the kept q/k/v and gate/up are the projections with their adapters' products added:
    the adapters' gradients are those of the full recompute."""
    cfg = _config(lora_rank=2, lora_alpha=4.0)
    adapters = lora.init_adapters(cfg, jax.random.key(1))
    adapters = jax.tree.map(lambda x: 0.1 * jax.random.normal(jax.random.key(2), x.shape), adapters)
    frozen = init_params(cfg.base(), jax.random.key(0))
    grads = lambda c: jax.grad(lambda a: _loss(c)(lora.join(frozen, a)))(adapters)  # noqa: E731
    want = grads(cfg)
    got = grads(cfg.replace(remat_saves=("qkv", "mlp")))
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), got, want)
    assert all(float(jnp.abs(g).max()) > 0 for g in jax.tree.leaves(want))


def test_remat_saves_names_what_a_layer_can_keep():
    assert _config(remat_saves=["mlp"]).remat_saves == ("mlp",)
    with pytest.raises(ValueError, match="remat_saves=.*one of qkv, mlp"):
        _config(remat_saves=("attention",))


def _layer_barriers(cfg: ModelConfig, differentiate: bool = True) -> int:
    """Optimization barriers in the program that pass one layer's weights' gradients and a [B, T, D]
    activation gradient together."""
    params = init_params(cfg, jax.random.key(0))
    leaves = len(jax.tree.leaves(init_params(cfg.replace(num_layers=1, scan_layers=False), jax.random.key(0))["layers"]))
    program = jax.jit(jax.grad(_loss(cfg)) if differentiate else _loss(cfg)).lower(params).as_text()
    return sum(f":{leaves + 1} = stablehlo.optimization_barrier" in line and line.endswith("x32xf32>")
               for line in program.splitlines())


@pytest.mark.parametrize("remat", [False, True])
def test_unrolled_layers_run_their_backward_a_layer_at_a_time(remat):
    """Each unrolled layer's weight gradients and its input's gradient leave the backward through one
    barrier, so the compiler cannot put the weight-gradient products of every layer at the end while
    all the layers' activation gradients wait for them (XLA:GPU's scheduler did). A scanned stack's
    loop orders them already; a forward without gradients has none."""
    cfg = _config(remat=remat)
    assert _layer_barriers(cfg) == LAYERS
    assert _layer_barriers(cfg.replace(scan_layers=True)) == 0
    assert _layer_barriers(cfg, differentiate=False) == 0
