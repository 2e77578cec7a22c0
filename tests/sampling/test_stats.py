"""DecodeStats: exact arithmetic on the counts, and rates that never divide by zero."""
import dataclasses

import pytest

from spiral_jax.sampling.stats import DecodeStats


def test_add_and_subtract_every_field():
    a = DecodeStats(1.5, 100, 90, 120, 300, 700)
    b = DecodeStats(0.25, 10, 8, 16, 30, 5)
    assert a + b == DecodeStats(1.75, 110, 98, 136, 330, 705)
    assert (a + b) - a == b and a - a == DecodeStats()
    assert sum([a, b], DecodeStats()) == a + b
    assert all(isinstance(v, int) for v in dataclasses.astuple(a - b)[1:])
    with pytest.raises(TypeError):
        a + 1  # noqa: B018
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.seconds = 0.0


def test_rates():
    s = DecodeStats(seconds=2.0, generated_tokens=100, decoded_tokens=90, slot_steps=120, prefilled_tokens=300,
                    reused_tokens=700)
    assert s.tokens_per_s == 50.0
    assert s.slot_utilization == 0.75
    assert s.prefill_saved == 0.7


def test_rates_of_nothing_are_guarded():
    empty = DecodeStats()
    assert empty.tokens_per_s == 0.0 and empty.slot_utilization == 0.0 and empty.prefill_saved == 0.0
    # The guards are max(seconds, 1e-9) and max(count, 1), so a tiny interval stays finite.
    assert DecodeStats(seconds=0.0, generated_tokens=3).tokens_per_s == 3 / 1e-9
    assert DecodeStats(decoded_tokens=0, slot_steps=0).slot_utilization == 0.0
