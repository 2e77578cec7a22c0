"""A tiny random model with the project's embedded tokenizer, shared by the eval tests."""
import pytest

from spiral_jax.config import base_config, build_model, build_tokenizer


@pytest.fixture(scope="session")
def tiny_model():
    """(ModelConfig, params, Tokenizer) of a 2-layer random model (no mesh)."""
    c = base_config()
    c.model.random.update(vocab_size=2048, hidden_size=32, intermediate_size=64, num_layers=2,
                          num_heads=2, num_kv_heads=1, head_dim=16, max_position_embeddings=1024)
    c.tokenizer.path = "embedded"
    c.lock()
    cfg, params = build_model(c)
    return cfg, params, build_tokenizer(c, cfg)
