"""XLA compilations: a process-wide count, so tests and logs can prove a hot loop never recompiles, and
the persistent compilation cache that a later run loads its programs from.

JAX reports a backend compile for every executable it builds, also one it loads from the persistent
compilation cache (`jax_compilation_cache_dir`) instead: either way the in-memory jit cache missed,
which is what a hot loop must never do (tests/test_compilation.py checks both).
"""
from __future__ import annotations

import os
import sys
import threading

import jax

_BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
_lock = threading.Lock()
_count = 0
_installed = False


def _on_event(event: str, duration: float, **kwargs) -> None:
    global _count
    if event == _BACKEND_COMPILE_EVENT:
        with _lock:
            _count += 1


def compile_count() -> int:
    """Number of backend compilations since the counter was first used in this process."""
    global _installed
    with _lock:
        if not _installed:
            jax.monitoring.register_event_duration_secs_listener(_on_event)
            _installed = True
        return _count


def use_persistent_cache(path: str) -> str | None:
    """Keep compiled programs in `path` (local or gs://), so a run that meets the same programs again (a
    resumed run, the next experiment on the same sizes) loads them instead of compiling: a real
    model's first RL step spends minutes compiling on a GPU, its sampler's decode steps unrolled over
    the layers. A directory already set (JAX_COMPILATION_CACHE_DIR or jax.config) wins; "" leaves
    the cache off. JAX writes only programs that took a second or more to compile. A folder that
    cannot be made is said on stderr and the run goes on without the cache: it only saves time.
    Returns the directory in use, or None. Call it before the first compile: JAX opens the cache once."""
    current = jax.config.jax_compilation_cache_dir
    if current or not path:
        return current or None
    if "://" not in path:
        path = os.path.abspath(os.path.expanduser(path))
        try:
            os.makedirs(path, exist_ok=True)
        except OSError as e:
            print(f"spiral-jax: no persistent compilation cache ({path}: {e.strerror or e}); programs "
                  f"compile again in every run. Set --config.compile_cache_dir to a folder you can "
                  f"write, or to '' to turn the cache off", file=sys.stderr)
            return None
    jax.config.update("jax_compilation_cache_dir", path)
    return path
