"""1,000 random games per env: random-legal and random-garbage players, no exception, sane results."""
import numpy as np
import pytest

from spiral_jax.envs import make, registered_ids

GAMES = 1_000
GARBAGE = [
    "", " ", "pass", "[", "]", "[]", "[ ]", "[-1]", "[99]", "[9 9]", "[0 0]", "[col 99]", "[col -1]",
    "[Bid: 0, 3]", "[Bid: 99, 6]", "[Bid: 1, 7]", "[Bid: 1, 0]", "[Call]", "[call] [bid 1 1]",
    "[Offer: 99 Wood -> 1 Gold]", "[Offer: 1 Stone -> 1 Gold]", "[Offer: -> 1 Gold]", "[Accept]", "[Deny]",
    "[Offer: 1 Wood -> 1 Gold] [Accept]", "[roll", "[r]", "[h]", "[up", "[jump]", "[w] [s]",
    "[check] or [bet]", "[CALL]", "[fold]", "I choose [4] or maybe [5]", "\\boxed{[4]}",
    "[" + "9" * 30 + "]", "[Bid: " + "9" * 30 + ", 2]", "[Offer: " + "9" * 5000 + " Wood -> 1 Gold]",
    "ünïcödé [٣]", "[col 3]\n[col 4]", "[Offer: 1 Wood, 1 Gold -> 3 Gold and 1 Wood]",
]


def _play(env_id: str, rng: np.random.Generator, game: int) -> tuple[int, int]:
    env = make(env_id, error_allowance=game % 2)
    env.reset(seed=game)
    p_garbage = 0.0 if game % 4 == 3 else 0.1  # a quarter of the games are played out cleanly
    steps = refused = 0
    while not env.done:
        legal = env.legal_actions()
        assert legal and env.legal_actions(1 - env.current_player()) == []
        errors_before = env.error_count
        if rng.random() < p_garbage:
            action = GARBAGE[rng.integers(len(GARBAGE))]
        else:
            action = legal[rng.integers(len(legal))]
            if rng.random() < 0.2:  # a decorated legal move
                action = f"My move: {action} ."
        result = env.step(action)
        steps += 1
        assert steps < 5000, f"{env_id} game {game} does not end"
        if action in legal:
            assert result.info["valid"], (env_id, game, action)
        if not result.info["valid"]:
            refused += 1
            assert env.error_count == errors_before + 1 or (env.done and env.rewards[1 - env.current_player()] == 0)
        assert result.done == env.done and (result.rewards is None) != env.done
    rewards = env.rewards
    assert set(rewards) == {0, 1}
    forfeit = sorted(rewards.values()) == [-1, 0]
    # zero-sum; +-1 / 0 except where the reward is chips (one hand of Kuhn: up to 2 either way)
    outcomes = (-2, -1, 1, 2) if env_id == "KuhnPokerChips-v0" else (-1, 0, 1)
    assert forfeit or (rewards[0] + rewards[1] == 0 and rewards[0] in outcomes), rewards
    for player in (0, 1):
        assert env.observation(player)
    return steps, refused


@pytest.mark.parametrize("env_id", registered_ids())
def test_random_games_finish_with_consistent_rewards(env_id):
    rng = np.random.default_rng(12345)
    steps = refused = 0
    for game in range(GAMES):
        s, r = _play(env_id, rng, game)
        steps, refused = steps + s, refused + r
    assert refused > 0 and steps > GAMES  # both kinds of players really played
