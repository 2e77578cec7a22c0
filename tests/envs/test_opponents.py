"""Scripted opponents: exact TicTacToe minimax, Kuhn Nash play, and heuristics that beat random."""
import numpy as np
import pytest

from spiral_jax.envs import (KuhnNashOpponent, NimOptimal, RandomOpponent, TicTacToeMinimax, make,
                             registered_ids, scripted_opponent)
from spiral_jax.envs.opponents import best_score


def _position(moves):
    env = make("TicTacToe-v0")
    env.reset(0)
    for cell in moves:
        env.step(f"[{cell}]")
    return env


def _duel(env_id, players, seed):
    env = make(env_id)
    env.reset(seed)
    while not env.done:
        action = players[env.current_player()].act(env)
        assert env.step(action).info["valid"], (env_id, action)
    return env.rewards


def test_minimax_values_the_empty_board_as_a_draw():
    assert best_score("." * 9, "O") == 0


@pytest.mark.parametrize("seed", range(10))
def test_minimax_self_play_draws(seed):
    assert _duel("TicTacToe-v0", [TicTacToeMinimax(seed), TicTacToeMinimax(seed + 100)], seed) == {0: 0, 1: 0}


def test_minimax_never_loses_to_random():
    for game in range(200):
        seat = game % 2
        players = [RandomOpponent(game), RandomOpponent(game)]
        players[seat] = TicTacToeMinimax(game)
        assert _duel("TicTacToe-v0", players, game)[seat] >= 0


@pytest.mark.parametrize("moves, best", [
    ((0, 3, 1, 4), {"[2]"}),        # O wins on the top row rather than blocking X's middle row
    ((0, 4, 1), {"[2]"}),           # X must block the top row
    ((4, 0, 8, 2), {"[1]"}),        # O: blocking X's top row is the only move that does not lose
    ((0, 4, 8), {"[1]", "[3]", "[5]", "[7]"}),  # X must answer opposite corners with an edge, not a corner
    ((4, 1, 0), {"[8]"}),           # X must block the diagonal
    ((0, 1, 4, 2), {"[8]"}),        # O completes the diagonal
])
def test_minimax_finds_winning_and_blocking_moves(moves, best):
    env = _position(moves)
    for seed in range(8):
        assert TicTacToeMinimax(seed).act(env) in best


def test_minimax_with_a_preferred_order_is_deterministic_and_still_exact():
    prefer = (4, 0, 2, 6, 8, 1, 3, 5, 7)
    assert TicTacToeMinimax(0, prefer).act(_position(())) == "[4]"  # every first move draws: the centre
    assert TicTacToeMinimax(0, prefer).act(_position((0, 4, 8))) == "[1]"  # the first edge, not a corner
    assert TicTacToeMinimax(0, prefer).act(_position((0, 3, 1, 4))) == "[2]"  # a win beats the order
    for game in range(100):
        seat = game % 2
        players = [RandomOpponent(game), RandomOpponent(game)]
        players[seat] = TicTacToeMinimax(game, prefer)
        assert _duel("TicTacToe-v0", players, game)[seat] >= 0
    env = _position((4,))
    assert {TicTacToeMinimax(seed, prefer).act(env) for seed in range(10)} == {"[0]"}


def test_kuhn_nash_opponent_plays_the_equilibrium_frequencies():
    opponent = KuhnNashOpponent(alpha=1 / 6, seed=0)
    bets = 0
    for game in range(3000):
        env = make("KuhnPoker-v2", rounds=1)
        env.reset(game, chance={"deal": [(2, 0)]})  # the opener (player 0) holds K: bets 3 * alpha = 1/2
        bets += opponent.act(env) == "[bet]"
    assert abs(bets / 3000 - 0.5) < 0.04
    env = make("KuhnPoker-v2", rounds=1)
    env.reset(0, chance={"deal": [(1, 0)]})
    env.step("[bet]")  # the responder holds J facing a bet: always folds
    assert all(KuhnNashOpponent(seed=s).act(env) == "[fold]" for s in range(20))


def test_nim_optimal_wins_from_a_winning_position():
    for game in range(50):
        assert _duel("Nim-v0", [NimOptimal(), RandomOpponent(game)], game)[0] == 1
    assert _duel("Nim-v0", [NimOptimal(), NimOptimal()], 0)[0] == 1  # piles 3, 4, 5: nim-sum != 0


@pytest.mark.parametrize("env_id", [e for e in registered_ids() if not e.startswith("KuhnPoker")])
def test_scripted_opponents_beat_random(env_id):
    wins = 0
    for game in range(60):
        seat = game % 2
        players = [RandomOpponent(game), RandomOpponent(game)]
        players[seat] = scripted_opponent(env_id, seed=game)
        wins += _duel(env_id, players, game)[seat] > 0
    assert wins >= 40, wins


def _first_player_chips(first: dict, second: dict) -> float:
    """Exact expected chips of the first player in one hand of Kuhn poker, each player betting or
    calling with the given probability at each information set (worked out over the 6 deals)."""
    total = 0.0
    for c0, c1 in [(a, b) for a in range(3) for b in range(3) if a != b]:
        j0, j1, s = "JQK"[c0], "JQK"[c1], (1 if c0 > c1 else -1)
        bet, call, bet_after_check, call_back = first[j0], second[j1 + "b"], second[j1 + "c"], first[j0 + "cb"]
        total += (bet * (call * 2 * s + (1 - call) * 1)
                  + (1 - bet) * ((1 - bet_after_check) * s
                                 + bet_after_check * (call_back * 2 * s + (1 - call_back) * -1))) / 6
    return total


def test_kuhn_nash_beats_random_in_chips():
    from spiral_jax.envs.exploitability import nash_policy

    nash, uniform = nash_policy(), {k: 0.5 for k in nash_policy()}
    exact = (_first_player_chips(nash, uniform) - _first_player_chips(uniform, nash)) / 2  # both seats
    chips = []
    for game in range(48000):
        seat = game % 2
        # seeds apart from the deal's (env.reset(game)), so the random moves do not depend on the cards
        players = [RandomOpponent(10**6 + game), RandomOpponent(10**6 + game)]
        players[seat] = scripted_opponent("KuhnPoker-v2", seed=2 * 10**6 + game)
        env = make("KuhnPoker-v2", rounds=1)
        env.reset(game)
        while not env.done:
            env.step(players[env.current_player()].act(env))
        chips.append(env.state()["chips"][seat])
    standard_error = np.std(chips) / np.sqrt(len(chips))
    assert abs(np.mean(chips) - exact) < 4 * standard_error, (np.mean(chips), exact, standard_error)
    # the test can tell equilibria apart: the family's ends differ from alpha = 1/6 by more than that
    for alpha in (0.0, 1 / 3):
        other = nash_policy(alpha)
        far = (_first_player_chips(other, uniform) - _first_player_chips(uniform, other)) / 2
        assert abs(far - exact) > 4 * standard_error


def test_unknown_scripted_opponent():
    with pytest.raises(ValueError, match="no scripted opponent"):
        scripted_opponent("Chess-v0")
