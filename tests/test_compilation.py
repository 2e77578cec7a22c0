"""The compile counter sees every new executable, including one loaded from the persistent cache."""
import jax
import jax.numpy as jnp
import numpy as np

from spiral_jax.compilation import compile_count


def test_counts_compilations_and_persistent_cache_loads():
    hits = []
    jax.monitoring.register_event_listener(
        lambda event, **_: hits.append(event) if event == "/jax/compilation_cache/cache_hits" else None)
    x = jnp.asarray(np.arange(7.0))  # a shape no other test uses, so the first call compiles
    program = jax.jit(lambda v: jnp.cumprod(v * 3.0 - 1.0))

    start = compile_count()
    program(x).block_until_ready()
    assert compile_count() == start + 1
    program(x).block_until_ready()  # in-memory jit cache: nothing new
    assert compile_count() == start + 1

    jax.clear_caches()  # the next call must build the executable again: from the persistent cache
    program(x).block_until_ready()
    assert hits, "the tests' persistent compilation cache (tests/conftest.py) did not serve the program"
    assert compile_count() == start + 2
