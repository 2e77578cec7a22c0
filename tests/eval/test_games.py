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


def test_truncated_responses_are_those_cut_at_the_token_limit():
    """A turn whose prompt was too long generated nothing and was cut by nothing: it is an invalid move
    of its own kind, not a truncated response."""
    import numpy as np

    from spiral_jax.rollout import ModelTurn

    game = _game({0: -1, 1: 1})
    game.model_turns.extend(ModelTurn(0, "model", [1], ids, np.zeros(len(ids)), reason)
                            for ids, reason in (([2, 3], "stop"), ([2, 2, 2], "length"), ([], "prompt_too_long")))
    assert summarize([game]).truncated_responses == 1 / 3
