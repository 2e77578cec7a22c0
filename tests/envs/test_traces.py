"""Replay every reference trace and demand full agreement with the native games.

At every step: the player to move, what that player has been told since their last move (as
facts), whether the action is accepted, the state after the step and the end of the game; at the
end, the final rewards and what each player is told last.
"""
import pytest

from spiral_jax.envs import make
from tests.envs import ta_traces as T

NATIVE_IDS = ["TicTacToe-v0", "KuhnPoker-v1", "SimpleNegotiation-v1", "PigDice-v1", "LiarsDice-v1",
              "Snake-v0", "ConnectFour-v0", "Nim-v0", "SimpleTak-v0"]


def replay(env_id: str, game: dict) -> int:
    where = f"{env_id} seed={game['seed']} ({game['mode']})"
    env = make(env_id, error_allowance=game["error_allowance"])
    env.reset(seed=game["seed"], chance=T.chance(env_id, game))
    init = game["initial_state"]
    assert env.current_player() == init["current_player_id"], where
    assert T.our_state(env_id, env) == T.reference_state(env_id, init), where
    seen = [0, 0]
    refused = T.invalid_steps(game)
    steps = game["steps"]
    for t, step in enumerate(steps):
        at = f"{where} step {t} action {step['action']!r}"
        player = step["player_id"]
        assert env.current_player() == player, at
        told = env.messages(player)[seen[player]:]
        assert T.our_facts(told) == T.reference_facts(env_id, step["obs_delta"]), at
        seen[player] += len(told)
        assert refused[t] == (step["action_kind"] == "illegal"), at  # the trace agrees with itself
        result = env.step(step["action"])
        assert result.info["valid"] is not refused[t], at
        assert result.done == step["done"], at
        state, game_state = step["state"], None
        if not step["done"] and state["game_state"].get("round_ended"):
            game_state = steps[t + 1]["game_state_before"]  # the reference deals the next round lazily
        assert T.our_state(env_id, env) == T.reference_state(env_id, state, game_state), at
    assert env.done and env.rewards == {int(k): v for k, v in game["close"].items()}, where
    for player in (0, 1):
        told = env.messages(player)[seen[player]:]
        assert T.our_facts(told) == T.reference_facts(env_id, game["final_pending_obs"][str(player)]), where
    return len(steps)


@pytest.mark.parametrize("env_id", NATIVE_IDS)
def test_reference_traces_replay(env_id):
    games = T.load(env_id)
    assert games, env_id
    steps = sum(replay(env_id, game) for game in games)
    T.REPLAYED[env_id] = (len(games), steps)


def test_every_trace_file_is_covered():
    """Each trace file is replayed natively, or documented as out of scope here."""
    files = {p.stem for p in T.TRACE_DIR.glob("*.jsonl")}
    assert files == set(NATIVE_IDS) | set(T.NOT_NATIVE), files
