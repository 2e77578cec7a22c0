"""Shared test setup: 8 fake CPU devices, a persistent compilation cache, and tiny random Hugging Face
models saved to temp dirs."""
import atexit
import os
import shutil
import tempfile

# XLA:CPU flags for the tests' programs, which are tiny and many: compiling them, not running them, is
# most of the suite's time. No LLVM optimisation, one codegen module and the classic loop emitters
# compile them several times faster (the commit that set them has the figures); the numerics the tests
# check hold to the same tolerances, and the programs users run keep XLA's defaults. Flags the caller
# put in XLA_FLAGS win.
_TEST_XLA_FLAGS = {"--xla_force_host_platform_device_count": "8", "--xla_backend_optimization_level": "0",
                   "--xla_cpu_parallel_codegen_split_count": "1"}


def _jaxlib_before(major: int, minor: int) -> bool:
    from importlib.metadata import version  # jax itself is imported only once XLA_FLAGS is final
    return tuple(int(x) for x in version("jaxlib").split(".")[:2]) < (major, minor)


# The XLA of jaxlib 0.11 and later has only the fusion emitters, and an unknown flag in XLA_FLAGS
# aborts the process (on a GPU machine too), so the classic emitters are asked for only before it.
if _jaxlib_before(0, 11):
    _TEST_XLA_FLAGS["--xla_cpu_use_fusion_emitters"] = "false"
_flags = os.environ.get("XLA_FLAGS", "")
os.environ["XLA_FLAGS"] = " ".join([_flags] + [f"{k}={v}" for k, v in _TEST_XLA_FLAGS.items() if k not in _flags]).strip()

# Many tests build the same tiny programs again (every Trainer jits its own closures), in both pytest
# workers and in the subprocesses some tests start. One persistent compilation cache for the whole
# run, made by the first process and inherited through the environment, loads them instead. Tests that
# count compilations count cache loads too (spiral_jax.compilation). A cache dir the caller set
# (JAX_COMPILATION_CACHE_DIR) is kept as is.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    _CACHE = tempfile.mkdtemp(prefix="spiral_jax_tests_xla_cache_")
    atexit.register(shutil.rmtree, _CACHE, ignore_errors=True)
    os.environ.update(JAX_COMPILATION_CACHE_DIR=_CACHE, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
                      JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)
jax.config.update("jax_default_matmul_precision", "highest")

import pytest  # noqa: E402

from spiral_jax.models import cpu  # noqa: E402
from tests.tiny_models import FAMILIES, TINY_RUN, make_hf_model  # noqa: E402


# Optional test dependencies (the test extra installs them). Locally a missing one skips its tests;
# in CI (CI=true) it fails the run, so no test drops out silently.
OPTIONAL_TEST_DEPENDENCIES = ("textarena", "math_verify", "matplotlib", "libtpu", "openai", "peft")


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: a slow test (deselect with -m 'not slow')")
    if os.environ.get("CI", "").lower() in ("true", "1"):
        import importlib.util

        missing = [m for m in OPTIONAL_TEST_DEPENDENCIES if importlib.util.find_spec(m) is None]
        if missing:
            raise pytest.UsageError(f"CI: the test dependencies {', '.join(missing)} are missing, so their tests "
                                    f"would be skipped; install them with pip install -e '.[test]'")


@pytest.fixture(autouse=True)
def _process_wide_jax_settings_restored():
    """`spiral-jax plan --hardware` (`aot.prepare`) sets up its process for devices other than its own:
    the CPU platform, no persistent compilation cache. Tests call the CLI in-process, so the settings
    go back after each one and the worker's later tests keep the cache."""
    saved = {name: getattr(jax.config, name) for name in ("jax_platforms", "jax_enable_compilation_cache")}
    yield
    for name, value in saved.items():
        jax.config.update(name, value)


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
    from spiral_jax.config import base_config
    from spiral_jax.run.build import build_model, build_tokenizer
    from spiral_jax.run.setup import run_spec

    c = base_config()
    c.model.random.update(TINY_RUN, max_position_embeddings=1024)
    c.tokenizer.path = "embedded"
    c.lock()
    spec = run_spec(c)
    cfg, params = build_model(spec)
    return cfg, params, build_tokenizer(spec, cfg)
