"""Game statistics at their edges: a seat the policy never took, no games at all."""
from spiral_jax.envs import GameRecord, Turn
from spiral_jax.eval.games import summarize
from spiral_jax.rollout import PlayedGame


def _game(rewards, seats=("model", "random")):
    return PlayedGame(GameRecord(0, "TicTacToe-v0", 0, [Turn(0, "o", "x", "[1]", True)], rewards, ""), seats, [])


def test_scalars_leave_out_a_seat_the_policy_never_took():
    """A step of one game against a fixed opponent has the model in one seat: the other seat's rates
    are not logged as 0% wins, draws, losses and invalid moves."""
    scalars = summarize([_game({0: 1, 1: -1})]).scalars("rollout/all")
    assert scalars["rollout/all/win_rate"] == 1.0 and scalars["rollout/all/seat0/win_rate"] == 1.0
    assert not [k for k in scalars if "/seat1/" in k]
    scalars = summarize([_game({0: 1, 1: -1}, ("random", "scripted"))]).scalars("x")
    assert not [k for k in scalars if k.endswith("_rate")] and scalars["x/games"] == 1
