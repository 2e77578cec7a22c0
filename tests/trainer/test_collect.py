"""A step's collection with a stand-in rollout (no model): how many rounds it plays and who sits where."""
import numpy as np
import pytest

from spiral_jax.config import base_config
from spiral_jax.envs.batch import GameRecord, Turn
from spiral_jax.rollout import ModelTurn, PlayedGame
from spiral_jax.run.collect import collect
from spiral_jax.run.setup import run_spec
from spiral_jax.sampling.stats import DecodeStats


class ScriptedRollout:
    """Plays each game as one move a seat, with the rewards of `outcomes` in turn (the last repeats);
    records the seats it was given."""

    def __init__(self, *outcomes):
        self.outcomes, self.seats, self.stats = list(outcomes), [], DecodeStats()

    def play(self, env_ids, seats, policies, seed):
        self.seats += seats
        rewards = self.outcomes.pop(0) if len(self.outcomes) > 1 else self.outcomes[0]
        games = []
        for env_id, seat in zip(env_ids, seats):
            turns = [ModelTurn(p, seat[p], [1, 2, 3], [4, 5], np.zeros(2, np.float32), "stop") for p in (0, 1)]
            record = GameRecord(0, env_id, seed, [Turn(p, "", "", "[0]", True) for p in (0, 1)], dict(rewards))
            games.append(PlayedGame(record, seat, turns))
        return games


def _spec(**rollout):
    c = base_config()
    c.rollout.update(**rollout)
    c.games.update(env_ids=("TicTacToe-v0",), weights=(1.0,))
    return run_spec(c)


def test_selection_all_plays_on_until_a_batch_gives_samples():
    """A drawn game at baselines 0 gives every turn a zero advantage, dropped: the step plays another
    batch instead of training on nothing."""
    rollout = ScriptedRollout({0: 0.0, 1: 0.0}, {0: 1.0, 1: -1.0})
    got = collect(_spec(games_per_batch=1, selection="all"), rollout, {"model": None}, 0, {"baselines": {}},
                  [], "random")
    assert len(got.games) == 2 and len(got.samples) == 2 and got.turns == 4
    assert sorted(s.advantage for s in got.samples) == [-1.0, 1.0]


def test_against_an_opponent_the_model_takes_each_seat_as_often_with_an_odd_batch():
    """Seats alternate over a step's games counted from step x games_per_batch: a one-game batch
    alternates from step to step (it always took seat 0), a three-game batch takes each seat as often."""
    for games_per_batch in (1, 3):
        spec = _spec(games_per_batch=games_per_batch, mode="fixed_opponent")
        for step in range(4):
            rollout = ScriptedRollout({0: 1.0, 1: -1.0})
            collect(spec, rollout, {"model": None}, step, {"baselines": {}}, [], "random")
            model_seats = [seat.index("model") for seat in rollout.seats]
            assert model_seats == [(step * games_per_batch + i) % 2 for i in range(len(model_seats))], model_seats


def test_a_steps_second_batch_reads_the_baselines_of_the_first():
    """Sharded baselines (one game a shard here) belong to a game's place in its batch: the second
    batch's game reads the baselines the first batch's game left, as an actor's next game would."""
    c = base_config()
    c.rollout.update(games_per_batch=1, samples_per_step=4)
    c.games.update(env_ids=("TicTacToe-v0",), weights=(1.0,))
    c.rae.update(games_per_shard=1, decay=0.95)
    got = collect(run_spec(c), ScriptedRollout({0: 1.0, 1: -1.0}), {"model": None}, 0, {"baselines": {}}, [],
                  "random")
    assert len(got.games) == 2 and list(got.rae["baselines"]) == ["TicTacToe-v0@0"]
    assert sorted(s.advantage for s in got.samples) == pytest.approx([-1.0, -0.95, 0.95, 1.0])
