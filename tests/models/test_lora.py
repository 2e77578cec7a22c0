"""LoRA adapters: the forward with adapters equals the merged weights' forward, a fresh adapter changes
nothing, gradients match finite differences, and a PEFT export loads in transformers + peft with our
logits."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spiral_jax.models import KVCache, cpu, decoder, forward, init_params, load_pretrained, lora, save_adapter
from tests.tiny_models import FAMILIES, TINY, make_hf_model

IDS = jnp.asarray(np.random.default_rng(0).integers(0, TINY.vocab_size, (2, 12)), jnp.int32)


def _adapted(cfg, seed=1, scale=0.05):
    """Base weights and adapters whose B is not zero (a fresh B is, which would hide every error)."""
    base = init_params(cfg.base(), jax.random.key(0))
    adapters = lora.init_adapters(cfg, jax.random.key(seed))
    leaves, tree = jax.tree.flatten(adapters)
    keys = jax.random.split(jax.random.key(seed + 1), len(leaves))
    adapters = jax.tree.unflatten(tree, [x + scale * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)])
    return base, adapters


@pytest.mark.parametrize("scan", [False, True])
@pytest.mark.parametrize("targets", [("q", "k", "v", "o", "gate", "up", "down"), ("q", "v")])
def test_the_forward_with_adapters_equals_the_merged_weights(scan, targets):
    cfg = TINY.replace(lora_rank=4, lora_alpha=8.0, lora_targets=targets, scan_layers=scan)
    base, adapters = _adapted(cfg)
    full = lora.join(base, adapters)
    merged = lora.merge(full, cfg)
    assert jax.tree.structure(merged) == jax.tree.structure(base)
    got, want = forward(full, cfg, IDS), forward(merged, cfg.base(), IDS)
    np.testing.assert_allclose(got, want, atol=1e-5)
    assert np.abs(np.asarray(got) - np.asarray(forward(base, cfg.base(), IDS))).max() > 1e-3  # they do act
    split = lora.split(full)
    assert jax.tree.structure(split) == jax.tree.structure((base, adapters))
    assert all(a is b for a, b in zip(jax.tree.leaves(split), jax.tree.leaves((base, adapters))))


def test_fresh_adapters_leave_the_model_as_it_was():
    cfg = TINY.replace(lora_rank=8)
    base = init_params(cfg.base(), jax.random.key(0))
    full = lora.join(base, lora.init_adapters(cfg, jax.random.key(1)))
    np.testing.assert_array_equal(forward(full, cfg, IDS), forward(base, cfg.base(), IDS))
    a = lora.split(full)[1]["layers"][0]
    assert float(jnp.abs(a["q_lora_a"]).max()) > 0 and float(jnp.abs(a["q_lora_b"]).max()) == 0


def test_adapter_gradients_match_finite_differences():
    cfg = TINY.replace(lora_rank=2, lora_alpha=4.0, lora_targets=("q", "o", "down"))
    base, adapters = _adapted(cfg, scale=0.2)
    probe = jax.random.normal(jax.random.key(7), (2, 12, cfg.vocab_size))

    def loss(adapters):
        return jnp.sum(forward(lora.join(base, adapters), cfg, IDS) * probe)

    grads = jax.grad(loss)(adapters)
    rng = np.random.default_rng(3)
    for name in ("q_lora_a", "q_lora_b", "o_lora_a", "o_lora_b", "down_lora_a", "down_lora_b"):
        x = adapters["layers"][1][name]
        index = tuple(rng.integers(0, n) for n in x.shape)
        eps = 1e-2

        def moved(delta):
            layers = list(adapters["layers"])
            layers[1] = {**layers[1], name: x.at[index].add(delta)}
            return {"layers": layers}

        numeric = (loss(moved(eps)) - loss(moved(-eps))) / (2 * eps)
        analytic = grads["layers"][1][name][index]
        np.testing.assert_allclose(analytic, numeric, rtol=2e-2, atol=2e-3, err_msg=name)


def test_the_base_of_any_lora_config_loads_the_checkpoint_it_came_from(tmp_path):
    """Export, eval and serve of a LoRA run, and a model-folder opponent, load the frozen weights
    with the run's config less its adapters: whatever alpha and targets the adapters have."""
    from spiral_jax.models import load_policy_weights

    make_hf_model("qwen3", tmp_path)
    cfg, params = load_pretrained(tmp_path)
    lora_cfg = cfg.replace(lora_rank=4, lora_alpha=8.0, lora_targets=("q", "v"))
    assert lora_cfg.base() == cfg
    loaded = load_policy_weights(str(tmp_path), lora_cfg.base(), None)
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(loaded)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_peft_export_loads_in_transformers_with_our_logits(tmp_path):
    """Our adapters written as a PEFT folder, loaded by peft onto the base model in transformers:
    the same logits as our forward, in fp32, to 1e-4."""
    torch = pytest.importorskip("torch")
    peft = pytest.importorskip("peft")
    import transformers

    make_hf_model("qwen3", tmp_path / "base")
    cfg, base = load_pretrained(tmp_path / "base")
    cfg = cfg.replace(lora_rank=4, lora_alpha=8.0)
    adapters = _adapted(cfg)[1]
    save_adapter(cfg, adapters, tmp_path / "adapter", base_model=str(tmp_path / "base"))
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "base", torch_dtype=torch.float32)
    model = peft.PeftModel.from_pretrained(model, tmp_path / "adapter").eval()
    ids = np.random.default_rng(1).integers(0, FAMILIES["qwen3"]["vocab_size"], (2, 10))
    with torch.no_grad():
        theirs = model(torch.as_tensor(ids)).logits.numpy()
    ours = np.asarray(forward(lora.join(base, adapters), cfg, jnp.asarray(ids)))
    assert np.abs(theirs - np.asarray(forward(base, cfg.base(), jnp.asarray(ids)))).max() > 1e-3  # adapters act
    np.testing.assert_allclose(ours, theirs, atol=1e-4)



def _barriers(cfg, params, cache) -> int:
    """Optimization barriers in one step of the decoder as traced for a GPU (the CPU's products put
    barriers of their own): a decode step with a cache, else a forward."""
    tokens = IDS[:, :1] if cache is not None else IDS
    mask = jnp.ones((IDS.shape[0], 8 if cache is not None else IDS.shape[1]), bool)
    run = lambda p: decoder(p, cfg, tokens, jnp.zeros_like(tokens), mask, cache=cache)  # noqa: E731
    with cpu.compiling_for("gpu"):
        eqns = jax.make_jaxpr(run)(params).jaxpr.eqns
    return sum(e.primitive.name == "optimization_barrier" for e in eqns)


@pytest.mark.parametrize("scan", [False, True])
def test_a_sampler_step_feeds_the_adapters_their_input_through_a_barrier(scan):
    """Each projection's adapter product takes its input as a value of its own in a step with a cache,
    so that XLA's dot merger cannot fold it into the frozen product over a concatenation of the two
    weights, a copy of the frozen weight every decode step. A forward without a cache (training,
    scoring) has no barrier: its products are past the merger's size limit."""
    cfg = TINY.replace(lora_rank=4, lora_alpha=8.0, scan_layers=scan, remat=False)
    full = lora.join(*_adapted(cfg))
    cache = KVCache.zeros(cfg, IDS.shape[0], 8, jnp.float32)
    assert _barriers(cfg, full, cache) == 7 * cfg.num_layers  # a GPU decode step runs a stack unrolled
    assert _barriers(cfg, full, None) == 0
    assert _barriers(cfg.base(), lora.merge(full, cfg), cache) == 0  # merged weights: no adapters
