"""The metrics writer: TensorBoard event files, and the optional Weights & Biases mirror."""
import sys
import time
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


def test_prune_events_removes_what_a_stopped_run_logged_past_its_checkpoint(tmp_path):
    """A run stopped at step 5 after a checkpoint at step 3: its steps 4 and 5 go, texts too (bootstrap curves,
    on their own step axis, stay), a file with nothing stale is left as it was, a record cut off by
    the crash is dropped, and the resumed run's steps follow on without a second point per step."""
    from spiral_jax.metrics import prune_events
    from spiral_jax.run.state import RunState

    early = MetricsWriter(tmp_path)
    early.scalars(0, {"bootstrap/loss": 2.0})
    early.close()
    first = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    time.sleep(1.1)  # event files are named by the second they were opened in
    crashed = MetricsWriter(tmp_path)
    for step in range(1, 6):
        crashed.scalars(step, {"train/loss": float(step), "bootstrap/loss": 1.0})
    crashed.text(5, "transcripts/x", "a game")
    crashed.close()
    (last,) = [p for p in tmp_path.iterdir() if p.name not in first]
    last.write_bytes(last.read_bytes() + b"\x40\x00\x00\x00\x00\x00\x00\x00cut")
    state = RunState(train=None, step=3)
    assert prune_events(tmp_path, state.logged_after) == 3  # train/loss at 4 and 5, the text at 5
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.name in first} == first
    assert not list(tmp_path.glob("*.tmp"))
    time.sleep(1.1)
    resumed = MetricsWriter(tmp_path)
    resumed.scalars(4, {"train/loss": 40.0})
    resumed.close()
    scalars = read_scalars(tmp_path)
    assert scalars["train/loss"] == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 40.0)]
    assert [s for s, _ in scalars["bootstrap/loss"]] == [0, 1, 2, 3, 4, 5]
    assert prune_events(tmp_path, state.logged_after) == 1  # the resumed run's own step 4, if asked
    assert prune_events(tmp_path / "none", state.logged_after) == 0


def test_a_bootstrap_state_marks_its_own_later_steps_stale():
    from spiral_jax.run.state import RunState

    state = RunState(train=None, step=0, phase="bootstrap", bootstrap_step=20)
    assert [state.logged_after("bootstrap/loss", s) for s in (19, 20)] == [False, True]
    assert [state.logged_after("time/checkpoint", s) for s in (0, 1)] == [False, True]
    assert not RunState(train=None, step=7).logged_after("bootstrap/loss", 500)
