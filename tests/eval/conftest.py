"""The eval tests' context on the tiny model (tests/conftest.py's `tiny_model`)."""
import pytest


@pytest.fixture(scope="session")
def tiny_ctx(tiny_model):
    """An EvalContext on the tiny model (8 new tokens, temperature 0.6, top-p 0.95), one sampler
    shared by the tests so its programs compile once."""
    from spiral_jax.eval.suite import EvalContext
    from spiral_jax.sampling import Sampler, SamplingParams

    cfg, params, tok = tiny_model
    sampler = Sampler(cfg, None, max_prompt_len=768, max_cache_len=1024)
    return EvalContext(cfg, params, tok, sampler, SamplingParams(8, 0.6, 0, 0.95))
