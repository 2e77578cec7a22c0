"""SPIRAL self-play reinforcement learning for LLMs in one JAX program.

Importing the package checks the installed jax against the oldest release the code runs on. An older
one (an environment whose jax another package pinned, or an install with --no-deps) would otherwise
fail deep inside a run, after minutes of work, with an error that never names jax's version: a
missing Pallas or shard_map API, or a gradient rule older releases lack.
"""
import re
from importlib import metadata

# The oldest jax the whole test suite passes with; setup.py requires the same (tests/test_imports.py).
JAX_MIN = "0.10.2"


def _release(version: str) -> tuple[int, ...]:
    """The leading numbers of a version string: "0.10.2.dev20261201" -> (0, 10, 2)."""
    return tuple(int(n) for n in re.match(r"\d+(?:\.\d+)*", version)[0].split("."))


def check_jax_version(found: str) -> None:
    """Raises ImportError naming the installed and the needed jax when `found` is older than JAX_MIN."""
    if _release(found) < _release(JAX_MIN):
        raise ImportError(
            f"spiral-jax needs jax {JAX_MIN} or newer, and this environment has jax {found}; upgrade it with "
            f"pip install -U 'jax>={JAX_MIN}' (in this repository on a TPU VM: pip install -e '.[tpu]'; on a "
            f"GPU box: pip install -e '.[cuda]')")


try:
    check_jax_version(metadata.version("jax"))
except metadata.PackageNotFoundError:  # the modules that use jax say so when imported
    pass
