"""The metrics writer: TensorBoard event files, and the optional Weights & Biases mirror."""
import sys
import time
import types

import pytest

from spiral_jax.metrics import MetricsWriter, read_scalars


class FakeRun:
    """Keeps what W&B keeps: a value logged at a step below W&B's current one is dropped."""

    def __init__(self, **init):
        self.init, self.logged, self.finished, self.axes, self.step = init, [], False, {}, 0

    def define_metric(self, name, step_metric=None):
        self.axes[name] = step_metric

    def log(self, values, step=None):
        if step is not None and step < self.step:
            return
        self.step = self.step + 1 if step is None else step
        self.logged.append(values)

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
    assert run.logged == [{"train/loss": 0.25, "rollout/games": 64.0, "step": 5}, {"config": "{}", "step": 5}]
    assert run.axes == {"step": None, "*": "step"} and run.finished


def test_wandb_keeps_the_steps_of_a_run_that_counts_from_0_again(tmp_path, fake_wandb):
    """The bootstrap logs its own steps, then RL counts from 0: W&B drops values logged below its own
    step, so every value goes at W&B's next step with the run's step as its x axis."""
    writer = MetricsWriter(tmp_path, wandb={"enabled": True})
    for step in (0, 10, 20):
        writer.scalars(step, {"bootstrap/loss": 1.0})
    for step in (0, 1):
        writer.scalars(step, {"train/loss": 0.5})
    writer.close()
    (run,) = fake_wandb
    assert run.logged[3:] == [{"train/loss": 0.5, "step": 0}, {"train/loss": 0.5, "step": 1}]


def test_wandb_off_by_default_and_a_clear_error_without_the_package(tmp_path, fake_wandb, monkeypatch):
    MetricsWriter(tmp_path / "a", wandb={"enabled": False}).scalars(1, {"x": 1.0})
    assert not fake_wandb
    monkeypatch.setitem(sys.modules, "wandb", None)  # not installed
    with pytest.raises(ValueError, match=r"pip install spiral-jax\[wandb\], or turn the mirror off"):
        MetricsWriter(tmp_path / "b", wandb={"enabled": True})


def test_a_wandb_run_that_does_not_start_is_a_clear_error(tmp_path, fake_wandb):
    """wandb.init failing (not logged in, no network) is said in one line with the ways out, which the
    command line prints as it does any dead endpoint."""
    def refused(**_):
        raise RuntimeError("api_key not configured (no-tty)")

    sys.modules["wandb"].init = refused
    with pytest.raises(ConnectionError, match=r"W&B did not start a run \(RuntimeError: api_key not configured "
                                              r"\(no-tty\)\); log in with `wandb login`, set WANDB_MODE=offline"):
        MetricsWriter(tmp_path, wandb={"enabled": True})


def test_a_run_without_the_wandb_package_is_refused_before_its_weights_load(tmp_path, monkeypatch):
    from spiral_jax.run import Trainer, loop
    from tests.trainer.test_trainer import tiny_config

    monkeypatch.setitem(sys.modules, "wandb", None)  # not installed
    monkeypatch.setattr(loop, "build_model", lambda *a, **k: pytest.fail("the weights were loaded"))
    with pytest.raises(ValueError, match="wandb.enabled needs the wandb package"):
        Trainer.from_config(tiny_config(tmp_path, **{"wandb.enabled": True}), log=lambda *_: None)


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


def test_prune_events_leaves_a_file_it_cannot_read_whole_as_it_is(tmp_path):
    """A damaged record inside an event file (a bad length, bytes that are no event), a file of
    garbage and a folder with an event file's name: each is said once and left as it was (rewriting
    would drop what follows the damage), and the readable files are still pruned. Reading them back
    gives each file's values up to its damage."""
    from spiral_jax.metrics import prune_events
    from spiral_jax.run.state import RunState

    names = []
    for _ in range(3):
        writer = MetricsWriter(tmp_path)
        for step in range(1, 6):
            writer.scalars(step, {"train/loss": float(step)})
        writer.close()
        names.append(max(p.name for p in tmp_path.iterdir() if p.name not in names))
        time.sleep(1.1)  # event files are named by the second they were opened in
    bad_length, bad_event, fine = (tmp_path / name for name in names)
    data = bytearray(bad_length.read_bytes())
    data[len(data) // 2] ^= 0xFF  # inside the third record's data or length
    bad_length.write_bytes(bytes(data))
    event = bad_event.read_bytes()
    bad_event.write_bytes(event[:-21] + b"\xff" * 17 + event[-4:])  # the last event's bytes
    (tmp_path / "events.out.tfevents.1.garbage").write_bytes(b"not an event file" * 9)
    (tmp_path / "events.out.tfevents.2.folder").mkdir()
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file() and p.name != fine.name}
    logged = []
    assert prune_events(tmp_path, RunState(train=None, step=3).logged_after, logged.append) == 2
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.name in before} == before
    assert len(logged) == 4 and all("is left as it is: it cannot be read" in m for m in logged)
    logged.clear()  # read back: each file up to its damage, the rest said
    loss = read_scalars(tmp_path, logged.append)["train/loss"]
    assert loss[-7:] == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 4.0), (1, 1.0), (2, 2.0), (3, 3.0)]
    assert len(logged) == 4 and all("cannot be read whole" in m for m in logged)


def test_a_bootstrap_state_marks_its_own_later_steps_stale():
    from spiral_jax.run.state import RunState

    state = RunState(train=None, step=0, phase="bootstrap", bootstrap_step=20)
    assert [state.logged_after("bootstrap/loss", s) for s in (19, 20)] == [False, True]
    assert [state.logged_after("time/checkpoint", s) for s in (0, 1)] == [False, True]
    assert not RunState(train=None, step=7).logged_after("bootstrap/loss", 500)


def test_an_event_whose_data_fails_its_crc_is_not_read_nor_rewritten(tmp_path):
    """A flipped bit in a logged value still parses, as another value: the data's CRC catches it, so
    reading stops before it (as TensorBoard does) and pruning does not write it back with a valid CRC."""
    import struct

    from spiral_jax.metrics import prune_events

    writer = MetricsWriter(tmp_path)
    for step in range(3):
        writer.scalars(step, {"train/loss": 1.5})
    writer.close()
    (events,) = tmp_path.iterdir()
    data = bytearray(events.read_bytes())
    data[data.rfind(struct.pack("<f", 1.5)) + 3] ^= 0x01  # step 2's 1.5 would read as 0.375
    events.write_bytes(bytes(data))
    logged = []
    assert read_scalars(tmp_path, logged.append)["train/loss"] == [(0, 1.5), (1, 1.5)]
    assert prune_events(tmp_path, lambda tag, step: step == 0, logged.append) == 0
    assert events.read_bytes() == bytes(data)
    assert "data of the record at byte" in logged[0] and "is left as it is" in logged[1]


def test_a_full_disk_is_an_error_where_values_are_logged_not_a_thread_traceback(tmp_path, monkeypatch):
    """The event file is written on the calling thread: the command turns ENOSPC into its one line,
    and no background thread prints a traceback of its own first."""
    import builtins
    import errno
    import threading

    from spiral_jax import metrics

    writer = MetricsWriter(tmp_path / "tb")
    writer.scalars(1, {"a": 1.0})
    writer.flush()
    assert read_scalars(tmp_path / "tb") == {"a": [(1, 1.0)]}
    monkeypatch.setattr(metrics, "open", lambda path, mode: builtins.open("/dev/full", mode), raising=False)
    hooked = []
    monkeypatch.setattr(threading, "excepthook", hooked.append)
    with pytest.raises(OSError) as e:
        full = MetricsWriter(tmp_path / "full")
        for step in range(4):
            full.scalars(step, {"a": float(step)})
        full.flush()
    assert e.value.errno == errno.ENOSPC and not hooked
