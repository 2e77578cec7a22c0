"""Per-role rewards, advantages, response lengths and the invalid-move breakdown of a step."""
import numpy as np
import pytest

from spiral_jax.envs import GameRecord, Turn
from spiral_jax.rl.samples import TurnSample
from spiral_jax.rl.step_metrics import invalid_kind, policy_turns, step_metrics
from spiral_jax.rollout import ModelTurn, PlayedGame


def _model_turn(player, n_tokens, reason="stop", policy="model"):
    return ModelTurn(player, policy, [1, 2, 3], list(range(n_tokens)), np.zeros(n_tokens, np.float32), reason)


def _games():
    # Game 0: the model in both seats; player 0 answers without a box, player 1 plays an illegal move.
    g0 = PlayedGame(GameRecord(0, "TicTacToe-v0", 1, [Turn(0, "o", "\\boxed{4}", "[4]", True),
                                                      Turn(1, "o", "no box here", "", False)],
                               {0: 0.5, 1: -1.5}, "invalid"),
                    ("model", "model"), [_model_turn(0, 4), _model_turn(1, 10)])
    # Game 1: the model as player 1 against random; its second move is cut at the token limit.
    g1 = PlayedGame(GameRecord(1, "TicTacToe-v0", 2, [Turn(0, "o", "r", "[0]", True),
                                                      Turn(1, "o", "\\boxed{4}", "[4]", True),
                                                      Turn(0, "o", "r", "[1]", True),
                                                      Turn(1, "o", "\\boxed{9}", "[9]", False)],
                               {0: 0.5, 1: -1.5}, "invalid"),
                    ("random", "model"), [_model_turn(1, 4), _model_turn(1, 8, reason="length")])
    g2 = PlayedGame(GameRecord(2, "TicTacToe-v0", 3, [Turn(0, "o", "\\boxed{[1]}", "[1]", False)],
                               {0: -1.5, 1: 0.5}, "invalid"),
                    ("model", "random"), [_model_turn(0, 6)])
    return [g0, g1, g2]


def test_invalid_moves_are_told_apart():
    turn = Turn(0, "o", "x", "", False)
    assert invalid_kind(turn, _model_turn(0, 3)) == "no_box"
    assert invalid_kind(Turn(0, "o", "x", "[9]", False), _model_turn(0, 3)) == "illegal_move"
    assert invalid_kind(turn, _model_turn(0, 3, "length")) == "cut_at_token_limit"
    assert invalid_kind(turn, _model_turn(0, 0, "prompt_too_long")) == "prompt_too_long"
    assert invalid_kind(Turn(0, "o", "x", "[4]", True), _model_turn(0, 3)) is None


def test_policy_turns_pair_each_move_with_its_llm_record():
    pairs = list(policy_turns(_games()[1], "model"))
    assert [(t.action, m.finish_reason) for t, m in pairs] == [("[4]", "stop"), ("[9]", "length")]


def test_step_metrics_per_role():
    samples = [TurnSample([1], [2], [0.0], "TicTacToe-v0", 0, 0, advantage=a) for a in (1.0, 3.0)]
    samples.append(TurnSample([1], [2], [0.0], "TicTacToe-v0", 1, 0, advantage=-2.0))
    m = step_metrics(_games(), samples)
    assert m["rollout/TicTacToe-v0/role0/reward"] == pytest.approx((0.5 - 1.5) / 2)
    assert m["rollout/TicTacToe-v0/role1/reward"] == pytest.approx(-1.5)
    assert m["rollout/TicTacToe-v0/role0/advantage_mean"] == 2.0
    assert m["rollout/TicTacToe-v0/role0/advantage_std"] == 1.0
    assert m["rollout/TicTacToe-v0/role1/advantage_std"] == 0.0
    assert m["rollout/TicTacToe-v0/role1/response_tokens_max"] == 10  # lengths 10, 4, 8
    assert m["rollout/TicTacToe-v0/role1/response_tokens_p50"] == 8
    assert m["rollout/TicTacToe-v0/role0/response_tokens_p50"] == 5  # lengths 4, 6
    # five model moves: one without a box, one cut, one illegal (g0's player 1 move has no box too)
    assert m["rollout/invalid/no_box"] == pytest.approx(1 / 5)
    assert m["rollout/invalid/cut_at_token_limit"] == pytest.approx(1 / 5)
    assert m["rollout/invalid/illegal_move"] == pytest.approx(1 / 5)
    assert m["rollout/invalid/prompt_too_long"] == 0.0


def test_valid_moves_and_response_length_are_the_trained_policys_alone():
    """Against a fixed opponent the random player's moves (always valid, one character) are not the
    model's: they counted in the valid-move share (4 of 7 moves, the model's being 2 of 5) and the
    mean response length."""
    m = step_metrics(_games(), [])
    assert m["rollout/valid_action_rate"] == pytest.approx(2 / 5)
    assert m["rollout/response_chars"] == pytest.approx((9 + 11 + 9 + 9 + 11) / 5)
    assert step_metrics([], [])["rollout/valid_action_rate"] == 0.0
