"""The Qwen3 shapes of models/shapes.py: the 4B one is the paper config's, and each has its model's
published parameter count."""
from pathlib import Path

import pytest

from spiral_jax.config import config_from_file
from spiral_jax.models import ModelConfig
from spiral_jax.models.shapes import QWEN3

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def test_the_4b_shape_is_the_paper_configs():
    random = config_from_file(str(CONFIGS / "spiral_kuhn_qwen3_4b.py")).model.random.to_dict()
    assert {k: random[k] for k in QWEN3["4b"]} == QWEN3["4b"]


@pytest.mark.parametrize("name, billions", [("0.6b", 0.596), ("1.7b", 1.721), ("4b", 4.022)])
def test_parameter_counts(name, billions):
    assert round(ModelConfig(**QWEN3[name]).num_params / 1e9, 3) == billions
