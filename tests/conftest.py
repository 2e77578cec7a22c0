"""Shared test setup: 8 fake CPU devices, and tiny random Hugging Face models saved to temp dirs."""
import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)
jax.config.update("jax_default_matmul_precision", "highest")

import pytest  # noqa: E402

from tests.tiny_models import FAMILIES, make_hf_model  # noqa: E402


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: a slow test (deselect with -m 'not slow')")


@pytest.fixture(scope="session", params=sorted(FAMILIES))
def hf_model(request, tmp_path_factory):
    """(family name, checkpoint folder, torch model) for each tiny model family."""
    path = tmp_path_factory.mktemp(request.param)
    return request.param, path, make_hf_model(request.param, path)
