"""Rollout: every game is seeded by its global index, so playing in chunks changes nothing."""
from types import SimpleNamespace

from spiral_jax.rl.rollout import Rollout
from spiral_jax.sampling import SamplingParams


def _games(max_in_flight):
    rollout = Rollout(None, SimpleNamespace(stop_ids=frozenset({0})), SamplingParams(8),
                      max_in_flight=max_in_flight)
    env_ids = ["TicTacToe-v0", "KuhnPoker-v1", "Nim-v0"] * 4
    seats = [("random", "scripted"), ("scripted", "random")] * 6
    games = rollout.play(env_ids, seats, {}, seed=7)
    return [(g.record.env_id, g.record.seed, g.seats, tuple(t.action for t in g.record.turns), g.record.rewards)
            for g in games]


def test_chunked_play_equals_all_at_once():
    whole = _games(None)
    assert len(whole) == 12 and len({g[1] for g in whole}) == 12  # distinct seeds per game
    assert _games(5) == whole == _games(1)
