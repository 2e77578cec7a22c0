"""Two CPU processes (4 fake devices each) joined by jax.distributed train exactly like one process
with 8 devices: same parameters, same RAE baselines, same games; they write one checkpoint together
and resume from it, and only process 0 logs."""
import json
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

WORKER = Path(__file__).with_name("worker.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _start(out: Path, count: int, devices: int, schedule: str = "rounds") -> list[subprocess.Popen]:
    out.mkdir()
    port = str(_free_port())
    # Each worker's output goes to a file: read through pipes one worker at a time, a worker whose pipe
    # filled would block on writing while its peers wait for it in a collective.
    procs = []
    for pid in range(count):
        with open(out / f"worker{pid}.log", "w") as log:
            procs.append(subprocess.Popen([sys.executable, str(WORKER), str(out), str(pid), str(count), port,
                                           str(devices), schedule], stdout=log, stderr=subprocess.STDOUT))
    return procs


def _result(out: Path, procs: list[subprocess.Popen]) -> tuple[dict, dict]:
    for pid, p in enumerate(procs):
        p.wait(timeout=600)
        assert p.returncode == 0, (out / f"worker{pid}.log").read_text()[-4000:]
    result = np.load(out / "result.npz")
    return {k: result[k] for k in result.files}, json.loads((out / "rae.json").read_text())


@pytest.mark.slow
def test_two_processes_equal_one(tmp_path):
    """The two hosts also run the continuous schedule, each its own decode engine over its share of
    the games, against one process playing them round by round: the same games either way."""
    # Both runs at once: the two hosts spend part of their time waiting on each other.
    two_procs = _start(tmp_path / "two", count=2, devices=4, schedule="continuous")
    one_procs = _start(tmp_path / "one", count=1, devices=8)
    two_params, two = _result(tmp_path / "two", two_procs)
    one_params, one = _result(tmp_path / "one", one_procs)
    assert (two["processes"], two["devices"], one["processes"], one["devices"]) == (2, 8, 1, 8)
    assert two["games"] == one["games"] and two["samples"] == one["samples"] == 16
    assert two["digest"] == one["digest"]  # the same games: moves, seeds and sampled tokens
    assert two["rae"] == one["rae"] and two["rae"]["baselines"]  # every baseline identical
    assert one_params.keys() == two_params.keys()
    for name, value in one_params.items():
        np.testing.assert_allclose(two_params[name], value, atol=1e-6, rtol=1e-5, err_msg=name)
    assert one["moved"] > 1e-4  # not vacuous: the two updates changed the weights
    assert two["stop"] and not one["stop"]  # process 1's stop request reached process 0
    assert two["restored_exactly"] and one["restored_exactly"]  # a checkpoint written and read by both hosts
    assert two["log_lines"][0] > 0 and two["log_lines"][1] == 0  # only process 0 logs

