"""KuhnPokerChips-v0: one textbook hand whose reward is the chips won, the unit of exploitability."""
import itertools

import pytest

from spiral_jax.envs import INFO_SETS, kuhn_exploitability, make, nash_policy

# (betting line, player 0's net chips when player 0 holds the higher card)
LINES = {("[check]", "[check]"): 1, ("[bet]", "[call]"): 2, ("[bet]", "[fold]"): 1,
         ("[check]", "[bet]", "[call]"): 2, ("[check]", "[bet]", "[fold]"): -1}


@pytest.mark.parametrize("line", LINES)
@pytest.mark.parametrize("high", [0, 1])
def test_reward_is_net_chips(line, high):
    env = make("KuhnPokerChips-v0")
    env.reset(0, chance={"deal": [(2, 0) if high == 0 else (0, 2)]})
    for i, move in enumerate(line):
        assert env.current_player() == i % 2  # player 0 opens
        result = env.step(move)
    chips = LINES[line]
    if line[-1] != "[fold]" and high == 1:
        chips = -chips  # showdown lost
    assert result.done and result.rewards == {0: chips, 1: -chips}


def test_rules_text_states_the_chip_reward():
    env = make("KuhnPokerChips-v0")
    env.reset(0)
    text = env.observation(0)
    assert "Your reward is the number of chips you win or lose." in text and "1 round(s)" in text


def test_expected_reward_under_nash_is_the_game_value():
    """The exact expected chips of player 0 over all deals, both players at a Nash equilibrium, is
    -1/18: the same number the exploitability code computes from the policy."""
    policy = nash_policy(alpha=0.2)
    total = 0.0
    for c0, c1 in itertools.permutations(range(3), 2):
        total += _expected(policy, (c0, c1), ()) / 6
    assert total == pytest.approx(-1 / 18, abs=1e-9)
    assert kuhn_exploitability(policy).value == pytest.approx(-1 / 18, abs=1e-9)
    assert set(policy) == set(INFO_SETS)


def _expected(policy, deal, line):
    env = make("KuhnPokerChips-v0")
    env.reset(0, chance={"deal": [deal]})
    for move in line:
        env.step(move)
    if env.done:
        return env.rewards[0]
    info = env.info_set(env.current_player())
    legal = env.legal_actions()
    aggressive = "[bet]" if "[bet]" in legal else "[call]"
    p = policy[info]
    return sum(q * _expected(policy, deal, line + (m,))
               for m, q in ((aggressive, p), (next(a for a in legal if a != aggressive), 1 - p)))
