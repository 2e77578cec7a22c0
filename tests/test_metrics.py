"""The metrics writer: TensorBoard event files, and the optional Weights & Biases mirror."""
import sys
import types

import pytest

from spiral_jax.metrics import MetricsWriter, read_scalars


class FakeRun:
    def __init__(self, **init):
        self.init, self.logged, self.finished = init, [], False

    def log(self, values, step):
        self.logged.append((step, values))

    def finish(self):
        self.finished = True


@pytest.fixture
def fake_wandb(monkeypatch):
    runs = []
    module = types.SimpleNamespace(init=lambda **kw: runs.append(FakeRun(**kw)) or runs[-1])
    monkeypatch.setitem(sys.modules, "wandb", module)
    return runs


def test_scalars_go_to_tensorboard_and_wandb(tmp_path, fake_wandb):
    writer = MetricsWriter(tmp_path, wandb={"enabled": True, "project": "p", "entity": "", "name": "run1"},
                           config={"seed": 3})
    writer.scalars(5, {"train/loss": 0.25, "rollout/games": 64})
    writer.text(5, "config", "{}")
    writer.close()
    assert read_scalars(tmp_path)["train/loss"] == [(5, 0.25)]
    (run,) = fake_wandb
    assert run.init == {"project": "p", "entity": None, "name": "run1", "config": {"seed": 3}}
    assert run.logged == [(5, {"train/loss": 0.25, "rollout/games": 64.0}), (5, {"config": "{}"})]
    assert run.finished


def test_wandb_off_by_default_and_a_clear_error_without_the_package(tmp_path, fake_wandb, monkeypatch):
    MetricsWriter(tmp_path / "a", wandb={"enabled": False}).scalars(1, {"x": 1.0})
    assert not fake_wandb
    monkeypatch.setitem(sys.modules, "wandb", None)  # not installed
    with pytest.raises(ImportError, match=r"pip install spiral-jax\[wandb\]"):
        MetricsWriter(tmp_path / "b", wandb={"enabled": True})
