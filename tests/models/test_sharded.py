"""The same model on 8 fake CPU devices under several meshes equals the 1-device result."""
import jax
import numpy as np
import pytest

from spiral_jax.models import forward, load_pretrained
from spiral_jax.sharding import Rules, make_mesh
from tests.models.test_hf_parity import _padded_batch

MESHES = [dict(data=1, fsdp=-1, tensor=1), dict(data=2, fsdp=2, tensor=2), dict(data=1, fsdp=2, tensor=4)]


@pytest.mark.parametrize("kind", ["train", "sample"])
@pytest.mark.parametrize("mesh_shape", MESHES, ids=lambda m: "x".join(str(v) for v in m.values()))
def test_sharded_equals_single_device(hf_model, kind, mesh_shape):
    _, path, _ = hf_model
    cfg, params = load_pretrained(path)
    ids, mask = _padded_batch(cfg.vocab_size, [64, 40, 50, 33, 64, 12, 20, 64], 64)
    expected = np.asarray(forward(params, cfg, ids, mask))

    mesh = make_mesh(**mesh_shape)
    rules = Rules.create(mesh, kind)
    cfg_s, params_s = load_pretrained(path, mesh=mesh, rules=kind)
    assert len(jax.tree.leaves(params_s)[1].sharding.device_set) == 8
    batch = rules.sharding(("batch", "seq"), ids.shape)
    fn = jax.jit(forward, static_argnums=(1,), static_argnames=("rules",))
    got = fn(params_s, cfg_s, jax.device_put(ids, batch), jax.device_put(mask, batch), rules=rules)
    np.testing.assert_allclose(np.asarray(got), expected, atol=1e-5, rtol=0)


def test_weights_are_actually_split():
    """Train rules split the embedding over fsdp x tensor; sample rules only over tensor."""
    from spiral_jax.models import ModelConfig, init_params

    cfg = ModelConfig("qwen3", vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=1,
                      num_heads=4, num_kv_heads=4, head_dim=16)
    mesh = make_mesh(data=1, fsdp=2, tensor=4)
    train = init_params(cfg, jax.random.key(0), mesh=mesh, rules="train")
    sample = init_params(cfg, jax.random.key(0), mesh=mesh, rules="sample")
    assert train["embed"].sharding.shard_shape(train["embed"].shape) == (64, 32)
    assert sample["embed"].sharding.shard_shape(sample["embed"].shape) == (64, 64)
    # 3 kv heads do not divide 4-way tensor parallelism: replicated instead of failing.
    odd = ModelConfig("qwen3", vocab_size=250, hidden_size=64, intermediate_size=128, num_layers=1,
                      num_heads=3, num_kv_heads=3, head_dim=16)
    p = init_params(odd, jax.random.key(0), mesh=mesh)
    assert p["layers"][0]["k"].sharding.shard_shape((3, 16, 64)) == (3, 16, 32)
    assert p["embed"].sharding.shard_shape((250, 64)) == (250, 32)
