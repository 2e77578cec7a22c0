"""Cross-play on scripted players: a known cycle shows in the residual, a known order does not."""
import numpy as np
import pytest

from spiral_jax.eval.crossplay import bradley_terry, cross_play, heatmap, markdown, predicted, rate
from tests.test_paths import out  # noqa: F401 (the out_dir fixture: a local folder, then a gs:// one)

BEATS = {"rock": "scissors", "paper": "rock", "scissors": "paper"}


def rps(first, second, n):
    if BEATS[first] == second:
        return ["win"] * n
    return ["loss"] * n if BEATS[second] == first else ["draw"] * n


def test_rock_paper_scissors_cycle_shows_in_residual():
    result = cross_play(["rock", "paper", "scissors"], rps, 4)
    np.testing.assert_array_equal(result.games, 4 * (1 - np.eye(3)))
    assert result.win_rate[1, 0] == 1.0 and result.win_rate[0, 1] == 0.0
    np.testing.assert_array_equal(result.seat_score[0] + result.seat_score[1], result.score)
    r = rate(result)
    np.testing.assert_allclose(r.strength, 1.0, atol=1e-9)   # symmetric: no one is stronger
    np.testing.assert_allclose(r.elo, 1000.0, atol=1e-6)
    off = ~np.eye(3, dtype=bool)
    np.testing.assert_allclose(np.abs(r.residual[off]), 0.5, atol=1e-9)
    assert r.residual_rms == pytest.approx(0.5)
    assert len(r.cycles) == 1 and r.cycles[0][1] == pytest.approx(0.5)
    assert set(r.cycles[0][0]) == {"rock", "paper", "scissors"}
    assert "Non-transitive" in markdown(result, r)


def test_transitive_players_fit_with_small_residual():
    """Player k beats player j with the BT probability of strengths 2**k (expected counts)."""
    true = np.array([1.0, 2.0, 4.0, 8.0])
    names = ["a", "b", "c", "d"]

    def play(first, second, n):
        q = predicted(true)[names.index(first), names.index(second)]
        wins = round(q * n)
        return ["win"] * wins + ["loss"] * (n - wins)

    result = cross_play(names, play, 2000)
    r = rate(result, prior=0.0)
    np.testing.assert_allclose(r.strength / r.strength[0], true, rtol=0.02)
    assert r.elo[3] - r.elo[0] == pytest.approx(400 * np.log10(8), abs=5)
    assert r.residual_rms < 0.01 and r.cycles == []


def test_unbeaten_player_gets_a_finite_rating():
    p = bradley_terry(np.array([[0, 2.0], [0, 0]]), np.array([[0, 2.0], [2.0, 0]]))
    assert np.all(np.isfinite(p)) and p[0] > p[1]


def test_far_apart_players_are_fitted_to_the_maximum():
    """A strict order a > b > c > d over 10,000 games a pair: the fit is the maximum of the likelihood
    (each player's expected score equals its score); 10,000 MM steps left a 100 Elo short."""
    names = ["a", "b", "c", "d"]
    result = cross_play(names, lambda f, s, n: ["win" if f < s else "loss"] * n, 10000)
    p = bradley_terry(result.score, result.games)
    played = result.games > 0
    expected = ((result.games + played) * predicted(p)).sum(1)
    np.testing.assert_allclose(expected, (result.score + 0.5 * played).sum(1), rtol=1e-9)
    assert np.all(np.diff(p) < 0) and np.mean(np.log(p)) == pytest.approx(0, abs=1e-12)


def test_undetermined_strengths_are_refused():
    """Without a prior an unbeaten player's strength has no maximum (the fit stopped wherever 10000
    steps left it, 2194 Elo here); two groups that never met have no common scale."""
    names = ["a", "b", "c"]
    result = cross_play(names, lambda f, s, n: ["win" if f == "a" else "loss" if s == "a" else "draw"] * n, 2)
    assert np.all(np.isfinite(rate(result).elo))  # the default prior: finite
    with pytest.raises(ValueError, match="not determined"):
        rate(result, prior=0.0)
    games = np.kron(np.eye(2), 1 - np.eye(2)) * 4  # a-b and c-d, never a pair across
    score = np.array([[0, 4, 0, 0], [0, 0, 0, 0], [0, 0, 0, 1], [0, 0, 3, 0.]])
    with pytest.raises(ValueError, match="not determined"):
        bradley_terry(score, games)


@pytest.mark.parametrize("names", [[], ["a"], ["a", "a"]])
def test_cross_play_needs_two_distinct_players(names):
    with pytest.raises(ValueError, match="two or more players"):
        cross_play(names, rps, 2)


def test_heatmap_png(out):  # noqa: F811 (the fixture imported above)
    """In the out_dir, local or gs:// (matplotlib alone opened "gs://..." as a local file and failed
    once every game was played)."""
    pytest.importorskip("matplotlib", reason="matplotlib is the optional `eval` extra; heatmap untested")
    from spiral_jax.paths import run_path

    given, local = out
    run_path(given).mkdir(parents=True)  # run_crossplay makes the report folder
    result = cross_play(["rock", "paper", "scissors"], rps, 2)
    heatmap(result, f"{given}/crossplay.png")
    assert (local / "crossplay.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_rollout_play_scripted_players():
    """The Rollout adapter on scripted players (no model): both seats, every game scored."""
    from types import SimpleNamespace

    from spiral_jax.eval.crossplay import rollout_play
    from spiral_jax.rollout import Rollout
    from spiral_jax.sampling import SamplingParams

    rollout = Rollout(None, SimpleNamespace(stop_ids=frozenset({0})), SamplingParams(8))
    result = cross_play(["random", "scripted"], rollout_play(rollout, {}, "TicTacToe-v0", seed=1), 8)
    assert result.games[0, 1] == 8
    assert result.win_rate[1, 0] > 0.5  # minimax beats random
