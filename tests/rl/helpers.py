"""Tiny models and random turn samples shared by the RL tests."""
import jax
import numpy as np

from spiral_jax.rl.samples import TurnSample
from tests.tiny_models import TINY


def random_samples(n, seed=0, vocab=TINY.vocab_size, max_prompt=12, max_response=10, game_id="g"):
    """n samples with random tokens, lengths, nonzero advantages and sampler log-probs."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        prompt = rng.integers(0, vocab, rng.integers(2, max_prompt + 1)).tolist()
        response = rng.integers(0, vocab, rng.integers(1, max_response + 1)).tolist()
        logprobs = (-rng.uniform(3.0, 5.0, len(response))).tolist()
        adv = float(rng.choice([-1.0, 1.0]) * rng.uniform(0.5, 1.5))
        out.append(TurnSample(prompt, response, logprobs, game_id, i % 2, i // 2, adv))
    return out


def assert_trees_close(actual, expected, rtol=1e-4, atol_frac=1e-5):
    """Leaf-wise allclose, with the absolute tolerance scaled by each expected leaf's largest entry."""
    for a, e in zip(jax.tree.leaves(actual), jax.tree.leaves(expected), strict=True):
        a, e = np.asarray(a), np.asarray(e)
        np.testing.assert_allclose(a, e, rtol=rtol, atol=atol_frac * max(np.abs(e).max(), 1e-30))
