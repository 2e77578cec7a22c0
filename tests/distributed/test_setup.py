"""`distributed.initialize`: how the config and the environment give the coordinator, process count
and process id, and the message when they are wrong (no processes are started here)."""
import jax
import pytest

from spiral_jax import distributed
from spiral_jax.distributed import DistributedSetup


@pytest.fixture
def joined(monkeypatch):
    """What initialize hands jax.distributed, without joining anything."""
    calls = []

    def fake_initialize(coordinator_address, num_processes, process_id):
        if coordinator_address is None or num_processes is None:  # as JAX says it outside a cluster
            raise ValueError("coordinator_address should be defined.")
        calls.append((coordinator_address, num_processes, process_id))

    monkeypatch.setattr(jax.distributed, "initialize", fake_initialize)
    monkeypatch.setattr(distributed, "_initialized", False)
    for name in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"):
        monkeypatch.delenv(name, raising=False)
    return calls


def test_the_environment_fills_what_the_config_leaves_out(joined, monkeypatch):
    monkeypatch.setenv("JAX_COORDINATOR_ADDRESS", "10.0.0.1:1234")
    monkeypatch.setenv("JAX_NUM_PROCESSES", "2")
    monkeypatch.setenv("JAX_PROCESS_ID", "1")
    distributed.initialize(DistributedSetup(enabled=True, num_processes=-1))  # -1 and 0 mean unset
    assert joined == [("10.0.0.1:1234", 2, 1)]


@pytest.mark.parametrize("setup, env, message", [
    (dict(coordinator_address="10.0.0.1", num_processes=2, process_id=0), {},
     r"coordinator address '10.0.0.1' needs a port: host:port"),
    (dict(), {"JAX_NUM_PROCESSES": "two", "JAX_PROCESS_ID": "0"},
     r"JAX_NUM_PROCESSES='two' is not an integer; .* distributed.num_processes"),
    (dict(num_processes=2), {"JAX_PROCESS_ID": " "}, r"partial setup"),  # an empty variable is unset
    (dict(), {}, r"jax.distributed could not start: coordinator_address should be defined. Outside a TPU pod"),
    (dict(coordinator_address="10.0.0.1:1234"), {}, r"could not start: .* give coordinator_address, "
                                                     r"num_processes and process_id"),
])
def test_a_wrong_setup_names_the_keys_and_variables(joined, monkeypatch, setup, env, message):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=message) as error:
        distributed.initialize(DistributedSetup(enabled=True, **setup))
    assert "JAX_COORDINATOR_ADDRESS" in str(error.value) or "JAX_NUM_PROCESSES=" in str(error.value)
    assert not joined
