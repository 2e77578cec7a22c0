"""The compile counter sees every new executable, including one loaded from the persistent cache; a
run's persistent cache goes where its config or the environment says."""
import os
import subprocess
import sys

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


def _cache_dir_chosen(tmp_path, env_dir: str | None, path: str, warns: bool = False) -> list[str]:
    """In a fresh process (JAX opens its cache once): what use_persistent_cache(path) returns, and
    the directory jax.config then holds; whether it said on stderr that the cache is off."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COMPILATION_CACHE")}
    env["HOME"] = str(tmp_path)
    if env_dir:
        env["JAX_COMPILATION_CACHE_DIR"] = env_dir
    code = ("import jax; from spiral_jax.compilation import use_persistent_cache as use; "
            f"print(use({path!r})); print(jax.config.jax_compilation_cache_dir)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert ("no persistent compilation cache" in out.stderr) == warns, out.stderr[-2000:]
    return out.stdout.split()


def test_the_persistent_cache_goes_where_the_config_says_unless_the_environment_says(tmp_path):
    # The default, under the user's home: made, and set.
    chosen = _cache_dir_chosen(tmp_path, None, "~/.cache/spiral_jax/xla")
    assert chosen == [str(tmp_path / ".cache/spiral_jax/xla")] * 2 and (tmp_path / ".cache/spiral_jax/xla").is_dir()
    # JAX_COMPILATION_CACHE_DIR wins over the config.
    assert _cache_dir_chosen(tmp_path, str(tmp_path / "env"), str(tmp_path / "cfg")) == [str(tmp_path / "env")] * 2
    assert not (tmp_path / "cfg").exists()
    # Empty: off.
    assert _cache_dir_chosen(tmp_path, None, "") == ["None", "None"]
    # A folder that cannot be made: off, said on stderr, and the run goes on.
    (tmp_path / "a_file").write_text("")
    assert _cache_dir_chosen(tmp_path, None, str(tmp_path / "a_file" / "xla"), warns=True) == ["None", "None"]
