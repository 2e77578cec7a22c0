"""Shared test setup: 8 fake CPU devices, a persistent compilation cache, and tiny random Hugging Face
models saved to temp dirs."""
import atexit
import os
import shutil
import tempfile

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)
jax.config.update("jax_default_matmul_precision", "highest")

# Many tests build the same tiny programs again (every Trainer jits its own closures). A persistent
# compilation cache for the session loads them instead: the trainer tests take about a third of the
# time. Tests that count compilations count cache loads too (spiral_jax.compilation). A cache dir
# the caller set (JAX_COMPILATION_CACHE_DIR) is kept as is.
if not jax.config.jax_compilation_cache_dir:
    _CACHE = tempfile.mkdtemp(prefix="spiral_jax_tests_xla_cache_")
    atexit.register(shutil.rmtree, _CACHE, ignore_errors=True)
    jax.config.update("jax_compilation_cache_dir", _CACHE)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)

import pytest  # noqa: E402

from spiral_jax.models import cpu  # noqa: E402
from tests.tiny_models import FAMILIES, TINY_RUN, make_hf_model  # noqa: E402


# Optional test dependencies (the test extra installs them). Locally a missing one skips its tests;
# in CI (CI=true) it fails the run, so no test drops out silently.
OPTIONAL_TEST_DEPENDENCIES = ("textarena", "math_verify", "matplotlib")


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: a slow test (deselect with -m 'not slow')")
    if os.environ.get("CI", "").lower() in ("true", "1"):
        import importlib.util

        missing = [m for m in OPTIONAL_TEST_DEPENDENCIES if importlib.util.find_spec(m) is None]
        if missing:
            raise pytest.UsageError(f"CI: the test dependencies {', '.join(missing)} are missing, so their tests "
                                    f"would be skipped; install them with pip install -e '.[test]'")


@pytest.fixture(scope="session", params=sorted(FAMILIES))
def hf_model(request, tmp_path_factory):
    """(family name, checkpoint folder, torch model) for each tiny model family."""
    path = tmp_path_factory.mktemp(request.param)
    return request.param, path, make_hf_model(request.param, path)


@pytest.fixture(params=["cpu", "accelerator"])
def layouts(request, monkeypatch):
    """Run a test with the operand layouts tuned for XLA:CPU, then with the ones GPUs and TPUs get
    (`models.cpu.layouts`): CI has no accelerator, and this keeps their code paths tested."""
    if request.param == "accelerator":
        monkeypatch.setattr(cpu, "layouts", lambda: False)
    return request.param


@pytest.fixture(scope="session")
def tiny_model():
    """(ModelConfig, params, Tokenizer) of a 2-layer random model (no mesh) with the project's
    embedded tokenizer, shared by the tests that need a real model and tokenizer."""
    from spiral_jax.config import base_config, build_model, build_tokenizer

    c = base_config()
    c.model.random.update(TINY_RUN, max_position_embeddings=1024)
    c.tokenizer.path = "embedded"
    c.lock()
    cfg, params = build_model(c)
    return cfg, params, build_tokenizer(c, cfg)
