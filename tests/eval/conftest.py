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


@pytest.fixture(scope="session")
def tiny_ctx(tiny_model):
    """An EvalContext on the tiny model (8 new tokens, temperature 0.6, top-p 0.95), one sampler
    shared by the tests so its programs compile once."""
    from spiral_jax.eval.suite import EvalContext
    from spiral_jax.sampling import Sampler, SamplingParams

    cfg, params, tok = tiny_model
    sampler = Sampler(cfg, None, max_prompt_len=768, max_cache_len=1024)
    return EvalContext(cfg, params, tok, sampler, SamplingParams(8, 0.6, 0, 0.95))
